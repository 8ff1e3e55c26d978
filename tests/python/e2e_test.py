#!/usr/bin/python3
"""knnd as a Python API service sees it: a client generated from the .proto
files, an index built with python3-faiss, answers compared with
python3-faiss on the same file, and bad inputs. (SIGTERM under load is
shutdown_test.py's.)

  e2e_test.py --knnd BUILD/knnd --source-dir . [unittest args]
"""
import os
import tempfile
import unittest

import numpy as np

from knnd_harness import Daemon, build_test_index, generate_stubs, unittest_main

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

        cls.path = os.path.join(cls.tmp.name, "py.index")
        cls.xb = build_test_index(cls.path, seed=7)
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
             "no queries"),
            (pb.SearchRequest(vectors_f32le=np.zeros((4097, 48), "<f4").tobytes(), k=3),
             grpc.StatusCode.INVALID_ARGUMENT,
             "num_queries=4097 exceeds max_queries_per_request=4096"),
            # Over the largest message (32 MiB with the default headroom):
            # gRPC's check, or its memory quota's when the bytes arrive
            # faster than gRPC checks the length.
            (pb.SearchRequest(vectors_f32le=b"\0" * (65 << 20), k=3),
             grpc.StatusCode.RESOURCE_EXHAUSTED,
             ("larger than max", "RST_STREAM with error code 11")),
        ]
        for request, code, message in cases:
            with self.assertRaises(grpc.RpcError) as err:
                self.stub.Search(request, timeout=30)
            self.assertEqual(err.exception.code(), code, err.exception.details())
            messages = message if isinstance(message, tuple) else (message,)
            self.assertTrue(any(m in err.exception.details() for m in messages),
                            err.exception.details())
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


if __name__ == "__main__":
    unittest_main(__doc__)
