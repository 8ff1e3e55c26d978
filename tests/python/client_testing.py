"""What the tests of knnd-client (clients/python) share: the driver that
runs a test script in each install route's venv, a fake KnnService, the
contract both clients keep against it, a fake DNS server, TLS files, and
the base of the tests against a live knnd.

Install routes: client_install_test.py (the ctest fixture
python_client_venvs) installs the client the two ways its README gives
into venvs under --venvs, with the test index and vectors (data/):
  system: a venv over Debian's python3-grpcio/protobuf/numpy, `pip install
    --no-index --no-build-isolation --no-deps` (nothing downloaded; the
    stubs from the system protoc);
  pypi: a venv of its own, `pip install 'clients/python[langchain]'` with
    build isolation and PyPI's newest releases (not made, with the reason
    in pypi.skipped, when PyPI cannot be reached).
Each client_*_test.py, run by /usr/bin/python3, reruns itself inside each
route's venv (main()), where its tests import the installed package.
"""
import concurrent.futures
import logging
import os
import subprocess
import socket
import struct
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

from knnd_harness import Daemon, generate_stubs, make_tls_files, unittest_main

VENV_ENV = "KNND_CLIENT_TEST_VENV"    # set in the suite's run: its venv
ROUTE_ENV = "KNND_CLIENT_TEST_ROUTE"  # "system" or "pypi"
DATA_ENV = "KNND_CLIENT_TEST_DATA"    # the index and vectors built once
SOURCE_ENV = "KNND_CLIENT_TEST_SOURCE"  # the copy of the tree installed from
ROUTES = ("system", "pypi")
# What the pypi route installs beside the client for client_types_test.py's
# `mypy --strict` (fixed versions: a new release's new checks are a change
# to make on purpose).
TYPE_CHECK_REQUIREMENTS = ("mypy==2.4.1", "types-grpcio==1.85.0.20261028",
                           "types-protobuf==7.35.1.20260906")
DIM = 48
SEARCH_OK = ('grpc_server_handled_total{grpc_code="OK",grpc_method="Search",'
             'grpc_service="knnd.v1.KnnService",grpc_type="unary",'
             'protocol="grpc"}')
SEARCH_CANCELLED = SEARCH_OK.replace('"OK"', '"CANCELLED"')


def script_args():
    """The test script's arguments (knnd_harness.unittest_main's ARGS)."""
    return sys.modules["__main__"].ARGS


def route_env(venvs, route):
    """The environment of the suite's run in `route`'s venv."""
    return dict(os.environ, **{
        VENV_ENV: os.path.join(venvs, route), ROUTE_ENV: route,
        DATA_ENV: os.path.join(venvs, "data"),
        SOURCE_ENV: os.path.join(venvs, f"src-{route}")})


def run_in_routes(parsed):
    """Outside a venv: reruns this script (same arguments) in each route's
    venv and exits with 1 if any run failed or the system route's venv is
    missing; the pypi route's may be missing with a reason. Inside one:
    returns, and the script's tests run."""
    if os.environ.get(VENV_ENV) is not None:
        return
    failed = []
    for route in ROUTES:
        venv = os.path.join(parsed.venvs, route)
        skipped = venv + ".skipped"
        if not os.path.isdir(venv):
            if route == "pypi" and os.path.exists(skipped):
                with open(skipped) as f:
                    print(f"==== {route} route skipped: {f.read().strip()}")
                continue
            print(f"==== no {route} venv under {parsed.venvs}: run "
                  "client_install_test.py (ctest's python_client_install) "
                  "first", flush=True)
            failed.append(route)
            continue
        python = os.path.join(venv, "bin", "python")
        print(f"==== {os.path.basename(sys.argv[0])}, {route} route "
              f"({python})", flush=True)
        if subprocess.call([python, "-W", "ignore", *sys.argv],
                           env=route_env(parsed.venvs, route)):
            failed.append(route)
    sys.exit(1 if failed else 0)


