#!/usr/bin/python3
"""The floors make bench measures knnd against (bench/noop_server): the
no-op server answers with results of the right shape and no search, and the
bare FAISS server (`--index`) answers exactly what FAISS does on the same
file, and re-ranks exactly when the request asks (refine_factor, on an
index knnctl built with its INDEX.vectors). A floor that answered less than
knnd would flatter knnd's share.

  bench_floor_test.py --knnd BUILD/knnd --noop-server BUILD/bench/noop_server \
      --knnctl BUILD/knnctl --source-dir . [unittest args]
"""
import json
import os
import subprocess
import tempfile
import unittest

import numpy as np

from knnd_harness import (build_test_index, channel, free_port, generate_stubs,
                          unittest_main)

ARGS = None


class Floor:
    """A noop_server process on a free loopback port."""

    def __init__(self, *flags):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [ARGS.noop_server, "--port", str(self.port), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1"))
        line = self.proc.stdout.readline().strip()
        if line != "serving":
            self.proc.kill()
            raise AssertionError(f"noop_server did not start: {line} "
                                 f"{self.proc.stderr.read()}")
        self.channel = channel(f"127.0.0.1:{self.port}")
        self.search = self.channel.unary_unary(
            "/knnd.v1.KnnService/Search",
            request_serializer=pb.SearchRequest.SerializeToString,
            response_deserializer=pb.SearchResponse.FromString)

    def stop(self):
        self.channel.close()
        self.proc.terminate()
        self.proc.wait(30)


class BenchFloorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import faiss
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(ARGS.source_dir, cls.tmp.name)
        global grpc, pb
        import grpc
        from knnd.v1 import knn_service_pb2 as pb
        cls.path = os.path.join(cls.tmp.name, "floor.index")
        cls.xb = build_test_index(cls.path, seed=11)
        cls.faiss_index = faiss.read_index(cls.path)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def serve(self, *flags):
        floor = Floor(*flags)
        self.addCleanup(floor.stop)
        return floor

    def test_bare_server_answers_as_faiss(self):
        floor = self.serve("--index", self.path, "--nprobe", "6")
        q = self.xb[:64] + 0.1
        for nprobe in (1, 6, 32):
            self.faiss_index.nprobe = nprobe
            want_d, want_i = self.faiss_index.search(q, 10)
            r = floor.search(pb.SearchRequest(
                vectors_f32le=q.astype("<f4").tobytes(), k=10, nprobe=nprobe), timeout=10)
            self.assertEqual((r.num_queries, r.k, r.nprobe), (64, 10, nprobe))
            np.testing.assert_array_equal(np.array(r.ids).reshape(64, 10), want_i)
            np.testing.assert_allclose(np.array(r.distances).reshape(64, 10), want_d,
                                       rtol=1e-4, atol=1e-3)
        # The packed-float form, and --nprobe where the request names none.
        self.faiss_index.nprobe = 6
        _, want_i = self.faiss_index.search(q[:1], 5)
        r = floor.search(pb.SearchRequest(vectors=q[0].tolist(), dim=48, k=5), timeout=10)
        self.assertEqual(list(r.ids), want_i[0].tolist())
        self.assertEqual(r.nprobe, 6)

    def test_bare_server_reranks_as_the_request_asks(self):
        # peers_run.py sets it beside knnd at the same (nprobe,
        # refine_factor): without re-ranking it would measure less work.
        npy = os.path.join(self.tmp.name, "floor.npy")
        np.save(npy, self.xb)
        path = os.path.join(self.tmp.name, "rerank.index")
        subprocess.run([ARGS.knnctl, "build", "--input", npy, "--output", path],
                       check=True, capture_output=True, timeout=240)
        floor = self.serve("--index", path)
        q = self.xb[:32] + 0.1
        exact = ((q[:, None, :] - self.xb[None, :, :]) ** 2).sum(-1)
        truth = np.argsort(exact, axis=1)[:, :10]

        def search(refine=None):
            # refine None: a request that sets no refine_factor.
            request = pb.SearchRequest(
                vectors_f32le=q.astype("<f4").tobytes(), k=10, nprobe=8)
            if refine is not None:
                request.refine_factor = refine
            r = floor.search(request, timeout=10)
            return (np.array(r.ids).reshape(32, 10),
                    np.array(r.distances).reshape(32, 10))

        def exact_of(ids):
            return np.take_along_axis(exact, ids, axis=1)

        found = {}
        for refine in (0, 8):
            ids, d = search(refine)
            found[refine] = np.mean([len(set(a) & set(b)) / 10
                                     for a, b in zip(ids, truth)])
            if refine:
                # Exact distances of the returned rows, best first.
                np.testing.assert_allclose(d, exact_of(ids), rtol=1e-4,
                                           atol=1e-3)
                self.assertTrue(np.all(np.diff(d, axis=1) >= 0))
        self.assertGreater(found[8], found[0])
        self.assertGreaterEqual(found[8], 0.95)
        # A request that sets none: knnd's default, the sidecar's tuned
        # refine_factor (none before the tuning).
        ids, d = search()
        self.assertFalse(np.allclose(d, exact_of(ids), rtol=1e-4, atol=1e-3))
        floor.stop()
        subprocess.run([ARGS.knnctl, "tune", "--index", path, "--sample", "200",
                        "--target_recall", "0.99"],
                       check=True, capture_output=True, timeout=240)
        with open(path + ".meta.json") as f:
            meta = json.load(f)
        self.assertGreater(meta["tuned_refine_factor"], 0, meta)
        floor = self.serve("--index", path)
        ids, d = search()
        np.testing.assert_allclose(d, exact_of(ids), rtol=1e-4, atol=1e-3)

    def test_bare_server_refuses_what_it_cannot_search(self):
        floor = self.serve("--index", self.path)
        for request in (pb.SearchRequest(vectors=[1.0] * 47, k=3),
                        pb.SearchRequest(vectors=[1.0] * 48, dim=47, k=3),
                        pb.SearchRequest(vectors=[1.0] * 48, k=0)):
            with self.assertRaises(grpc.RpcError) as caught:
                floor.search(request, timeout=10)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        # Still serving after the refusals.
        r = floor.search(pb.SearchRequest(vectors=self.xb[0].tolist(), k=1), timeout=10)
        self.assertEqual(r.ids[0], 0)

    def test_noop_server_answers_the_shape_without_searching(self):
        floor = self.serve()
        q = self.xb[:7]
        r = floor.search(pb.SearchRequest(
            vectors_f32le=q.astype("<f4").tobytes(), dim=48, k=4), timeout=10)
        self.assertEqual((r.num_queries, r.k), (7, 4))
        self.assertEqual(list(r.ids), [-1] * 28)
        self.assertEqual(len(r.distances), 28)

    def test_bare_server_refuses_a_missing_index(self):
        proc = subprocess.run(
            [ARGS.noop_server, "--port", str(free_port()), "--index",
             os.path.join(self.tmp.name, "missing.index")],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("missing.index", proc.stderr)


if __name__ == "__main__":
    def add_arguments(p):
        p.add_argument("--noop-server", required=True)
        p.add_argument("--knnctl", required=True)
    unittest_main(__doc__, add_arguments=add_arguments)
