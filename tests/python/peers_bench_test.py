#!/usr/bin/python3
"""bench/peers_bench, knnd's in-process side of `make bench-peers`: each of
its threads searches with one OpenMP thread and OpenBLAS with one thread,
as knnd's workers do, whatever OMP_NUM_THREADS says. A thread started after
main() begins at the process's OpenMP default, and Debian's OpenBLAS starts
as many threads as OMP_NUM_THREADS (else cores): two bench threads on two
cores then measured knnd's 256-row calls at 0.7x-0.8x of what they are
(bench/RESULTS.md "The benches' threads and OpenMP"). And its threads share
the calls without changing an answer.

  peers_bench_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl \
      --peers-bench BUILD/bench/peers_bench --source-dir . [unittest args]
"""
import json
import os
import subprocess
import tempfile
import unittest

import numpy as np

from knnd_harness import unittest_main

ARGS = None
K = 10


class PeersBenchTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        rng = np.random.default_rng(5)
        centres = rng.standard_normal((30, 32)).astype("float32") * 4
        cls.xb = (centres[rng.integers(0, 30, 4000)]
                  + rng.standard_normal((4000, 32))).astype("float32")
        cls.xq = (cls.xb[rng.integers(0, 4000, 200)]
                  + 0.5 * rng.standard_normal((200, 32))).astype("float32")
        base = os.path.join(cls.tmp.name, "base.npy")
        cls.queries = os.path.join(cls.tmp.name, "queries.npy")
        np.save(base, cls.xb)
        np.save(cls.queries, cls.xq)
        cls.index = os.path.join(cls.tmp.name, "peers.index")
        subprocess.run([ARGS.knnctl, "build", "--input", base, "--output", cls.index,
                        "--threads", "1"], check=True, capture_output=True, timeout=240)
        exact = ((cls.xq[:, None, :] - cls.xb[None, :, :]) ** 2).sum(-1)
        cls.truth = np.argsort(exact, axis=1)[:, :K]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def bench(self, commands, omp_num_threads):
        """peers_bench's JSON line for each command (ROWS THREADS NPROBE
        REFINE REPS IDS_OUT), run with OMP_NUM_THREADS as given (None:
        unset)."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        if omp_num_threads is not None:
            env["OMP_NUM_THREADS"] = omp_num_threads
        proc = subprocess.run(
            [ARGS.peers_bench, "--index", self.index, "--queries", self.queries],
            input="".join(c + "\n" for c in commands), capture_output=True,
            text=True, env=env, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertTrue(lines[0].startswith("ready"), lines)
        return [json.loads(line) for line in lines[1:]]

    def ids(self, name):
        return np.fromfile(os.path.join(self.tmp.name, name),
                           dtype=np.int64).reshape(len(self.xq), K)

    def test_each_thread_runs_one_openmp_and_one_openblas_thread(self):
        for omp in ("3", None):
            with self.subTest(OMP_NUM_THREADS=omp):
                results = self.bench(["64 2 4 4 2 -", "0 1 4 4 1 -"], omp)
                self.assertEqual([r["queries"] for r in results], [800, 200])
                for r in results:
                    self.assertEqual((r["omp_threads"], r["blas_threads"]), (1, 1))

    def test_two_threads_answer_as_one(self):
        one, two = self.bench([f"64 1 8 4 1 {self.tmp.name}/one.ids",
                               f"64 2 8 4 3 {self.tmp.name}/two.ids"], None)
        self.assertEqual((one["queries"], two["queries"]), (200, 1200))
        np.testing.assert_array_equal(self.ids("two.ids"), self.ids("one.ids"))
        recall = np.mean([len(set(a) & set(b)) / K
                          for a, b in zip(self.ids("one.ids"), self.truth)])
        self.assertGreater(recall, 0.9)


if __name__ == "__main__":
    def add_arguments(p):
        p.add_argument("--knnctl", required=True)
        p.add_argument("--peers-bench", required=True)
    unittest_main(__doc__, add_arguments=add_arguments)
