#!/usr/bin/python3
"""knnd-client's hybrid search (search(text=...)) in each route's venv
(client_testing.py), against knnd serving hybrid_test.py's corpus (English,
Chinese and Korean rows, `knnctl build --payloads --text text
--attribute_fields lang --ids`), whole and in 2 shards, and knnd's front
of those shards:
  - KnnClient and AsyncKnnClient send text alone and text with queries
    (RRF, weighted, windows, filter, payloads) and read back what knnd
    answers a raw stub: ids, fused scores, each retriever's ranks and
    scores, the fusion; Hit carries them;
  - ShardedKnnClient and AsyncShardedKnnClient merge the shards' windows
    into the whole index's answer (text alone, filtered too; RRF and
    weighted without filter or re-ranking: each shard plans a filtered or
    re-ranked vector search alone, docs/hybrid.md), and into knnd's
    front's answer for every request, filtered hybrid included;
  - bad hybrid arguments raise before any RPC; the merge's rules without
    a server (fusion arithmetic, padding, shape checks).

  client_hybrid_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl \\
      --source-dir . --venvs BUILD/tests/python_client_venvs [unittest args]
"""
import json
import os
import subprocess
import tempfile
import unittest

import numpy as np

import client_testing
from hybrid_test import corpus
from knnd_harness import Daemon, LoopThread, stop_all

ARGS = None
ROWS = 2400
DIM = 16
K = 10
QUERIES = ["printer network", "服务器 字体", "서버 차트", "macro",
           "电子表格图表", "프린터", "formula table export"]


class HybridClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import grpc
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        from knnd_client._generated.knnd.v1 import knn_service_pb2_grpc
        cls.pb = pb
        cls.tmp = tempfile.TemporaryDirectory()
        tmp = cls.tmp.name
        rng = np.random.default_rng(8)
        cls.xb = rng.standard_normal((ROWS, DIM)).astype("float32")
        cls.ids = np.arange(ROWS, dtype=np.int64) * 5 + 11
        np.save(os.path.join(tmp, "x.npy"), cls.xb)
        np.save(os.path.join(tmp, "ids.npy"), cls.ids)
        with open(os.path.join(tmp, "p.jsonl"), "w", encoding="utf-8") as out:
            for row in corpus():
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        for name, extra in (("whole", []), ("split", ["--shards", "2"])):
            subprocess.run(
                [ARGS.knnctl, "build", "--input", os.path.join(tmp, "x.npy"),
                 "--output", os.path.join(tmp, name + ".index"), "--nlist",
                 "16", "--ids", os.path.join(tmp, "ids.npy"), "--payloads",
                 os.path.join(tmp, "p.jsonl"), "--attribute_fields", "lang",
                 "--text", "text", *extra], check=True, capture_output=True)
        split = os.path.join(tmp, "split.index")
        cls.daemons = {}
        for name, args in [
                ("whole", ["--index", os.path.join(tmp, "whole.index")]),
                ("shard0", ["--index", split + ".shard-0-of-2"]),
                ("shard1", ["--index", split + ".shard-1-of-2"])]:
            cls.start(name, args)
        cls.shards = [cls.daemons[s].address for s in ("shard0", "shard1")]
        cls.start("front", ["--shard_targets", ",".join(cls.shards)])
        cls.channels = {name: grpc.insecure_channel(d.address)
                        for name, d in cls.daemons.items()}
        cls.stubs = {name: knn_service_pb2_grpc.KnnServiceStub(c)
                     for name, c in cls.channels.items()}
        cls.loop = LoopThread()

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
        if hasattr(cls, "loop"):
            cls.loop.stop()
        for channel in getattr(cls, "channels", {}).values():
            channel.close()
        stop_all(cls.daemons.values(), 30)
        cls.tmp.cleanup()

    # -- helpers ------------------------------------------------------------

    def client(self, kind, target):
        """A new client of `kind` ("sync", "async", "sharded",
        "async_sharded"), closed at clean-up; its search() blocks."""
        import knnd_client
        if kind in ("sync", "sharded"):
            make = (knnd_client.KnnClient if kind == "sync"
                    else knnd_client.ShardedKnnClient)
            client = make(target, timeout_s=30)
            self.addCleanup(client.close)
            return client.search

        async def made():
            make = (knnd_client.AsyncKnnClient if kind == "async"
                    else knnd_client.AsyncShardedKnnClient)
            return make(target, timeout_s=30)
        client = self.loop.run(made())
        self.addCleanup(lambda: self.loop.run(client.close()))
        return lambda *a, **kw: self.loop.run(client.search(*a, **kw))

    def raw(self, name, **fields):
        return self.stubs[name].Search(self.pb.SearchRequest(**fields),
                                       timeout=30)

    def assert_answers(self, result, response, what=""):
        """`result` (a client's SearchResult) holds what `response` (a raw
        SearchResponse to the same hybrid request) says."""
        shape = (response.num_queries, response.k)
        self.assertEqual(result.ids.tolist(),
                         np.reshape(response.ids, shape).tolist(), what)
        np.testing.assert_array_equal(
            result.distances, np.reshape(response.distances, shape), what)
        for name in ("text_ranks", "text_scores", "vector_ranks",
                     "vector_scores"):
            wire = list(getattr(response, name))
            column = getattr(result, name)
            if not wire:
                self.assertIsNone(column, name)
                continue
            np.testing.assert_array_equal(column, np.reshape(wire, shape),
                                          f"{what} {name}")
        self.assertEqual(result.fusion, {self.pb.FUSION_RRF: "rrf",
                                         self.pb.FUSION_WEIGHTED: "weighted"}
                         .get(response.fusion), what)
        if response.payloads:
            self.assertEqual(
                [[json.loads(p) if p else None for p in row]
                 for row in np.reshape(list(response.payloads), shape)],
                result.payloads, what)

    def assert_same(self, got, want, what=""):
        """Two SearchResults of one request agree exactly."""
        for name in ("ids", "distances", "text_ranks", "text_scores",
                     "vector_ranks", "vector_scores"):
            a, b = getattr(got, name), getattr(want, name)
            if b is None:
                self.assertIsNone(a, f"{what} {name}")
            else:
                np.testing.assert_array_equal(a, b, f"{what} {name}")
        self.assertEqual(got.fusion, want.fusion, what)
        self.assertEqual(got.payloads, want.payloads, what)
        self.assertEqual(got.filter_matched_rows, want.filter_matched_rows,
                         what)

    def queries(self, n=len(QUERIES)):
        return self.xb[:n] + 0.01

    # -- one knnd ------------------------------------------------------------

    def test_text_alone_reads_bm25_answer(self):
        for kind in ("sync", "async"):
            search = self.client(kind, self.daemons["whole"].address)
            result = search(text=QUERIES, k=5, payloads=["lang"])
            self.assert_answers(result, self.raw(
                "whole", texts=QUERIES, k=5,
                payloads=self.pb.PayloadRequest(fields=["lang"])), kind)
            self.assertIsNone(result.fusion)
            self.assertIsNone(result.vector_ranks)
            self.assertEqual(result.text_ranks.dtype, np.int32)
            # One str is one query; k defaults to 10.
            one = search(text="printer")
            self.assertEqual(one.ids.shape, (1, 10))
            hit = one.hits(0)[0]
            self.assertEqual((hit.text_rank, hit.vector_rank,
                              hit.vector_score), (1, None, None))
            self.assertEqual(hit.text_score, hit.distance)

    def test_queries_and_text_fuse_as_knnd_answers(self):
        xq = self.queries()
        f = self.pb.Filter(condition=self.pb.Condition(
            field="lang", eq=self.pb.AttributeValue(keyword="zh")))
        cases = [
            (dict(), dict()),
            (dict(fusion="rrf", rrf_k=20, vector_window=25, text_window=40),
             dict(fusion=self.pb.FUSION_RRF, rrf_k=20, vector_window=25,
                  text_window=40)),
            (dict(fusion="weighted", vector_weight=0.3, text_weight=0.7),
             dict(fusion=self.pb.FUSION_WEIGHTED, vector_weight=0.3,
                  text_weight=0.7)),
            (dict(filter={"lang": "zh"}, payloads=True, vector_window=20),
             dict(filter=f, payloads=self.pb.PayloadRequest(all_fields=True),
                  vector_window=20))]
        for kind in ("sync", "async"):
            search = self.client(kind, self.daemons["whole"].address)
            for args, fields in cases:
                what = f"{kind} {args}"
                result = search(xq, K, text=QUERIES, refine_factor=0, **args)
                self.assert_answers(result, self.raw(
                    "whole", vectors_f32le=xq.tobytes(), dim=DIM,
                    texts=QUERIES, k=K, refine_factor=0,
                    **fields), what)
                self.assertEqual(result.fusion, args.get("fusion", "rrf"))
        # Hits carry each retriever's rank and score; a query vector is its
        # row plus noise, so that row is the vector retriever's first.
        result = search(xq, K, text=QUERIES, payloads=["n"])
        for q in range(len(QUERIES)):
            hits = {h.id: h for h in result.hits(q)}
            own = hits[int(self.ids[q])]
            self.assertEqual(own.vector_rank, 1)
            self.assertEqual(own.payload, {"n": q})
            for h in hits.values():
                self.assertGreater(h.vector_rank + h.text_rank, 0)
                self.assertEqual(h.vector_score is None, h.vector_rank == 0)
                self.assertEqual(h.text_score is None, h.text_rank == 0)
        # Without text nothing hybrid is read.
        plain = search(xq, K)
        self.assertIsNone(plain.text_ranks)
        self.assertIsNone(plain.hits(0)[0].text_rank)

    def test_bad_hybrid_arguments_raise_before_any_rpc(self):
        # A client of a port nothing listens on: any RPC would fail with
        # UNAVAILABLE, not these.
        q = np.ones((2, DIM), np.float32)
        for kind in ("sync", "async", "sharded", "async_sharded"):
            target = ("127.0.0.1:9" if "sharded" not in kind
                      else ["127.0.0.1:9", "127.0.0.1:10"])
            search = self.client(kind, target)
            for args, kwargs, error, message in [
                    ((), {}, TypeError, "needs queries"),
                    ((), {"text": b"x"}, TypeError, "text must be a str"),
                    ((), {"text": ["a", 3]}, TypeError, r"text\[1\]"),
                    ((), {"text": []}, ValueError, "text is empty"),
                    ((q,), {"text": "a"}, ValueError,
                     "text holds 1 texts but queries has 2 rows"),
                    ((q,), {"fusion": "rrf"}, ValueError,
                     "fusion is set without text"),
                    ((), {"text": "a", "fusion": "rrf"}, ValueError,
                     "fusion is set without queries"),
                    ((q,), {"text": ["a", "b"], "fusion": "dbsf"},
                     ValueError, "fusion='dbsf' is not one of"),
                    ((q,), {"text": ["a", "b"], "rrf_k": 0}, ValueError,
                     "rrf_k=0"),
                    ((q,), {"text": ["a", "b"], "vector_weight": -1},
                     ValueError, "vector_weight=-1 must be finite"),
                    ((q,), {"text": ["a", "b"], "text_weight": "1"},
                     TypeError, "text_weight must be a number"),
                    ((q,), {"text": ["a", "b"], "vector_weight": 0,
                            "text_weight": 0}, ValueError, "both 0"),
                    ((q, 10), {"text": ["a", "b"], "text_window": 5},
                     ValueError, "text_window=5 must be >= k=10")]:
                with self.subTest(kind=kind, kwargs=kwargs):
                    with self.assertRaisesRegex(error, message):
                        search(*args, **kwargs)

    # -- shards --------------------------------------------------------------

    def test_sharded_clients_merge_the_windows_as_the_whole_index(self):
        xq = self.queries()
        cases = [
            dict(text=QUERIES, k=K),
            dict(text=QUERIES, k=3, text_window=50),
            dict(text=QUERIES, k=K, filter={"lang": "en"}, text_window=30,
                 payloads=["lang", "n"]),
            dict(queries=xq, text=QUERIES, k=K, refine_factor=0,
                 vector_window=25, text_window=40, payloads=True),
            dict(queries=xq, text=QUERIES, k=K, refine_factor=0,
                 fusion="rrf", rrf_k=1),
            dict(queries=xq, text=QUERIES, k=K, refine_factor=0,
                 fusion="weighted", vector_weight=0.25, text_weight=0.75,
                 vector_window=20, text_window=20),
            dict(queries=xq[:1], text="macro", k=K, refine_factor=0,
                 fusion="weighted", text_weight=0, vector_window=100)]
        whole = self.client("sync", self.daemons["whole"].address)
        for kind in ("sharded", "async_sharded"):
            sharded = self.client(kind, self.shards)
            for case in cases:
                what = f"{kind} " + str({k: v for k, v in case.items()
                                         if k != "queries"})
                got = sharded(**case)
                self.assert_same(got, whole(**case), what)
                self.assertTrue(got.complete)

    def test_sharded_clients_merge_as_knnds_front(self):
        """The same merge as knnd's front of shards, filtered hybrid and
        re-ranked or not (where the whole index may differ on the vector
        side: each shard plans its own filtered search)."""
        xq = self.queries()
        front = self.client("sync", self.daemons["front"].address)
        cases = [
            dict(queries=xq, text=QUERIES, k=K, filter={"lang": "ko"},
                 payloads=["n"]),
            dict(queries=xq, text=QUERIES, k=K, filter={"lang": "en"},
                 fusion="weighted", vector_window=30, text_window=15),
            dict(queries=xq[:2], text=QUERIES[:2], k=K,
                 allowed_ids=self.ids[::3], vector_window=50)]
        for kind in ("sharded", "async_sharded"):
            sharded = self.client(kind, self.shards)
            for case in cases:
                what = f"{kind} " + str({k: v for k, v in case.items()
                                         if k not in ("queries",
                                                      "allowed_ids")})
                got = sharded(**case)
                self.assert_same(got, front(**case), what)
                if "filter" in case:
                    lang = case["filter"]["lang"]
                    self.assertEqual(got.filter_matched_rows, ROWS // 3)
                    admitted = {int(i) for r, i in enumerate(self.ids)
                                if ("en", "zh", "ko")[r % 3] == lang}
                    self.assertLessEqual(
                        {int(i) for i in got.ids.ravel() if i >= 0}, admitted)


class HybridMergeUnitTest(unittest.TestCase):
    """knnd_client.sharding's hybrid merge without a server."""

    def test_fuse_follows_knnds_rules(self):
        from knnd_client import sharding
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        vector = [(7, 0.5), (3, 1.0), (9, 2.0)]      # L2: smaller first
        text = [(9, 8.0), (4, 6.0), (7, 2.0)]
        rrf = sharding.fuse(vector, False, text, sharding.HybridMerge(
            k=3, vector_window=3, text_window=3, fusion=pb.FUSION_RRF))
        want = {7: 1 / 61 + 1 / 63, 3: 1 / 62, 9: 1 / 63 + 1 / 61, 4: 1 / 62}
        # 7 and 9 tie: by id; so do 3 and 4.
        self.assertEqual([h[0] for h in rrf], [7, 9, 3, 4])
        for i, fused, *_ in rrf:
            self.assertEqual(fused, want[i])
        self.assertEqual(rrf[0][2:], (1, 0.5, 3, 2.0))
        self.assertEqual(rrf[3][2:], (0, 0.0, 2, 6.0))
        weighted = sharding.fuse(vector, False, text, sharding.HybridMerge(
            k=3, vector_window=3, text_window=3, fusion=pb.FUSION_WEIGHTED,
            vector_weight=0.25, text_weight=0.75))
        # Distances turned around: 0.5 -> 1, 2.0 -> 0; BM25 8 -> 1, 2 -> 0.
        want = {7: 0.25 * 1.0 + 0.75 * 0.0,
                3: 0.25 * ((-1.0 + 2.0) / (-0.5 + 2.0)),
                9: 0.25 * 0.0 + 0.75 * 1.0,
                4: 0.75 * ((6.0 - 2.0) / (8.0 - 2.0))}
        self.assertEqual([(h[0], h[1]) for h in weighted],
                         sorted(want.items(), key=lambda e: (-e[1], e[0])))
        # Inner product as it is; a list whose ends are equal counts 1.
        flat = sharding.fuse([(1, 0.9), (2, 0.9)], True, [], sharding.HybridMerge(
            k=2, vector_window=2, text_window=2, fusion=pb.FUSION_WEIGHTED))
        self.assertEqual(flat, [(1, 0.5, 1, 0.9, 0, 0.0),
                                (2, 0.5, 2, 0.9, 0, 0.0)])
        alone = sharding.fuse([], False, text, sharding.HybridMerge(
            k=3, vector_window=0, text_window=3, fusion=None))
        self.assertEqual([(h[0], h[1]) for h in alone],
                         [(9, 8.0), (4, 6.0), (7, 2.0)])

    def answer(self, shard, ids, scores, vw, ranks=True, payloads=()):
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        width = len(ids[0])
        flat_ids = [i for row in ids for i in row]
        return pb.SearchResponse(
            num_queries=len(ids), k=width, ids=flat_ids,
            distances=[s for row in scores for s in row],
            metric=pb.METRIC_L2, index_version=3,
            shard=pb.ShardInfo(shard_id=shard, shard_count=2, build_id="b"),
            vector_ranks=([1] * len(flat_ids) if vw and ranks else []),
            vector_scores=[0] * len(flat_ids) if vw else [],
            text_ranks=[1] * len(flat_ids), text_scores=[0] * len(flat_ids),
            payloads=list(payloads))

    def test_windows_merge_pad_and_carry_payloads(self):
        from knnd_client import sharding
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        inf = float("inf")
        # k 3, windows 2 + 2: per query [v, v, t, t].
        a = self.answer(0, [[1, 2, 1, -1], [-1, -1, -1, -1]],
                        [[0.1, 0.4, 5.0, 0], [inf, inf, 0, 0]], 2,
                        payloads=[b'{"i":1}', b'{"i":2}', b'{"i":1}', b""]
                        + [b""] * 4)
        b = self.answer(1, [[10, 11, 11, 10], [12, -1, 12, -1]],
                        [[0.2, float("nan"), 5.0, 1.0], [0.3, inf, 2.0, 0]],
                        2, payloads=[b'{"i":10}', b'{"i":11}', b'{"i":11}',
                                     b'{"i":10}', b'{"i":12}', b"",
                                     b'{"i":12}', b""])
        request = pb.SearchRequest(vectors_f32le=b"\0" * 8, dim=1, k=3,
                                   texts=["x", "y"], vector_window=2,
                                   text_window=2,
                                   payloads=pb.PayloadRequest(all_fields=True))
        merge = sharding.hybrid_merge_of(request)
        self.assertEqual((merge.k, merge.vector_window, merge.text_window,
                          merge.fusion, merge.rrf_k), (3, 2, 2,
                                                       pb.FUSION_RRF, 60))
        versions = sharding.ShardVersions(2)
        sharding.check_answers(["a", "b"], versions, {0: a, 1: b}, request)
        fields, payloads = sharding.merge_hybrid_answers([a, b], 2, merge)
        # Query 0: vector window over the set 1 (0.1), 10 (0.2) (11's NaN
        # is no entry); text window 1 (5.0) and 11 (5.0, tie: by id).
        self.assertEqual(fields["ids"].tolist()[0], [1, 10, 11])
        self.assertEqual(fields["vector_ranks"].tolist()[0], [1, 2, 0])
        self.assertEqual(fields["text_ranks"].tolist()[0], [1, 0, 2])
        np.testing.assert_array_equal(
            fields["distances"][0],
            np.float32([1 / 61 + 1 / 61, 1 / 62, 1 / 62]))
        self.assertEqual(payloads[0], [b'{"i":1}', b'{"i":10}', b'{"i":11}'])
        # Query 1: one id in both windows, then padding.
        self.assertEqual(fields["ids"].tolist()[1], [12, -1, -1])
        self.assertEqual(fields["distances"][1, 1], -np.inf)
        self.assertEqual(fields["text_scores"].tolist()[1], [2.0, 0, 0])
        self.assertEqual(payloads[1], [b'{"i":12}', b"", b""])
        self.assertEqual(fields["fusion"], "rrf")
        # An answer without its vector ranks is not a window answer.
        bad = self.answer(1, [[10, 11, 11, 10]] * 2, [[0.2] * 4] * 2, 2,
                          ranks=False, payloads=[b"{}"] * 8)
        from knnd_client import ShardedSearchError
        with self.assertRaisesRegex(ShardedSearchError,
                                    "0 vector_ranks.*vector_window \\+ "
                                    "text_window = 4"):
            sharding.check_answers(["a", "b"], versions, {0: a, 1: bad},
                                   request)


if __name__ == "__main__":
    client_testing.main(__doc__)
