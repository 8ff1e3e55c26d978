#!/usr/bin/python3
"""deploy/docker/build.sh, as CI runs it outside docker: its runtime folder
(what the image's runtime stage copies) runs on its own. knnd and knnctl
are taken from that folder only, with an empty environment: --version,
then serving a small index, health, a search and a clean SIGTERM drain.
A folder missing a library is refused by the script's own check.

  runtime_test.py --build-dir BUILD --source-dir . [unittest args]
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
import urllib.request

ARGS = None


class RuntimeFolderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = os.path.join(cls.tmp.name, "knnd")
        cls.script = os.path.join(ARGS.source_dir, "deploy", "docker", "build.sh")
        subprocess.run([cls.script, "runtime", ARGS.build_dir, cls.out], check=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_bin(self, name, *args, **kwargs):
        return subprocess.run([os.path.join(self.out, "bin", name), *args], env={},
                              capture_output=True, text=True, **kwargs)

    def test_layout(self):
        self.assertEqual(sorted(os.listdir(self.out)), ["bin", "etc", "lib"])
        self.assertEqual(sorted(os.listdir(os.path.join(self.out, "bin"))),
                         ["knnctl", "knnd"])
        libs = os.listdir(os.path.join(self.out, "lib"))
        for needed in ("libgrpc++.so.1.51", "libprotobuf.so.32", "libopenblas.so.0",
                       "libgomp.so.1", "libmicrohttpd.so.12", "libgnutls.so.30"):
            self.assertIn(needed, libs)
        self.assertNotIn("libc.so.6", libs)

    def test_version_runs_from_the_folder(self):
        r = self.run_bin("knnd", "--version")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"^knnd \d+\.\d+\.\d+ \(git \S+\) faiss 1\.7\.3 \[")

    def test_serves_an_index(self):
        index = os.path.join(self.tmp.name, "small.index")
        subprocess.run([sys.executable, os.path.join(ARGS.source_dir, "tests", "tools",
                                                     "make_index.py"),
                        "--output", index, "--random", "2000", "--dim", "16",
                        "--factory", "IVF16,PQ4", "--nprobe", "4"],
                       check=True, capture_output=True)
        from knnd_harness import Daemon, free_port
        http = f"127.0.0.1:{free_port()}"
        # knnctl health polls with the daemon's (empty) environment.
        daemon = Daemon(os.path.join(self.out, "bin", "knnd"),
                        ["--config", os.path.join(self.out, "etc", "knnd.textproto"),
                         "--index", index, "--workers", "1", "--http_listen", http],
                        log_path=os.path.join(self.tmp.name, "knnd.log"),
                        knnctl=os.path.join(self.out, "bin", "knnctl"), env={})
        self.addCleanup(daemon.stop)
        self.assertTrue(daemon.wait_serving(60, poll_s=0.1),
                        "knnd exited or never became SERVING: " + daemon.read_log())
        r = self.run_bin("knnctl", "search", "--addr", daemon.address, "--random", "5",
                         "--k", "3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"query 0: \d+\(")
        # The HTTP/JSON listener, from the folder's libmicrohttpd.
        with urllib.request.urlopen(f"http://{http}/v1/index_info", timeout=10) as r:
            self.assertEqual(json.load(r)["dim"], 16)
        daemon.proc.send_signal(signal.SIGTERM)
        self.assertEqual(daemon.proc.wait(timeout=60), 0)
        self.assertIn("drained", daemon.read_log())

    def test_check_refuses_a_folder_missing_a_library(self):
        broken = os.path.join(self.tmp.name, "broken")
        shutil.copytree(self.out, broken, symlinks=True)
        os.remove(os.path.join(broken, "lib", "libprotobuf.so.32"))
        r = subprocess.run([self.script, "check", broken], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertRegex(r.stderr, r"libraries resolved outside .*libprotobuf\.so\.32")


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    sys.path.insert(0, os.path.join(ARGS.source_dir, "tests", "python"))
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
