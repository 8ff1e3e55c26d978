"""Scatter-gather over the shards of one index: what ShardedKnnClient and
AsyncShardedKnnClient share (docs/sharding.md, "The merge", rules 1-5).

An index split by `knnctl build --shards N` is served by N knnd processes,
one per shard (each may have replicas behind its own target). Asking every
shard with the same request and merging their answers gives the answer of
the unsharded index, provided that the merge follows the rules the C++
front follows too. They live here, once, without I/O, so that the sync and
the asyncio client cannot drift apart and each rule can be tested without
a server:

- shard_request: the request every shard gets (rule 1);
- merge_top_k / merge_candidates / merge_answers: the merge (rules 2, 3);
- check_answers / check_infos: one version, one build, a complete set of
  distinct shards (rule 4);
- ShardVersions: the version every request pins (rule 4);
- SearchScatter / InfoScatter: the decisions of one call (which shards to
  ask, retry or not, fail or answer partially; rule 5), driven by the
  clients' I/O loops.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import (Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple,
                    Union)

import grpc
import grpc.aio
import numpy as np
import numpy.typing as npt

from knnd_client import _common
from knnd_client._common import pushback_ms
from knnd_client.errors import ShardedSearchError, _code, _details, _trailing
from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
from knnd_client.types import RetryPolicy, ShardedSearchResult

__all__ = ["SERVING_VERSION_METADATA_KEY", "ShardVersions", "shard_request",
           "merge_top_k", "merge_candidates", "merge_answers",
           "check_answers", "check_infos", "serving_version_of"]

# Trailing metadata of knnd's FAILED_PRECONDITION for an index_version it
# does not have: the version it serves instead.
SERVING_VERSION_METADATA_KEY = "knnd-serving-version"

_DESCENDING_METRICS = (pb.METRIC_INNER_PRODUCT, pb.METRIC_COSINE)


# --------------------------------------------------------------------------
# Rule 1: the request of every shard

def shard_request(request: pb.SearchRequest,
                  index_version: Optional[int]) -> pb.SearchRequest:
    """The request every shard gets: the caller's, pinned to the set's
    `index_version` (None: unpinned, each shard's serving version) and with
    return_candidates, which a shard ignores without re-ranking and which
    with re-ranking is the only way to merge exactly (rule 3). Shards are
    never asked for partial results: that option is the front's, and a
    shard has no shards."""
    copy = pb.SearchRequest()
    copy.CopyFrom(request)
    copy.return_candidates = True
    copy.allow_partial_results = False
    if index_version:
        copy.index_version = index_version
    else:
        copy.ClearField("index_version")
    return copy


# --------------------------------------------------------------------------
# Rules 2 and 3: the merge

def pad_distance(metric: int) -> float:
    """The distance of a padding id -1: the worst one of the metric."""
    return -np.inf if metric in _DESCENDING_METRICS else np.inf


def _best_columns(ids: npt.NDArray[np.int64], distances: npt.NDArray[Any],
                  n: int, metric: int) -> npt.NDArray[np.intp]:
    """Per row, the columns of the `n` best entries, best first: padding
    (id < 0) after every real id, then by distance in the metric's order,
    then by ascending id, so that equal distances come out the same however
    the ids were split over the shards."""
    key = distances if metric not in _DESCENDING_METRICS else -distances
    # lexsort: the last key is the primary one; sorts each row (axis -1).
    order = np.lexsort((ids, key, ids < 0), axis=-1)
    return order[:, :n]


def _padded(ids: npt.NDArray[np.int64], distances: npt.NDArray[Any], k: int,
            metric: int
            ) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """(ids, distances) cut or padded to k columns, every id < 0 made -1
    with the metric's worst distance (whatever distance a shard sent)."""
    nq, m = ids.shape
    if m < k:
        ids = np.concatenate([ids, np.full((nq, k - m), -1, np.int64)], axis=1)
        distances = np.concatenate(
            [distances, np.zeros((nq, k - m), distances.dtype)], axis=1)
    ids, distances = ids[:, :k], distances[:, :k]
    pad = ids < 0
    return (np.where(pad, np.int64(-1), ids).astype(np.int64, copy=False),
            np.where(pad, np.float32(pad_distance(metric)),
                     distances).astype(np.float32, copy=False))


def _top_k_columns(ids: npt.NDArray[np.int64], distances: npt.NDArray[Any],
                   k: int, metric: int) -> npt.NDArray[np.intp]:
    """Rule 2's choice: per row, the columns of the k best."""
    return _best_columns(ids, distances, k, metric)


def _candidate_columns(ids: npt.NDArray[np.int64], approx: npt.NDArray[Any],
                       exact: npt.NDArray[Any], k: int, refine_factor: int,
                       metric: int) -> npt.NDArray[np.intp]:
    """Rule 3's choice: per row, the columns of the k best exact distances
    among the refine_factor * k best PQ estimates."""
    candidates = _best_columns(ids, approx, refine_factor * k, metric)
    best = _best_columns(np.take_along_axis(ids, candidates, axis=1),
                         np.take_along_axis(exact, candidates, axis=1),
                         k, metric)
    return np.take_along_axis(candidates, best, axis=1)


def _taken(ids: npt.NDArray[np.int64], distances: npt.NDArray[Any],
           columns: npt.NDArray[np.intp], k: int, metric: int
           ) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    return _padded(np.take_along_axis(ids, columns, axis=1),
                   np.take_along_axis(distances, columns, axis=1), k, metric)


def merge_top_k(ids: npt.NDArray[np.int64], distances: npt.NDArray[Any],
                k: int, metric: int
                ) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Rule 2: the k best of each row of the shards' answers laid side by
    side (shape (num_queries, sum of the shards' k)). Padding -1 of a shard
    never displaces a real id; a row with fewer than k real ids is padded."""
    return _taken(ids, distances, _top_k_columns(ids, distances, k, metric),
                  k, metric)


def merge_candidates(ids: npt.NDArray[np.int64], approx: npt.NDArray[Any],
                     exact: npt.NDArray[Any], k: int, refine_factor: int,
                     metric: int
                     ) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Rule 3: of the shards' candidates laid side by side, the
    refine_factor * k best PQ estimates (`approx`): the candidates the
    unsharded index would have re-ranked; then the k best exact distances
    among them. Taking each shard's own k exact best instead would re-rank
    refine_factor * k candidates per shard, a different (larger) set than
    the unsharded index's, so answers would change with the shard count."""
    return _taken(ids, exact, _candidate_columns(ids, approx, exact, k,
                                                 refine_factor, metric),
                  k, metric)


def merge_answers(answers: Sequence[pb.SearchResponse], num_queries: int,
                  k: int
                  ) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """The merged (ids, distances) of answers that check_answers accepted
    (one metric and refine_factor, each num_queries rows of the expected
    width)."""
    ids, distances, _ = merge_answers_with_payloads(answers, num_queries, k)
    return ids, distances


def merge_answers_with_payloads(
        answers: Sequence[pb.SearchResponse], num_queries: int, k: int
) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.float32],
           Optional[List[List[bytes]]]]:
    """merge_answers(), and when the answers carry payloads
    (SearchRequest.payloads) each merged result's, per query (b"" for a
    padding -1); None without payloads."""
    metric, refine_factor = answers[0].metric, answers[0].refine_factor

    def side_by_side(column: str) -> npt.NDArray[Any]:
        return np.concatenate(
            [_common.result_column(a, column).reshape(num_queries, -1)
             for a in answers], axis=1)
    ids = side_by_side("ids")
    distances = side_by_side("distances")
    # Filtered, each shard planned alone (exact over its matching rows, or
    # a widened IVF scan): their estimates do not compare, so the k best
    # exact distances over every candidate are taken (the front's rule).
    filtered = any(a.filter_plan != pb.FILTER_PLAN_UNSPECIFIED
                   for a in answers)
    if refine_factor == 0 or filtered:
        columns = _top_k_columns(ids, distances, k, metric)
    else:
        columns = _candidate_columns(ids, side_by_side("approx_distances"),
                                     distances, k, refine_factor, metric)
    merged_ids, merged_distances = _taken(ids, distances, columns, k, metric)
    if not answers[0].payloads:
        return merged_ids, merged_distances, None
    rows: List[List[bytes]] = [[] for _ in range(num_queries)]
    for a in answers:
        width = len(a.payloads) // num_queries
        for q in range(num_queries):
            rows[q].extend(a.payloads[q * width:(q + 1) * width])
    payloads = [[rows[q][c] if merged_ids[q, j] >= 0 else b""
                 for j, c in enumerate(columns[q])] +
                [b""] * (k - len(columns[q]))
                for q in range(num_queries)]
    return merged_ids, merged_distances, payloads


# --------------------------------------------------------------------------
# Rule 4: versions and the checks of a shard set

def serving_version_of(error: BaseException) -> Optional[int]:
    """The knnd-serving-version of a FAILED_PRECONDITION (the shard no
    longer has the pinned version), or None for any other error."""
    if _code(error) != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    for key, value in _trailing(error):
        if key == SERVING_VERSION_METADATA_KEY:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None


class ShardVersions:
    """Per target (by its position in the client's list), the version its
    shard last said it serves, and its shard id once it answered.

    The set's version is the lowest of the serving versions: every shard
    has it, either serving it or keeping it loaded after a swap
    (keep_previous_versions), so pinning it never mixes versions and a new
    version is used only once every shard serves it. Until every target has
    reported one it is None and requests go unpinned; a first answer that
    mixes versions is then retried pinned (SearchScatter).

    Shared by every call of one client, from any thread (the lock is never
    held across I/O, so the asyncio client uses it as it is).
    """

    def __init__(self, count: int) -> None:
        self._lock = threading.Lock()
        self._serving: List[Optional[int]] = [None] * count
        self._shard_ids: List[Optional[int]] = [None] * count

    def record(self, target: int, serving_version: int) -> None:
        """Records the version `target` serves (0 or less: unknown, from a
        knnd that does not report it, and ignored)."""
        if serving_version > 0:
            with self._lock:
                self._serving[target] = serving_version

    def record_response(self, target: int, response: Any) -> None:
        """Learns from a SearchResponse or a GetIndexInfoResponse."""
        if isinstance(response, pb.GetIndexInfoResponse):
            self.record(target, response.version)
        else:
            self.record(target, response.serving_version)
        if response.HasField("shard") and response.shard.shard_count:
            with self._lock:
                self._shard_ids[target] = response.shard.shard_id

    def record_error(self, target: int, error: BaseException) -> Optional[int]:
        """Learns the serving version from a FAILED_PRECONDITION's
        knnd-serving-version; returns it (None: `error` had none)."""
        version = serving_version_of(error)
        if version is not None:
            self.record(target, version)
        return version

    def set_version(self) -> Optional[int]:
        """The version to pin: the lowest serving version, or None while a
        target's is unknown."""
        with self._lock:
            if any(v is None for v in self._serving):
                return None
            return min(v for v in self._serving if v is not None)

    def serving_versions(self) -> List[Optional[int]]:
        """The last serving version of each target (None: not known yet)."""
        with self._lock:
            return list(self._serving)

    def shard_id(self, target: int) -> Optional[int]:
        """The shard id `target` last answered as, or None."""
        with self._lock:
            return self._shard_ids[target]


def describe(targets: Sequence[str], versions: ShardVersions,
             target: int) -> str:
    """How messages name a target: its shard id when known, and its address."""
    shard_id = versions.shard_id(target)
    if shard_id is None:
        return f"the shard at {targets[target]} (targets[{target}])"
    return f"shard {shard_id} at {targets[target]}"


def _check_set(targets: Sequence[str], versions: ShardVersions,
               answers: Mapping[int, Any]) -> str:
    """The checks of rule 4 common to search answers and index infos:
    every answer is a shard, of a set of len(targets) shards, of one build,
    with distinct shard ids. Returns the build id; raises
    ShardedSearchError (FAILED_PRECONDITION naming the shards) otherwise."""
    def fail(what: str) -> ShardedSearchError:
        return ShardedSearchError(grpc.StatusCode.FAILED_PRECONDITION, what)

    def name(i: int) -> str:
        return describe(targets, versions, i)
    whole = [i for i, a in sorted(answers.items())
             if not a.HasField("shard") or a.shard.shard_count == 0]
    if whole:
        raise fail(
            "not a shard: " + ", ".join(f"{targets[i]} (targets[{i}])"
                                        for i in whole)
            + " answered without `shard`, so it serves a whole index (or is "
            "a front of shards); a sharded client needs the targets of the "
            "shards of one `knnctl build --shards N`, one per shard")
    counts = {i: a.shard.shard_count for i, a in answers.items()}
    wrong = sorted(i for i, c in counts.items() if c != len(targets))
    if wrong:
        raise fail(
            f"the client has {len(targets)} targets but "
            + ", ".join(f"{name(i)} is one of {counts[i]} shards"
                        for i in wrong)
            + ": give exactly one target per shard of the set")
    builds = {i: a.shard.build_id for i, a in answers.items()}
    if len(set(builds.values())) > 1:
        raise fail("shards of different builds (never merged): " + ", ".join(
            f"{name(i)}: build_id {builds[i]!r}" for i in sorted(builds)))
    by_id: Dict[int, List[int]] = {}
    for i, a in answers.items():
        by_id.setdefault(a.shard.shard_id, []).append(i)
    repeated = {s: t for s, t in by_id.items() if len(t) > 1}
    if repeated:
        raise fail("shards answered more than once: " + "; ".join(
            f"shard {s} by " + ", ".join(targets[i] for i in sorted(t))
            for s, t in sorted(repeated.items()))
            + "; give exactly one target per shard of the set")
    out_of_range = sorted(i for i, a in answers.items()
                          if a.shard.shard_id >= len(targets))
    if out_of_range:
        raise fail("shard ids out of [0, shard_count): " + ", ".join(
            name(i) for i in out_of_range))
    return str(next(iter(builds.values())))


def check_answers(targets: Sequence[str], versions: ShardVersions,
                  answers: Mapping[int, pb.SearchResponse],
                  request: pb.SearchRequest) -> Tuple[int, str]:
    """Rule 4 over the answers of one search (target position -> answer),
    plus what the merge needs: one index_version, one metric, nprobe and
    refine_factor (shards that used different defaults would not make the
    unsharded answer), and rows of the expected shape (with re-ranking:
    every candidate's PQ estimate, without which rule 3 cannot be
    followed). Returns (index_version, build_id); raises
    ShardedSearchError (FAILED_PRECONDITION, as the C++ front) otherwise."""
    build_id = _check_set(targets, versions, answers)

    def name(i: int) -> str:
        return describe(targets, versions, i)
    # Shards answer one request with different nprobe or refine_factor
    # only when it left them unset and each took its own default.
    defaults = ("each shard took its own default: tune the set as one "
                "(knnctl tune --index OUT --shards N records one decision in "
                "every shard's sidecar), give every shard the same default "
                "in its config, or pass {} explicitly")
    for field, hint in (("index_version", "answers never mix versions"),
                        ("metric", "one index, one metric"),
                        ("nprobe", defaults.format("nprobe")),
                        ("refine_factor", defaults.format("refine_factor"))):
        values = {i: getattr(a, field) for i, a in answers.items()}
        if len(set(values.values())) > 1:
            raise ShardedSearchError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"shards answered with different {field} ({hint}): "
                + ", ".join(f"{name(i)}: {values[i]}" for i in sorted(values)))
    first = next(iter(answers.values()))
    if first.metric not in (pb.METRIC_L2, *_DESCENDING_METRICS):
        raise ShardedSearchError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"shards answered with metric {first.metric}, which cannot be "
            "merged (a knnd older than this client?)")
    num_queries = _common.request_rows(request)
    candidates_width = request.k * (first.refine_factor or 1)
    for i, a in sorted(answers.items()):
        # A filtered answer holds the shard's k best exact distances (all
        # the merge can use, rule 3); an older knnd sends its candidates.
        filtered = a.filter_plan != pb.FILTER_PLAN_UNSPECIFIED
        width = (request.k if filtered and a.k == request.k
                 else candidates_width)
        cells = num_queries * width
        ids = _common.result_column(a, "ids")
        shape_ok = (a.num_queries == num_queries and a.k == width
                    and ids.size == cells
                    and _common.result_column(a, "distances").size == cells)
        if shape_ok and first.refine_factor and not filtered and \
                _common.result_column(a, "approx_distances").size != cells:
            raise ShardedSearchError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{name(i)} re-ranked without returning its candidates' "
                "PQ estimates (approx_distances), which the merge needs: is "
                "it a knnd older than return_candidates?")
        if not shape_ok:
            raise ShardedSearchError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{name(i)} answered {a.num_queries}x{a.k} results "
                f"({ids.size} ids) for {num_queries} queries at "
                f"{width} per query")
        if request.HasField("payloads") and len(a.payloads) != cells:
            raise ShardedSearchError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{name(i)} answered {len(a.payloads)} payloads for {cells} "
                "results: is it a knnd older than payloads?")
    return first.index_version, build_id


