"""AsyncKnnClient: KnnClient's contract on grpc.aio, for asyncio services
(FastAPI, aiohttp, ...).

A search awaits the RPC instead of blocking a thread, so the event loop
keeps serving other requests meanwhile. Cancelling the awaiting task
cancels the RPC: knnd drops the work and counts the call CANCELLED.
"""
from __future__ import annotations

import asyncio
import time
from typing import (Any, Callable, Coroutine, Dict, List, Optional, Sequence,
                    Tuple, cast)

import grpc
import grpc.aio

from knnd_client import _common, _records, errors, sharding
from knnd_client._base import ClientBase, ShardedClientBase
from knnd_client._common import SearchArgs
from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
from knnd_client.types import (GetResult, RetryPolicy, SearchResult,
                               ShardedSearchResult)

__all__ = ["AsyncKnnClient", "AsyncShardedKnnClient"]

# Default bound on calls in flight per client: enough to keep the worker
# pools of a few replicas busy (knnd coalesces small requests); more would
# only wait in knnd's admission gate or come back RESOURCE_EXHAUSTED.
DEFAULT_MAX_CONCURRENT_CALLS = 64


class AsyncKnnClient(ClientBase[Coroutine[Any, Any, SearchResult],
                                Coroutine[Any, Any,
                                          pb.GetIndexInfoResponse],
                                Coroutine[Any, Any, GetResult]]):
    """asyncio client of knnd.v1.KnnService; the arguments, results, errors
    and retries of KnnClient (one search(), ClientBase's), awaited: its
    arguments are checked when search() is called, before anything is
    awaited.

    Create it inside the event loop that uses it (in a coroutine: FastAPI's
    lifespan, aiohttp's on_startup), one per loop and per process: a
    grpc.aio channel belongs to the loop it was made in and does not
    survive fork().

    target, timeout_s, retry, credentials, bearer_token, options: as
      KnnClient.
    max_concurrent_calls: at most this many search()/info() calls of this
      client are in flight at once; the others wait for a slot (an
      asyncio.Semaphore), and that wait counts against their deadline. A
      call holds its slot from its first attempt to its last, retry waits
      included, so that a burst refused with RESOURCE_EXHAUSTED does not
      turn into more calls on a server that is already full.
    """

    def __init__(self, target: str, *, timeout_s: float = 2.0,
                 retry: RetryPolicy = RetryPolicy(),
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 bearer_token: Optional[str] = None,
                 max_concurrent_calls: int = DEFAULT_MAX_CONCURRENT_CALLS,
                 options: Sequence[Tuple[str, Any]] = ()) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "AsyncKnnClient must be created inside a running event loop "
                "(in a coroutine, e.g. FastAPI's lifespan): its grpc.aio "
                "channel belongs to that loop") from None
        super().__init__(timeout_s=timeout_s, retry=retry,
                         bearer_token=bearer_token)
        self._max_concurrent_calls = _common.positive_int(
            "max_concurrent_calls", max_concurrent_calls)
        self._slots = asyncio.Semaphore(self._max_concurrent_calls)
        self._channel = _common.open_channel(grpc.aio, target, credentials,
                                             options)
        # Search takes the request already serialized (see _common).
        self._search_rpc = _common.unary_method(self._channel, "Search",
                                                serialized=True)
        self._info_rpc = _common.unary_method(self._channel, "GetIndexInfo")
        self._get_rpc = _common.unary_method(self._channel, "Get")

    async def _get(self, request: pb.GetRequest, timeout_s: float
                   ) -> GetResult:
        return _records.get_result(
            await self._call(self._get_rpc, request, timeout_s, "Get"),
            request)

    def _search(self, args: SearchArgs, timeout_s: float
                ) -> Coroutine[Any, Any, SearchResult]:
        request, shape = _common.serialized_search_request(args)
        return self._answer(request, shape, args.wants_payloads,
                            args.text is not None, timeout_s)

    async def _answer(self, request: bytes, shape: Tuple[int, int],
                      with_payloads: bool, hybrid: bool,
                      timeout_s: float) -> SearchResult:
        return _common.search_result(
            await self._call(self._search_rpc, request, timeout_s, "Search"),
            shape, with_payloads, hybrid)

    async def _info(self, timeout_s: float) -> pb.GetIndexInfoResponse:
        return cast(pb.GetIndexInfoResponse,
                    await self._call(self._info_rpc,
                                     pb.GetIndexInfoRequest(), timeout_s,
                                     "GetIndexInfo"))

    async def close(self, grace_s: Optional[float] = None) -> None:
        """Closes the channel: with `grace_s`, calls in progress get that
        long to finish, then (or at once) they end with CANCELLED."""
        if not self._fork_guard.forked():
            await self._channel.close(grace_s)

    async def __aenter__(self) -> "AsyncKnnClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: Callable[..., Any], request: Any,
                    timeout_s: float, what: str) -> Any:
        """Awaits `method` within one deadline, retrying per the
        RetryPolicy, in one of the client's slots."""
        self._fork_guard.check()
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError(
                "AsyncKnnClient used from another event loop than the one it "
                "was created in; create one client per loop")
        deadline = time.monotonic() + timeout_s
        if not await _acquire(self._slots, timeout_s):
            raise errors.DeadlineExceeded(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "deadline passed while waiting for one of the "
                f"client's max_concurrent_calls={self._max_concurrent_calls}"
                " slots; nothing was sent")
        try:
            try:
                return await method(
                    request, timeout=max(deadline - time.monotonic(), 0.0),
                    metadata=self._metadata)
            except grpc.aio.AioRpcError as error:
                failed = error
            attempts = _common.Attempts(self._retry, deadline, what)
            while True:
                delay_s = attempts.delay_before_retry_s(failed)
                if delay_s is None:
                    # As KnnClient: knnd_client's own error for the code.
                    raise errors.from_rpc_error(failed) from None
                await asyncio.sleep(delay_s)
                try:
                    return await method(request,
                                        timeout=attempts.remaining_s(),
                                        metadata=self._metadata)
                except grpc.aio.AioRpcError as error:
                    failed = error
        finally:
            self._slots.release()


