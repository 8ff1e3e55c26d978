#!/usr/bin/python3
"""knnd as a Python API service sees it: a client generated from the .proto
files, an index built with python3-faiss, answers compared with
python3-faiss on the same file, bad inputs, and SIGTERM under load.

  e2e_test.py --knnd BUILD/knnd --source-dir . [unittest args]
"""
import collections
import os
import signal
import tempfile
import threading
import time
import unittest

import numpy as np

from knnd_harness import Daemon, generate_stubs, unittest_main

ARGS = None


class KnndTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import faiss
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(ARGS.source_dir, cls.tmp.name)
        global grpc, pb
        import grpc
        from knnd.v1 import knn_service_pb2 as pb

        rng = np.random.default_rng(7)
        centres = rng.standard_normal((40, 48)).astype("float32") * 4
        cls.xb = (centres[rng.integers(0, 40, 20000)]
                  + rng.standard_normal((20000, 48))).astype("float32")
        cls.path = os.path.join(cls.tmp.name, "py.index")
        index = faiss.index_factory(48, "IVF64,PQ12")
        # index_factory turns polysemous training on; it takes minutes here.
        faiss.downcast_index(faiss.extract_index_ivf(index)).do_polysemous_training = False
        index.train(cls.xb)
        index.add(cls.xb)
        faiss.extract_index_ivf(index).nprobe = 6
        faiss.write_index(index, cls.path)
        cls.faiss_index = faiss.read_index(cls.path)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def start(self, *extra):
        self.daemon = Daemon(ARGS.knnd, ["--index", self.path, "--workers", "2", *extra],
                             log_path=os.path.join(self.tmp.name, "knnd.log"))
        self.proc = self.daemon.proc
        self.assertTrue(self.daemon.wait_serving(60),
                        "knnd did not become SERVING: " + self.read_log())
        self.stub = self.daemon.stub()

    def read_log(self):
        return self.daemon.read_log()

    def tearDown(self):
        if getattr(self, "daemon", None):
            self.daemon.stop()

    def test_results_match_python_faiss(self):
        self.start()
        q = self.xb[:100] + 0.1
        for nprobe in (1, 6, 32):
            self.faiss_index.nprobe = nprobe
            want_d, want_i = self.faiss_index.search(q, 10)
            # numpy's tobytes(): no per-float encoding.
            r = self.stub.Search(pb.SearchRequest(
                vectors_f32le=q.astype("<f4").tobytes(), dim=48, k=10,
                nprobe=nprobe))
            ids = np.array(r.ids, dtype=np.int64).reshape(100, 10)
            np.testing.assert_array_equal(ids, want_i)
            np.testing.assert_allclose(
                np.array(r.distances).reshape(100, 10), want_d, rtol=1e-4, atol=1e-3)
            self.assertEqual(r.nprobe, nprobe)
            self.assertEqual(r.metric, pb.METRIC_L2)
        # The packed-float form and the default nprobe (saved in the file).
        self.faiss_index.nprobe = 6
        _, want_i = self.faiss_index.search(q[:1], 5)
        r = self.stub.Search(pb.SearchRequest(vectors=q[0].tolist(), k=5))
        self.assertEqual(list(r.ids), want_i[0].tolist())
        self.assertEqual(r.nprobe, 6)

    def test_bad_inputs_get_precise_statuses(self):
        self.start()
        good = pb.SearchRequest(vectors_f32le=self.xb[:1].tobytes(), k=3)
        cases = [
            (pb.SearchRequest(vectors=[1.0] * 47, k=3),
             grpc.StatusCode.INVALID_ARGUMENT, "not a multiple of dim=48"),
            (pb.SearchRequest(vectors=[1.0] * 48, dim=32, k=3),
             grpc.StatusCode.INVALID_ARGUMENT, "dim=32 does not match"),
            (pb.SearchRequest(vectors=[1.0] * 48, k=0),
             grpc.StatusCode.INVALID_ARGUMENT, "k=0 must be positive"),
            (pb.SearchRequest(vectors=[1.0] * 48, k=5000),
             grpc.StatusCode.INVALID_ARGUMENT, "k=5000 exceeds max_k=1024"),
            (pb.SearchRequest(vectors=[1.0] * 48, k=3, nprobe=65),
             grpc.StatusCode.INVALID_ARGUMENT, "nprobe=65 is outside [1, 64]"),
            (pb.SearchRequest(vectors=[float("nan")] * 48, k=3),
             grpc.StatusCode.INVALID_ARGUMENT, "non-finite"),
            (pb.SearchRequest(vectors_f32le=b"\0" * 100, k=3),
             grpc.StatusCode.INVALID_ARGUMENT, "not a multiple of 4*dim=192"),
            (pb.SearchRequest(k=3), grpc.StatusCode.INVALID_ARGUMENT,
             "no query vectors"),
            (pb.SearchRequest(vectors_f32le=np.zeros((4097, 48), "<f4").tobytes(), k=3),
             grpc.StatusCode.INVALID_ARGUMENT,
             "num_queries=4097 exceeds max_queries_per_request=4096"),
            (pb.SearchRequest(vectors_f32le=b"\0" * (65 << 20), k=3),
             grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
        ]
        for request, code, message in cases:
            with self.assertRaises(grpc.RpcError) as err:
                self.stub.Search(request, timeout=30)
            self.assertEqual(err.exception.code(), code, err.exception.details())
            self.assertIn(message, err.exception.details())
            self.assertEqual(len(self.stub.Search(good).ids), 3)

    def test_allow_list(self):
        self.start()
        allowed = [5, 50, 500, 5000, 19999]
        r = self.stub.Search(pb.SearchRequest(
            vectors_f32le=self.xb[:8].tobytes(), k=10, nprobe=64,
            allowed_ids=allowed))
        ids = np.array(r.ids).reshape(8, 10)
        for row in ids:
            self.assertEqual(sorted(row[:5].tolist()), allowed)
            self.assertEqual(row[5:].tolist(), [-1] * 5)
        self.assertTrue(np.isinf(np.array(r.distances).reshape(8, 10)[:, 5:]).all())

    def test_sigterm_under_load_answers_every_request_and_exits_zero(self):
        self.start()
        outcomes = []
        lock = threading.Lock()
        stop = threading.Event()

        def client(seed):
            rng = np.random.default_rng(seed)
            while not stop.is_set():
                n = int(rng.integers(1, 200))
                q = self.xb[rng.integers(0, 20000, n)]
                try:
                    r = self.stub.Search(pb.SearchRequest(
                        vectors_f32le=q.tobytes(), k=10, nprobe=32), timeout=60)
                    ok = len(r.ids) == n * 10 and min(r.ids) >= 0
                    result = "OK" if ok else "BAD_RESULT"
                except grpc.RpcError as e:
                    result = e.code().name
                with lock:
                    outcomes.append(result)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        stop.set()
        for t in threads:
            t.join(timeout=60)
            self.assertFalse(t.is_alive(), "a request was left without an answer")
        self.assertEqual(code, 0, self.read_log())
        self.assertGreater(outcomes.count("OK"), 10)
        # After SIGTERM new requests are refused: UNAVAILABLE while draining
        # and once the port is closed, CANCELLED for one that reaches gRPC in
        # the instant it shuts down. Every admitted request finished (the
        # drain waits for them), none was answered wrongly.
        counts = collections.Counter(outcomes)
        self.assertEqual(set(counts) - {"OK", "UNAVAILABLE", "CANCELLED"}, set(),
                         counts)
        self.assertIn("drained", self.read_log())


if __name__ == "__main__":
    unittest_main(__doc__)
