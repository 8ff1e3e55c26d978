#!/usr/bin/python3
"""knnd-client (clients/python) installed the two ways its README gives,
then tested from each install as an API service uses it.

Install routes (InstallRoutesTest, run by /usr/bin/python3; each installs
into a new venv and runs the suite below there, in a child process):
  system: a venv over Debian's python3-grpcio/protobuf/numpy, `pip install
    --no-index --no-build-isolation --no-deps` (nothing can be downloaded;
    the stubs come from the system protoc), then `pip check` must not
    complain about knnd-client's declared requirements;
  pypi: a venv of its own, `pip install 'clients/python[langchain]'` with
    build isolation (setuptools and grpcio-tools from PyPI generate the
    stubs) and every dependency from PyPI's newest releases. Skipped, with
    the reason, only when PyPI cannot be reached.
The suite, in each venv:
  - against a small fake server that counts attempts, one contract run
    for KnnClient and for AsyncKnnClient: bad inputs raise before any RPC;
    pushback and backoff timings; no retry past the deadline; bearer-token
    metadata; plus AsyncKnnClient's bound on calls in flight and the fork
    guard of both clients;
  - against a live knnd started here: results equal those of the raw
    generated stub (protoc 3.21 gencode, so in the pypi route this is old
    gencode on the newest runtime) and of knnctl (the C++ client); async
    results equal sync ones; the event loop keeps ticking during async
    searches; cancelling the awaiting task makes knnd count the call
    CANCELLED; deadlines; RESOURCE_EXHAUSTED from a full gate is retried
    after the server's pushback until every request succeeds, sync and
    async; round_robin over a headless Service (a DNS name with two
    addresses, served by a fake DNS server, each address a knnd); TLS and
    bearer tokens; max_connection_age_ms makes the server close
    connections (GOAWAY);
  - pypi route only: the LangChain vector store and retriever over a live
    knnd, and over two shards through the sharded clients, with a
    deterministic fake embedding.

  client_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl --source-dir . [unittest args]
(unittest args, e.g. LiveKnndTest.test_tls_and_bearer_tokens, select tests of
the suite; they run in both routes.)
"""
import asyncio
import concurrent.futures
import importlib.metadata
import json
import logging
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

from knnd_harness import (Daemon, LoopThread, build_test_index,
                          copy_client_sources, free_port, generate_stubs,
                          unittest_main)

ARGS = None
VENV_ENV = "KNND_CLIENT_TEST_VENV"    # set in the suite's run: its venv
ROUTE_ENV = "KNND_CLIENT_TEST_ROUTE"  # "system" or "pypi"
DATA_ENV = "KNND_CLIENT_TEST_DATA"    # the index and vectors built once
SOURCE_ENV = "KNND_CLIENT_TEST_SOURCE"  # the copy of the tree installed from
DIM = 48
SEARCH_OK = ('grpc_server_handled_total{grpc_code="OK",grpc_method="Search",'
             'grpc_service="knnd.v1.KnnService",grpc_type="unary"}')
SEARCH_CANCELLED = SEARCH_OK.replace('"OK"', '"CANCELLED"')


# --------------------------------------------------------------------------
# Install routes (outside any venv)

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
        cls.tmp = tempfile.TemporaryDirectory(prefix="knnd-client-test-")
        cls.data = os.path.join(cls.tmp.name, "data")
        os.makedirs(cls.data)
        start = time.monotonic()
        build_index(cls.data)
        print(f"[{time.monotonic() - start:5.1f} s] test index built", flush=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def venv(self, name, *venv_args):
        venv = os.path.join(self.tmp.name, name)
        subprocess.run([sys.executable, "-m", "venv", *venv_args, venv],
                       check=True)
        return venv

    def run_suite(self, venv, route, source_copy):
        """Runs this script's suite inside `venv` (its output goes to ours);
        fails this test unless every test there passed. `source_copy` is
        the tree the client was installed from: the suite's raw stubs come
        from the same proto/ even if the working tree changes meanwhile."""
        python = os.path.join(venv, "bin", "python")
        env = dict(os.environ, **{VENV_ENV: venv, ROUTE_ENV: route,
                                  DATA_ENV: self.data, SOURCE_ENV: source_copy})
        print(f"==== the suite, {route} route ({python})", flush=True)
        code = subprocess.call([python, "-W", "ignore", *sys.argv], env=env)
        self.assertEqual(code, 0, f"the suite failed in the {route} route")

    def test_system_packages_route(self):
        """README's route for a machine without PyPI: Debian's packages."""
        source = os.path.join(self.tmp.name, "src-system")
        client = copy_client_sources(ARGS.source_dir, source)
        venv = self.venv("venv-system", "--system-site-packages")
        pip = [os.path.join(venv, "bin", "python"), "-m", "pip"]
        run(pip + ["install", "--quiet", "--no-index", "--no-build-isolation",
                   "--no-deps", client], check=True)
        # The requirements the wheel declares hold for Debian's versions.
        check = run(pip + ["check"], capture_output=True, text=True)
        complaints = [line for line in check.stdout.splitlines()
                      if line.lower().startswith("knnd-client")]
        self.assertEqual(complaints, [], check.stdout)
        self.run_suite(venv, "system", source)

    def test_pypi_route(self):
        """`pip install clients/python`: isolated build, PyPI's newest."""
        source = os.path.join(self.tmp.name, "src-pypi")
        client = copy_client_sources(ARGS.source_dir, source)
        venv = self.venv("venv-pypi")
        python = os.path.join(venv, "bin", "python")
        pip = [python, "-m", "pip"]
        probe = run(pip + ["index", "versions", "grpcio", "--timeout", "15",
                           "--retries", "1"], capture_output=True, text=True)
        if probe.returncode != 0:
            self.skipTest("PyPI is unreachable (`pip index versions grpcio` "
                          f"failed: {probe.stderr.strip()[-300:]})")
        # With the extra in the same install: one build. That the base
        # package works without langchain-core is PackageTest's.
        run(pip + ["install", "--quiet", client + "[langchain]"], check=True)
        self.run_suite(venv, "pypi", source)


def main_outside_venv(args):
    """Outside a venv this script runs InstallRoutesTest, which reruns it
    (with the same arguments) inside each route's venv."""
    if os.environ.get(VENV_ENV) is None:
        unittest.main(argv=[sys.argv[0]], defaultTest="InstallRoutesTest",
                      verbosity=2)


# --------------------------------------------------------------------------
# Fake server

class FakeKnnd:
    """An in-process KnnService whose Search answers with `script`, one entry
    per call (the last one repeats): ("ok",), ("fail", code, pushback or
    None[, details]) or ("sleep", seconds). Records the time and metadata of each call
    and the most calls it had in progress at once."""

    def __init__(self, script):
        import grpc
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        self.script = script
        self.calls = []
        self.metadata = []
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(16))
        handler = grpc.unary_unary_rpc_method_handler(
            self._search, request_deserializer=pb.SearchRequest.FromString,
            response_serializer=pb.SearchResponse.SerializeToString)
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "knnd.v1.KnnService", {"Search": handler})])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()
        self.pb = pb

    def _search(self, request, context):
        with self.lock:
            self.calls.append(time.monotonic())
            self.metadata.append(dict(context.invocation_metadata()))
            step = self.script[min(len(self.calls), len(self.script)) - 1]
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if step[0] == "fail":
                if step[2] is not None:
                    context.set_trailing_metadata(
                        (("grpc-retry-pushback-ms", str(step[2])),))
                context.abort(step[1], step[3] if len(step) > 3 else "scripted failure")
            if step[0] == "sleep":
                time.sleep(step[1])
            n = len(request.vectors_f32le) // (4 * request.dim)
            return self.pb.SearchResponse(
                num_queries=n, k=request.k, ids=range(n * request.k),
                distances=[0.5] * (n * request.k))
        finally:
            with self.lock:
                self.active -= 1

    def stop(self):
        self.server.stop(0)


