#!/usr/bin/python3
"""The Java example (examples/java) against a real knnd, in the system
route's venv (client_testing.py): examples/java/build.sh builds it offline
from Debian's packages (protoc with the grpc-java plugin, javac against
/usr/share/java), and its gRPC client must answer what knnd-client's
KnnClient answers for the same request, and so must its HTTP/JSON
client (java.net.http + Jackson) against knnd's HTTP listener: ids and float32 distances bit for
bit, payloads equal as JSON, hybrid ranks equal; for a vector search with
payloads, a hybrid search fused by RRF and by weights, and texts alone
(BM25); a refused request exits with knnd's status code and message.
Skipped, saying what to install, only where javac is absent.

  client_java_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl \\
      --source-dir . --venvs BUILD/tests/python_client_venvs [unittest args]
"""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import unittest

import numpy as np

import client_testing
from hybrid_test import corpus
from knnd_harness import Daemon, stop_all

ARGS = None
ROWS = 1200
DIM = 16
K = 10
TEXTS = ["printer network", "服务器 字体", "서버 차트", "macro"]


@unittest.skipUnless(os.environ.get(client_testing.ROUTE_ENV) == "system",
                     "the Java example runs once, in the system route")
class JavaClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("javac") is None:
            raise unittest.SkipTest(
                "javac not found: the Java example needs Debian's "
                "openjdk-17-jdk-headless and the jars examples/java/build.sh "
                "names (make deps installs them)")
        ARGS = client_testing.script_args()
        cls.tmp = tempfile.TemporaryDirectory()
        tmp = cls.tmp.name
        built = subprocess.run(
            [os.path.join(ARGS.source_dir, "examples", "java", "build.sh"),
             os.path.join(tmp, "java")], capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError("examples/java/build.sh failed:\n"
                               + built.stdout + built.stderr)
        with open(os.path.join(tmp, "java", "classpath")) as f:
            cls.classpath = f.read().strip()
        rng = np.random.default_rng(21)
        cls.xb = rng.standard_normal((ROWS, DIM)).astype("float32")
        np.save(os.path.join(tmp, "x.npy"), cls.xb)
        np.save(os.path.join(tmp, "ids.npy"),
                np.arange(ROWS, dtype=np.int64) * 3 + 2**40)
        with open(os.path.join(tmp, "p.jsonl"), "w", encoding="utf-8") as out:
            for row in corpus()[:ROWS]:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        index = os.path.join(tmp, "j.index")
        subprocess.run(
            [ARGS.knnctl, "build", "--input", os.path.join(tmp, "x.npy"),
             "--output", index, "--nlist", "16", "--ids",
             os.path.join(tmp, "ids.npy"), "--payloads",
             os.path.join(tmp, "p.jsonl"), "--text", "text"],
            check=True, capture_output=True)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            cls.http_url = f"http://127.0.0.1:{probe.getsockname()[1]}"
        cls.daemon = Daemon(ARGS.knnd, ["--index", index, "--http_listen",
                                        cls.http_url[len("http://"):]],
                            log_path=os.path.join(tmp, "knnd.log"),
                            knnctl=ARGS.knnctl)
        if not cls.daemon.wait_serving(60):
            cls.tearDownClass()
            raise RuntimeError("knnd did not start: " + cls.daemon.read_log())
        import knnd_client
        cls.client = knnd_client.KnnClient(cls.daemon.address, timeout_s=30)
        cls.queries = cls.xb[:len(TEXTS)] + 0.05
        cls.queries.astype("<f4").tofile(os.path.join(tmp, "q.f32"))
        with open(os.path.join(tmp, "t.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(TEXTS) + "\n")

    @classmethod
    def tearDownClass(cls):
        if hasattr(cls, "client"):
            cls.client.close()
        if hasattr(cls, "daemon"):
            stop_all([cls.daemon], 30)
        cls.tmp.cleanup()

    VIAS = ("grpc", "http")

    def java(self, via, *args, check=True):
        """KnndExample over `via` ("grpc" or "http"): its JSON lines."""
        target = self.daemon.address if via == "grpc" else self.http_url
        run = subprocess.run(
            ["java", "-cp", self.classpath, "io.knnd.example.KnndExample",
             "--" + via, target, *args],
            capture_output=True, text=True, timeout=120)
        if check:
            self.assertEqual(run.returncode, 0, run.stderr)
            return [json.loads(line) for line in run.stdout.splitlines()]
        return run

    def assert_same(self, lines, result, hybrid=False):
        """The Java lines hold what the SearchResult `result` holds."""
        self.assertEqual(len(lines), result.ids.shape[0])
        for q, line in enumerate(lines):
            keep = result.ids[q] >= 0
            self.assertEqual(line["ids"], result.ids[q][keep].tolist())
            self.assertEqual(
                line["distance_bits"],
                result.distances[q][keep].view(np.int32).tolist())
            if result.payloads is not None:
                want = [p for p, i in zip(result.payloads[q], result.ids[q])
                        if i >= 0]
                self.assertEqual(line["payloads"], want)
            if hybrid:
                for name in ("text_ranks", "vector_ranks"):
                    column = getattr(result, name)
                    want = ([0] * int(keep.sum()) if column is None
                            else column[q][keep].tolist())
                    self.assertEqual(line[name], want, name)

    def test_vector_search_with_payloads_equals_the_python_client(self):
        result = self.client.search(self.queries, K, nprobe=4, payloads=True)
        for via in self.VIAS:
            lines = self.java(via, "--queries",
                              os.path.join(self.tmp.name, "q.f32"), "--dim",
                              str(DIM), "--k", str(K), "--payloads",
                              "--nprobe", "4")
            self.assert_same(lines, result)
            self.assertGreaterEqual(min(lines[0]["ids"]), 2**40)  # int64
            self.assertIn("text", lines[0]["payloads"][0])

    def test_hybrid_and_text_search_equal_the_python_client(self):
        common = ["--texts", os.path.join(self.tmp.name, "t.txt"), "--k",
                  str(K)]
        for via in self.VIAS:
            for fusion in ("rrf", "weighted"):
                lines = self.java(via, "--queries",
                                  os.path.join(self.tmp.name, "q.f32"),
                                  "--dim", str(DIM), "--fusion", fusion,
                                  *common)
                result = self.client.search(self.queries, K, text=TEXTS,
                                            fusion=fusion)
                self.assertEqual(result.fusion, fusion)
                self.assert_same(lines, result, hybrid=True)
            lines = self.java(via, *common)
            result = self.client.search(None, K, text=TEXTS)
            self.assert_same(lines, result, hybrid=True)
            self.assertTrue(all(line["text_ranks"][0] == 1 for line in lines))

    def test_a_refused_request_names_the_status_and_the_limit(self):
        for via in self.VIAS:
            run = self.java(via, "--queries",
                            os.path.join(self.tmp.name, "q.f32"), "--dim",
                            str(DIM), "--k", "100000", check=False)
            self.assertEqual(run.returncode, 2, via)
            self.assertIn("INVALID_ARGUMENT", run.stderr, via)
            self.assertIn("max_k", run.stderr, via)


if __name__ == "__main__":
    client_testing.main(__doc__)
