#!/usr/bin/python3
"""knnd-client (clients/python) installed the two ways its README gives
(client_testing.py: the system and pypi routes), into venvs under --venvs
that the other client_*_test.py scripts then use (ctest's fixture
python_client_venvs), with the test index and its vectors (data/);
outside a venv InstallRoutesTest makes each route's venv and runs
PackageTest inside it:
  system: `pip check` must not complain about knnd-client's declared
    requirements; the stubs come from the system protoc;
  pypi: skipped, with the reason, only when PyPI cannot be reached; the
    stubs come from grpcio-tools;
  both: importing the client warns about nothing and pulls in no
    LangChain; the LangChain adapter without langchain-core names the
    extra to install.

  client_install_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl \
      --source-dir . --venvs BUILD/tests/python_client_venvs
"""
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import time
import unittest

import numpy as np

import client_testing
from client_testing import ROUTE_ENV, VENV_ENV
from knnd_harness import build_test_index, copy_client_sources, unittest_main

ARGS = None


def build_index(data_dir):
    """The suite's index, built once for both routes with python3-faiss
    (the pypi venv has no faiss), and its vectors."""
    xb = build_test_index(os.path.join(data_dir, "client.index"), seed=11)
    np.save(os.path.join(data_dir, "xb.npy"), xb)


def run(command, **kwargs):
    """Runs `command`, printing it and how long it took."""
    start = time.monotonic()
    result = subprocess.run(command, **kwargs)
    print(f"[{time.monotonic() - start:5.1f} s] {' '.join(command)}",
          flush=True)
    return result



class InstallRoutesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.venvs = ARGS.venvs
        shutil.rmtree(cls.venvs, ignore_errors=True)
        os.makedirs(os.path.join(cls.venvs, "data"))
        start = time.monotonic()
        build_index(os.path.join(cls.venvs, "data"))
        print(f"[{time.monotonic() - start:5.1f} s] test index built", flush=True)

    def venv(self, name, *venv_args):
        venv = os.path.join(self.venvs, name)
        subprocess.run([sys.executable, "-m", "venv", *venv_args, venv],
                       check=True)
        return venv

    def run_suite(self, route):
        """Runs PackageTest inside `route`'s venv (its output goes to
        ours); fails this test unless it passed there."""
        python = os.path.join(self.venvs, route, "bin", "python")
        print(f"==== PackageTest, {route} route ({python})", flush=True)
        code = subprocess.call([python, "-W", "ignore", *sys.argv],
                               env=client_testing.route_env(self.venvs, route))
        self.assertEqual(code, 0, f"PackageTest failed in the {route} route")

    def test_system_packages_route(self):
        """README's route for a machine without PyPI: Debian's packages."""
        client = copy_client_sources(ARGS.source_dir,
                                     os.path.join(self.venvs, "src-system"))
        venv = self.venv("system", "--system-site-packages")
        pip = [os.path.join(venv, "bin", "python"), "-m", "pip"]
        run(pip + ["install", "--quiet", "--no-index", "--no-build-isolation",
                   "--no-deps", client], check=True)
        # The requirements the wheel declares hold for Debian's versions.
        check = run(pip + ["check"], capture_output=True, text=True)
        complaints = [line for line in check.stdout.splitlines()
                      if line.lower().startswith("knnd-client")]
        self.assertEqual(complaints, [], check.stdout)
        self.run_suite("system")

    def test_pypi_route(self):
        """`pip install clients/python`: isolated build, PyPI's newest."""
        client = copy_client_sources(ARGS.source_dir,
                                     os.path.join(self.venvs, "src-pypi"))
        venv = self.venv("pypi")
        python = os.path.join(venv, "bin", "python")
        pip = [python, "-m", "pip"]
        probe = run(pip + ["index", "versions", "grpcio", "--timeout", "15",
                           "--retries", "1"], capture_output=True, text=True)
        if probe.returncode != 0:
            reason = ("PyPI is unreachable (`pip index versions grpcio` "
                      f"failed: {probe.stderr.strip()[-300:]})")
            shutil.rmtree(venv)
            with open(venv + ".skipped", "w") as f:
                f.write(reason + "\n")
            self.skipTest(reason)
        # With the extra in the same install: one build. That the base
        # package works without langchain-core is PackageTest's.
        run(pip + ["install", "--quiet", client + "[langchain]"], check=True)
        self.run_suite("pypi")


class PackageTest(unittest.TestCase):
    """The installed package: its own stubs, its declared requirements."""

    def test_versions_and_generated_stubs(self):
        import grpc
        import google.protobuf
        from knnd_client._generated.knnd.v1 import knn_service_pb2
        with open(knn_service_pb2.__file__) as f:
            gencode = re.search(r"^# Protobuf Python Version: (.*)$", f.read(), re.M)
        requires = importlib.metadata.requires("knnd-client")
        print(f"\n  route {os.environ[ROUTE_ENV]}: grpcio {grpc.__version__}, "
              f"protobuf {google.protobuf.__version__}, numpy {np.__version__}, "
              f"gencode {gencode.group(1) if gencode else 'protoc 3.21 (unversioned)'}; "
              f"knnd-client requires {requires}", flush=True)
        if os.environ[ROUTE_ENV] == "system":
            self.assertIsNone(gencode, "the system route used grpcio-tools")
            self.assertIn("protobuf<8,>=4.21.12",
                          [re.sub(r"[ ()]", "", r) for r in requires])
        else:
            self.assertIsNotNone(gencode, "the pypi route did not use grpcio-tools")
        # Importing the client warns about nothing (a gencode/runtime
        # mismatch would) and pulls in no LangChain.
        check = subprocess.run([sys.executable, "-W", "error", "-c", """if True:
            import sys, knnd_client
            assert "langchain_core" not in sys.modules
            """], capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stderr)

    def test_langchain_adapter_without_langchain_names_the_extra(self):
        check = subprocess.run([sys.executable, "-c", """if True:
            import sys
            sys.modules["langchain_core"] = None   # as if not installed
            import knnd_client
            try:
                import knnd_client.langchain
            except ImportError as e:
                print(e)
            """], capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stderr)
        self.assertIn("pip install './clients/python[langchain]'", check.stdout)
        self.assertIn("langchain-core>=0.3,<2", check.stdout)



def load_tests(loader, tests, pattern):
    """Inside a route's venv, PackageTest (InstallRoutesTest runs outside)."""
    return loader.loadTestsFromTestCase(PackageTest)


def main_outside_venv(parsed):
    """Outside a venv this script runs InstallRoutesTest, which reruns it
    (with the same arguments) inside each route's venv for PackageTest."""
    if os.environ.get(VENV_ENV) is None:
        unittest.main(argv=[sys.argv[0]], defaultTest="InstallRoutesTest",
                      verbosity=2)


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True, setup=main_outside_venv,
                  add_arguments=lambda parser: parser.add_argument(
                      "--venvs", required=True))
