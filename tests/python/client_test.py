#!/usr/bin/python3
"""knnd-client (clients/python) as an API service uses it.

The package is installed the way its README says (a venv over the system
packages, pip with no index), then tested from that venv:
  - against a live knnd started here: results equal those of the raw
    generated stub and of knnctl (the C++ client); a deadline is respected;
    RESOURCE_EXHAUSTED from a full gate is retried after the server's
    pushback until every request succeeds; max_connection_age_ms makes the
    server close connections (GOAWAY);
  - against a small fake server that counts attempts: bad inputs raise
    before any RPC; pushback and backoff timings; no retry past the deadline.

  client_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl --source-dir . [unittest args]
"""
import concurrent.futures
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

from knnd_harness import Daemon, generate_stubs, unittest_main

ARGS = None
VENV_ENV = "KNND_CLIENT_TEST_VENV"


def install_client(source_dir, tmp):
    """Copies proto/ and clients/python/ (so the build leaves nothing in the
    source tree), makes a venv over the system packages and pip-installs the
    client there with no index: nothing can be downloaded. Returns the venv's
    python."""
    src = os.path.join(tmp, "src")
    shutil.copytree(os.path.join(source_dir, "proto"), os.path.join(src, "proto"))
    shutil.copytree(os.path.join(source_dir, "clients", "python"),
                    os.path.join(src, "clients", "python"),
                    ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                  "__pycache__", "_generated"))
    venv = os.path.join(tmp, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv],
                   check=True)
    python = os.path.join(venv, "bin", "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index",
                    "--no-build-isolation", "--no-deps",
                    os.path.join(src, "clients", "python")], check=True)
    return python


class FakeKnnd:
    """An in-process KnnService whose Search answers with `script`, one entry
    per call (the last one repeats): ("ok",), ("fail", code, pushback or
    None) or ("sleep", seconds). Records the time of each call."""

    def __init__(self, script):
        import grpc
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        self.script = script
        self.calls = []
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
        handler = grpc.unary_unary_rpc_method_handler(
            self._search, request_deserializer=pb.SearchRequest.FromString,
            response_serializer=pb.SearchResponse.SerializeToString)
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "knnd.v1.KnnService", {"Search": handler})])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.pb = pb

    def _search(self, request, context):
        self.calls.append(time.monotonic())
        step = self.script[min(len(self.calls), len(self.script)) - 1]
        if step[0] == "fail":
            if step[2] is not None:
                context.set_trailing_metadata(
                    (("grpc-retry-pushback-ms", str(step[2])),))
            context.abort(step[1], "scripted failure")
        if step[0] == "sleep":
            time.sleep(step[1])
        n = len(request.vectors_f32le) // (4 * request.dim)
        return self.pb.SearchResponse(
            num_queries=n, k=request.k, ids=range(n * request.k),
            distances=[0.5] * (n * request.k))

    def stop(self):
        self.server.stop(0)


