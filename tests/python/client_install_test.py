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
    stubs come from the grpcio-tools pyproject.toml pins; mypy and the
    type stubs of grpcio and protobuf are installed beside it
    (client_types_test.py runs mypy --strict there);
  lowest: the wheel the pypi route builds, installed with the lowest
    version of each requirement it declares (grpcio, protobuf, numpy),
    which must be what pip then installs; skipped as pypi is;
  all: importing the client warns about nothing and pulls in no
    LangChain; the LangChain adapter without langchain-core names the
    extra to install; a blocking and an asyncio client search knnd and
    get a SearchResult, and a refused call is knnd_client's error.

  client_install_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl \
      --source-dir . --venvs BUILD/tests/python_client_venvs
"""
import asyncio
import glob
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

import numpy as np

import client_testing
from client_testing import ROUTE_ENV, VENV_ENV
from knnd_harness import (Daemon, build_test_index, copy_client_sources,
                          unittest_main)

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

    def pypi_venv(self, route):
        """A venv of its own for `route`, and its pip; skips the test, with
        the reason in ROUTE.skipped, when PyPI cannot be reached."""
        venv = self.venv(route)
        pip = [os.path.join(venv, "bin", "python"), "-m", "pip"]
        probe = run(pip + ["index", "versions", "grpcio", "--timeout", "15",
                           "--retries", "1"], capture_output=True, text=True)
        if probe.returncode != 0:
            reason = ("PyPI is unreachable (`pip index versions grpcio` "
                      f"failed: {probe.stderr.strip()[-300:]})")
            shutil.rmtree(venv)
            with open(venv + ".skipped", "w") as f:
                f.write(reason + "\n")
            self.skipTest(reason)
        return pip

    def test_pypi_route(self):
        """`pip install clients/python`: isolated build, PyPI's newest."""
        client = copy_client_sources(ARGS.source_dir,
                                     os.path.join(self.venvs, "src-pypi"))
        pip = self.pypi_venv("pypi")
        # With the extra in the same install: one build. That the base
        # package works without langchain-core is PackageTest's.
        run(pip + ["install", "--quiet", client + "[langchain]",
                   *client_testing.TYPE_CHECK_REQUIREMENTS], check=True)
        self.run_suite("pypi")

    def test_lowest_declared_versions_route(self):
        """The wheel with the lowest grpcio, protobuf and numpy it says
        it works with: an application pinned that low can install it."""
        client = copy_client_sources(ARGS.source_dir,
                                     os.path.join(self.venvs, "src-lowest"))
        pip = self.pypi_venv("lowest")
        wheels = os.path.join(self.venvs, "wheels-lowest")
        run(pip + ["wheel", "--quiet", "--no-deps", "-w", wheels, client],
            check=True)
        wheel, = glob.glob(os.path.join(wheels, "knnd_client-*.whl"))
        lowest = lowest_versions(wheel)
        self.assertEqual(sorted(lowest), ["grpcio", "numpy", "protobuf"])
        constraints = os.path.join(wheels, "lowest.txt")
        with open(constraints, "w") as f:
            f.writelines(f"{name}=={version}\n"
                         for name, version in sorted(lowest.items()))
        run(pip + ["install", "--quiet", "--only-binary", ":all:",
                   "--constraint", constraints, wheel], check=True)
        self.run_suite("lowest")


def lowest_versions(wheel):
    """{requirement: its lowest version} of each `name>=X` the wheel
    declares (its METADATA's Requires-Dist, extras left out)."""
    with zipfile.ZipFile(wheel) as z:
        name, = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = z.read(name).decode()
    lowest = {}
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            found = re.search(r"^Requires-Dist: ([\w.-]+).*>=([\w.]+)", line)
            lowest[found.group(1).lower()] = found.group(2)
    return lowest


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
        route = os.environ[ROUTE_ENV]
        if route == "system":
            self.assertIsNone(gencode, "the system route used grpcio-tools")
            self.assertIn("protobuf<8,>=4.21.12",
                          [re.sub(r"[ ()]", "", r) for r in requires])
        else:
            self.assertIsNotNone(gencode, f"the {route} route did not use "
                                 "grpcio-tools")
            # The pinned grpcio-tools (pyproject.toml) keeps the lowest
            # runtimes low: stubs that check no version.
            self.assertIn("protobuf<8,>=4.25.1",
                          [re.sub(r"[ ()]", "", r) for r in requires])
        if route == "lowest":
            for name, version in (("grpcio", grpc.__version__),
                                  ("protobuf", google.protobuf.__version__),
                                  ("numpy", np.__version__)):
                declared = [r for r in requires if r.startswith(name)][0]
                lowest = re.search(r">=([\w.]+)", declared).group(1)
                self.assertEqual(release(version), release(lowest),
                                 f"{name} {version}, not the lowest declared")
        # Importing the client warns about nothing (a gencode/runtime
        # mismatch would) and pulls in no LangChain.
        check = subprocess.run([sys.executable, "-W", "error", "-c", """if True:
            import sys, knnd_client
            assert "langchain_core" not in sys.modules
            """], capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stderr)

    def test_both_clients_search_knnd(self):
        """The typed results and errors, on this route's grpcio and
        protobuf (for the lowest route: the oldest the wheel accepts)."""
        import knnd_client
        from knnd_client import AsyncKnnClient, KnnClient, SearchResult
        data = os.environ[client_testing.DATA_ENV]
        xb = np.load(os.path.join(data, "xb.npy"))
        with tempfile.TemporaryDirectory() as tmp:
            config = os.path.join(tmp, "knnd.textproto")
            with open(config, "w") as f:
                f.write("shutdown_delay_ms: 0\n")
            daemon = Daemon(ARGS.knnd, ["--config", config, "--index",
                                        os.path.join(data, "client.index")],
                            log_path=os.path.join(tmp, "knnd.log"),
                            knnctl=ARGS.knnctl)
            try:
                self.assertTrue(daemon.wait_serving(60), daemon.read_log())
                with KnnClient(daemon.address, timeout_s=10) as client:
                    result = client.search(xb[:3], 5, 8)
                    with self.assertRaises(knnd_client.InvalidArgument) as err:
                        client.search(xb[:1], 100000)
                self.assertIn("k=100000", str(err.exception))

                async def search():
                    async with AsyncKnnClient(daemon.address,
                                              timeout_s=10) as aclient:
                        return await aclient.search(xb[:3], 5, 8)
                aresult = asyncio.run(search())
            finally:
                daemon.stop()
        for r in (result, aresult):
            self.assertIsInstance(r, SearchResult)
            self.assertEqual(r.ids[:, 0].tolist(), [0, 1, 2])
            self.assertEqual((r.ids.dtype, r.distances.dtype),
                             (np.int64, np.float32))
            self.assertEqual((r.nprobe, r.metric), (8, 1))
            self.assertEqual(r.hits(0)[0].id, 0)
        np.testing.assert_array_equal(result.ids, aresult.ids)

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



def release(version):
    """A version's release numbers, zeros at the end dropped (1.24 is
    1.24.0)."""
    numbers = [int(n) for n in re.findall(r"\d+", version)[:3]]
    while numbers and numbers[-1] == 0:
        numbers.pop()
    return numbers


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