def check_infos(targets: Sequence[str], versions: ShardVersions,
                infos: Mapping[int, pb.GetIndexInfoResponse]) -> str:
    """Rule 4 over GetIndexInfo answers (every target's); returns the
    build id. Their versions may differ: shards swap independently."""
    return _check_set(targets, versions, infos)


# --------------------------------------------------------------------------
# Rule 5: the decisions of one call

class _NoAnswer(grpc.aio.AioRpcError):
    """What the merger records for a shard still silent at the deadline
    (its own call was cancelled, so gRPC reports nothing for it)."""


@dataclasses.dataclass(frozen=True)
class Retry:
    """Ask again (the shards that requests() names) after delay_s."""
    delay_s: float


@dataclasses.dataclass(frozen=True)
class Done:
    """The call's result."""
    value: Any


Step = Union[Retry, Done]


class Scatter:
    """The state of one call over every shard, without I/O.

    A client's loop: send requests() (target position, request) to those
    targets, each with timeout remaining_s(); report each outcome with
    answered() or failed(), and no_answer() for a target still silent when
    the deadline passes; stop waiting early once stop_early() is true
    (cancelling the calls left); then next_step() returns Retry (sleep,
    loop again) or Done, or raises ShardedSearchError.

    One deadline and one RetryPolicy (attempt count and backoff) cover the
    whole call, not each shard: a retry round re-asks only the shards whose
    error was UNAVAILABLE or RESOURCE_EXHAUSTED as _common retries them
    (their answers would have been the same version's; the others' answers
    are kept), after the longest pushback any of them asked for.
    """

    def __init__(self, targets: Sequence[str], versions: ShardVersions,
                 policy: RetryPolicy, timeout_s: float, request: Any,
                 allow_partial: bool) -> None:
        self.targets = targets
        self.versions = versions
        self._policy = policy
        self._attempts = _common.Attempts(
            policy, time.monotonic() + timeout_s, type(request).__name__)
        self._allow_partial = allow_partial
        self.answers: Dict[int, Any] = {}
        self._errors: Dict[int, BaseException] = {}    # of this round
        self._missing: Dict[int, BaseException] = {}   # given up on

    # ---- what the I/O loop calls

    def remaining_s(self) -> float:
        return self._attempts.remaining_s()

    def requests(self) -> List[Tuple[int, Any]]:
        """The targets to ask in this round, with their request."""
        return [(i, self._request(i)) for i in range(len(self.targets))
                if i not in self.answers and i not in self._missing]

    def answered(self, target: int, response: Any) -> None:
        self.versions.record_response(target, response)
        self.answers[target] = response

    def failed(self, target: int, error: BaseException) -> None:
        self._errors[target] = error

    def no_answer(self, target: int) -> None:
        """`target` had not answered when the deadline passed."""
        self._errors[target] = _NoAnswer(
            grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(),
            grpc.aio.Metadata(), details="no answer within the deadline")

    def stop_early(self) -> bool:
        """Whether the call's outcome is already decided, so that waiting
        for the other shards would only delay the error: a shard failed
        for good and partial answers are not allowed."""
        return not self._allow_partial and any(
            self._decisive(e) for e in self._errors.values())

    def next_step(self) -> Step:
        if self._retry_with_new_version():
            return Retry(0.0)
        errors, self._errors = self._errors, {}
        again = {i: e for i, e in errors.items()
                 if isinstance(e, grpc.RpcError) and self._retryable(e)}
        final = {i: e for i, e in errors.items() if i not in again}
        if final and not self._allow_partial:
            raise self.named(min(final), final[min(final)])
        self._missing.update(final)
        if again:
            # One wait for the round: the longest pushback asked for, else
            # backoff; it counts as one attempt of the whole call.
            worst = max(again, key=lambda i: (pushback_ms(again[i]) or -1, -i))
            delay_s = self._attempts.delay_before_retry_s(again[worst])
            if delay_s is not None:
                return Retry(delay_s)
            if not self._allow_partial:
                raise self.named(worst, again[worst])
            self._missing.update(again)
        if not self.answers:
            raise self._nobody_answered()
        return Done(self._finish())

    # ---- errors

    def named(self, target: int, error: BaseException) -> ShardedSearchError:
        """`error` of `target` as the call's error: the shard's code and
        trailing metadata, details prefixed with the shard's name."""
        code = _code(error) or grpc.StatusCode.UNKNOWN
        return ShardedSearchError(
            code, f"{describe(self.targets, self.versions, target)}: "
            f"{_details(error)}", target=self.targets[target],
            shard_id=self.versions.shard_id(target),
            cause=None if isinstance(error, _NoAnswer) else error,
            trailing_metadata=_trailing(error))

    def _nobody_answered(self) -> ShardedSearchError:
        first = min(self._missing)
        error = self.named(first, self._missing[first])
        others = [f"{describe(self.targets, self.versions, i)}: "
                  f"{(_code(e) or grpc.StatusCode.UNKNOWN).name}"
                  for i, e in sorted(self._missing.items()) if i != first]
        if others:
            return ShardedSearchError(
                error.code(), f"no shard answered: {error.details()}"
                + "; " + "; ".join(others), target=error.target,
                shard_id=error.shard_id, cause=error.cause,
                trailing_metadata=error.trailing_metadata())
        return error

    def _retryable(self, error: BaseException) -> bool:
        # _common's rule (UNAVAILABLE, RESOURCE_EXHAUSTED with a
        # non-negative pushback or from a quota reset); the delay it draws
        # is not used here.
        return isinstance(error, grpc.RpcError) and _common._retry_delay_s(
            error, self._policy.initial_backoff_s, self._policy) is not None

    def _decisive(self, error: BaseException) -> bool:
        return not self._retryable(error)

    def missing(self) -> Dict[int, BaseException]:
        return dict(self._missing)

    # ---- hooks

    def _request(self, target: int) -> Any:
        raise NotImplementedError

    def _retry_with_new_version(self) -> bool:
        return False

    def _finish(self) -> Any:
        raise NotImplementedError


