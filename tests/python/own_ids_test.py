"""Own ids end to end, as a Python service uses them: `knnctl build --ids`
over seeded data with 63-bit ids in no order, knnd serving the index, and
the knnd-client (installed from clients/python) searching it. Answers carry
the user's ids, with the recall of the same build with row ids at every
setting; allow-lists are the user's ids; ShardedKnnClient over the same
build split in 2 shards (each with its slice of the id table) merges to the
unsharded answer, and serves the defaults the set was tuned to as one
(`knnctl tune --shards 2`).

Run by ctest (python_own_ids); by hand:
  /usr/bin/python3 tests/python/own_ids_test.py --knnd build/knnd \\
      --knnctl build/knnctl --source-dir .
"""
import os
import subprocess
import tempfile
import unittest

import numpy as np

from knnd_harness import Daemon, install_client, stop_all, unittest_main

ARGS = None
ROWS = 6000
DIM = 32
K = 10


def recall(ids, truth):
    """recall@K of `ids` against `truth`, both (queries, K)."""
    return np.mean([len(set(a) & set(b)) / K for a, b in zip(ids, truth)])


class OwnIdsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import faiss
        cls.tmp = tempfile.TemporaryDirectory()
        install_client(ARGS.source_dir, cls.tmp.name)
        rng = np.random.default_rng(7)
        centres = rng.standard_normal((40, DIM)).astype("float32") * 4
        def sample(n):
            return (centres[rng.integers(0, 40, n)]
                    + rng.standard_normal((n, DIM))).astype("float32")
        cls.xb = sample(ROWS)
        cls.xq = sample(200)
        cls.ids = rng.integers(0, 2**63 - 1, ROWS, dtype=np.int64)
        assert len(np.unique(cls.ids)) == ROWS
        flat = faiss.IndexFlatL2(DIM)
        flat.add(cls.xb)
        cls.truth = flat.search(cls.xq, K)[1]  # rows
        base = os.path.join(cls.tmp.name, "base.npy")
        ids = os.path.join(cls.tmp.name, "ids.npy")
        np.save(base, cls.xb)
        np.save(ids, cls.ids)

        def build(name, *extra):
            path = os.path.join(cls.tmp.name, name)
            subprocess.run([ARGS.knnctl, "build", "--input", base, "--output",
                            path, "--nlist", "64", "--m", "16", *extra],
                           check=True, capture_output=True)
            return path
        rows = build("rows.index")
        own = build("own.index", "--ids", ids)
        # Tuned as a row-id index is: it records re-ranking as the default.
        for path in (rows, own):
            subprocess.run([ARGS.knnctl, "tune", "--index", path,
                            "--target_recall", "0.95", "--sample", "300"],
                           check=True, capture_output=True)
        split = build("split.index", "--ids", ids, "--shards", "2")
        # One decision for the set, in both shards' sidecars.
        subprocess.run([ARGS.knnctl, "tune", "--index", split, "--shards",
                        "2", "--target_recall", "0.95", "--sample", "300"],
                       check=True, capture_output=True)
        cls.daemons = {}
        for name, path in [("rows", rows), ("own", own),
                           ("shard0", split + ".shard-0-of-2"),
                           ("shard1", split + ".shard-1-of-2")]:
            daemon = Daemon(ARGS.knnd, ["--index", path],
                            log_path=os.path.join(cls.tmp.name, name + ".log"),
                            knnctl=ARGS.knnctl)
            cls.daemons[name] = daemon
            if not daemon.wait_serving(60):
                cls.tearDownClass()
                raise RuntimeError(f"knnd ({name}) did not start: "
                                   + daemon.read_log())

    @classmethod
    def tearDownClass(cls):
        stop_all(cls.daemons.values(), 30)
        cls.tmp.cleanup()

    def client(self, name):
        from knnd_client import KnnClient
        return KnnClient(self.daemons[name].address, timeout_s=30)

    def test_answers_carry_own_ids_with_the_recall_of_row_ids(self):
        own, rows = self.client("own"), self.client("rows")
        self.assertTrue(own.info().has_vectors)
        known = set(self.ids.tolist())
        for nprobe in (2, 8, 64):
            for refine in (None, 0, 4):
                got = own.search(self.xq, K, nprobe, refine_factor=refine).ids
                want = rows.search(self.xq, K, nprobe,
                                   refine_factor=refine).ids
                what = f"nprobe {nprobe} refine {refine}"
                self.assertTrue(set(got.ravel().tolist()) <= known, what)
                own_recall = recall(got, self.ids[self.truth])
                row_recall = recall(want, self.truth)
                # Equal estimates at the candidates' edge are taken by id,
                # not by row; under a sanitizer on a loaded machine the two
                # differed by 0.0075 once (nprobe 2, the default refine):
                # held to the bound, 2% of recall.
                self.assertAlmostEqual(own_recall, row_recall,
                                       delta=0.02 * row_recall,
                                       msg=what)
        # knnctl tune chose re-ranking, as it does for row ids (setUpClass):
        # the served default beats PQ alone.
        default = recall(own.search(self.xq, K, 64).ids, self.ids[self.truth])
        pq_only = recall(own.search(self.xq, K, 64, refine_factor=0).ids,
                         self.ids[self.truth])
        self.assertGreater(default, pq_only)
        self.assertGreaterEqual(default, 0.95)

    def test_allowed_ids_are_the_users_ids(self):
        own = self.client("own")
        allowed_rows = np.arange(0, ROWS, 5)
        allowed = self.ids[allowed_rows]
        got = own.search(self.xq, K, 64, allowed_ids=allowed).ids
        self.assertTrue(set(got.ravel().tolist()) <= set(allowed.tolist()))
        import faiss
        flat = faiss.IndexFlatL2(DIM)
        flat.add(self.xb[allowed_rows])
        truth = allowed[flat.search(self.xq, K)[1]]
        self.assertGreaterEqual(recall(got, truth), 0.95)
        # Ids the index does not hold match nothing.
        none = own.search(self.xq[:3], K, 8, allowed_ids=[1, 2, 3]).ids
        self.assertTrue((none == -1).all())

    def test_sharded_client_serves_the_set_tuned_as_one(self):
        # Requests that set no nprobe or refine_factor: every shard applies
        # the one tuned decision, so the answers merge, and they are the
        # whole index's answers at that setting.
        from knnd_client import ShardedKnnClient
        sharded = ShardedKnnClient([self.daemons["shard1"].address,
                                    self.daemons["shard0"].address],
                                   timeout_s=30)
        self.addCleanup(sharded.close)
        infos = sharded.info()
        defaults = {(i.defaults_source, i.default_nprobe,
                     i.default_refine_factor) for i in infos}
        self.assertEqual(len(defaults), 1, defaults)
        source, nprobe, refine = defaults.pop()
        self.assertEqual(source, "tuned")
        self.assertGreater(refine, 0)
        result = sharded.search(self.xq, K)
        got, got_d = result.ids, result.distances
        result = self.client("own").search(self.xq, K, nprobe,
                                           refine_factor=refine)
        want, want_d = result.ids, result.distances
        np.testing.assert_array_equal(got_d, want_d)
        self.assertAlmostEqual(recall(got, self.ids[self.truth]),
                               recall(want, self.ids[self.truth]), delta=0.01)

    def test_sharded_client_merges_own_id_shards_to_the_whole_answer(self):
        from knnd_client import ShardedKnnClient
        sharded = ShardedKnnClient([self.daemons["shard1"].address,
                                    self.daemons["shard0"].address],
                                   timeout_s=30)
        whole = self.client("own")
        for refine in (0, 4):
            result = sharded.search(self.xq, K, 8, refine_factor=refine)
            got, got_d = result.ids, result.distances
            result = whole.search(self.xq, K, 8, refine_factor=refine)
            want, want_d = result.ids, result.distances
            np.testing.assert_array_equal(got_d, want_d)
            # Equal distances hold the same ids, but at the K-th place,
            # where which of a tie is returned may differ.
            for q in range(len(self.xq)):
                last = want_d[q, -1]
                for d in set(want_d[q].tolist()) - {last}:
                    self.assertEqual(set(got[q][got_d[q] == d].tolist()),
                                     set(want[q][want_d[q] == d].tolist()),
                                     f"refine {refine} query {q}")


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True)
