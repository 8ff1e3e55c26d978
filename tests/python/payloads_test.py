"""Payloads end to end, as a Python service uses them: `knnctl build
--payloads` (JSON Lines: objects and plain strings) over seeded data with
own 63-bit ids, knnd serving the index, and the knnd-client searching with
payloads=True or named fields: each result's payload as a dict aligned
with its id (None for -1), the payload of the row the id names. Errors:
an unknown field (INVALID_ARGUMENT naming the fields) and payloads of an
index without them (FAILED_PRECONDITION). ShardedKnnClient over the same
build split in 2 shards (each with its rows' payloads) merges to the
unsharded answer, payloads included; so does knnd's own shard front.

Run by ctest (python_payloads); by hand:
  /usr/bin/python3 tests/python/payloads_test.py --knnd build/knnd \\
      --knnctl build/knnctl --source-dir .
"""
import json
import os
import subprocess
import tempfile
import unittest

import grpc
import numpy as np

from knnd_harness import Daemon, install_client, stop_all, unittest_main

ARGS = None
ROWS = 3000
DIM = 16
K = 5


class PayloadsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        install_client(ARGS.source_dir, cls.tmp.name)
        rng = np.random.default_rng(3)
        cls.xb = rng.standard_normal((ROWS, DIM)).astype("float32")
        cls.xq = rng.standard_normal((20, DIM)).astype("float32")
        cls.ids = rng.integers(0, 2**63 - 1, ROWS, dtype=np.int64)
        # Row r's payload: every 7th a plain string (stored as {"text"}),
        # the others objects; "page" only on even rows.
        cls.payloads = []
        for r in range(ROWS):
            if r % 7 == 0:
                cls.payloads.append(f"plain text of row {r}")
            else:
                p = {"text": f"chunk {r}: caf\u00e9 \"{r}\"",
                     "source": f"doc{r % 13}.pdf", "id": int(cls.ids[r])}
                if r % 2 == 0:
                    p["page"] = r // 2
                cls.payloads.append(p)
        base = os.path.join(cls.tmp.name, "base.npy")
        ids = os.path.join(cls.tmp.name, "ids.npy")
        lines = os.path.join(cls.tmp.name, "payloads.jsonl")
        np.save(base, cls.xb)
        np.save(ids, cls.ids)
        with open(lines, "w", encoding="utf-8") as out:
            for p in cls.payloads:
                out.write(json.dumps(p) + "\n")

        def build(name, *extra):
            path = os.path.join(cls.tmp.name, name)
            subprocess.run([ARGS.knnctl, "build", "--input", base, "--output",
                            path, "--nlist", "16", "--ids", ids, *extra],
                           check=True, capture_output=True)
            return path
        whole = build("whole.index", "--payloads", lines)
        bare = build("bare.index")
        split = build("split.index", "--payloads", lines, "--shards", "2")
        cls.daemons = {}
        shard_paths = [split + ".shard-0-of-2", split + ".shard-1-of-2"]
        for name, args in [("whole", ["--index", whole]),
                           ("bare", ["--index", bare]),
                           ("shard0", ["--index", shard_paths[0]]),
                           ("shard1", ["--index", shard_paths[1]])]:
            cls.start(name, args)
        cls.start("front", ["--shard_targets",
                            cls.daemons["shard0"].address + "," +
                            cls.daemons["shard1"].address])

    @classmethod
    def start(cls, name, args):
        daemon = Daemon(ARGS.knnd, args,
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
        client = KnnClient(self.daemons[name].address, timeout_s=30)
        self.addCleanup(client.close)
        return client

    def stored(self, vector_id, fields=None):
        """The payload of the row holding `vector_id`, as knnd returns it
        (None for -1)."""
        if vector_id < 0:
            return None
        row = int(np.flatnonzero(self.ids == vector_id)[0])
        p = self.payloads[row]
        p = {"text": p} if isinstance(p, str) else p
        return p if fields is None else {f: p[f] for f in fields if f in p}

    def test_payloads_come_with_their_ids(self):
        whole = self.client("whole")
        info = whole.info()
        self.assertTrue(info.has_payloads)
        self.assertEqual(list(info.payload_fields),
                         ["text", "source", "id", "page"])
        result = whole.search(self.xq, K, 16)
        ids, distances = result.ids, result.distances
        result = whole.search(self.xq, K, 16, payloads=True)
        got_ids, got_d, payloads = result.ids, result.distances, result.payloads
        np.testing.assert_array_equal(got_ids, ids)
        np.testing.assert_array_equal(got_d, distances)
        self.assertEqual(len(payloads), len(self.xq))
        for q, row in enumerate(payloads):
            self.assertEqual(len(row), K)
            for j, p in enumerate(row):
                self.assertEqual(p, self.stored(ids[q, j]))
        some = whole.search(self.xq, K, 16, payloads=["page", "id"]).payloads
        for q, row in enumerate(some):
            for j, p in enumerate(row):
                self.assertEqual(p, self.stored(ids[q, j], ["page", "id"]))
                self.assertEqual(list(p), [f for f in ("id", "page") if f in p])
        # A row with fewer than K reachable neighbours pads with None.
        allowed = self.ids[:2]
        result = whole.search(self.xq[:1], K, 16, allowed_ids=allowed,
                              payloads=True)
        pad_ids, padded = result.ids, result.payloads
        self.assertEqual(padded[0][2:], [None] * (K - 2))
        self.assertEqual(padded[0][0], self.stored(pad_ids[0, 0]))

    def test_unknown_fields_and_indexes_without_payloads_are_refused(self):
        with self.assertRaises(grpc.RpcError) as raised:
            self.client("whole").search(self.xq[:1], K, payloads=["title"])
        self.assertEqual(raised.exception.code(),
                         grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn('"title"', raised.exception.details())
        self.assertIn("text, source, id, page", raised.exception.details())
        with self.assertRaises(grpc.RpcError) as raised:
            self.client("bare").search(self.xq[:1], K, payloads=True)
        self.assertEqual(raised.exception.code(),
                         grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("has no payloads", raised.exception.details())
        with self.assertRaises(TypeError):
            self.client("whole").search(self.xq[:1], K, payloads="text")

    def test_async_clients_return_the_same_payloads(self):
        import asyncio
        from knnd_client import AsyncKnnClient, AsyncShardedKnnClient
        result = self.client("whole").search(self.xq, K, 16,
                                             payloads=["text"])
        ids, payloads = result.ids, result.payloads

        async def main():
            async with AsyncKnnClient(self.daemons["whole"].address) as one:
                whole = await one.search(self.xq, K, 16, payloads=["text"])
            async with AsyncShardedKnnClient(
                    [self.daemons["shard0"].address,
                     self.daemons["shard1"].address]) as shards:
                sharded = await shards.search(self.xq, K, 16,
                                              payloads=["text"])
            return whole, sharded
        whole, sharded = asyncio.run(main())
        np.testing.assert_array_equal(whole.ids, ids)
        self.assertEqual(whole.payloads, payloads)
        for q in range(len(self.xq)):
            for j in range(K):
                self.assertEqual(sharded.payloads[q][j],
                                 self.stored(sharded.ids[q, j], ["text"]))

    def test_shards_merge_to_the_whole_answer_with_payloads(self):
        from knnd_client import ShardedKnnClient
        sharded = ShardedKnnClient([self.daemons["shard1"].address,
                                    self.daemons["shard0"].address],
                                   timeout_s=30)
        self.addCleanup(sharded.close)
        whole = self.client("whole")
        front = self.client("front")
        self.assertTrue(front.info().has_payloads)
        for refine in (0, 4):
            result = whole.search(
                self.xq, K, 16, refine_factor=refine, payloads=True)
            want_ids, want_d, want_p = (result.ids, result.distances,
                                        result.payloads)
            for name, client in (("ShardedKnnClient", sharded),
                                 ("shard front", front)):
                what = f"{name} refine {refine}"
                result = client.search(
                    self.xq, K, 16, refine_factor=refine, payloads=True)
                got_ids, got_d, got_p = (result.ids, result.distances,
                                         result.payloads)
                np.testing.assert_array_equal(got_d, want_d, what)
                for q in range(len(self.xq)):
                    for j in range(K):
                        # Ties may order differently; each id keeps its
                        # own payload.
                        self.assertEqual(got_p[q][j],
                                         self.stored(got_ids[q, j]), what)
                    # Equal distances hold the same ids, but at the K-th
                    # place, where which of a tie is returned may differ.
                    for d in set(want_d[q].tolist()) - {want_d[q, -1]}:
                        self.assertEqual(
                            set(got_ids[q][got_d[q] == d].tolist()),
                            set(want_ids[q][want_d[q] == d].tolist()), what)
                    self.assertEqual(
                        [p for p, i in zip(got_p[q], got_ids[q]) if i < 0],
                        [p for p, i in zip(want_p[q], want_ids[q]) if i < 0])


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True)