class FakeServerTest(unittest.TestCase):
    def serve(self, *script):
        from knnd_client import KnnClient, RetryPolicy
        fake = FakeKnnd(list(script))
        self.addCleanup(fake.stop)
        client = KnnClient(f"127.0.0.1:{fake.port}", timeout_s=5,
                           retry=RetryPolicy(max_attempts=5))
        self.addCleanup(client.close)
        return fake, client

    def test_bad_inputs_raise_before_any_rpc(self):
        fake, client = self.serve(("ok",))
        good = np.ones((2, 4), np.float32)
        cases = [
            (([[1.0, 2.0]], 3), TypeError, "numpy.ndarray"),
            ((good.astype(np.float64), 3), TypeError, "dtype float32, got float64"),
            ((good.astype(np.int32), 3), TypeError, "dtype float32, got int32"),
            ((good.astype(np.float16), 3), TypeError, "dtype float32, got float16"),
            ((good[0], 3), ValueError, r"reshape\(1, -1\)"),
            ((good.reshape(1, 2, 4), 3), ValueError, "must be 2-D"),
            ((np.ones((0, 4), np.float32), 3), ValueError, "no values"),
            ((np.ones((2, 0), np.float32), 3), ValueError, "no values"),
            ((np.array([[1, np.nan]], np.float32), 3), ValueError,
             r"queries\[0, 1\] is nan"),
            ((np.array([[1, 2], [np.inf, 0]], np.float32), 3), ValueError,
             r"queries\[1, 0\] is inf"),
            ((good, 0), ValueError, "k=0 must be >= 1"),
            ((good, 2.5), TypeError, "k must be an int, got float"),
            ((good, True), TypeError, "k must be an int, got bool"),
            ((good, 3, 0), ValueError, "nprobe=0 must be >= 1"),
            ((good, 3, "8"), TypeError, "nprobe must be an int, got str"),
        ]
        for args, error, message in cases:
            with self.subTest(message=message):
                with self.assertRaisesRegex(error, message):
                    client.search(*args)
        with self.assertRaisesRegex(TypeError, "allowed_ids must be a 1-D"):
            client.search(good, 3, allowed_ids=[1.5, 2.0])
        with self.assertRaisesRegex(ValueError, "timeout_s=0 must be > 0"):
            client.search(good, 3, timeout_s=0)
        with self.assertRaisesRegex(ValueError, "refine_factor=-1 must be >= 0"):
            client.search(good, 3, refine_factor=-1)
        self.assertEqual(fake.calls, [], "an RPC was made for a bad input")
        ids, distances = client.search(good, 3)
        self.assertEqual(len(fake.calls), 1)
        self.assertEqual((ids.dtype, ids.shape), (np.int64, (2, 3)))
        self.assertEqual((distances.dtype, distances.shape), (np.float32, (2, 3)))
        np.testing.assert_array_equal(ids, np.arange(6).reshape(2, 3))

    def test_resource_exhausted_is_retried_after_the_pushback(self):
        import grpc
        fake, client = self.serve(
            ("fail", grpc.StatusCode.RESOURCE_EXHAUSTED, 300),
            ("fail", grpc.StatusCode.RESOURCE_EXHAUSTED, 300), ("ok",))
        ids, _ = client.search(np.ones((1, 4), np.float32), 2)
        self.assertEqual(ids.tolist(), [[0, 1]])
        self.assertEqual(len(fake.calls), 3)
        gaps = np.diff(fake.calls)
        # Never sooner than the server asked; jitter adds at most 20%.
        self.assertTrue(((gaps >= 0.3) & (gaps < 0.3 * 1.2 + 0.15)).all(), gaps)

    def test_no_retry_when_the_pushback_ends_past_the_deadline(self):
        import grpc
        fake, client = self.serve(
            ("fail", grpc.StatusCode.RESOURCE_EXHAUSTED, 5000), ("ok",))
        start = time.monotonic()
        with self.assertRaises(grpc.RpcError) as err:
            client.search(np.ones((1, 4), np.float32), 2, timeout_s=1.0)
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
                fake, client = self.serve(step, ("ok",))
                with self.assertRaises(grpc.RpcError) as err:
                    client.search(np.ones((1, 4), np.float32), 2)
                self.assertEqual(err.exception.code(), step[1])
                self.assertEqual(len(fake.calls), 1)

    def test_unavailable_is_retried_with_backoff(self):
        import grpc
        fake, client = self.serve(
            ("fail", grpc.StatusCode.UNAVAILABLE, None),
            ("fail", grpc.StatusCode.UNAVAILABLE, None), ("ok",))
        client.search(np.ones((1, 4), np.float32), 2)
        self.assertEqual(len(fake.calls), 3)
        # U(0, 50 ms), then U(0, 100 ms) (plus scheduling slack).
        self.assertTrue((np.diff(fake.calls) < 0.1 + 0.1).all(), np.diff(fake.calls))

    def test_attempts_stop_at_max_attempts(self):
        import grpc
        fake, client = self.serve(("fail", grpc.StatusCode.UNAVAILABLE, 1))
        with self.assertRaises(grpc.RpcError):
            client.search(np.ones((1, 4), np.float32), 2)
        self.assertEqual(len(fake.calls), 5)

    def test_deadline_covers_a_slow_server(self):
        import grpc
        fake, client = self.serve(("sleep", 3.0))
        start = time.monotonic()
        with self.assertRaises(grpc.RpcError) as err:
            client.search(np.ones((1, 4), np.float32), 2, timeout_s=0.3)
        elapsed = time.monotonic() - start
        self.assertEqual(err.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertGreaterEqual(elapsed, 0.29)
        self.assertLess(elapsed, 0.8)
        self.assertEqual(len(fake.calls), 1)


class LiveKnndTest(unittest.TestCase):
    """The installed client against knnd serving an index built here."""

    @classmethod
    def setUpClass(cls):
        import faiss
        cls.tmp = tempfile.TemporaryDirectory()
        # The raw generated stub, as any other client would make it; it
        # registers the same knnd/v1/knn_service.proto descriptor as
        # knnd_client, so this also shows the two coexist in one process.
        generate_stubs(ARGS.source_dir, os.path.join(cls.tmp.name, "raw"))
        rng = np.random.default_rng(11)
        centres = rng.standard_normal((40, 48)).astype("float32") * 4
        cls.xb = (centres[rng.integers(0, 40, 20000)]
                  + rng.standard_normal((20000, 48))).astype("float32")
        cls.index_path = os.path.join(cls.tmp.name, "client.index")
        index = faiss.index_factory(48, "IVF64,PQ12")
        # Through the downcast IndexIVFPQ: set on extract_index_ivf()'s
        # IndexIVF proxy, the flag would be a Python attribute, ignored.
        faiss.downcast_index(
            faiss.extract_index_ivf(index)).do_polysemous_training = False
        index.train(cls.xb)
        index.add(cls.xb)
        faiss.extract_index_ivf(index).nprobe = 6
        faiss.write_index(index, cls.index_path)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def start_knnd(self, config_text=""):
        """Starts knnd with `config_text` as its config file; returns its
        address once health says SERVING."""
        config = os.path.join(self.tmp.name, f"knnd-{self.id()}.textproto")
        with open(config, "w") as f:
            f.write(config_text)
        daemon = Daemon(ARGS.knnd, ["--config", config, "--index", self.index_path],
                        log_path=os.path.join(self.tmp.name, f"knnd-{self.id()}.log"))
        self.addCleanup(daemon.stop, 60)
        self.assertTrue(daemon.wait_serving(60),
                        "knnd did not become SERVING: " + daemon.read_log())
        return daemon.address

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
        addr = self.start_knnd()
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

    def test_server_errors_surface_as_rpc_errors(self):
        import grpc
        client = self.client(self.start_knnd())
        with self.assertRaises(grpc.RpcError) as err:
            client.search(np.ones((1, 16), np.float32), 3)
        self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("dim=16 does not match the index dimension 48",
                      err.exception.details())

    def test_deadline_is_respected(self):
        import grpc
        client = self.client(self.start_knnd())
        big = np.tile(self.xb[:1024], (4, 1))
        start = time.monotonic()
        with self.assertRaises(grpc.RpcError) as err:
            client.search(big, 100, 64, timeout_s=0.005)
        self.assertEqual(err.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertLess(time.monotonic() - start, 0.5)
        # The server dropped that work and still answers.
        ids, _ = client.search(self.xb[:2], 5, timeout_s=10)
        self.assertEqual(ids[:, 0].tolist(), [0, 1])

    def test_full_gate_is_retried_after_pushback_until_all_succeed(self):
        import grpc
        from knnd_client import RetryPolicy
        from knnd.v1 import knn_service_pb2 as raw_pb
        from knnd.v1 import knn_service_pb2_grpc as raw_grpc
        # One 256-row request fills the gate; one worker; pushback 100 ms.
        addr = self.start_knnd(
            "num_workers: 1\nmax_inflight_queries: 256\n"
            "max_queries_per_request: 256\nmax_inflight_bytes: 0\n"
            "retry_pushback_ms: 100\n")
        q = self.xb[:256]
        retries = []

        class Record(logging.Handler):
            def emit(self, record):
                retries.append(record.args)
        logger = logging.getLogger("knnd_client")
        handler = Record()
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        self.addCleanup(logger.removeHandler, handler)
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
            "max_connection_age_ms: 300\nmax_connection_age_grace_ms: 100\n"))
        self.assertIsNotNone(aged, "the server never closed the connection")
        self.assertIsNone(seconds_until_not_ready(self.start_knnd()),
                          "with the 5 minute default the connection stays open")


def install_and_rerun(args):
    """Outside the venv: installs the client into a new one and runs this
    script again from there."""
    if os.environ.get(VENV_ENV) is None:
        with tempfile.TemporaryDirectory() as tmp:
            python = install_client(args.source_dir, tmp)
            env = dict(os.environ, **{VENV_ENV: tmp})
            sys.exit(subprocess.call([python, "-W", "ignore", *sys.argv], env=env))


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True, setup=install_and_rerun)
