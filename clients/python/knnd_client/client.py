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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

import grpc

from knnd_client import _common, _records, errors, sharding
from knnd_client._base import ClientBase, ShardedClientBase
from knnd_client._common import (PUSHBACK_METADATA_KEY, SearchArgs,
                                 pushback_ms)
from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
from knnd_client.types import (GetResult, RetryPolicy, SearchResult,
                               ShardedSearchResult)

__all__ = ["KnnClient", "ShardedKnnClient", "RetryPolicy",
           "PUSHBACK_METADATA_KEY", "pushback_ms"]


class KnnClient(ClientBase[SearchResult, pb.GetIndexInfoResponse,
                           GetResult]):
    """Blocking client of knnd.v1.KnnService: search() (ClientBase) returns
    a SearchResult, get() a GetResult, info() a GetIndexInfoResponse.

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
        super().__init__(timeout_s=timeout_s, retry=retry,
                         bearer_token=bearer_token)
        self._channel = _common.open_channel(grpc, target, credentials,
                                             options)
        # Search takes the request already serialized (see _common).
        self._search_rpc = _common.unary_method(self._channel, "Search",
                                                serialized=True)
        self._info_rpc = _common.unary_method(self._channel, "GetIndexInfo")
        self._get_rpc = _common.unary_method(self._channel, "Get")

    def _get(self, request: pb.GetRequest, timeout_s: float) -> GetResult:
        return _records.get_result(
            self._call(self._get_rpc, request, timeout_s, "Get"), request)

    def _search(self, args: SearchArgs, timeout_s: float) -> SearchResult:
        request, shape = _common.serialized_search_request(args)
        return _common.search_result(
            self._call(self._search_rpc, request, timeout_s, "Search"),
            shape, args.wants_payloads, hybrid=args.text is not None)

    def _info(self, timeout_s: float) -> pb.GetIndexInfoResponse:
        return cast(pb.GetIndexInfoResponse,
                    self._call(self._info_rpc,
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
              timeout_s: float, what: str) -> Any:
        """Calls `method` within one deadline, retrying per the RetryPolicy."""
        self._fork_guard.check()
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


class ShardedKnnClient(ShardedClientBase[ShardedSearchResult,
                                         List[pb.GetIndexInfoResponse],
                                         GetResult]):
    """Blocking client of an index split into shards (`knnctl build --shards N`),
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
      target. True: answer from the shards that did answer (the result's
      missing_shards and missing_targets say which are missing); fail only
      when none did. search(allow_partial=...) overrides it per call.

    search() (ClientBase) returns a ShardedSearchResult: a SearchResult
    with the set's build and the missing shards. info() returns every
    shard's GetIndexInfoResponse, in the order of `targets`, after checking
    that they are one set (one build_id, one shard per id); each one's
    `shard` says which ids it holds and `version` what it serves.
    Aggregates are the caller's: sum(i.ntotal for i in infos) is the set's
    size. Every shard must answer. info() also teaches the client the
    shards' versions, so that a search after it is pinned from its first
    request. Errors are ShardedSearchError (a grpc.RpcError) with a failing
    shard's code, or FAILED_PRECONDITION when the answers are not one set's
    at one version (docs/sharding.md, rule 4).

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
        super().__init__(targets, timeout_s=timeout_s, retry=retry,
                         bearer_token=bearer_token,
                         allow_partial=allow_partial)
        self._channels: List[grpc.Channel] = [
            _common.open_channel(grpc, target, credentials, options)
            for target in self._targets]
        self._methods = [{name: _common.unary_method(c, name)
                          for name in ("Search", "GetIndexInfo", "Get")}
                         for c in self._channels]

    def _get(self, request: pb.GetRequest, timeout_s: float) -> GetResult:
        scatter = self._get_scatter(request, timeout_s)
        self._fork_guard.check()
        return cast(GetResult, self._run(scatter, "Get"))

    def _search(self, args: SearchArgs, timeout_s: float
                ) -> ShardedSearchResult:
        scatter = self._search_scatter(args, timeout_s)
        self._fork_guard.check()
        return cast(ShardedSearchResult, self._run(scatter, "Search"))

    def _info(self, timeout_s: float) -> List[pb.GetIndexInfoResponse]:
        self._fork_guard.check()
        return cast(List[pb.GetIndexInfoResponse],
                    self._run(self._info_scatter(timeout_s), "GetIndexInfo"))

    def close(self) -> None:
        """Closes every shard's channel (as KnnClient.close)."""
        if not self._fork_guard.forked():
            for channel in self._channels:
                channel.close()

    def __enter__(self) -> "ShardedKnnClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
                future = self._methods[target][method].future(
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
                    scatter.failed(target, errors.ShardedSearchError(
                        grpc.StatusCode.CANCELLED, "the client was closed"))
                if scatter.stop_early():
                    return
        finally:
            for future in futures.values():
                future.cancel()  # no-op for the calls that ended