def bad_input_cases():
    """(args of search, error type, message regex): each must raise before
    any RPC, from either client."""
    good = np.ones((2, 4), np.float32)
    return [
        (([[1.0, 2.0]], 3), {}, TypeError, "numpy.ndarray"),
        ((good.astype(np.float64), 3), {}, TypeError, "dtype float32, got float64"),
        ((good.astype(np.int32), 3), {}, TypeError, "dtype float32, got int32"),
        ((good.astype(np.float16), 3), {}, TypeError, "dtype float32, got float16"),
        ((good[0], 3), {}, ValueError, r"reshape\(1, -1\)"),
        ((good.reshape(1, 2, 4), 3), {}, ValueError, "must be 2-D"),
        ((np.ones((0, 4), np.float32), 3), {}, ValueError, "no values"),
        ((np.ones((2, 0), np.float32), 3), {}, ValueError, "no values"),
        ((np.array([[1, np.nan]], np.float32), 3), {}, ValueError,
         r"queries\[0, 1\] is nan"),
        ((np.array([[1, 2], [np.inf, 0]], np.float32), 3), {}, ValueError,
         r"queries\[1, 0\] is inf"),
        ((good, 0), {}, ValueError, "k=0 must be >= 1"),
        ((good, 2.5), {}, TypeError, "k must be an int, got float"),
        ((good, True), {}, TypeError, "k must be an int, got bool"),
        ((good, 3, 0), {}, ValueError, "nprobe=0 must be >= 1"),
        ((good, 3, "8"), {}, TypeError, "nprobe must be an int, got str"),
        ((good, 3), {"allowed_ids": [1.5, 2.0]}, TypeError,
         "allowed_ids must be a 1-D"),
        ((good, 3), {"timeout_s": 0}, ValueError, "timeout_s=0 must be > 0"),
        ((good, 3), {"timeout_s": float("inf")}, ValueError,
         "timeout_s=inf must be finite"),
        ((good, 3), {"refine_factor": -1}, ValueError,
         "refine_factor=-1 must be >= 0"),
    ]


