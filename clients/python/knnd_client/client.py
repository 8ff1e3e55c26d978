"""KnnClient: k-NN search against knnd from an API process that holds no
index.

One KnnClient owns one gRPC channel (HTTP/2 connections to one or more knnd
replicas). It is safe to use from many threads at once; create it once per
process, after any fork() (gRPC channels do not survive fork: a client
created before one raises RuntimeError in the child), and close() it when
done. For asyncio code use knnd_client.AsyncKnnClient, which has the same
contract.
"""
from __future__ import annotations

import queue
import time
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence,
                    Tuple, Union, cast)

import grpc
import numpy as np
import numpy.typing as npt

from knnd_client import _common, errors, sharding
from knnd_client._common import PUSHBACK_METADATA_KEY, RetryPolicy, pushback_ms
from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
from knnd_client._generated.knnd.v1 import knn_service_pb2_grpc as pb_grpc
from knnd_client.sharding import ShardedSearchResult, ShardVersions

__all__ = ["KnnClient", "ShardedKnnClient", "RetryPolicy",
           "PUSHBACK_METADATA_KEY", "pushback_ms"]


class KnnClient:
    """Client of knnd.v1.KnnService.

    target: a gRPC target. "dns:///knnd-headless.NAMESPACE.svc:50051" (a
      Kubernetes headless Service) resolves every replica and spreads calls
      over them round-robin, as does a static "ipv4:10.0.0.1:50051,..."
      list; "host:port" uses gRPC's default pick_first (one connection).
    timeout_s: default deadline of one call, retries and waits included.
    retry: RetryPolicy; RetryPolicy(max_attempts=1) turns retries off.
    credentials: grpc.ssl_channel_credentials(...) for TLS (optionally
      composed with call credentials); None: plaintext.
    bearer_token: sent as "authorization: Bearer <token>" on every call
      (knnd's search_token_file). Also over plaintext, for a mesh whose
      sidecar encrypts; otherwise use it with TLS.
    options: extra gRPC channel arguments; one with the key of the client's
      own (max message sizes, service config) replaces it.
    """

    def __init__(self, target: str, *, timeout_s: float = 2.0,
                 retry: RetryPolicy = RetryPolicy(),
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 bearer_token: Optional[str] = None,
                 options: Sequence[Tuple[str, Any]] = ()) -> None:
        self._timeout_s = _common.positive_timeout_s("timeout_s", timeout_s)
        self._retry = retry
        self._metadata = _common.call_metadata(bearer_token)
        self._fork_guard = _common.ForkGuard("KnnClient")
        self._channel = _common.open_channel(grpc, target, credentials,
                                             options)
        self._stub = pb_grpc.KnnServiceStub(self._channel)
        # Search takes the request already serialized (see _common).
        self._search = self._channel.unary_unary(
            _common.SEARCH_METHOD,
            response_deserializer=pb.SearchResponse.FromString)

    def search(self, queries: npt.NDArray[np.float32], k: int,
               nprobe: Optional[int] = None, *,
               allowed_ids: Optional[npt.ArrayLike] = None,
               filter: Optional[Mapping[str, Any]] = None,
               refine_factor: Optional[int] = None,
               payloads: Union[bool, Sequence[str], None] = None,
               timeout_s: Optional[float] = None,
               ) -> Tuple[Any, ...]:
        """The k nearest neighbours of each row of `queries`.

        queries: float32 array of shape (num_queries, dim), any byte order
          or strides (sent as little-endian row-major bytes); a float16
          array is sent as float16 (vectors_f16le, half the bytes).
        k: neighbours per query, 1 <= k <= the server's max_k.
        nprobe: inverted lists to visit; None: the server's default.
        allowed_ids: optional 1-D integer ids; only these can be returned.
        filter: optional attribute filter (index built with `knnctl build
          --attributes`), a dict in the style of Chroma and Qdrant:
          {"genre": "news"}, {"year": {"$gte": 2020, "$lt": 2024}},
          {"tags": {"$in": ["a", "b"]}}, {"$and": [...]}, {"$or": [...]},
          {"$not": {...}}; operators $eq $ne $in $nin $gt $gte $lt $lte
          $exists. Only rows it admits can be returned; with allowed_ids
          too, rows both admit. A bad dict is ValueError naming the key.
        refine_factor: exact re-ranking of refine_factor * k IVF-PQ
          candidates from the raw vectors served beside the index (distances
          then exact); 0: off; None: the server's default. Needs an index
          built with `knnctl build --keep_vectors` (else FAILED_PRECONDITION).
        payloads: True: every field of each result's payload; a list of
          field names: those fields (a payload lacking one leaves it out);
          None: no payloads. Needs an index built with `knnctl build
          --payloads` (else FAILED_PRECONDITION); an unknown field is
          INVALID_ARGUMENT naming it and the index's fields.
        timeout_s: deadline of this call (retries included); None: the
          client's default.

        Returns (ids, distances): int64 and float32 arrays of shape
        (num_queries, k), closest first; a row with fewer than k neighbours
        is padded with id -1 and distance +inf (L2) or -inf (inner product).
        With payloads, (ids, distances, payloads): payloads[q][j] is the
        dict of ids[q, j]'s payload (None for -1).

        Raises TypeError / ValueError for bad arguments, before any RPC, and
        grpc.RpcError when the server refuses (INVALID_ARGUMENT names the
        field and limit) or the deadline passes (DEADLINE_EXCEEDED).
        """
        request, shape = _common.serialized_search_request(
            queries, k, nprobe, allowed_ids, refine_factor, payloads, filter)
        return _common.search_answer(
            self._call(self._search, request, timeout_s, "Search"), shape,
            payloads)

    def info(self, timeout_s: Optional[float] = None) -> pb.GetIndexInfoResponse:
        """The served index (dim, metric, ntotal, ...) and the server's limits
        (max_k, max_queries_per_request, ...)."""
        return cast(pb.GetIndexInfoResponse,
                    self._call(self._stub.GetIndexInfo,
                               pb.GetIndexInfoRequest(), timeout_s,
                               "GetIndexInfo"))

    def close(self) -> None:
        """Closes the channel; calls in progress end with CANCELLED. In a
        forked child this only drops the inherited channel: closing it
        there would act on the parent's connections."""
        if not self._fork_guard.forked():
            self._channel.close()

    def __enter__(self) -> "KnnClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Callable[..., Any], request: Any,
              timeout_s: Optional[float], what: str) -> Any:
        """Calls `method` within one deadline, retrying per the RetryPolicy."""
        self._fork_guard.check()
        timeout_s = (self._timeout_s if timeout_s is None else
                     _common.positive_timeout_s("timeout_s", timeout_s))
        deadline = time.monotonic() + timeout_s
        try:
            return method(request, timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as error:
            failed = error
        attempts = _common.Attempts(self._retry, deadline, what)
        while True:
            delay_s = attempts.delay_before_retry_s(failed)
            if delay_s is None:
                # knnd_client's own error for the code (errors.py), a
                # grpc.RpcError still; the gRPC one is its `cause`.
                raise errors.from_rpc_error(failed) from None
            _common.sleep_polling(self._channel, delay_s)
            try:
                return method(request, timeout=attempts.remaining_s(),
                              metadata=self._metadata)
            except grpc.RpcError as error:
                failed = error


class ShardedKnnClient:
    """Client of an index split into shards (`knnctl build --shards N`),
    one knnd (or one Service of replicas) per shard: every search goes to
    every shard at once and their answers are merged into the answer of
    the unsharded index (docs/sharding.md, "The merge").

    targets: one gRPC target per shard of the set, in any order; each may
      resolve to several replicas of its shard ("dns:///knnd-shard-0...").
    timeout_s, retry, credentials, bearer_token, options: as KnnClient, for
      every shard. One deadline covers the whole scatter (every shard gets
      what is left of it) and one RetryPolicy its retries: a round re-asks
      only the shards that answered UNAVAILABLE or RESOURCE_EXHAUSTED.
    allow_partial: False (the default): a shard's failure fails the call
      with that shard's status code, the message naming its shard id and
      target. True: answer from the shards that did answer
      (search_result() says which are missing); fail only when none did.

    Thread-safe, one per process, created after any fork, as KnnClient.
    The serving version of every shard (ShardVersions) is shared by the
    client's calls: each search pins the lowest of them, so that answers
    never mix versions while the shards swap one by one.
    """

    def __init__(self, targets: Sequence[str], *, timeout_s: float = 2.0,
                 retry: RetryPolicy = RetryPolicy(),
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 bearer_token: Optional[str] = None,
                 options: Sequence[Tuple[str, Any]] = (),
                 allow_partial: bool = False) -> None:
        self._targets = sharding.targets_list(targets)
        self._timeout_s = _common.positive_timeout_s("timeout_s", timeout_s)
        self._retry = retry
        self._metadata = _common.call_metadata(bearer_token)
        self._allow_partial = bool(allow_partial)
        self._fork_guard = _common.ForkGuard("ShardedKnnClient")
        self._versions = ShardVersions(len(self._targets))
        self._channels: List[grpc.Channel] = [
            _common.open_channel(grpc, target, credentials, options)
            for target in self._targets]
        self._stubs = [pb_grpc.KnnServiceStub(c) for c in self._channels]

    @property
    def targets(self) -> List[str]:
        """The shards' targets, in the order given."""
        return list(self._targets)

    @property
    def versions(self) -> ShardVersions:
        """The serving version each shard last reported (for monitoring:
        versions.set_version() is what the next search pins)."""
        return self._versions

    def search(self, queries: npt.NDArray[np.float32], k: int,
               nprobe: Optional[int] = None, *,
               allowed_ids: Optional[npt.ArrayLike] = None,
               filter: Optional[Mapping[str, Any]] = None,
               refine_factor: Optional[int] = None,
               payloads: Union[bool, Sequence[str], None] = None,
               timeout_s: Optional[float] = None,
               allow_partial: Optional[bool] = None,
               ) -> Tuple[Any, ...]:
        """KnnClient.search over every shard: the same arguments, results
        and argument errors; the unsharded index's (ids, distances).

        allow_partial: None: the client's. With partial answers allowed the
        arrays may come from fewer shards than the set has, which this
        method does not say: use search_result() to know.

        Raises a grpc.RpcError (ShardedSearchError) with a failing shard's
        code, or FAILED_PRECONDITION when the answers are not one set's at
        one version (docs/sharding.md, rule 4).
        """
        result = self.search_result(
            queries, k, nprobe, allowed_ids=allowed_ids, filter=filter,
            refine_factor=refine_factor, payloads=payloads,
            timeout_s=timeout_s, allow_partial=allow_partial)
        if result.payloads is None:
            return result.ids, result.distances
        return result.ids, result.distances, result.payloads

    def search_result(self, queries: npt.NDArray[np.float32], k: int,
                      nprobe: Optional[int] = None, *,
                      allowed_ids: Optional[npt.ArrayLike] = None,
                      filter: Optional[Mapping[str, Any]] = None,
                      refine_factor: Optional[int] = None,
                      payloads: Union[bool, Sequence[str], None] = None,
                      timeout_s: Optional[float] = None,
                      allow_partial: Optional[bool] = None,
                      ) -> ShardedSearchResult:
        """search() with where the answer came from: the index version and
        build, and with allow_partial the shards that are missing."""
        request = _common.search_request(queries, k, nprobe, allowed_ids,
                                         refine_factor, payloads, filter)
        self._fork_guard.check()
        scatter = sharding.SearchScatter(
            self._targets, self._versions, self._retry,
            self._call_timeout_s(timeout_s), request,
            self._allow_partial if allow_partial is None else bool(allow_partial))
        return cast(ShardedSearchResult, self._run(scatter, "Search"))

    def info(self, timeout_s: Optional[float] = None
             ) -> List[pb.GetIndexInfoResponse]:
        """Every shard's GetIndexInfo, in the order of `targets`, after
        checking that they are one set (one build_id, one shard per id);
        each one's `shard` says which ids it holds and `version` what it
        serves. Aggregates are the caller's: sum(i.ntotal for i in infos)
        is the set's size. Every shard must answer. Also teaches the client
        the shards' versions, so that a search after it is pinned from its
        first request."""
        self._fork_guard.check()
        scatter = sharding.InfoScatter(self._targets, self._versions,
                                       self._retry,
                                       self._call_timeout_s(timeout_s))
        return cast(List[pb.GetIndexInfoResponse],
                    self._run(scatter, "GetIndexInfo"))

    def close(self) -> None:
        """Closes every shard's channel (as KnnClient.close)."""
        if not self._fork_guard.forked():
            for channel in self._channels:
                channel.close()

    def __enter__(self) -> "ShardedKnnClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call_timeout_s(self, timeout_s: Optional[float]) -> float:
        return (self._timeout_s if timeout_s is None else
                _common.positive_timeout_s("timeout_s", timeout_s))

    def _run(self, scatter: sharding.Scatter, method: str) -> Any:
        """Rounds of the scatter until it is done or raises."""
        while True:
            self._round(scatter, method)
            step = scatter.next_step()
            if isinstance(step, sharding.Done):
                return step.value
            time.sleep(step.delay_s)

    def _round(self, scatter: sharding.Scatter, method: str) -> None:
        """Sends one round's requests at once (grpc futures) and reports
        each outcome as it comes; stops waiting at the deadline or as soon
        as the outcome is decided, and cancels the calls left."""
        timeout_s = scatter.remaining_s()
        done: "queue.SimpleQueue[int]" = queue.SimpleQueue()
        futures: Dict[int, Any] = {}
        try:
            for target, request in scatter.requests():
                future = getattr(self._stubs[target], method).future(
                    request, timeout=timeout_s, metadata=self._metadata)
                futures[target] = future
                future.add_done_callback(lambda _, t=target: done.put(t))
            pending = set(futures)
            while pending:
                try:
                    target = done.get(timeout=scatter.remaining_s())
                except queue.Empty:
                    for silent in sorted(pending):
                        scatter.no_answer(silent)
                    return
                pending.discard(target)
                try:
                    scatter.answered(target, futures[target].result())
                except grpc.RpcError as error:
                    scatter.failed(target, error)
                except grpc.FutureCancelledError:  # close() meanwhile
                    scatter.failed(target, sharding.ShardedSearchError(
                        grpc.StatusCode.CANCELLED, "the client was closed"))
                if scatter.stop_early():
                    return
        finally:
            for future in futures.values():
                future.cancel()  # no-op for the calls that ended
