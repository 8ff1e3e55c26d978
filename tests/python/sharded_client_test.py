#!/usr/bin/python3
"""knnd-client's sharded clients (ShardedKnnClient, AsyncShardedKnnClient)
against fake shard servers.

Run by /usr/bin/python3, the script installs clients/python into a new venv
over Debian's python3-grpcio/protobuf/numpy (client_test.py's "system"
route: `pip install --no-index --no-build-isolation --no-deps`, stubs from
the system protoc) and reruns itself there, where the suite runs:

  - MergeUnitTest: knnd_client.sharding without a server: the merge rules
    (metric order, ties by id, padding, the two steps of re-ranking), the
    shard request, ShardVersions and the set checks;
  - ShardedClientTest and AsyncShardedClientTest, one contract for both
    clients, against three fake shards (KnnService servicers on 127.0.0.1)
    that each hold a brute-force "index" of one id range: merged answers
    equal the unsharded index's answer computed here on the whole set, for
    L2 and inner product, 1 and 100 queries, with and without re-ranking,
    with allow-lists; version pinning while shards swap; retries; a shard
    that fails or hangs; sets that must not be merged.

The fakes follow proto/knnd/v1/knn_service.proto: a shard's PQ estimate of
a distance is the exact distance plus a deterministic error that depends on
the id; it returns its k best estimates without re-ranking, and with
refine_factor r and return_candidates its r*k best estimates with their
exact distances. Vectors and queries hold small integers, so every distance
is an exact integer in float32 whatever the order of the sums, and equal
distances are frequent: the tie rule (ascending id) is exercised.

  sharded_client_test.py --source-dir . [--build-dir BUILD] [unittest args]
(--build-dir is accepted for the ctest line and not used: the fakes need
no knnd.)
"""
import argparse
import asyncio
import concurrent.futures
import inspect
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

from knnd_harness import LoopThread, copy_client_sources

ARGS = None
VENV_ENV = "KNND_SHARDED_TEST_VENV"  # set in the suite's run: its venv

DIM = 8
N = 600
# Shard s holds ids [first, end): uneven on purpose.
RANGES = [(0, 150), (150, 420), (420, 600)]
V = 7              # the version every shard serves at first
BUILD = "build-3f9a"
# Slack over a deadline for the client to notice it, cancel and return.
DEADLINE_MARGIN_S = 0.5


# --------------------------------------------------------------------------
# Install (outside the venv)

class InstallTest(unittest.TestCase):
    def test_suite_in_a_venv_over_debian_packages(self):
        with tempfile.TemporaryDirectory(prefix="knnd-sharded-test-") as tmp:
            client = copy_client_sources(ARGS.source_dir,
                                         os.path.join(tmp, "src"))
            venv = os.path.join(tmp, "venv")
            subprocess.run([sys.executable, "-m", "venv",
                            "--system-site-packages", venv], check=True)
            python = os.path.join(venv, "bin", "python")
            start = time.monotonic()
            subprocess.run([python, "-m", "pip", "install", "--quiet",
                            "--no-index", "--no-build-isolation", "--no-deps",
                            client], check=True)
            print(f"[{time.monotonic() - start:5.1f} s] knnd-client installed",
                  flush=True)
            code = subprocess.call([python, "-W", "ignore", *sys.argv],
                                   env=dict(os.environ, **{VENV_ENV: venv}))
            self.assertEqual(code, 0, "the suite failed in the venv")


# --------------------------------------------------------------------------
# The index, brute force

def base_vectors(version):
    """The whole index's vectors at `version`: small integers, different
    for every version, so that an answer mixing versions shows."""
    rng = np.random.default_rng(1000 + version)
    return rng.integers(-4, 5, (N, DIM)).astype(np.float32)


def queries(nq, seed=5):
    return np.random.default_rng(seed).integers(-4, 5, (nq, DIM)).astype(
        np.float32)


def pq_error(ids):
    """The fakes' PQ estimate error of each id: deterministic, in [-15, 15]."""
    return ((np.asarray(ids, np.int64) * 7919) % 31) - 15


def ranked(qs, xb, ids, k, metric, refine, candidates):
    """Brute-force answer over `ids` (every list probed), per knnd's
    contract: (ids, distances, approx), each (nq, width), padded with -1
    and the worst distance. Without re-ranking: the k best estimates.
    With refine_factor r: the r*k best estimates, then, unless
    `candidates`, the k best exact distances among them. Ties: ascending
    id. Plain Python sorting, not the client's numpy code."""
    from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
    ids = np.array(sorted(ids), np.int64)
    sign = 1 if metric == pb.METRIC_L2 else -1
    pad = np.inf if sign == 1 else -np.inf
    q = qs.astype(np.float64)
    x = xb[ids].astype(np.float64) if len(ids) else np.zeros((0, DIM))
    if metric == pb.METRIC_L2:
        exact = ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    else:
        exact = q @ x.T
    approx = exact + pq_error(ids)[None, :]
    width = refine * k if refine and candidates else k
    out_ids = np.full((len(qs), width), -1, np.int64)
    out_distances = np.full((len(qs), width), pad, np.float32)
    out_approx = np.full((len(qs), width), pad, np.float32)
    for row in range(len(qs)):
        order = sorted(range(len(ids)),
                       key=lambda j: (sign * approx[row, j], ids[j]))
        order = order[:refine * k] if refine else order[:k]
        if refine and not candidates:
            order = sorted(order, key=lambda j: (sign * exact[row, j], ids[j]))[:k]
        n = len(order)
        out_ids[row, :n] = ids[order]
        out_distances[row, :n] = (exact if refine else approx)[row, order]
        out_approx[row, :n] = approx[row, order]
    return out_ids, out_distances, out_approx


