"""Attribute filters end to end, as a Python service uses them: `knnctl
build --attributes` over seeded data with its own 63-bit ids and JSON Lines
attributes written one line per row with json.dumps, knnd serving it, and
the knnd-client (installed from clients/python) searching it with filter
dicts. Every answer holds only rows the filter admits, and matches an exact
numpy/FAISS search over those rows (recall@10 >= 0.95) at selectivities from
0.1% to 99%; a filter matching nothing is an empty, padded answer; bad
dicts and unknown attributes are refused naming the key or field;
ShardedKnnClient over the same build in 2 shards filters on both.

Run by ctest (python_filters); by hand:
  /usr/bin/python3 tests/python/filters_test.py --knnd build/knnd \\
      --knnctl build/knnctl --source-dir .
"""
import datetime
import json
import os
import subprocess
import tempfile
import unittest

import grpc
import numpy as np

from knnd_harness import Daemon, install_client, stop_all, unittest_main

ARGS = None
ROWS = 6000
DIM = 32
K = 10
GENRES = ["news", "sport", "arts", "tech"]
START = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)


def recall(ids, truth):
    """recall@K of `ids` against `truth`, both (queries, K); -1 ignored."""
    hits = [len(set(a) & set(b) - {-1}) / max(1, len(set(b) - {-1}))
            for a, b in zip(ids, truth)]
    return float(np.mean(hits))


class FiltersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        install_client(ARGS.source_dir, cls.tmp.name)
        rng = np.random.default_rng(11)
        centres = rng.standard_normal((40, DIM)).astype("float32") * 4
        def sample(n):
            return (centres[rng.integers(0, 40, n)]
                    + rng.standard_normal((n, DIM))).astype("float32")
        cls.xb = sample(ROWS)
        cls.xq = sample(100)
        cls.ids = rng.integers(0, 2**63 - 1, ROWS, dtype=np.int64)
        # The columns, as numpy arrays for the reference masks.
        cls.u = rng.integers(0, 100000, ROWS)
        cls.genre = rng.integers(0, len(GENRES), ROWS)
        cls.has_genre = np.arange(ROWS) % 7 != 0
        cls.tags = [sorted(set(rng.choice(10, rng.integers(0, 4)).tolist()))
                    for _ in range(ROWS)]
        cls.price = rng.random(ROWS)
        cls.hours = np.arange(ROWS)
        base = os.path.join(cls.tmp.name, "base.npy")
        ids = os.path.join(cls.tmp.name, "ids.npy")
        attrs = os.path.join(cls.tmp.name, "attrs.jsonl")
        np.save(base, cls.xb)
        np.save(ids, cls.ids)
        with open(attrs, "w") as f:
            for r in range(ROWS):
                meta = {"u": int(cls.u[r]),
                        "tags": [f"t{t}" for t in cls.tags[r]],
                        "price": float(cls.price[r]),
                        "at": (START + datetime.timedelta(hours=r)).strftime(
                            "%Y-%m-%dT%H:%M:%SZ")}
                if cls.has_genre[r]:
                    meta["genre"] = GENRES[cls.genre[r]]
                f.write(json.dumps(meta) + "\n")

        def build(name, *extra):
            path = os.path.join(cls.tmp.name, name)
            subprocess.run([ARGS.knnctl, "build", "--input", base, "--output",
                            path, "--nlist", "64", "--m", "16", "--ids", ids,
                            "--attributes", attrs, *extra],
                           check=True, capture_output=True)
            return path
        whole = build("whole.index")
        split = build("split.index", "--shards", "2")
        cls.daemons = {}
        for name, path in [("whole", whole),
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

    def client(self):
        from knnd_client import KnnClient
        return KnnClient(self.daemons["whole"].address, timeout_s=30)

    def truth(self, mask):
        """The exact K nearest ids among the rows of `mask`, -1 padded."""
        import faiss
        rows = np.flatnonzero(mask)
        out = np.full((len(self.xq), K), -1, dtype=np.int64)
        if len(rows) == 0:
            return out
        flat = faiss.IndexFlatL2(DIM)
        flat.add(self.xb[rows])
        _, found = flat.search(self.xq, min(K, len(rows)))
        out[:, :found.shape[1]] = self.ids[rows[found]]
        return out

    def cases(self):
        """(filter dict, the mask of rows it admits) pairs."""
        news = self.has_genre & (self.genre == 0)
        has_t3 = np.array([3 in t for t in self.tags])
        has_t1_or_t8 = np.array([1 in t or 8 in t for t in self.tags])
        return [
            ({"u": {"$lt": 100}}, self.u < 100),                  # 0.1%
            ({"u": {"$lt": 1000}}, self.u < 1000),                # 1%
            ({"u": {"$gte": 10000, "$lt": 20000}},
             (self.u >= 10000) & (self.u < 20000)),              # 10%
            ({"u": {"$lt": 50000}}, self.u < 50000),              # 50%
            ({"u": {"$lt": 99000}}, self.u < 99000),              # 99%
            ({"genre": "news"}, news),
            ({"genre": {"$ne": "news"}}, ~news),
            ({"genre": {"$exists": False}}, ~self.has_genre),
            ({"tags": "t3", "price": {"$lte": 0.5}},
             has_t3 & (self.price <= 0.5)),
            ({"tags": {"$in": ["t1", "t8"]}}, has_t1_or_t8),
            ({"$or": [{"genre": "arts"}, {"u": {"$gt": 95000}}]},
             (self.has_genre & (self.genre == 2)) | (self.u > 95000)),
            ({"$not": {"genre": {"$in": ["news", "tech"]}}},
             ~(self.has_genre & ((self.genre == 0) | (self.genre == 3)))),
            ({"at": {"$gte": START + datetime.timedelta(hours=5900)}},
             self.hours >= 5900),
            ({"$and": [{"u": {"$lt": 3000}}, {"genre": "sport"}]},
             (self.u < 3000) & self.has_genre & (self.genre == 1)),
        ]

    def check(self, search, what_prefix):
        # refine_factor 32 (in the callers): with 4-bit codes over 32 dims,
        # 8 x k candidates hold about 0.9 of the true neighbours filtered
        # or not; 32 x k hold them all.
        for spec, mask in self.cases():
            what = f"{what_prefix} {spec} ({mask.sum()} rows)"
            got = search(spec).ids
            allowed = set(self.ids[mask].tolist())
            found = got[got >= 0]
            self.assertTrue(set(found.tolist()) <= allowed, what)
            # k matches whenever k rows match.
            self.assertTrue(((got >= 0).sum(axis=1)
                             == min(K, int(mask.sum()))).all(), what)
            self.assertGreaterEqual(recall(got, self.truth(mask)), 0.95, what)

    def test_dict_filters_match_an_exact_search_of_the_rows_they_admit(self):
        client = self.client()
        names = [c.name for c in client.info().attributes]
        self.assertEqual(sorted(names), ["at", "genre", "price", "tags", "u"])
        self.check(lambda spec: client.search(self.xq, K, 32, filter=spec,
                                              refine_factor=32), "whole")

    def test_a_filter_matching_nothing_is_an_empty_padded_answer(self):
        result = self.client().search(self.xq[:3], K, 8,
                                      filter={"genre": "opera"})
        got, distances = result.ids, result.distances
        self.assertTrue((got == -1).all())
        self.assertTrue(np.isinf(distances).all())

    def test_bad_filters_are_refused_naming_the_key_or_field(self):
        client = self.client()
        for spec, says in [({"u": {"$gtx": 1}}, "filter['u']['$gtx']"),
                           ({"$and": []}, "filter['$and']"),
                           ({"u": {"$in": []}}, "filter['u']['$in']"),
                           ({"u": True}, "filter['u']"),
                           ({"at": {"$gte": datetime.datetime(2020, 1, 1)}},
                            "timezone")]:
            with self.assertRaises(ValueError) as err:
                client.search(self.xq[:1], K, filter=spec)
            self.assertIn(says, str(err.exception))
        with self.assertRaises(grpc.RpcError) as err:
            client.search(self.xq[:1], K, filter={"year": 2020})
        self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn('unknown attribute "year"', err.exception.details())
        with self.assertRaises(grpc.RpcError) as err:
            client.search(self.xq[:1], K, filter={"genre": 3})
        self.assertIn('"genre" has type keyword', err.exception.details())

    def test_sharded_client_filters_on_every_shard(self):
        from knnd_client import ShardedKnnClient
        sharded = ShardedKnnClient([self.daemons["shard1"].address,
                                    self.daemons["shard0"].address],
                                   timeout_s=30)
        self.check(lambda spec: sharded.search(self.xq, K, 32, filter=spec,
                                               refine_factor=32), "sharded")


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True)