class SearchScatter(Scatter):
    """One sharded search: rules 1-5.

    Versions: requests pin the set's version when it is known. After a
    round, if a shard refused the pinned version (FAILED_PRECONDITION with
    knnd-serving-version) or the answers' versions disagree (unpinned first
    calls), and the set's version has changed meanwhile, every shard is
    asked again, once per call, pinned to the new version; otherwise such
    a shard counts as failed, and answers of mixed versions fail the call.
    """

    def __init__(self, targets: Sequence[str], versions: ShardVersions,
                 policy: RetryPolicy, timeout_s: float,
                 request: pb.SearchRequest, allow_partial: bool) -> None:
        super().__init__(targets, versions, policy, timeout_s, request,
                         allow_partial)
        self._caller_request = request
        self._num_queries = _common.request_rows(request)
        self._version_retried = False
        self._pin = versions.set_version()
        self._pinned = shard_request(request, self._pin)

    def _request(self, target: int) -> pb.SearchRequest:
        return self._pinned

    def failed(self, target: int, error: BaseException) -> None:
        self.versions.record_error(target, error)
        super().failed(target, error)

    def _decisive(self, error: BaseException) -> bool:
        # A refused version may be retried with the new set version.
        return super()._decisive(error) and serving_version_of(error) is None

    def _retry_with_new_version(self) -> bool:
        if self._version_retried:
            return False
        refused = any(serving_version_of(e) is not None
                      for e in self._errors.values())
        served = {a.index_version for a in self.answers.values()}
        if not (refused or len(served) > 1
                or (self._pin is not None and served - {self._pin})):
            return False
        version = self.versions.set_version()
        if (version is None or version == self._pin
                or self.remaining_s() <= 0):
            return False
        self._version_retried = True
        self._pin = version
        self._pinned = shard_request(self._caller_request, version)
        self.answers.clear()
        self._errors.clear()
        self._missing.clear()
        return True

    def _finish(self) -> ShardedSearchResult:
        index_version, build_id = check_answers(
            self.targets, self.versions, self.answers, self._caller_request)
        answers = [self.answers[i] for i in sorted(self.answers)]
        ids, distances, payloads = merge_answers_with_payloads(
            answers, self._num_queries, self._caller_request.k)
        missing = self.missing()
        answered_ids = {a.shard.shard_id for a in answers}
        plans = {a.filter_plan for a in answers}
        return ShardedSearchResult(
            ids=ids, distances=distances,
            payloads=(None if payloads is None
                      else _common.payload_dicts(payloads)),
            index_version=index_version, metric=answers[0].metric,
            nprobe=answers[0].nprobe,
            refine_factor=answers[0].refine_factor,
            # As knnd's front: one plan, or FILTER_PLAN_MIXED.
            filter_plan=(plans.pop() if len(plans) == 1
                         else pb.FILTER_PLAN_MIXED),
            filter_matched_rows=sum(a.filter_matched_rows for a in answers),
            build_id=build_id,
            missing_shards=tuple(s for s in range(len(self.targets))
                                 if s not in answered_ids),
            missing_targets=tuple(self.targets[i] for i in sorted(missing)),
            failures=tuple(self.named(i, e) for i, e in sorted(missing.items())))