def unsharded(qs, version, k, metric, refine, allowed=None, without=()):
    """The unsharded index's (ids, distances); `without`: the shards whose
    ids are missing (a partial answer)."""
    ids = set(range(N)) if allowed is None else set(int(i) for i in allowed)
    for s in without:
        ids -= set(range(*RANGES[s]))
    out_ids, out_distances, _ = ranked(qs, base_vectors(version), ids, k,
                                       metric, refine, candidates=False)
    return out_ids, out_distances


# --------------------------------------------------------------------------
# Fake shards

def make_fake_shard_class():
    """FakeShard, defined once the installed package can be imported."""
    import grpc
    from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
    from knnd_client._generated.knnd.v1 import knn_service_pb2_grpc as pb_grpc

    class FakeShard(pb_grpc.KnnServiceServicer):
        """One knnd serving shard `shard_id` of `shard_count`, the ids of
        [first, end), at version `serving`, keeping `retained` loaded.

        whole: answer as an unsharded index (no `shard`).
        script: one-shot behaviours of the next Search calls, in order:
          ("fail", code, details, pushback_ms or None), ("hang", s), or
          ("fail_after", event, code, details): fail once `event` is set;
          fail_always: a ("fail", ...) step for every call after them.
        swap_each_call: after every Search, serve the next version (and
          keep none): a shard that never holds a version for long.
        Records every SearchRequest with its time and metadata (`received`
        is set at the first), and how many calls ended by the client
        cancelling them."""

        def __init__(self, first, end, shard_id, shard_count=3,
                     build_id=BUILD, metric=pb.METRIC_L2, serving=V,
                     retained=(), whole=False, port=0):
            self.first, self.end = first, end
            self.shard_id, self.shard_count = shard_id, shard_count
            self.build_id, self.metric, self.whole = build_id, metric, whole
            self.serving, self.retained = serving, list(retained)
            self.script = []
            self.fail_always = None
            self.swap_each_call = False
            self.requests = []
            self.times = []
            self.metadata = []
            self.cancelled = 0
            self.received = threading.Event()
            self.lock = threading.Lock()
            self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(8))
            pb_grpc.add_KnnServiceServicer_to_server(self, self.server)
            self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
            self.address = f"127.0.0.1:{self.port}"
            self.server.start()

        def swap(self, version, keep=()):
            """Serves `version` from now on, keeping the versions `keep`."""
            with self.lock:
                self.serving, self.retained = version, list(keep)

        def pinned(self):
            """The index_version of every request so far (0: unpinned)."""
            with self.lock:
                return [r.index_version for r in self.requests]

        def stop(self):
            self.server.stop(0)

        def _info(self):
            return pb.ShardInfo(shard_id=self.shard_id,
                                shard_count=self.shard_count,
                                build_id=self.build_id, first_id=self.first,
                                end_id=self.end)

        def GetIndexInfo(self, request, context):
            with self.lock:
                info = pb.GetIndexInfoResponse(
                    dim=DIM, metric=self.metric, ntotal=self.end - self.first,
                    version=self.serving, has_vectors=True,
                    retained_versions=self.retained)
            if not self.whole:
                info.shard.CopyFrom(self._info())
            return info

        def Search(self, request, context):
            copy = pb.SearchRequest()
            copy.CopyFrom(request)
            with self.lock:
                self.requests.append(copy)
                self.times.append(time.monotonic())
                self.metadata.append(dict(context.invocation_metadata()))
                self.received.set()
                step = self.script.pop(0) if self.script else self.fail_always
                serving, loaded = self.serving, {self.serving, *self.retained}
                if self.swap_each_call:
                    self.serving, self.retained = serving + 1, []
            if step and step[0] == "hang":
                ended = threading.Event()
                # False: the call already ended (cancelled before this ran).
                if not context.add_callback(ended.set) or ended.wait(step[1]):
                    with self.lock:
                        self.cancelled += 1
                    return pb.SearchResponse()
            elif step and step[0] == "fail_after":
                _, event, code, details = step
                event.wait(30)
                context.abort(code, details)
            elif step:
                _, code, details, pushback = step
                if pushback is not None:
                    context.set_trailing_metadata(
                        (("grpc-retry-pushback-ms", str(pushback)),))
                context.abort(code, details)
            version = request.index_version or serving
            if version not in loaded:
                context.set_trailing_metadata(
                    (("knnd-serving-version", str(serving)),))
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"index_version {version} is not loaded; this "
                              f"server has versions {sorted(loaded)}")
            if request.dim not in (0, DIM) or request.k < 1:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "dim or k")
            if request.vectors_f16le:  # widened, as knnd does
                qs = np.frombuffer(request.vectors_f16le, "<f2").astype(
                    np.float32).reshape(-1, DIM)
            else:
                qs = np.frombuffer(request.vectors_f32le, "<f4").reshape(-1, DIM)
            ids = set(range(self.first, self.end))
            if request.allowed_ids:
                ids &= set(request.allowed_ids)
            refine = request.refine_factor  # unset: the default, 0 here
            out_ids, distances, approx = ranked(
                qs, base_vectors(version), ids, request.k, self.metric,
                refine, candidates=request.return_candidates)
            response = pb.SearchResponse(
                num_queries=len(qs), k=out_ids.shape[1],
                ids=out_ids.ravel().tolist(),
                distances=distances.ravel().tolist(), index_version=version,
                metric=self.metric,
                nprobe=request.nprobe if request.HasField("nprobe") else 8,
                refine_factor=refine, serving_version=serving)
            if refine and request.return_candidates:
                response.approx_distances.extend(approx.ravel().tolist())
            if request.results_as_bytes:  # as knnd answers the flag
                response.ids_i64le = out_ids.astype("<i8").tobytes()
                response.distances_f32le = distances.astype("<f4").tobytes()
                response.approx_distances_f32le = np.asarray(
                    response.approx_distances, "<f4").tobytes()
                for field in ("ids", "distances", "approx_distances"):
                    response.ClearField(field)
            if not self.whole:
                response.shard.CopyFrom(self._info())
            return response

    return FakeShard