class AsyncShardedKnnClient(
        ShardedClientBase[Coroutine[Any, Any, ShardedSearchResult],
                          Coroutine[Any, Any,
                                    List[pb.GetIndexInfoResponse]],
                          Coroutine[Any, Any, GetResult]]):
    """asyncio client of an index split into shards: ShardedKnnClient's
    arguments, results, errors, retries and version pinning, awaited; the
    shards are asked at once (one task per shard) within one deadline, and
    cancelling the awaiting task cancels every shard's RPC.

    Create it inside the event loop that uses it, as AsyncKnnClient.

    targets, timeout_s, retry, credentials, bearer_token, options,
      allow_partial: as ShardedKnnClient.
    max_concurrent_calls: as AsyncKnnClient, counting a search of every
      shard as one call (it holds one slot, and sends one request to each
      shard).
    """

    def __init__(self, targets: Sequence[str], *, timeout_s: float = 2.0,
                 retry: RetryPolicy = RetryPolicy(),
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 bearer_token: Optional[str] = None,
                 max_concurrent_calls: int = DEFAULT_MAX_CONCURRENT_CALLS,
                 options: Sequence[Tuple[str, Any]] = (),
                 allow_partial: bool = False) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "AsyncShardedKnnClient must be created inside a running "
                "event loop (in a coroutine, e.g. FastAPI's lifespan): its "
                "grpc.aio channels belong to that loop") from None
        super().__init__(targets, timeout_s=timeout_s, retry=retry,
                         bearer_token=bearer_token,
                         allow_partial=allow_partial)
        self._max_concurrent_calls = _common.positive_int(
            "max_concurrent_calls", max_concurrent_calls)
        self._slots = asyncio.Semaphore(self._max_concurrent_calls)
        self._channels: List[grpc.aio.Channel] = [
            _common.open_channel(grpc.aio, target, credentials, options)
            for target in self._targets]
        self._methods = [{name: _common.unary_method(c, name)
                          for name in ("Search", "GetIndexInfo", "Get")}
                         for c in self._channels]

    async def _get(self, request: pb.GetRequest, timeout_s: float
                   ) -> GetResult:
        self._check_loop()
        return cast(GetResult,
                    await self._run(self._get_scatter(request, timeout_s),
                                    "Get"))

    def _search(self, args: SearchArgs, timeout_s: float
                ) -> Coroutine[Any, Any, ShardedSearchResult]:
        return self._merged(self._search_scatter(args, timeout_s))

    async def _merged(self, scatter: sharding.SearchScatter
                      ) -> ShardedSearchResult:
        self._check_loop()
        return cast(ShardedSearchResult, await self._run(scatter, "Search"))

    async def _info(self, timeout_s: float
                    ) -> List[pb.GetIndexInfoResponse]:
        self._check_loop()
        return cast(List[pb.GetIndexInfoResponse],
                    await self._run(self._info_scatter(timeout_s),
                                    "GetIndexInfo"))

    async def close(self, grace_s: Optional[float] = None) -> None:
        """Closes every shard's channel, as AsyncKnnClient.close."""
        if not self._fork_guard.forked():
            await asyncio.gather(*(c.close(grace_s) for c in self._channels))

    async def __aenter__(self) -> "AsyncShardedKnnClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_loop(self) -> None:
        self._fork_guard.check()
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError(
                "AsyncShardedKnnClient used from another event loop than the "
                "one it was created in; create one client per loop")

    async def _run(self, scatter: sharding.Scatter, method: str) -> Any:
        """Rounds of the scatter in one of the client's slots, until it is
        done or raises."""
        if not await _acquire(self._slots, scatter.remaining_s()):
            raise errors.ShardedSearchError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "deadline passed while waiting for one of the client's "
                f"max_concurrent_calls={self._max_concurrent_calls} slots; "
                "nothing was sent")
        try:
            while True:
                await self._round(scatter, method)
                step = scatter.next_step()
                if isinstance(step, sharding.Done):
                    return step.value
                await asyncio.sleep(step.delay_s)
        finally:
            self._slots.release()

    async def _round(self, scatter: sharding.Scatter, method: str) -> None:
        """One task per shard; reports each outcome as it comes; stops
        waiting at the deadline or once the outcome is decided, and cancels
        the tasks left (also when the awaiting task is cancelled)."""
        timeout_s = scatter.remaining_s()
        tasks: Dict["asyncio.Future[Any]", int] = {}
        for target, request in scatter.requests():
            call = self._methods[target][method](
                request, timeout=timeout_s, metadata=self._metadata)
            tasks[asyncio.ensure_future(_awaited(call))] = target
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(
                    pending, timeout=scatter.remaining_s(),
                    return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    for silent in sorted(tasks[t] for t in pending):
                        scatter.no_answer(silent)
                    return
                for task in sorted(done, key=tasks.__getitem__):
                    try:
                        scatter.answered(tasks[task], task.result())
                    except grpc.RpcError as error:
                        scatter.failed(tasks[task], error)
                    except asyncio.CancelledError:  # close() meanwhile
                        scatter.failed(tasks[task], errors.ShardedSearchError(
                            grpc.StatusCode.CANCELLED, "the client was closed"))
                if scatter.stop_early():
                    return
        finally:
            for task in pending:
                task.cancel()


async def _awaited(call: Any) -> Any:
    """Awaits a grpc.aio call in a task of its own: cancelling the task
    cancels the RPC."""
    return await call


async def _acquire(slots: asyncio.Semaphore, timeout_s: float) -> bool:
    """Takes one of `slots` within `timeout_s`; False if none came in time.

    Not asyncio.wait_for(slots.acquire(), ...): before Python 3.12 it can
    swallow a cancellation that races with the acquire. Here a slot that an
    abandoned acquire obtained is always handed back or passed on."""
    if not slots.locked():
        await slots.acquire()  # a free slot: returns without suspending
        return True
    acquire = asyncio.ensure_future(slots.acquire())
    try:
        await asyncio.wait((acquire,), timeout=timeout_s)
    except BaseException:  # this task was cancelled while it waited
        if acquire.done() and not acquire.cancelled():
            slots.release()
        else:
            acquire.cancel()  # Semaphore passes a slot it gave on
        raise
    if acquire.done():
        return True
    acquire.cancel()
    return False