class InfoScatter(Scatter):
    """GetIndexInfo of every shard: all must answer (no partial info), and
    they must form one set (rule 4); their versions teach ShardVersions,
    so that a search after info() is pinned from its first request."""

    def __init__(self, targets: Sequence[str], versions: ShardVersions,
                 policy: RetryPolicy, timeout_s: float) -> None:
        self._info_request = pb.GetIndexInfoRequest()
        super().__init__(targets, versions, policy, timeout_s,
                         self._info_request, allow_partial=False)

    def _request(self, target: int) -> pb.GetIndexInfoRequest:
        return self._info_request

    def _finish(self) -> List[pb.GetIndexInfoResponse]:
        check_infos(self.targets, self.versions, self.answers)
        return [self.answers[i] for i in range(len(self.targets))]


def targets_list(targets: Any) -> List[str]:
    """The clients' `targets` argument checked: a non-empty sequence of
    distinct target strings, one per shard."""
    if isinstance(targets, (str, bytes)) or not isinstance(targets, Sequence):
        raise TypeError(
            "targets must be a list of gRPC targets, one per shard, got "
            f"{type(targets).__name__}")
    listed = list(targets)
    if not listed:
        raise ValueError("targets is empty: give one target per shard")
    bad = [t for t in listed if not isinstance(t, str) or not t]
    if bad:
        raise TypeError(f"every target must be a non-empty str, got {bad[0]!r}")
    seen: Set[str] = set()
    for target in listed:
        if target in seen:
            raise ValueError(f"target {target!r} is listed twice: give one "
                             "target per shard")
        seen.add(target)
    return listed
