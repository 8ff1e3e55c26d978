#!/usr/bin/python3
"""knnd-client's shared call path (knnd_client/_common.py), installed in
each route's venv (client_testing.py), without a server:
  - the serialized request of the single-target clients (a cached head and
    the vectors field) parses as the SearchRequest message built field by
    field, for every argument combination, byte order and layout;
  - results are read from the bytes fields (results_as_bytes) or, from a
    knnd that ignores the flag, the repeated fields, into writable arrays
    of the caller's dtypes; answers of the wrong size are refused; the
    SearchResult carries the response's fields and per-query Hits, and is
    frozen;
  - the channel options carry the reconnect backoff, and `options=`
    replaces any of them.

  client_common_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl \\
      --source-dir . --venvs BUILD/tests/python_client_venvs
"""
import unittest

import numpy as np

import client_testing

ARGS = None


def search_args(queries, k, nprobe, allowed_ids, refine_factor, **options):
    """The SearchArgs of a search() call with these arguments."""
    from knnd_client._common import SearchArgs
    return SearchArgs(queries=queries, k=k, nprobe=nprobe,
                      allowed_ids=allowed_ids, refine_factor=refine_factor,
                      **options)


def serialized(*args, **options):
    from knnd_client import _common
    return _common.serialized_search_request(search_args(*args, **options))


def message(*args, **options):
    from knnd_client import _common
    return _common.search_request(search_args(*args, **options))


class RequestTest(unittest.TestCase):
    def test_serialized_request_is_the_message(self):
        from knnd_client import _common
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        q = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32)
        for queries in (q, q.astype(">f4"), np.asfortranarray(q), q[::2],
                        np.tile(q, (60, 1))):
            for k, nprobe, refine, allowed in ((3, None, None, None),
                                               (10, 8, 0, None),
                                               (1, 2, 4, [5, 1, 9])):
                with self.subTest(shape=queries.shape, k=k, nprobe=nprobe,
                                  refine=refine, allowed=allowed):
                    wire, shape = serialized(queries, k, nprobe, allowed,
                                             refine)
                    want = message(queries, k, nprobe, allowed, refine)
                    self.assertEqual(pb.SearchRequest.FromString(wire), want)
                    self.assertEqual(shape, (queries.shape[0], k))
                    self.assertTrue(want.results_as_bytes)
                    np.testing.assert_array_equal(
                        np.frombuffer(want.vectors_f32le, "<f4").reshape(
                            queries.shape), queries)

    def test_float16_queries_go_as_vectors_f16le(self):
        from knnd_client import _common
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        q = np.arange(24, dtype=np.float32).reshape(3, 8) / 7
        half = q.astype(np.float16)
        for queries in (half, half.astype(">f2"), np.asfortranarray(half)):
            with self.subTest(dtype=queries.dtype.str):
                wire, shape = serialized(queries, 5, None, None, None)
                request = pb.SearchRequest.FromString(wire)
                self.assertEqual(request.vectors_f32le, b"")
                np.testing.assert_array_equal(
                    np.frombuffer(request.vectors_f16le, "<f2").reshape(3, 8),
                    half)
                self.assertEqual(shape, (3, 5))
                self.assertEqual(_common.request_rows(request), 3)
                # With an allow-list the message is built, the same field.
                built = message(queries, 5, None, [1], None)
                self.assertEqual(built.vectors_f16le, request.vectors_f16le)
        with self.assertRaisesRegex(ValueError, r"queries\[1, 2\] is inf"):
            bad = half.copy()
            bad[1, 2] = np.inf
            serialized(bad, 5, None, None, None)
        with self.assertRaisesRegex(TypeError, "float32 or float16, got float64"):
            serialized(q.astype(np.float64), 5, None, None, None)

    def test_cached_heads_still_check_the_arguments(self):
        from knnd_client import _common
        q = np.ones((1, 4), np.float32)
        serialized(q, 1, None, None, None)
        for k, error in ((True, "k must be an int, got bool"),
                         (1.0, "k must be an int, got float"),
                         ([1], "k must be an int, got list")):
            with self.assertRaisesRegex(TypeError, error):
                serialized(q, k, None, None, None)

    def test_filters_are_converted_once_and_sent_as_their_message(self):
        import collections
        import datetime
        import types
        from knnd_client import _common
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        q = np.random.default_rng(4).standard_normal((3, 5)).astype(np.float32)
        when = datetime.datetime(2024, 1, 2, tzinfo=datetime.timezone.utc)
        # (filter, whether it can be cached: a UserList cannot be hashed)
        filters = (({"u": {"$lt": 1000}}, True),
                   ({"u": {"$lt": 1000.0}}, True),  # another message
                   ({"genre": "news", "tags": {"$in": ["a", "b"]}}, True),
                   ({"$or": [{"year": {"$gte": 2020}},
                             {"when": {"$lt": when}}]}, True),
                   ({"$not": {"tags": {"$exists": True}}}, True),
                   # Any mapping, tuples as lists, numpy's integers.
                   (types.MappingProxyType({"u": {"$in": (3, 4)}}), True),
                   (collections.OrderedDict(u={"$lt": np.int64(7)}), True),
                   ({"tags": {"$in": collections.UserList(["a"])}}, False))
        for spec, hashable in filters:
            with self.subTest(filter=spec):
                before = _common._cached_filter_bytes.cache_info()
                for _ in range(2):
                    wire, shape = serialized(q, 4, 2, None, 3, filter=spec)
                    want = message(q, 4, 2, None, 3, filter=spec)
                    self.assertEqual(pb.SearchRequest.FromString(wire), want)
                    self.assertEqual(shape, (3, 4))
                after = _common._cached_filter_bytes.cache_info()
                # Converted once (a miss, then a hit), or never cached.
                self.assertEqual(after.misses - before.misses, int(hashable))
                self.assertEqual(after.hits - before.hits, int(hashable))
        # 1 and 1.0 and True are different filters; True is refused.
        a = serialized(q, 4, 2, None, 3, filter={"u": 1})[0]
        b = serialized(q, 4, 2, None, 3, filter={"u": 1.0})[0]
        self.assertNotEqual(a, b)
        for _ in range(2):  # a bad filter raises each time: never kept
            with self.assertRaisesRegex(ValueError, "boolean"):
                serialized(q, 4, 2, None, 3, filter={"u": True})