def main(description):
    """The main of a client_*_test.py script (see run_in_routes)."""
    unittest_main(description, knnctl=True, setup=run_in_routes,
                  add_arguments=lambda parser: parser.add_argument(
                      "--venvs", required=True,
                      help="where client_install_test.py made the venvs"))


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
            n = (len(request.vectors_f32le) // 4
                 + len(request.vectors_f16le) // 2) // request.dim
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
        ((good.astype(np.float64), 3), {}, TypeError,
         "dtype float32 or float16, got float64"),
        ((good.astype(np.int32), 3), {}, TypeError,
         "dtype float32 or float16, got int32"),
        ((good.astype(np.longdouble), 3), {}, TypeError,
         "dtype float32 or float16, got float128"),
        ((np.array([[1, np.nan]], np.float16), 3), {}, ValueError,
         r"queries\[0, 1\] is nan"),
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
        result = search(np.ones((2, 4), np.float32), 3)
        ids, distances = result.ids, result.distances
        self.assertEqual(len(fake.calls), 1)
        self.assertEqual((ids.dtype, ids.shape), (np.int64, (2, 3)))
        self.assertEqual((distances.dtype, distances.shape), (np.float32, (2, 3)))
        np.testing.assert_array_equal(ids, np.arange(6).reshape(2, 3))

    def test_resource_exhausted_is_retried_after_the_pushback(self):
        import grpc
        fake, search = self.serve(
            ("fail", grpc.StatusCode.RESOURCE_EXHAUSTED, 300),
            ("fail", grpc.StatusCode.RESOURCE_EXHAUSTED, 300), ("ok",))
        ids = search(np.ones((1, 4), np.float32), 2).ids
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
        ids = search(np.ones((1, 4), np.float32), 2).ids
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





class LiveKnnd(unittest.TestCase):
    """The base of the tests of the installed client against knnd serving
    the index client_install_test.py built (no tests of its own)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        # The raw generated stub, as any other client would make it; it
        # registers the same knnd/v1/knn_service.proto descriptor as
        # knnd_client, so this also shows the two coexist in one process.
        generate_stubs(os.environ.get(SOURCE_ENV, script_args().source_dir),
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
        daemon = Daemon(script_args().knnd, ["--config", config, "--index", self.index_path,
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

    def assert_flood_answered(self, results, retries):
        """Every one of the 24 searches of a flood on start_small_gate()'s
        knnd answered alike, some after a RESOURCE_EXHAUSTED retried no
        sooner than the 100 ms pushback (`retries`: record_retries())."""
        self.assertEqual(len(results), 24)
        for ids in results:
            np.testing.assert_array_equal(ids, results[0])
        exhausted = [r for r in retries if r[1] == "RESOURCE_EXHAUSTED"]
        self.assertGreater(len(exhausted), 0, "the gate never filled")
        self.assertTrue(all(r[2] >= 0.1 for r in exhausted), exhausted)

    def start_small_gate(self):
        # One 256-row request fills the gate; one worker; pushback 100 ms.
        return self.start_knnd(
            "num_workers: 1\nmax_inflight_queries: 256\n"
            "max_queries_per_request: 256\nmax_inflight_bytes: 0\n"
            "retry_pushback_ms: 100\n").address


    def assert_back_within(self, address, search, seconds, outage_s=5):
        """Starts knnd on `address`; then stops it, keeps calling `search`
        (a blocking call of a client of that address) for `outage_s` (the
        calls fail, as an API worker's do meanwhile), starts knnd again on
        the same address, and asserts that `search` answers within
        `seconds` of knnd reporting SERVING."""
        import grpc
        daemon = self.start_knnd(address=address)
        search()
        daemon.stop()
        end = time.monotonic() + outage_s
        while time.monotonic() < end:
            with self.assertRaises(grpc.RpcError):
                search()
            time.sleep(0.1)
        self.start_knnd(address=address)
        serving = time.monotonic()
        while True:
            try:
                search()
                break
            except grpc.RpcError:
                time.sleep(0.02)
        back = time.monotonic() - serving
        print(f"\n  answered {back:.2f} s after knnd served again", flush=True)
        self.assertLess(back, seconds)