def fork_and_call(call):
    """Forks; the child runs `call()` and reports what it raised. Returns
    that report (the exception's type and message)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test runner
        try:
            os.close(read)
            try:
                call()
                report = "no exception"
            except BaseException as e:  # noqa: B902 - reported to the parent
                report = f"{type(e).__name__}: {e}"
            os.write(write, report.encode()[:60000])
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        report = f.read().decode()
    os.waitpid(pid, 0)
    return report


class ClientContract:
    """What both clients promise, against the fake server. A subclass
    says how to make a client and call its search (connect)."""

    def connect(self, address, **client_args):
        """A search(queries, k, ...) callable of a new client of
        `address`, closed at cleanup."""
        raise NotImplementedError

    def serve(self, *script, **client_args):
        from knnd_client import RetryPolicy
        fake = FakeKnnd(list(script))
        self.addCleanup(fake.stop)
        search = self.connect(fake.address, **dict(
            dict(timeout_s=5, retry=RetryPolicy(max_attempts=5)), **client_args))
        return fake, search

    def test_bad_inputs_raise_before_any_rpc(self):
        fake, search = self.serve(("ok",))
        for args, kwargs, error, message in bad_input_cases():
            with self.subTest(message=message):
                with self.assertRaisesRegex(error, message):
                    search(*args, **kwargs)
        self.assertEqual(fake.calls, [], "an RPC was made for a bad input")
        ids, distances = search(np.ones((2, 4), np.float32), 3)
        self.assertEqual(len(fake.calls), 1)
        self.assertEqual((ids.dtype, ids.shape), (np.int64, (2, 3)))
        self.assertEqual((distances.dtype, distances.shape), (np.float32, (2, 3)))
        np.testing.assert_array_equal(ids, np.arange(6).reshape(2, 3))

    def test_resource_exhausted_is_retried_after_the_pushback(self):
        import grpc
        fake, search = self.serve(
            ("fail", grpc.StatusCode.RESOURCE_EXHAUSTED, 300),
            ("fail", grpc.StatusCode.RESOURCE_EXHAUSTED, 300), ("ok",))
        ids, _ = search(np.ones((1, 4), np.float32), 2)
        self.assertEqual(ids.tolist(), [[0, 1]])
        self.assertEqual(len(fake.calls), 3)
        gaps = np.diff(fake.calls)
        # Never sooner than the server asked; jitter adds at most 20%.
        self.assertTrue(((gaps >= 0.3) & (gaps < 0.3 * 1.2 + 0.15)).all(), gaps)

    def test_no_retry_when_the_pushback_ends_past_the_deadline(self):
        import grpc
        fake, search = self.serve(
            ("fail", grpc.StatusCode.RESOURCE_EXHAUSTED, 5000), ("ok",))
        start = time.monotonic()
        with self.assertRaises(grpc.RpcError) as err:
            search(np.ones((1, 4), np.float32), 2, timeout_s=1.0)
        self.assertEqual(err.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertLess(time.monotonic() - start, 0.5)
        self.assertEqual(len(fake.calls), 1)

    def test_only_capacity_and_availability_errors_are_retried(self):
        import grpc
        for step in (("fail", grpc.StatusCode.RESOURCE_EXHAUSTED, None),
                     ("fail", grpc.StatusCode.RESOURCE_EXHAUSTED, -1),
                     ("fail", grpc.StatusCode.INVALID_ARGUMENT, 10),
                     ("fail", grpc.StatusCode.INTERNAL, None)):
            with self.subTest(step=step):
                fake, search = self.serve(step, ("ok",))
                with self.assertRaises(grpc.RpcError) as err:
                    search(np.ones((1, 4), np.float32), 2)
                self.assertEqual(err.exception.code(), step[1])
                self.assertEqual(len(fake.calls), 1)

    def test_a_stream_reset_under_the_memory_quota_is_retried_with_backoff(self):
        # What gRPC reports for a stream its transport reset under the
        # server's memory quota: RESOURCE_EXHAUSTED, no pushback.
        import grpc
        from knnd_client._common import QUOTA_RESET_DETAILS
        reset = ("fail", grpc.StatusCode.RESOURCE_EXHAUSTED, None,
                 f"Stream removed (Received {QUOTA_RESET_DETAILS})")
        fake, search = self.serve(reset, reset, ("ok",))
        ids, _ = search(np.ones((1, 4), np.float32), 2)
        self.assertEqual(ids.tolist(), [[0, 1]])
        self.assertEqual(len(fake.calls), 3)
        self.assertTrue((np.diff(fake.calls) < 0.1 + 0.1).all(), np.diff(fake.calls))

    def test_unavailable_is_retried_with_backoff(self):
        import grpc
        fake, search = self.serve(
            ("fail", grpc.StatusCode.UNAVAILABLE, None),
            ("fail", grpc.StatusCode.UNAVAILABLE, None), ("ok",))
        search(np.ones((1, 4), np.float32), 2)
        self.assertEqual(len(fake.calls), 3)
        # U(0, 50 ms), then U(0, 100 ms) (plus scheduling slack).
        self.assertTrue((np.diff(fake.calls) < 0.1 + 0.1).all(), np.diff(fake.calls))

    def test_attempts_stop_at_max_attempts(self):
        import grpc
        fake, search = self.serve(("fail", grpc.StatusCode.UNAVAILABLE, 1))
        with self.assertRaises(grpc.RpcError):
            search(np.ones((1, 4), np.float32), 2)
        self.assertEqual(len(fake.calls), 5)

    def test_deadline_covers_a_slow_server(self):
        import grpc
        fake, search = self.serve(("sleep", 3.0))
        start = time.monotonic()
        with self.assertRaises(grpc.RpcError) as err:
            search(np.ones((1, 4), np.float32), 2, timeout_s=0.3)
        elapsed = time.monotonic() - start
        self.assertEqual(err.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertGreaterEqual(elapsed, 0.29)
        self.assertLess(elapsed, 0.8)
        self.assertEqual(len(fake.calls), 1)

    def test_bearer_token_is_sent_on_every_call(self):
        import grpc
        token = "a-search-token-0123456789"
        fake, search = self.serve(
            ("fail", grpc.StatusCode.UNAVAILABLE, None), ("ok",),
            bearer_token=token)
        search(np.ones((1, 4), np.float32), 2)
        self.assertEqual([m.get("authorization") for m in fake.metadata],
                         [f"Bearer {token}"] * 2)


class FakeServerTest(ClientContract, unittest.TestCase):
    """KnnClient against the fake server."""

    def connect(self, address, **client_args):
        from knnd_client import KnnClient
        client = KnnClient(address, **client_args)
        self.addCleanup(client.close)
        self.client = client
        return client.search

    def test_bad_client_arguments_raise(self):
        from knnd_client import AsyncKnnClient, KnnClient
        with self.assertRaisesRegex(ValueError, "timeout_s=-1 must be > 0"):
            KnnClient("127.0.0.1:1", timeout_s=-1)
        token = "tok en-that-is-long-enough"
        with self.assertRaisesRegex(ValueError, "whitespace") as err:
            KnnClient("127.0.0.1:1", bearer_token=token)
        self.assertNotIn(token, str(err.exception), "the token was echoed")
        with self.assertRaisesRegex(ValueError, "knnd accepts 16 to 4096"):
            KnnClient("127.0.0.1:1", bearer_token="short")
        with self.assertRaisesRegex(RuntimeError, "running event loop"):
            AsyncKnnClient("127.0.0.1:1")

        async def zero_slots():
            AsyncKnnClient("127.0.0.1:1", max_concurrent_calls=0)
        with self.assertRaisesRegex(ValueError, "max_concurrent_calls=0 must be >= 1"):
            asyncio.run(zero_slots())

    def test_a_client_created_before_fork_refuses_in_the_child(self):
        from knnd_client import AsyncKnnClient
        fake, _ = self.serve(("ok",))
        client = self.client
        q = np.ones((1, 4), np.float32)
        client.search(q, 2)  # connected: gRPC's threads run in the parent

        def in_child():
            client.close()  # drops the inherited channel, must not hang
            client.search(q, 2)
        report = fork_and_call(in_child)
        self.assertRegex(report, r"^RuntimeError: this KnnClient was created "
                         rf"in process {os.getpid()} and is used in process \d+")
        self.assertIn("post_fork", report)

        async def async_case():
            aclient = AsyncKnnClient(fake.address)
            await aclient.search(q, 2)
            # In the child, the first step of the coroutine must raise
            # (before it awaits anything on the inherited loop).
            report = fork_and_call(lambda: aclient.search(q, 2).send(None))
            await aclient.close()
            return report
        report = asyncio.run(async_case())
        self.assertRegex(report, r"^RuntimeError: this AsyncKnnClient was created")
        self.assertEqual(len(fake.calls), 2, "the children made RPCs")
        self.assertEqual(client.search(q, 2)[0].tolist(), [[0, 1]])


class AsyncFakeServerTest(ClientContract, unittest.TestCase):
    """AsyncKnnClient against the fake server: the same contract, plus its
    bound on calls in flight."""

    def setUp(self):
        self.loop = LoopThread()
        self.addCleanup(self.loop.stop)  # runs after the clients' close

    def connect(self, address, **client_args):
        from knnd_client import AsyncKnnClient

        async def make():
            return AsyncKnnClient(address, **client_args)
        client = self.loop.run(make())
        self.addCleanup(lambda: self.loop.run(client.close()))
        self.client = client
        return lambda *args, **kwargs: self.loop.run(client.search(*args, **kwargs))

    def test_calls_in_flight_are_bounded(self):
        fake, _ = self.serve(("sleep", 0.2), max_concurrent_calls=3)

        async def nine():
            start = time.monotonic()
            results = await asyncio.gather(*(
                self.client.search(np.ones((1, 4), np.float32), 2) for _ in range(9)))
            return len(results), time.monotonic() - start
        count, elapsed = self.loop.run(nine())
        self.assertEqual(count, 9)
        self.assertEqual(fake.max_active, 3)
        self.assertGreaterEqual(elapsed, 0.6 - 0.01)  # three rounds of 0.2 s

    def test_waiting_for_a_slot_counts_against_the_deadline(self):
        import grpc
        fake, _ = self.serve(("sleep", 1.0), max_concurrent_calls=1)
        client = self.client
        q = np.ones((1, 4), np.float32)

        async def main():
            first = asyncio.ensure_future(client.search(q, 2))
            await asyncio.sleep(0.1)
            start = time.monotonic()
            with self.assertRaises(grpc.RpcError) as err:
                await client.search(q, 2, timeout_s=0.2)
            self.assertEqual(err.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
            self.assertIn("max_concurrent_calls=1", err.exception.details())
            self.assertLess(time.monotonic() - start, 0.5)
            # A caller cancelled while it waits for a slot gives nothing
            # away: the slot goes to the next caller once the first ends.
            waiting = asyncio.ensure_future(client.search(q, 2))
            await asyncio.sleep(0.05)
            waiting.cancel()
            await first
            self.assertEqual(len(fake.calls), 1, "calls that waited were sent")
            fake.script[:] = [("ok",)]
            ids, _ = await client.search(q, 2, timeout_s=1)
            self.assertEqual(ids.tolist(), [[0, 1]])
            self.assertTrue(waiting.cancelled())
        self.loop.run(main())


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
        self.assertIn("pip install 'knnd-client[langchain]'", check.stdout)


# --------------------------------------------------------------------------
# Live knnd

class FakeDns:
    """A DNS server on 127.0.0.1 (UDP) that answers A queries for `name`
    with `addresses`: the records of a Kubernetes headless Service, one per
    ready pod. Other names are NXDOMAIN; other types of `name`, none."""

    def __init__(self, name, addresses):
        self.name = name.lower()
        self.addresses = addresses
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                query, peer = self.sock.recvfrom(512)
            except OSError:
                return  # closed
            labels, i = [], 12
            while query[i]:
                labels.append(query[i + 1:i + 1 + query[i]].decode())
                i += 1 + query[i]
            qtype = struct.unpack(">H", query[i + 1:i + 3])[0]
            question = query[12:i + 5]
            known = ".".join(labels).lower() == self.name
            answers = [b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 5, 4)
                       + socket.inet_aton(a)
                       for a in (self.addresses if known and qtype == 1 else ())]
            header = struct.pack(">HHHHHH", struct.unpack(">H", query[:2])[0],
                                 0x8180 | (0 if known else 3), 1, len(answers),
                                 0, 0)
            self.sock.sendto(header + question + b"".join(answers), peer)

    def close(self):
        self.sock.close()


def make_tls_files(directory):
    """A CA and a server certificate for localhost / 127.0.0.1 signed by
    it, made with openssl; returns (ca.crt, server.crt, server.key)."""
    ca_key, ca_crt = (os.path.join(directory, n) for n in ("ca.key", "ca.crt"))
    key, csr, crt = (os.path.join(directory, n)
                     for n in ("server.key", "server.csr", "server.crt"))
    ext = os.path.join(directory, "san.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for command in (
            ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca_crt, "-days", "2",
             "-subj", "/CN=knnd-client-test CA"],
            ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=localhost"],
            ["x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key,
             "-CAcreateserial", "-out", crt, "-days", "2", "-extfile", ext]):
        subprocess.run(["openssl", *command], check=True, capture_output=True)
    return ca_crt, crt, key


class LiveKnndTest(unittest.TestCase):
    """The installed client against knnd serving an index built here."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        # The raw generated stub, as any other client would make it; it
        # registers the same knnd/v1/knn_service.proto descriptor as
        # knnd_client, so this also shows the two coexist in one process.
        generate_stubs(os.environ.get(SOURCE_ENV, ARGS.source_dir),
                       os.path.join(cls.tmp.name, "raw"))
        data = os.environ[DATA_ENV]
        cls.xb = np.load(os.path.join(data, "xb.npy"))
        cls.index_path = os.path.join(data, "client.index")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def start_daemon(self, config_text="", args=(), address=None):
        """Starts knnd with `config_text` as its config file (no shutdown
        delay unless it sets one: the clean-up's SIGTERM need not wait);
        returns the Daemon (not yet waited on)."""
        if "shutdown_delay_ms" not in config_text:
            config_text = "shutdown_delay_ms: 0\n" + config_text
        name = f"{self.id()}-{len(os.listdir(self.tmp.name))}"
        config = os.path.join(self.tmp.name, f"knnd-{name}.textproto")
        with open(config, "w") as f:
            f.write(config_text)
        daemon = Daemon(ARGS.knnd, ["--config", config, "--index", self.index_path,
                                    *args],
                        log_path=os.path.join(self.tmp.name, f"knnd-{name}.log"),
                        address=address)
        self.addCleanup(daemon.stop, 60)
        return daemon

    def start_knnd(self, config_text="", args=(), address=None):
        """Starts knnd; returns its Daemon once health says SERVING."""
        daemon = self.start_daemon(config_text, args, address)
        self.assertTrue(daemon.wait_serving(60),
                        "knnd did not become SERVING: " + daemon.read_log())
        return daemon

    def client(self, addr, **kwargs):
        from knnd_client import KnnClient
        client = KnnClient(addr, **kwargs)
        self.addCleanup(client.close)
        return client

    def test_installed_package_is_used(self):
        import knnd_client
        self.assertTrue(knnd_client.__file__.startswith(sys.prefix),
                        knnd_client.__file__)

    def test_round_trip_equals_raw_stub_and_knnctl(self):
        import grpc
        from knnd.v1 import knn_service_pb2 as raw_pb
        from knnd.v1 import knn_service_pb2_grpc as raw_grpc
        addr = self.start_knnd().address
        client = self.client(f"dns:///{addr}")
        q = self.xb[:50] + 0.1
        for nprobe in (None, 1, 8):
            ids, distances = client.search(q, 10, nprobe)
            request = raw_pb.SearchRequest(vectors_f32le=q.tobytes(), k=10)
            if nprobe is not None:
                request.nprobe = nprobe
            with grpc.insecure_channel(addr) as channel:
                r = raw_grpc.KnnServiceStub(channel).Search(request, timeout=10)
            np.testing.assert_array_equal(ids, np.array(r.ids).reshape(50, 10))
            np.testing.assert_array_equal(
                distances, np.array(r.distances, np.float32).reshape(50, 10))
        # refine_factor 0 is plain IVF-PQ; > 0 needs the raw-vectors file,
        # which this index (written by python3-faiss) has not.
        ids0, _ = client.search(q, 10, 8, refine_factor=0)
        np.testing.assert_array_equal(ids0, client.search(q, 10, 8)[0])
        with self.assertRaises(grpc.RpcError) as refused:
            client.search(q, 10, 8, refine_factor=2)
        self.assertEqual(refused.exception.code(),
                         grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("--keep_vectors", refused.exception.details())
        # knnctl, the C++ client, prints ids and distances to 4 digits.
        npy = os.path.join(self.tmp.name, "queries.npy")
        np.save(npy, q)
        out = subprocess.run(
            [ARGS.knnctl, "search", "--addr", addr, "--queries", npy, "--k", "10",
             "--nprobe", "8", "--show", "50", "--batch", "50"],
            check=True, capture_output=True, text=True).stdout
        rows = re.findall(r"^query (\d+):(.*)$", out, re.M)
        self.assertEqual(len(rows), 50, out)
        pairs = [re.findall(r"(-?\d+)\(([^)]+)\)", row) for _, row in rows]
        np.testing.assert_array_equal(
            ids, np.array([[int(i) for i, _ in p] for p in pairs]))
        np.testing.assert_allclose(
            distances, np.array([[float(d) for _, d in p] for p in pairs]),
            rtol=1e-3)
        # Byte order and memory layout do not change the answer.
        for variant in (q.astype(">f4"), np.asfortranarray(q),
                        np.repeat(q, 2, axis=0)[::2]):
            np.testing.assert_array_equal(client.search(variant, 10, 8)[0], ids)
        # The allow-list reaches the server.
        ids, _ = client.search(q[:4], 10, 64, allowed_ids=np.array([3, 30, 300]))
        self.assertEqual(sorted(ids[0, :3].tolist()), [3, 30, 300])
        self.assertEqual(ids[:, 3:].tolist(), [[-1] * 7] * 4)
        self.assertEqual(client.info().dim, 48)

    def test_async_results_equal_sync(self):
        from knnd_client import AsyncKnnClient
        addr = self.start_knnd().address
        sync = self.client(f"dns:///{addr}")
        q = self.xb[:50] + 0.1
        calls = [((q, 10, nprobe), {}) for nprobe in (None, 1, 8)] + [
            ((q, 10, 8), {"refine_factor": 0}),
            ((q.astype(">f4"), 10, 8), {}),
            ((np.asfortranarray(q), 10, 8), {}),
            ((q[:4], 10, 64), {"allowed_ids": np.array([3, 30, 300])})]
        expected = [sync.search(*args, **kwargs) for args, kwargs in calls]

        async def main():
            async with AsyncKnnClient(f"dns:///{addr}") as client:
                # One at a time, as the sync calls were: concurrent requests
                # with equal (k, nprobe) are batched together by knnd,
                # which may change distances in the last bits.
                one_by_one = [await client.search(*args, **kwargs)
                              for args, kwargs in calls]
                together = await asyncio.gather(*(
                    client.search(*args, **kwargs) for args, kwargs in calls))
                return one_by_one, together, await client.info()
        one_by_one, together, info = asyncio.run(main())
        for (ids, distances), (ids2, distances2), (want_ids, want_distances) in zip(
                one_by_one, together, expected):
            np.testing.assert_array_equal(ids, want_ids)
            np.testing.assert_array_equal(distances, want_distances)
            self.assertEqual((ids.dtype, distances.dtype), (np.int64, np.float32))
            # (near-ties may swap when the distances move; a batch of 20 or
            # more rows takes FAISS's BLAS path for the coarse distances,
            # which rounds differently: seen 1.03e-4 relative)
            self.assertGreater((ids2 == want_ids).mean(), 0.98)
            np.testing.assert_allclose(np.sort(distances2, axis=1), want_distances,
                                       rtol=1e-3)
        self.assertEqual(info, sync.info())

    def test_event_loop_keeps_ticking_during_async_searches(self):
        from knnd_client import AsyncKnnClient, KnnClient
        addr = self.start_knnd(args=["--workers", "1"]).address
        q = self.xb[:1024]

        async def measure(work):
            """(seconds `work` took, the longest gap of a 5 ms ticker that
            ran beside it)."""
            gaps, done = [], asyncio.Event()

            async def tick():
                while not done.is_set():
                    start = time.monotonic()
                    await asyncio.sleep(0.005)
                    gaps.append(time.monotonic() - start)
            ticker = asyncio.ensure_future(tick())
            await asyncio.sleep(0.02)
            start = time.monotonic()
            await work()
            elapsed = time.monotonic() - start
            done.set()
            await ticker
            return elapsed, max(gaps)

        async def main():
            # 3 x 1024 rows in flight stay under knnd's 4096-row gate.
            async with AsyncKnnClient(addr, timeout_s=60,
                                      max_concurrent_calls=3) as client:
                await client.search(q[:1], 10)  # connected

                async def searches():
                    await asyncio.gather(*(client.search(q, 10, 64)
                                           for _ in range(6)))
                async_times = await measure(searches)
            with KnnClient(addr, timeout_s=60) as blocking:
                blocking.search(q[:1], 10)

                async def blocking_search():
                    blocking.search(q, 10, 64)
                blocking_times = await measure(blocking_search)
            return async_times, blocking_times
        (elapsed, gap), (blocking_elapsed, blocking_gap) = asyncio.run(main())
        print(f"\n  6 async searches: {elapsed:.3f} s, longest tick gap "
              f"{gap * 1000:.1f} ms; one blocking search: "
              f"{blocking_elapsed:.3f} s, gap {blocking_gap * 1000:.1f} ms",
              flush=True)
        self.assertGreater(elapsed, 0.5, "too little work to show anything")
        # The ticker does see a blocked loop: the sync client stalls it for
        # the whole search. The async searches never stall it for more
        # than a fraction of one such search (relative bounds, so that a
        # loaded machine slows both sides alike), and well under 0.5 s.
        self.assertGreater(blocking_gap, blocking_elapsed * 0.8)
        self.assertLess(gap, blocking_elapsed / 3)
        self.assertLess(gap, elapsed / 6)
        self.assertLess(gap, 0.5)

    def test_cancelling_the_task_cancels_the_rpc(self):
        from knnd_client import AsyncKnnClient
        daemon = self.start_knnd(args=["--workers", "1"])
        # 4096 queries over every list at k=100: over a second of work.
        q = np.tile(self.xb[:1024], (4, 1)) + 0.03

        async def main():
            async with AsyncKnnClient(daemon.address, timeout_s=60,
                                      max_concurrent_calls=1) as client:
                await client.search(q[:1], 1)
                ok_before = daemon.scrape().get(SEARCH_OK, 0)
                task = asyncio.ensure_future(client.search(q, 100, 64))
                loop = asyncio.get_running_loop()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and (await loop.run_in_executor(
                        None, daemon.scrape)).get("knnd_queries_in_flight", 0) == 0:
                    await asyncio.sleep(0.01)
                self.assertFalse(task.done(), "the search ended before it could be cancelled")
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    values = await loop.run_in_executor(None, daemon.scrape)
                    if (values.get(SEARCH_CANCELLED, 0) >= 1
                            and values["knnd_queries_in_flight"] == 0):
                        break
                    await asyncio.sleep(0.05)
                # The client's one slot came back: the next call runs.
                ids, _ = await client.search(self.xb[:2], 5, timeout_s=10)
                self.assertEqual(ids[:, 0].tolist(), [0, 1])
                return ok_before
        ok_before = asyncio.run(main())
        values = daemon.scrape()
        self.assertEqual(values.get(SEARCH_CANCELLED), 1,
                         sorted(k for k in values if "handled" in k))
        self.assertEqual(values["knnd_queries_in_flight"], 0)
        self.assertEqual(values.get(SEARCH_OK), ok_before + 1,
                         "the cancelled search was answered")

    def test_server_errors_surface_as_rpc_errors(self):
        import grpc
        from knnd_client import AsyncKnnClient
        addr = self.start_knnd().address
        client = self.client(addr)
        with self.assertRaises(grpc.RpcError) as err:
            client.search(np.ones((1, 16), np.float32), 3)
        self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("dim=16 does not match the index dimension 48",
                      err.exception.details())

        async def main():
            async with AsyncKnnClient(addr) as aclient:
                await aclient.search(np.ones((1, 16), np.float32), 3)
        with self.assertRaises(grpc.RpcError) as err:
            asyncio.run(main())
        self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("dim=16 does not match", err.exception.details())

    def test_deadline_is_respected(self):
        import grpc
        from knnd_client import AsyncKnnClient
        addr = self.start_knnd().address
        client = self.client(addr)
        big = np.tile(self.xb[:1024], (4, 1))
        start = time.monotonic()
        with self.assertRaises(grpc.RpcError) as err:
            client.search(big, 100, 64, timeout_s=0.005)
        self.assertEqual(err.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertLess(time.monotonic() - start, 0.5)

        async def main():
            async with AsyncKnnClient(addr) as aclient:
                await aclient.search(self.xb[:1], 1)
                start = time.monotonic()
                try:
                    await aclient.search(big, 100, 64, timeout_s=0.005)
                except grpc.RpcError as e:
                    return e, time.monotonic() - start
        error, elapsed = asyncio.run(main())
        self.assertEqual(error.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertLess(elapsed, 0.5)
        # The server dropped that work and still answers.
        ids, _ = client.search(self.xb[:2], 5, timeout_s=10)
        self.assertEqual(ids[:, 0].tolist(), [0, 1])

    def record_retries(self):
        """The (request type, code, delay, attempt, max) of every retry the
        clients log from now on."""
        retries = []

        class Record(logging.Handler):
            def emit(self, record):
                retries.append(record.args)
        logger = logging.getLogger("knnd_client")
        handler = Record()
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        self.addCleanup(logger.removeHandler, handler)
        return retries

    def start_small_gate(self):
        # One 256-row request fills the gate; one worker; pushback 100 ms.
        return self.start_knnd(
            "num_workers: 1\nmax_inflight_queries: 256\n"
            "max_queries_per_request: 256\nmax_inflight_bytes: 0\n"
            "retry_pushback_ms: 100\n").address

    def test_full_gate_is_retried_after_pushback_until_all_succeed(self):
        import grpc
        from knnd_client import RetryPolicy
        from knnd.v1 import knn_service_pb2 as raw_pb
        from knnd.v1 import knn_service_pb2_grpc as raw_grpc
        addr = self.start_small_gate()
        q = self.xb[:256]
        retries = self.record_retries()
        client = self.client(addr, timeout_s=60, retry=RetryPolicy(max_attempts=1000))
        barrier = threading.Barrier(8)

        def flood(_):
            barrier.wait()
            return [client.search(q, 100, 64)[0] for _ in range(3)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = [ids for r in pool.map(flood, range(8)) for ids in r]
        self.assertEqual(len(results), 24)
        for ids in results:
            np.testing.assert_array_equal(ids, results[0])
        exhausted = [r for r in retries if r[1] == "RESOURCE_EXHAUSTED"]
        self.assertGreater(len(exhausted), 0, "the gate never filled")
        self.assertTrue(all(r[2] >= 0.1 for r in exhausted), exhausted)
        # What the client saw: knnd's own rejection and pushback value.
        errors = []

        def raw(_):
            with grpc.insecure_channel(addr) as channel:
                stub = raw_grpc.KnnServiceStub(channel)
                barrier.wait()
                try:
                    stub.Search(raw_pb.SearchRequest(
                        vectors_f32le=q.tobytes(), k=100, nprobe=64), timeout=60)
                except grpc.RpcError as e:
                    errors.append((e.code(), dict(e.trailing_metadata())))
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(raw, range(8)))
        self.assertGreater(len(errors), 0)
        for code, metadata in errors:
            self.assertEqual(code, grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertEqual(metadata.get("grpc-retry-pushback-ms"), "100")

    def test_async_full_gate_is_retried_after_pushback_until_all_succeed(self):
        from knnd_client import AsyncKnnClient, RetryPolicy
        addr = self.start_small_gate()
        q = self.xb[:256]
        retries = self.record_retries()

        async def main():
            async with AsyncKnnClient(addr, timeout_s=60,
                                      retry=RetryPolicy(max_attempts=1000),
                                      max_concurrent_calls=8) as client:
                async def three():
                    return [(await client.search(q, 100, 64))[0] for _ in range(3)]
                return [ids for r in await asyncio.gather(*(three() for _ in range(8)))
                        for ids in r]
        results = asyncio.run(main())
        self.assertEqual(len(results), 24)
        for ids in results:
            np.testing.assert_array_equal(ids, results[0])
        exhausted = [r for r in retries if r[1] == "RESOURCE_EXHAUSTED"]
        self.assertGreater(len(exhausted), 0, "the gate never filled")
        self.assertTrue(all(r[2] >= 0.1 for r in exhausted), exhausted)

    def test_round_robin_over_a_headless_service(self):
        from knnd_client import AsyncKnnClient
        # Two replicas on one port, as pods behind a headless Service: one
        # name, one A record per replica.
        port = free_port()
        replicas = [self.start_daemon(address=f"{ip}:{port}")
                    for ip in ("127.0.0.1", "127.0.0.2")]
        for daemon in replicas:
            self.assertTrue(daemon.wait_serving(60), daemon.read_log())
        dns = FakeDns("knnd-headless.search.svc.cluster.local",
                      ["127.0.0.1", "127.0.0.2"])
        self.addCleanup(dns.close)
        target = (f"dns://127.0.0.1:{dns.port}/"
                  f"knnd-headless.search.svc.cluster.local:{port}")
        q = self.xb[:4]

        def served():
            return [d.scrape().get(SEARCH_OK, 0) for d in replicas]
        client = self.client(target, timeout_s=10)
        expected = client.search(q, 5)[0]
        for _ in range(19):
            np.testing.assert_array_equal(client.search(q, 5)[0], expected)
        sync_counts = served()
        self.assertEqual(sum(sync_counts), 20)
        self.assertTrue(all(c >= 5 for c in sync_counts), sync_counts)

        async def main():
            async with AsyncKnnClient(target, timeout_s=10) as aclient:
                for _ in range(20):
                    await aclient.search(q, 5)
        asyncio.run(main())
        async_counts = [c - s for c, s in zip(served(), sync_counts)]
        self.assertEqual(sum(async_counts), 20)
        self.assertTrue(all(c >= 5 for c in async_counts), async_counts)
        # A service config in `options` replaces the client's own: with
        # pick_first every call goes to one replica.
        before = served()
        pinned = self.client(target, options=[("grpc.service_config", json.dumps(
            {"loadBalancingConfig": [{"pick_first": {}}]}))])
        for _ in range(6):
            pinned.search(q, 5)
        self.assertEqual(sorted(a - b for a, b in zip(served(), before)), [0, 6])

    def test_round_robin_skips_a_replica_that_is_not_serving(self):
        # knnd-client's round_robin watches grpc.health.v1: a replica that
        # turned NOT_SERVING (SIGTERM, during its shutdown delay, still
        # listening and serving) gets no new calls; a pick_first client
        # pinned to it still reaches it.
        import grpc
        replicas = [self.start_knnd("shutdown_delay_ms: 300000\n") for _ in range(2)]
        target = "ipv4:" + ",".join(d.address for d in replicas)
        client = self.client(target, timeout_s=10)
        q = self.xb[:2]

        def served():
            return [d.scrape().get(SEARCH_OK, 0) for d in replicas]
        for _ in range(10):
            client.search(q, 5)
        self.assertTrue(all(c > 0 for c in served()), served())
        replicas[0].proc.send_signal(signal.SIGTERM)
        while replicas[0].serving():
            time.sleep(0.01)
        # The channel learns it from its Watch stream, a moment later.
        time.sleep(0.5)
        before = served()
        for _ in range(20):
            client.search(q, 5)
        after = served()
        self.assertEqual([a - b for a, b in zip(after, before)], [0, 20])
        pinned = self.client(replicas[0].address)
        pinned.search(q, 5)  # still served during the delay
        self.assertEqual(served()[0], after[0] + 1)
        # Only replica 1 answers also when both are asked directly.
        with self.assertRaises(grpc.RpcError) as err:
            self.client(target, timeout_s=1,
                        options=[("grpc.service_config", json.dumps({
                            "loadBalancingConfig": [{"round_robin": {}}],
                            "healthCheckConfig": {"serviceName": "no.Such"}}))],
                        ).search(q, 5)
        self.assertEqual(err.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_tls_and_bearer_tokens(self):
        import grpc
        from knnd_client import AsyncKnnClient, KnnClient, RetryPolicy
        ca, cert, key = make_tls_files(self.tmp.name)
        token = "search-token-" + "7" * 24
        tokens = os.path.join(self.tmp.name, "search.tokens")
        with open(tokens, "w") as f:
            f.write(f"# search tokens\n{token}\n")
        os.chmod(tokens, 0o600)
        config = f'search_token_file: "{tokens}"\n'
        with open(ca, "rb") as f:
            ca_pem = f.read()
        tls = self.start_daemon(config, ["--tls_cert", cert, "--tls_key", key])
        plain = self.start_knnd(config)  # tokens over plaintext: a mesh
        target = f"localhost:{tls.port}"

        def creds():
            return grpc.ssl_channel_credentials(root_certificates=ca_pem)
        # Ready once an authenticated call goes through (its health check
        # is behind TLS too).
        ready = KnnClient(target, credentials=creds(), bearer_token=token,
                          retry=RetryPolicy(max_attempts=50), timeout_s=60)
        self.addCleanup(ready.close)
        ready.info()
        q = self.xb[:2]

        def sync_codes(addr, **kwargs):
            with KnnClient(addr, timeout_s=10, **kwargs) as client:
                try:
                    return client.search(q, 5)[0][:, 0].tolist()
                except grpc.RpcError as e:
                    return e.code()

        async def async_codes(addr, **kwargs):
            async with AsyncKnnClient(addr, timeout_s=10, **kwargs) as client:
                try:
                    return (await client.search(q, 5))[0][:, 0].tolist()
                except grpc.RpcError as e:
                    return e.code()
        cases = [
            (target, dict(credentials=creds(), bearer_token=token), [0, 1]),
            (f"dns:///{target}", dict(credentials=creds(), bearer_token=token), [0, 1]),
            (target, dict(credentials=creds()), grpc.StatusCode.UNAUTHENTICATED),
            (target, dict(credentials=creds(), bearer_token="x" * 32),
             grpc.StatusCode.UNAUTHENTICATED),
            (target, dict(bearer_token=token, retry=RetryPolicy(max_attempts=1)),
             grpc.StatusCode.UNAVAILABLE),  # plaintext to a TLS port
            (plain.address, dict(bearer_token=token), [0, 1]),
            (plain.address, {}, grpc.StatusCode.UNAUTHENTICATED),
        ]
        for addr, kwargs, want in cases:
            with self.subTest(addr=addr, kwargs=sorted(kwargs)):
                self.assertEqual(sync_codes(addr, **kwargs), want)
                self.assertEqual(asyncio.run(async_codes(addr, **kwargs)), want)

    def test_max_connection_age_closes_connections(self):
        import grpc

        def seconds_until_not_ready(addr):
            """Connects, then waits up to 3 s for the connection to leave
            READY; returns the time that took, or None."""
            left = threading.Event()

            def watch(state):
                if state != grpc.ChannelConnectivity.READY:
                    left.set()
            with grpc.insecure_channel(addr) as channel:
                grpc.channel_ready_future(channel).result(timeout=10)
                start = time.monotonic()
                channel.subscribe(watch)
                ok = left.wait(3)
                channel.unsubscribe(watch)
                return time.monotonic() - start if ok else None
        aged = seconds_until_not_ready(self.start_knnd(
            "max_connection_age_ms: 300\nmax_connection_age_grace_ms: 100\n").address)
        self.assertIsNotNone(aged, "the server never closed the connection")
        self.assertIsNone(seconds_until_not_ready(self.start_knnd().address),
                          "with the 5 minute default the connection stays open")


# --------------------------------------------------------------------------
# LangChain (pypi route)

class LangChainTest(unittest.TestCase):
    """knnd_client.langchain.KnndVectorStore over a live knnd serving the
    deterministic fake embeddings of 1,500 texts (cosine index, raw vectors
    kept for exact re-ranking), the docstore a dict keyed by vector id; and
    over the same vectors split into two shards, each served by its knnd,
    through the sharded clients."""

    DIM = 32

    @classmethod
    def setUpClass(cls):
        from langchain_core.documents import Document
        from langchain_core.embeddings import DeterministicFakeEmbedding
        cls.tmp = tempfile.TemporaryDirectory()
        words = ["index", "vector", "shard", "replica", "token", "probe",
                 "cluster", "memory", "latency", "batch", "queue", "worker"]
        cls.texts = [f"chunk {i}: {words[i % 12]} {words[(i // 12) % 12]} "
                     f"{words[(i // 144) % 12]}" for i in range(1500)]
        cls.embedding = DeterministicFakeEmbedding(size=cls.DIM)
        vectors = np.array(cls.embedding.embed_documents(cls.texts), np.float32)
        # --keep_vectors (exact re-ranking) stores row i as vector id i, so
        # the ids are row numbers here; the docstore is keyed by them.
        cls.docstore = {i: Document(page_content=t, metadata={"row": i})
                        for i, t in enumerate(cls.texts)}
        base = os.path.join(cls.tmp.name, "chunks")
        np.save(base + ".npy", vectors)
        subprocess.run([ARGS.knnctl, "build", "--input", base + ".npy",
                        "--output", base + ".index", "--metric", "cosine",
                        "--factory", "IVF16,PQ8", "--keep_vectors"],
                       check=True, capture_output=True)
        cls.daemon = Daemon(ARGS.knnd, ["--index", base + ".index"],
                            log_path=os.path.join(cls.tmp.name, "knnd.log"),
                            knnctl=ARGS.knnctl)
        if not cls.daemon.wait_serving(60):
            cls.daemon.stop()
            raise RuntimeError("knnd did not start: " + cls.daemon.read_log())
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        cls.unit = unit
        # The same vectors as a FastScan index split into 2 shards, a knnd
        # per shard, for the sharded clients.
        subprocess.run([ARGS.knnctl, "build", "--input", base + ".npy",
                        "--output", base + "_fs.index", "--metric", "cosine",
                        "--factory", "IVF16,PQ16x4fs", "--keep_vectors"],
                       check=True, capture_output=True)
        subprocess.run([ARGS.knnctl, "shard", "--index", base + "_fs.index",
                        "--shards", "2"], check=True, capture_output=True)
        cls.shards = []
        for i in range(2):
            shard = Daemon(ARGS.knnd,
                           ["--index", f"{base}_fs.index.shard-{i}-of-2"],
                           log_path=os.path.join(cls.tmp.name, f"shard{i}.log"),
                           knnctl=ARGS.knnctl)
            cls.shards.append(shard)
            if not shard.wait_serving(60):
                cls.tearDownClass()
                raise RuntimeError("shard knnd did not start: " + shard.read_log())

    @classmethod
    def tearDownClass(cls):
        for shard in getattr(cls, "shards", []):
            shard.stop(30)
        cls.daemon.stop(30)
        cls.tmp.cleanup()

    def store(self, docstore=None, **kwargs):
        from knnd_client import KnnClient
        from knnd_client.langchain import KnndVectorStore
        client = KnnClient(self.daemon.address, timeout_s=10)
        self.addCleanup(client.close)
        return KnndVectorStore(client, self.embedding,
                              self.docstore if docstore is None else docstore,
                              nprobe=16, refine_factor=16, **kwargs)

    def exact(self, row, k):
        """Exact cosine top-k of text `row` (numpy), as (vector ids, cosines)."""
        cosines = self.unit @ self.unit[row]
        top = np.argsort(-cosines, kind="stable")[:k]
        return top.tolist(), cosines[top]

    def test_similarity_search_returns_the_docstore_documents(self):
        store = self.store()
        for row in (7, 400, 1499):
            with self.subTest(row=row):
                docs = store.similarity_search(self.texts[row], k=4)
                want_ids, want_cosines = self.exact(row, 4)
                self.assertEqual(docs, [self.docstore[i] for i in want_ids])
                scored = store.similarity_search_with_score(self.texts[row], k=4)
                self.assertEqual([d for d, _ in scored], docs)
                np.testing.assert_allclose([s for _, s in scored], want_cosines,
                                           atol=1e-4)
                by_vector = store.similarity_search_by_vector(
                    self.embedding.embed_query(self.texts[row]), k=4)
                self.assertEqual(by_vector, docs)
        # The search kwargs reach knnd: only allowed ids come back.
        docs = store.similarity_search(self.texts[7], k=3, allowed_ids=[10, 11])
        self.assertEqual(sorted(d.metadata["row"] for d in docs), [10, 11])

    def test_relevance_scores_and_retrievers(self):
        store = self.store()
        scored = store.similarity_search_with_relevance_scores(self.texts[5], k=5)
        self.assertAlmostEqual(scored[0][1], 1.0, places=4)  # itself: cosine 1
        self.assertTrue(all(0.0 <= s <= 1.0 for _, s in scored), scored)
        retriever = store.as_retriever(search_kwargs={"k": 3})
        docs = retriever.invoke(self.texts[5])
        self.assertEqual(docs, [self.docstore[i] for i in self.exact(5, 3)[0]])
        strict = store.as_retriever(search_type="similarity_score_threshold",
                                    search_kwargs={"k": 5, "score_threshold": 0.999})
        self.assertEqual(strict.invoke(self.texts[5]),
                         [self.docstore[5]])
        # LangChain runs a sync store's a* methods in a thread.
        self.assertEqual(asyncio.run(retriever.ainvoke(self.texts[5])), docs)

    def test_async_client_store(self):
        from knnd_client import AsyncKnnClient
        from knnd_client.langchain import KnndVectorStore
        sync_store = self.store()
        want = sync_store.similarity_search_with_score(self.texts[9], k=4)

        async def main():
            async with AsyncKnnClient(self.daemon.address) as client:
                store = KnndVectorStore(client, self.embedding, self.docstore,
                                       nprobe=16, refine_factor=16)
                with self.assertRaisesRegex(TypeError, "await the a\\* methods"):
                    store.similarity_search(self.texts[9])
                scored = await store.asimilarity_search_with_score(self.texts[9], k=4)
                docs = await store.as_retriever(search_kwargs={"k": 4}).ainvoke(
                    self.texts[9])
                relevance = await store.asimilarity_search_with_relevance_scores(
                    self.texts[9], k=4)
                return scored, docs, relevance
        scored, docs, relevance = asyncio.run(main())
        self.assertEqual([d for d, _ in scored], [d for d, _ in want])
        np.testing.assert_allclose([s for _, s in scored], [s for _, s in want],
                                   atol=1e-6)
        self.assertEqual(docs, [d for d, _ in want])
        self.assertAlmostEqual(relevance[0][1], 1.0, places=4)

    def test_sharded_clients_store(self):
        """The store over the two shards, sync and asyncio: the documents
        of the exact top-k (every list probed, 64 candidates re-ranked
        exactly), cosine scores, and relevance from the shards' metric."""
        from knnd_client import AsyncShardedKnnClient, ShardedKnnClient
        from knnd_client.langchain import KnndVectorStore
        targets = [shard.address for shard in self.shards]
        client = ShardedKnnClient(targets, timeout_s=10)
        self.addCleanup(client.close)
        store = KnndVectorStore(client, self.embedding, self.docstore,
                                nprobe=16, refine_factor=16)
        for row in (7, 400, 1499):
            with self.subTest(row=row):
                want_ids, want_cosines = self.exact(row, 4)
                scored = store.similarity_search_with_score(self.texts[row], k=4)
                self.assertEqual([d for d, _ in scored],
                                 [self.docstore[i] for i in want_ids])
                np.testing.assert_allclose([s for _, s in scored], want_cosines,
                                           atol=1e-4)
        relevance = store.similarity_search_with_relevance_scores(self.texts[5], k=2)
        self.assertAlmostEqual(relevance[0][1], 1.0, places=4)
        docs = store.similarity_search(self.texts[7], k=3, allowed_ids=[10, 1400])
        self.assertEqual(sorted(d.metadata["row"] for d in docs), [10, 1400])

        async def main():
            async with AsyncShardedKnnClient(targets) as aclient:
                astore = KnndVectorStore(aclient, self.embedding, self.docstore,
                                         nprobe=16, refine_factor=16)
                with self.assertRaisesRegex(TypeError, "AsyncShardedKnnClient: "
                                            "await the a\\* methods"):
                    astore.similarity_search(self.texts[9])
                docs = await astore.as_retriever(search_kwargs={"k": 4}).ainvoke(
                    self.texts[9])
                relevance = await astore.asimilarity_search_with_relevance_scores(
                    self.texts[9], k=1)
                return docs, relevance
        docs, relevance = asyncio.run(main())
        self.assertEqual(docs, [self.docstore[i] for i in self.exact(9, 4)[0]])
        self.assertAlmostEqual(relevance[0][1], 1.0, places=4)

    def test_docstores_lookup_and_missing_ids(self):
        from langchain_core.stores import InMemoryStore
        by_string = InMemoryStore()
        by_string.mset([(str(i), d) for i, d in self.docstore.items()])
        store = self.store(docstore=by_string)
        self.assertEqual(store.similarity_search(self.texts[3], k=2),
                         self.store().similarity_search(self.texts[3], k=2))
        self.assertEqual(store.get_by_ids(["3", "999999"]), [self.docstore[3]])
        partial = dict(self.docstore)
        del partial[3]
        with self.assertRaisesRegex(LookupError, "vector id 3, which the docstore"):
            self.store(docstore=partial).similarity_search(self.texts[3], k=2)

    def test_read_only_and_argument_errors(self):
        from langchain_core.documents import Document
        from knnd_client.langchain import KnndVectorStore
        store = self.store()
        for call in (lambda: store.add_texts(["new"]),
                     lambda: store.add_documents([Document(page_content="new")]),
                     lambda: store.delete(["1000"]),
                     lambda: KnndVectorStore.from_texts(["new"], self.embedding),
                     lambda: KnndVectorStore.from_documents(
                         [Document(page_content="new")], self.embedding),
                     lambda: asyncio.run(store.aadd_texts(["new"]))):
            with self.assertRaises(NotImplementedError) as err:
                call()
            self.assertIn("knnctl build", str(err.exception))
            self.assertIn("knnctl publish", str(err.exception))
        with self.assertRaisesRegex(TypeError, "allowed_ids"):
            store.similarity_search("x", filter={"row": 1})
        with self.assertRaisesRegex(TypeError, "got fetch_k"):
            store.similarity_search("x", fetch_k=20)
        with self.assertRaisesRegex(TypeError, "docstore must be a Mapping"):
            KnndVectorStore(store._client, self.embedding, [Document(page_content="x")])


def load_tests(loader, tests, pattern):
    """The suite run inside a route's venv (InstallRoutesTest runs outside)."""
    classes = [FakeServerTest, AsyncFakeServerTest, PackageTest, LiveKnndTest]
    if os.environ.get(ROUTE_ENV) == "pypi":
        classes.append(LangChainTest)
    suite = unittest.TestSuite()
    for cls in classes:
        suite.addTests(loader.loadTestsFromTestCase(cls))
    return suite


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True, setup=main_outside_venv)