class Blocking:
    """The async client's methods that return a coroutine as blocking
    calls (called here, as an application would: search() checks its
    arguments before anything is awaited; the coroutine runs in the
    loop)."""

    def __init__(self, loop, client):
        self._loop, self._client = loop, client

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            out = attr(*args, **kwargs)
            return self._loop.run(out) if inspect.isawaitable(out) else out
        return call


# --------------------------------------------------------------------------
# Without a server

class MergeUnitTest(unittest.TestCase):
    """knnd_client.sharding's pure parts."""

    def test_top_k_orders_by_metric_breaks_ties_by_id_and_pads(self):
        from knnd_client import sharding
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        # Two shards' rows side by side: [9, 4, -1 | 7, 2, 5].
        ids = np.array([[9, 4, -1, 7, 2, 5]], np.int64)
        distances = np.array([[1.0, 3.0, np.inf, 1.0, 3.0, 0.5]], np.float32)
        got_ids, got = sharding.merge_top_k(ids, distances, 4, pb.METRIC_L2)
        self.assertEqual(got_ids.tolist(), [[5, 7, 9, 2]])
        self.assertEqual(got.tolist(), [[0.5, 1.0, 1.0, 3.0]])
        for metric in (pb.METRIC_INNER_PRODUCT, pb.METRIC_COSINE):
            got_ids, got = sharding.merge_top_k(
                ids, np.where(ids < 0, -np.inf, distances).astype(np.float32),
                7, metric)
            self.assertEqual(got_ids.tolist(), [[2, 4, 7, 9, 5, -1, -1]])
            self.assertEqual(got.tolist(),
                             [[3.0, 3.0, 1.0, 1.0, 0.5, -np.inf, -np.inf]])
            self.assertEqual((got_ids.dtype, got.dtype), (np.int64, np.float32))
        # A padding id never displaces a real one, whatever its distance.
        got_ids, _ = sharding.merge_top_k(
            np.array([[-1, 3]]), np.array([[0.0, 9.0]], np.float32), 1,
            pb.METRIC_L2)
        self.assertEqual(got_ids.tolist(), [[3]])

    def test_candidates_rerank_the_best_estimates_of_every_shard(self):
        from knnd_client import sharding
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        # k=1, r=2: each shard sends its 2 best estimates. Over both, the
        # 2 best estimates are ids 1 and 3; the exact best of them is 3.
        # Id 4 is exactly closer still but not among the unsharded index's
        # candidates, so a merge of each shard's exact best would be wrong.
        ids = np.array([[1, 4, 3, 6]], np.int64)
        approx = np.array([[1.0, 5.0, 2.0, 6.0]], np.float32)
        exact = np.array([[9.0, 0.5, 4.0, 0.1]], np.float32)
        got_ids, got = sharding.merge_candidates(ids, approx, exact, 1, 2,
                                                 pb.METRIC_L2)
        self.assertEqual((got_ids.tolist(), got.tolist()), ([[3]], [[4.0]]))
        got_ids, got = sharding.merge_candidates(ids, -approx, -exact, 1, 2,
                                                 pb.METRIC_INNER_PRODUCT)
        self.assertEqual((got_ids.tolist(), got.tolist()), ([[3]], [[-4.0]]))

    def test_shard_request_pins_and_asks_for_candidates(self):
        from knnd_client import sharding
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        caller = pb.SearchRequest(vectors_f32le=b"\0" * 32, dim=8, k=5,
                                  nprobe=9, refine_factor=2, allowed_ids=[4],
                                  allow_partial_results=True)
        pinned = sharding.shard_request(caller, 12)
        self.assertEqual((pinned.index_version, pinned.return_candidates,
                          pinned.allow_partial_results), (12, True, False))
        self.assertEqual((pinned.k, pinned.nprobe, pinned.refine_factor,
                          list(pinned.allowed_ids), pinned.vectors_f32le),
                         (5, 9, 2, [4], caller.vectors_f32le))
        self.assertFalse(sharding.shard_request(caller, None).HasField(
            "index_version"))
        self.assertFalse(caller.return_candidates, "the caller's was changed")

    def test_answers_merge_alike_in_either_result_form(self):
        # Shards answer results_as_bytes in the bytes fields; a knnd older
        # than the flag, in the repeated fields: both are merged.
        from knnd_client import sharding
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        repeated = pb.SearchResponse(num_queries=1, k=2, ids=[3, 1],
                                     distances=[0.5, 1.0],
                                     metric=pb.METRIC_L2)
        packed = pb.SearchResponse(
            num_queries=1, k=2, metric=pb.METRIC_L2,
            ids_i64le=np.array([2, 9], "<i8").tobytes(),
            distances_f32le=np.array([0.7, 2.0], "<f4").tobytes())
        ids, distances = sharding.merge_answers([repeated, packed], 1, 3)
        self.assertEqual(ids.tolist(), [[3, 2, 1]])
        np.testing.assert_array_equal(
            distances, np.array([[0.5, 0.7, 1.0]], np.float32))
        self.assertEqual((ids.dtype, distances.dtype), (np.int64, np.float32))

    def test_filtered_answers_merge_by_exact_distance(self):
        # Filtered, shard 0 searched its matching rows exactly (estimates =
        # exact distances), shard 1 scanned its lists (PQ estimates): the
        # k best exact distances over every candidate win, as in the front.
        from knnd_client import sharding
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb

        def answer(ids, exact, approx, plan):
            return pb.SearchResponse(
                num_queries=1, k=2, ids=ids, distances=exact,
                approx_distances=approx, metric=pb.METRIC_L2,
                refine_factor=1, filter_plan=plan)
        exact_shard = answer([4, 7], [0.5, 4.0], [0.5, 4.0],
                             pb.FILTER_PLAN_EXACT)
        ivf_shard = answer([6, 5], [2.0, 3.0], [0.1, 0.2],
                           pb.FILTER_PLAN_IVF)
        ids, distances, payloads = sharding.merge_answers_with_payloads(
            [exact_shard, ivf_shard], 1, 1)
        self.assertEqual(ids.tolist(), [[4]])
        self.assertEqual(distances.tolist(), [[0.5]])
        self.assertIsNone(payloads)
        # Unfiltered, the same answers keep the unsharded candidates (the
        # one best estimate at k 1, refine 1): id 6.
        for a in (exact_shard, ivf_shard):
            a.filter_plan = pb.FILTER_PLAN_UNSPECIFIED
        ids, _ = sharding.merge_answers([exact_shard, ivf_shard], 1, 1)
        self.assertEqual(ids.tolist(), [[6]])

    def test_shard_versions(self):
        import grpc
        from knnd_client import sharding
        versions = sharding.ShardVersions(3)
        versions.record(0, 5)
        versions.record(1, 4)
        self.assertIsNone(versions.set_version(), "a shard is unknown")
        versions.record(2, 6)
        self.assertEqual(versions.set_version(), 4)
        versions.record(2, 0)  # a knnd that does not say: ignored

        def error(code, trailing):
            return grpc.aio.AioRpcError(code, grpc.aio.Metadata(),
                                        grpc.aio.Metadata(*trailing))
        self.assertIsNone(versions.record_error(1, error(
            grpc.StatusCode.UNAVAILABLE, [("knnd-serving-version", "9")])))
        self.assertEqual(versions.set_version(), 4)
        self.assertEqual(versions.record_error(1, error(
            grpc.StatusCode.FAILED_PRECONDITION,
            [("knnd-serving-version", "8")])), 8)
        self.assertEqual(versions.serving_versions(), [5, 8, 6])
        self.assertEqual(versions.set_version(), 5)
        # Many threads at once: every update lands.
        many = sharding.ShardVersions(64)
        threads = [threading.Thread(target=lambda i=i: [
            many.record(i, v) for v in range(1, 200)]) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(many.set_version(), 199)

    def test_set_checks(self):
        import grpc
        from knnd_client import sharding
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        targets = ["a:1", "b:2", "c:3"]
        request = pb.SearchRequest(vectors_f32le=b"\0" * 32, dim=8, k=1)

        def answer(shard_id, build=BUILD, count=3, version=V, nprobe=4,
                   refine=0):
            return pb.SearchResponse(
                num_queries=1, k=1, ids=[shard_id], distances=[1.0],
                metric=pb.METRIC_L2, index_version=version, nprobe=nprobe,
                refine_factor=refine,
                shard=pb.ShardInfo(shard_id=shard_id, shard_count=count,
                                   build_id=build))

        def check(*answers):
            versions = sharding.ShardVersions(3)
            return sharding.check_answers(targets, versions,
                                          dict(enumerate(answers)), request)
        self.assertEqual(check(answer(1), answer(0), answer(2)), (V, BUILD))
        for answers, message in (
                ((answer(0), answer(1), answer(2, build="x")),
                 "different builds.*'x'"),
                ((answer(0), answer(1), answer(1)),
                 "more than once: shard 1 by b:2, c:3"),
                ((answer(0), answer(1), answer(2, count=4)),
                 "c:3.*one of 4 shards"),
                ((answer(0), answer(1), answer(2, version=V + 1)),
                 "different index_version"),
                # Shards tuned one by one: each answered with its own
                # default; the error names them and how to agree.
                ((answer(0), answer(1), answer(2, nprobe=8)),
                 r"different nprobe \(each shard took its own default: tune "
                 r"the set as one \(knnctl tune --index OUT --shards N.*"
                 r"a:1 \(targets\[0\]\): 4, .*c:3 \(targets\[2\]\): 8"),
                ((answer(0, refine=2), answer(1, refine=2),
                  answer(2, refine=4)),
                 r"different refine_factor \(each shard took its own "
                 r"default: tune the set as one.*"
                 r"b:2 \(targets\[1\]\): 2, .*c:3 \(targets\[2\]\): 4"),
                ((answer(0), pb.SearchResponse(), answer(2)),
                 r"not a shard: b:2 \(targets\[1\]\)")):
            with self.subTest(message=message):
                with self.assertRaisesRegex(grpc.RpcError, message) as err:
                    check(*answers)
                self.assertEqual(err.exception.code(),
                                 grpc.StatusCode.FAILED_PRECONDITION)


    def test_the_fixture_tells_the_merge_rules_apart(self):
        # The client scenarios could not fail if the reference did not
        # depend on the rules: re-ranking changes answers, re-ranking each
        # shard's own candidates (a wrong merge) gives another answer than
        # the unsharded index's, and equal distances are frequent.
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        qs = queries(100)
        for metric in (pb.METRIC_L2, pb.METRIC_INNER_PRODUCT):
            sign = 1 if metric == pb.METRIC_L2 else -1
            plain_ids, plain_distances = unsharded(qs, V, 10, metric, 0)
            refined = unsharded(qs, V, 10, metric, 3)[0]
            self.assertFalse(np.array_equal(plain_ids, refined))
            self.assertTrue((np.diff(plain_distances, axis=1) == 0).any())
            per_shard = [ranked(qs, base_vectors(V), range(*r), 10, metric, 3,
                                candidates=False) for r in RANGES]
            naive = []
            for row in range(len(qs)):
                pairs = [(sign * d, i) for ids, ds, _ in per_shard
                         for i, d in zip(ids[row], ds[row])]
                naive.append([i for _, i in sorted(pairs)[:10]])
            self.assertFalse(np.array_equal(np.array(naive), refined))


# --------------------------------------------------------------------------
# Both clients against fake shards

class ShardedContract:
    """What both sharded clients promise. A subclass says how to make a
    client (connect) whose methods block."""

    def connect(self, targets, **client_args):
        raise NotImplementedError

    def setUp(self):
        import grpc
        from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
        self.grpc, self.pb = grpc, pb
        self.FakeShard = make_fake_shard_class()

    def shards(self, metric=None, **per_shard):
        """Three fake shards over RANGES; per_shard: keyword -> a list of
        three values (shard_id=[0, 1, 1], build_id=[...], ...)."""
        fakes = []
        for s, (first, end) in enumerate(RANGES):
            kwargs = {key: values[s] for key, values in per_shard.items()}
            kwargs.setdefault("shard_id", s)
            fake = self.FakeShard(first, end, metric=metric or self.pb.METRIC_L2,
                                  **kwargs)
            self.addCleanup(fake.stop)
            fakes.append(fake)
        return fakes

    def client(self, fakes, order=(0, 1, 2), **client_args):
        client_args.setdefault("timeout_s", 10)
        return self.connect([fakes[i].address for i in order], **client_args)

    def assert_unsharded(self, result, qs, version, k, metric, refine,
                         allowed=None, without=()):
        want_ids, want_distances = unsharded(qs, version, k, metric, refine,
                                             allowed, without)
        np.testing.assert_array_equal(result.ids, want_ids)
        np.testing.assert_array_equal(result.distances, want_distances)
        self.assertEqual((result.ids.dtype, result.distances.dtype),
                         (np.int64, np.float32))
        self.assertEqual(result.index_version, version)

    # ---- merged answers

    def test_merged_answers_equal_the_unsharded_index(self):
        pb = self.pb
        allow_lists = {"all": None,
                       "60 ids": np.random.default_rng(3).choice(N, 60, False),
                       "4 ids": np.array([599, 3, 151, 420])}
        for metric in (pb.METRIC_L2, pb.METRIC_INNER_PRODUCT):
            fakes = self.shards(metric)
            client = self.client(fakes, order=(2, 0, 1))
            for nq in (1, 100):
                qs = queries(nq)
                for refine in (0, 3):
                    for name, allowed in allow_lists.items():
                        with self.subTest(metric=metric, nq=nq, refine=refine,
                                          allowed=name):
                            result = client.search(
                                qs, 10, nprobe=4, refine_factor=refine,
                                allowed_ids=allowed)
                            self.assert_unsharded(result, qs, V, 10, metric,
                                                  refine, allowed)
                            self.assertEqual(result.build_id, BUILD)
                            self.assertEqual(result.missing_shards, ())
                            self.assertTrue(result.complete)
                            again = client.search(
                                qs, 10, nprobe=4, refine_factor=refine,
                                allowed_ids=allowed)
                            np.testing.assert_array_equal(again.ids,
                                                          result.ids)
                            np.testing.assert_array_equal(again.distances,
                                                          result.distances)
            for fake in fakes:
                last = fake.requests[-1]
                self.assertTrue(last.return_candidates)
                self.assertEqual((last.k, last.nprobe, last.refine_factor,
                                  last.index_version, len(last.allowed_ids)),
                                 (10, 4, 3, V, 4))

    def test_float16_queries_merge_like_their_float32_values(self):
        pb = self.pb
        fakes = self.shards(pb.METRIC_L2)
        client = self.client(fakes)
        half = queries(20).astype(np.float16)
        for refine in (0, 3):
            with self.subTest(refine=refine):
                result = client.search(half, 10, nprobe=4,
                                       refine_factor=refine)
                self.assert_unsharded(result, half.astype(np.float32), V, 10,
                                      pb.METRIC_L2, refine, None)
                for fake in fakes:
                    last = fake.requests[-1]
                    self.assertEqual(last.vectors_f32le, b"")
                    self.assertEqual(len(last.vectors_f16le), 20 * DIM * 2)

    def test_bearer_token_goes_to_every_shard(self):
        fakes = self.shards()
        token = "a-search-token-0123456789"
        self.client(fakes, bearer_token=token).search(queries(1), 3)
        self.assertEqual([f.metadata[0].get("authorization") for f in fakes],
                         [f"Bearer {token}"] * 3)

    def test_bad_arguments_raise_before_any_rpc(self):
        fakes = self.shards()
        client = self.client(fakes)
        for args, kwargs, error in (
                ((queries(2).astype(np.float64), 3), {}, TypeError),
                ((queries(2), 0), {}, ValueError),
                ((queries(2), 3), {"timeout_s": 0}, ValueError),
                ((queries(2), 3), {"refine_factor": -1}, ValueError)):
            with self.assertRaises(error):
                client.search(*args, **kwargs)
        self.assertEqual([len(f.requests) for f in fakes], [0, 0, 0])
        for targets, error, message in (
                (fakes[0].address, TypeError, "a list of gRPC targets"),
                ([], ValueError, "one target per shard"),
                ([fakes[0].address] * 2, ValueError, "listed twice")):
            with self.assertRaisesRegex(error, message):
                self.connect(targets)

    # ---- versions

    def test_requests_pin_the_lowest_serving_version_and_never_mix(self):
        pb = self.pb
        qs = queries(20)
        # Shard 0 has swapped to V+1 (different vectors) and keeps V.
        fakes = self.shards(serving=[V + 1, V, V], retained=[[V], [], []])
        client = self.client(fakes)
        # A new client knows no version: its first answers mix V+1 and V,
        # so the call is asked again pinned to V.
        result = client.search(qs, 10, refine_factor=3)
        self.assert_unsharded(result, qs, V, 10, pb.METRIC_L2, 3)
        self.assertEqual(fakes[0].pinned(), [0, V])
        self.assertEqual(client.versions.serving_versions(), [V + 1, V, V])
        # From now on every request is pinned from the start.
        self.assert_unsharded(client.search(qs, 10), qs, V, 10,
                              pb.METRIC_L2, 0)
        self.assertEqual([f.pinned() for f in fakes], [[0, V, V]] * 3)
        # The others swap too: this call learns it, still answered at V...
        for fake in fakes[1:]:
            fake.swap(V + 1, keep=[V])
        self.assert_unsharded(client.search(qs, 10), qs, V, 10,
                              pb.METRIC_L2, 0)
        # ...and the next one uses V+1 everywhere.
        self.assert_unsharded(client.search(qs, 10), qs, V + 1, 10,
                              pb.METRIC_L2, 0)
        self.assertEqual([f.pinned()[-1] for f in fakes], [V + 1] * 3)

    def test_info_checks_the_set_and_teaches_the_versions(self):
        fakes = self.shards(serving=[V + 1, V, V], retained=[[V], [], []])
        client = self.client(fakes, order=(1, 2, 0))
        infos = client.info()
        self.assertEqual([i.shard.shard_id for i in infos], [1, 2, 0])
        self.assertEqual(sum(i.ntotal for i in infos), N)
        self.assertEqual({i.shard.build_id for i in infos}, {BUILD})
        self.assertEqual(list(infos[2].retained_versions), [V])
        client.search(queries(3), 5)
        self.assertEqual([f.pinned() for f in fakes], [[V]] * 3,
                         "the first search after info() was not pinned")

    def test_a_shard_without_the_pinned_version_is_retried_with_the_new_one(self):
        pb = self.pb
        qs = queries(20)
        fakes = self.shards()
        client = self.client(fakes)
        client.search(qs, 10)  # learns V
        # Every shard swaps to V+1; shard 0 keeps nothing.
        fakes[0].swap(V + 1)
        for fake in fakes[1:]:
            fake.swap(V + 1, keep=[V])
        result = client.search(qs, 10, refine_factor=2)
        self.assert_unsharded(result, qs, V + 1, 10, pb.METRIC_L2, 2)
        self.assertEqual(fakes[0].pinned(), [0, V, V + 1])
        self.assertEqual(fakes[1].pinned(), [0, V, V + 1])

    def test_the_version_retry_happens_once_then_the_shard_fails(self):
        grpc, pb = self.grpc, self.pb
        qs = queries(20)
        fakes = self.shards()
        client = self.client(fakes)
        client.search(qs, 10)  # learns V
        # Shard 0 jumped to V+2 and keeps nothing; the others serve V+1 and
        # keep V. No version is common to the three.
        fakes[0].swap(V + 2)
        for fake in fakes[1:]:
            fake.swap(V + 1, keep=[V])
        with self.assertRaises(grpc.RpcError) as err:
            client.search(qs, 10)
        e = err.exception
        self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn(f"shard 0 at {fakes[0].address}", e.details())
        self.assertIn(f"index_version {V + 1} is not loaded", e.details())
        self.assertIn(("knnd-serving-version", str(V + 2)),
                      list(e.trailing_metadata()))
        self.assertEqual(fakes[0].pinned(), [0, V, V + 1], "not one retry")
        # Partial answers allowed: the shards at V+1 answer, shard 0 is
        # named missing, and nothing of V+2 is mixed in.
        result = client.search(qs, 10, allow_partial=True)
        self.assert_unsharded(result, qs, V + 1, 10, pb.METRIC_L2, 0,
                              without=[0])
        self.assertEqual(result.missing_shards, (0,))
        self.assertEqual(result.missing_targets, (fakes[0].address,))
        self.assertEqual(result.failures[0].code(),
                         grpc.StatusCode.FAILED_PRECONDITION)
        # A shard whose version moves on every call: the set's version
        # changes after the retry too, and still only one retry is made.
        fakes[0].swap(V + 3)
        fakes[0].swap_each_call = True
        for fake in fakes[1:]:
            fake.swap(V + 9, keep=range(V, V + 9))
        client.search(qs, 10, allow_partial=True)  # learns them
        pin = client.versions.set_version()
        before = len(fakes[0].requests)
        with self.assertRaises(grpc.RpcError) as err:
            client.search(qs, 10)
        self.assertEqual(err.exception.code(),
                         grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(fakes[0].pinned()[before:], [pin, pin + 1],
                         "not one retry")
        self.assertEqual(client.versions.set_version(), pin + 2)

    # ---- failures

    def test_a_failing_shard_fails_the_call_naming_it(self):
        grpc, pb = self.grpc, self.pb
        qs = queries(10)
        fakes = self.shards()
        client = self.client(fakes, order=(2, 1, 0))
        fakes[1].fail_always = ("fail", grpc.StatusCode.INTERNAL,
                                "disk on fire", None)
        with self.assertRaises(grpc.RpcError) as err:
            client.search(qs, 5)
        self.assertEqual(err.exception.code(), grpc.StatusCode.INTERNAL)
        self.assertEqual(err.exception.details(),
                         f"the shard at {fakes[1].address} (targets[1]): "
                         "disk on fire")
        self.assertEqual(err.exception.target, fakes[1].address)
        self.assertEqual(len(fakes[1].requests), 1, "INTERNAL was retried")
        # Once it has answered, its shard id is known and named.
        fakes[1].fail_always = None
        client.search(qs, 5)
        fakes[1].fail_always = ("fail", grpc.StatusCode.INTERNAL,
                                "disk on fire", None)
        with self.assertRaises(grpc.RpcError) as err:
            client.search(qs, 5)
        self.assertEqual(err.exception.details(),
                         f"shard 1 at {fakes[1].address}: disk on fire")
        self.assertEqual(err.exception.shard_id, 1)
        # Partial answers: the others' merged answer, shard 1 named missing.
        allowed = np.arange(100, 200)
        for allow_partial_per_call in (True, None):
            partial = client if allow_partial_per_call else self.client(
                fakes, order=(2, 1, 0), allow_partial=True)
            result = partial.search(qs, 5, allowed_ids=allowed,
                                    allow_partial=allow_partial_per_call)
            self.assert_unsharded(result, qs, V, 5, pb.METRIC_L2, 0,
                                  allowed=allowed, without=[1])
            self.assertEqual(result.missing_shards, (1,))
            self.assertEqual(result.missing_targets, (fakes[1].address,))
            self.assertFalse(result.complete)
            self.assertEqual(result.failures[0].code(), grpc.StatusCode.INTERNAL)
            ids = partial.search(qs, 5, allowed_ids=allowed,
                                 allow_partial=allow_partial_per_call).ids
            np.testing.assert_array_equal(ids, result.ids)
        # Partial answers need one shard that answers.
        for fake in fakes:
            fake.fail_always = ("fail", grpc.StatusCode.UNIMPLEMENTED, "no", None)
        with self.assertRaises(grpc.RpcError) as err:
            client.search(qs, 5, allow_partial=True)
        self.assertEqual(err.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        self.assertIn("no shard answered", err.exception.details())

    def test_unavailable_and_resource_exhausted_shards_are_asked_again(self):
        grpc, pb = self.grpc, self.pb
        from knnd_client import RetryPolicy
        qs = queries(10)
        fakes = self.shards()
        client = self.client(fakes)
        fakes[2].script = [("fail", grpc.StatusCode.UNAVAILABLE, "draining", None),
                           ("fail", grpc.StatusCode.RESOURCE_EXHAUSTED, "full", 300)]
        result = client.search(qs, 5, refine_factor=2)
        self.assert_unsharded(result, qs, V, 5, pb.METRIC_L2, 2)
        self.assertEqual([len(f.requests) for f in fakes], [1, 1, 3])
        self.assertGreaterEqual(fakes[2].times[2] - fakes[2].times[1], 0.3,
                                "the pushback was not honoured")
        # Retries off: the shard's error, named.
        fakes[2].script = [("fail", grpc.StatusCode.UNAVAILABLE, "draining", None)]
        with self.assertRaises(grpc.RpcError) as err:
            self.client(fakes, retry=RetryPolicy(max_attempts=1)).search(qs, 5)
        self.assertEqual(err.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn(fakes[2].address, err.exception.details())

    def test_a_hanging_shard_ends_the_call_by_its_deadline(self):
        grpc, pb = self.grpc, self.pb
        qs = queries(10)
        fakes = self.shards()
        client = self.client(fakes)
        client.search(qs, 5)  # connected, shard ids known
        deadline_s = 0.6
        for allow_partial in (False, True):
            with self.subTest(allow_partial=allow_partial):
                fakes[1].script = [("hang", 30)]
                cancelled = fakes[1].cancelled
                start = time.monotonic()
                if allow_partial:
                    result = client.search(
                        qs, 5, timeout_s=deadline_s, allow_partial=True)
                else:
                    with self.assertRaises(grpc.RpcError) as err:
                        client.search(qs, 5, timeout_s=deadline_s)
                elapsed = time.monotonic() - start
                self.assertLess(elapsed, deadline_s + DEADLINE_MARGIN_S)
                if allow_partial:
                    self.assert_unsharded(result, qs, V, 5, pb.METRIC_L2, 0,
                                          without=[1])
                    self.assertEqual(result.missing_shards, (1,))
                    self.assertEqual(result.failures[0].code(),
                                     grpc.StatusCode.DEADLINE_EXCEEDED)
                else:
                    self.assertEqual(err.exception.code(),
                                     grpc.StatusCode.DEADLINE_EXCEEDED)
                    self.assertIn(f"shard 1 at {fakes[1].address}",
                                  err.exception.details())
                self.wait_for(lambda: fakes[1].cancelled == cancelled + 1,
                              "the hanging shard's call was not cancelled")

    def test_a_failure_does_not_wait_for_a_hanging_shard(self):
        grpc = self.grpc
        fakes = self.shards()
        client = self.client(fakes)
        fakes[0].script = [("hang", 30)]
        # Shard 2 fails once shard 0 hangs on its call.
        fakes[2].script = [("fail_after", fakes[0].received,
                            grpc.StatusCode.INTERNAL, "bug")]
        with self.assertRaises(grpc.RpcError) as err:
            client.search(queries(2), 5, timeout_s=20)
        # Waiting for shard 0 would end in its DEADLINE_EXCEEDED instead.
        self.assertEqual(err.exception.code(), grpc.StatusCode.INTERNAL)
        self.assertIn(fakes[2].address, err.exception.details())
        self.wait_for(lambda: fakes[0].cancelled == 1,
                      "the hanging shard's call was not cancelled")

    # ---- sets that must not be merged

    def test_sets_that_must_not_be_merged_fail(self):
        grpc = self.grpc
        cases = [
            ("build_id", dict(build_id=[BUILD, BUILD, "build-other"]), None,
             "different builds.*'build-other'"),
            ("shard ids", dict(shard_id=[0, 1, 1]), None,
             "shard 1 by .* more than once|more than once: shard 1 by"),
            ("shard count", {}, (0, 1), "client has 2 targets.*one of 3 shards"),
            ("not a shard", dict(whole=[False, True, False]), None,
             "not a shard: 127.0.0.1:[0-9]+ \\(targets\\[1\\]\\)"),
        ]
        for name, per_shard, order, message in cases:
            with self.subTest(name):
                fakes = self.shards(**per_shard)
                for allow_partial in (False, True):
                    client = self.client(fakes, order=order or (0, 1, 2),
                                         allow_partial=allow_partial)
                    for call in (lambda: client.search(queries(2), 5),
                                 client.info):
                        with self.assertRaisesRegex(grpc.RpcError,
                                                    message) as err:
                            call()
                        self.assertEqual(err.exception.code(),
                                         grpc.StatusCode.FAILED_PRECONDITION)

    def test_a_restarted_shard_is_asked_again_within_a_second(self):
        # A shard down for some seconds, then serving again on its
        # address: the client's channel tries to connect at most a second
        # apart (_common.RECONNECT_BACKOFF_OPTIONS), so calls succeed
        # again within about a second, not after gRPC's default backoff.
        fakes = self.shards()
        client = self.client(fakes, timeout_s=0.5)
        qs = queries(1)
        client.search(qs, 5)
        down = fakes[1]
        down.stop()
        end = time.monotonic() + 5
        while time.monotonic() < end:  # an API worker keeps calling
            with self.assertRaises(self.grpc.RpcError):
                client.search(qs, 5)
            time.sleep(0.1)
        restarted = self.FakeShard(down.first, down.end, 1, port=down.port)
        self.addCleanup(restarted.stop)
        serving = time.monotonic()
        while True:
            try:
                client.search(qs, 5)
                break
            except self.grpc.RpcError:
                time.sleep(0.02)
        self.assertLess(time.monotonic() - serving, 2.0)

    def wait_for(self, condition, message, timeout_s=5):
        end = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > end:
                self.fail(message)
            time.sleep(0.01)


class ShardedClientTest(ShardedContract, unittest.TestCase):
    """ShardedKnnClient (grpc futures) against fake shards."""

    def connect(self, targets, **client_args):
        from knnd_client import ShardedKnnClient
        client = ShardedKnnClient(targets, **client_args)
        self.addCleanup(client.close)
        return client

    def test_searches_from_many_threads(self):
        pb = self.pb
        fakes = self.shards()
        client = self.client(fakes)
        qs = queries(8)
        want = unsharded(qs, V, 5, pb.METRIC_L2, 2)[0]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(
                lambda _: client.search(qs, 5, refine_factor=2).ids, range(24)))
        for ids in answers:
            np.testing.assert_array_equal(ids, want)


class AsyncShardedClientTest(ShardedContract, unittest.TestCase):
    """AsyncShardedKnnClient (asyncio tasks) against the same fakes."""

    def setUp(self):
        super().setUp()
        self.loop = LoopThread()
        self.addCleanup(self.loop.stop)  # runs after the clients' close

    def connect(self, targets, **client_args):
        from knnd_client.aio import AsyncShardedKnnClient

        async def make():
            return AsyncShardedKnnClient(targets, **client_args)
        client = self.loop.run(make())
        self.addCleanup(lambda: self.loop.run(client.close()))
        return Blocking(self.loop, client)

    def test_created_outside_a_loop_it_refuses(self):
        from knnd_client import AsyncShardedKnnClient
        with self.assertRaisesRegex(RuntimeError, "running event loop"):
            AsyncShardedKnnClient(["127.0.0.1:1"])

    def test_cancelling_the_search_cancels_every_shard_call(self):
        fakes = self.shards()
        for fake in fakes:
            fake.script = [("hang", 30)]
        client = self.client(fakes)._client

        async def cancel_one():
            task = asyncio.ensure_future(client.search(queries(2), 5))
            while sum(len(f.requests) for f in fakes) < 3:
                await asyncio.sleep(0.01)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
        self.loop.run(cancel_one())
        self.wait_for(lambda: [f.cancelled for f in fakes] == [1, 1, 1],
                      "a shard's call was not cancelled")


def load_tests(loader, tests, pattern):
    """Inside the venv: the suite; outside: InstallTest, which runs it."""
    classes = ([MergeUnitTest, ShardedClientTest, AsyncShardedClientTest]
               if os.environ.get(VENV_ENV) else [InstallTest])
    suite = unittest.TestSuite()
    for cls in classes:
        suite.addTests(loader.loadTestsFromTestCase(cls))
    return suite


def main():
    global ARGS
    import warnings
    warnings.simplefilter("ignore", DeprecationWarning)
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--build-dir")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