class ResultTest(unittest.TestCase):
    def answer(self, packed):
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        ids, distances = np.array([4, -1, 7, 2]), np.array([.5, 1, 2, 3])
        if packed:
            return pb.SearchResponse(
                num_queries=2, k=2, ids_i64le=ids.astype("<i8").tobytes(),
                distances_f32le=distances.astype("<f4").tobytes())
        return pb.SearchResponse(num_queries=2, k=2, ids=ids.tolist(),
                                 distances=distances.tolist())

    def test_either_form_reads_as_writable_arrays(self):
        from knnd_client import _common
        for packed in (True, False):
            with self.subTest(packed=packed):
                ids, distances = _common.result_arrays(self.answer(packed),
                                                       (2, 2))
                self.assertEqual(ids.tolist(), [[4, -1], [7, 2]])
                self.assertEqual(distances.tolist(), [[.5, 1], [2, 3]])
                self.assertEqual((ids.dtype, distances.dtype),
                                 (np.int64, np.float32))
                ids[0, 1] = 0  # the caller's to change
                self.assertTrue(distances.flags.writeable)

    def test_answers_of_the_wrong_size_are_refused(self):
        from knnd_client import _common
        for packed in (True, False):
            answer = self.answer(packed)
            with self.assertRaisesRegex(RuntimeError, "2x2 results for 1 "
                                        "queries at k=2"):
                _common.result_arrays(answer, (1, 2))
            answer.num_queries, answer.k = 1, 3
            with self.assertRaisesRegex(RuntimeError, "for 1x3 results"):
                _common.result_arrays(answer, (1, 3))
        answer = self.answer(True)
        answer.ids_i64le += b"\0"
        with self.assertRaisesRegex(RuntimeError, "33 bytes of ids_i64le"):
            _common.result_arrays(answer, (2, 2))

    def test_the_search_result_is_typed_and_frozen(self):
        import dataclasses
        import json
        from knnd_client import Hit, SearchResult, _common
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        answer = self.answer(True)
        answer.payloads.extend([json.dumps({"t": "a"}).encode(), b"",
                                json.dumps({"t": "c"}).encode(), b"{}"])
        answer.index_version, answer.metric = 7, pb.METRIC_L2
        answer.nprobe, answer.refine_factor = 8, 2
        answer.filter_plan = pb.FILTER_PLAN_IVF
        answer.filter_matched_rows = 40
        answer.missing_shards.append(1)
        result = _common.search_result(answer, (2, 2), with_payloads=True)
        self.assertIsInstance(result, SearchResult)
        self.assertEqual((result.num_queries, result.k), (2, 2))
        self.assertEqual(
            (result.index_version, result.metric, result.nprobe,
             result.refine_factor, result.filter_plan,
             result.filter_matched_rows, result.missing_shards),
            (7, pb.METRIC_L2, 8, 2, pb.FILTER_PLAN_IVF, 40, (1,)))
        self.assertEqual(result.payloads, [[{"t": "a"}, None],
                                           [{"t": "c"}, {}]])
        # hits(): one query's neighbours, padding left out.
        self.assertEqual(result.hits(0), [Hit(4, 0.5, {"t": "a"})])
        self.assertEqual(result.hits(1), [Hit(7, 2.0, {"t": "c"}),
                                          Hit(2, 3.0, {})])
        self.assertIsInstance(result.hits(1)[0].id, int)
        self.assertIsInstance(result.hits(1)[0].distance, float)
        plain = _common.search_result(answer, (2, 2), with_payloads=False)
        self.assertIsNone(plain.payloads)
        self.assertEqual(plain.hits(0), [Hit(4, 0.5)])
        for frozen, field in ((result, "ids"), (result.hits(0)[0], "id")):
            with self.assertRaises(dataclasses.FrozenInstanceError):
                setattr(frozen, field, None)
        # Not a tuple any more: the 0.3 unpacking fails loudly.
        with self.assertRaises(TypeError):
            ids, distances = result


class ChannelOptionsTest(unittest.TestCase):
    def test_reconnect_backoff_is_set_and_can_be_replaced(self):
        from knnd_client import _common
        options = dict(_common.channel_options("dns:///knnd:50051", ()))
        self.assertEqual(
            {key: options[key] for key in _common.RECONNECT_BACKOFF_OPTIONS},
            {"grpc.initial_reconnect_backoff_ms": 100,
             "grpc.min_reconnect_backoff_ms": 1000,
             "grpc.max_reconnect_backoff_ms": 1000})
        self.assertIn("grpc.service_config", options)
        mine = dict(_common.channel_options(
            "knnd:50051", [("grpc.max_reconnect_backoff_ms", 5000)]))
        self.assertEqual(mine["grpc.max_reconnect_backoff_ms"], 5000)
        self.assertNotIn("grpc.service_config", mine)


if __name__ == "__main__":
    client_testing.main(__doc__)
