"""ClientBase: the one declared surface of knnd_client's four clients.

KnnClient, AsyncKnnClient, ShardedKnnClient and AsyncShardedKnnClient do
not declare search(), get() or info(): each inherits them from ClientBase,
parameterised by what a call returns (chromadb's CollectionCommon is the
model). A blocking client is ClientBase[SearchResult, ...], an asyncio one
ClientBase[Coroutine[..., SearchResult], ...]: search() checks every
argument and builds the request at once, in the caller's frame, and hands
the I/O to the subclass's _search(), which either does it (blocking) or
returns the coroutine that will (asyncio). So the signature, the defaults,
the docstring and the validation exist once, a new argument reaches all
four clients by being added here, and a type checker sees `await
aclient.search(...)` as a SearchResult.
"""
from __future__ import annotations

from typing import Any, Generic, List, Optional, Sequence, TypeVar

import numpy as np
import numpy.typing as npt

from knnd_client import _common, _records, sharding
from knnd_client._common import SearchArgs
from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
from knnd_client.types import (FilterSpec, FusionName, PayloadFields,
                               RetryPolicy, TextQueries)

__all__ = ["ClientBase", "ShardedClientBase"]

# What search(), info() and get() return: the result itself (a blocking
# client) or a coroutine of it (an asyncio client).
ResultT = TypeVar("ResultT")
InfoT = TypeVar("InfoT")
GetT = TypeVar("GetT")


class ClientBase(Generic[ResultT, InfoT, GetT]):
    """What every client holds and checks the same way: the default
    deadline, the RetryPolicy, the bearer token's metadata and the fork
    guard; search() and info(), whose I/O is the subclass's."""

    def __init__(self, *, timeout_s: float, retry: RetryPolicy,
                 bearer_token: Optional[str]) -> None:
        if not isinstance(retry, RetryPolicy):
            raise TypeError("retry must be a knnd_client.RetryPolicy, got "
                            f"{type(retry).__name__}")
        self._timeout_s = _common.positive_timeout_s("timeout_s", timeout_s)
        self._retry = retry
        self._metadata = _common.call_metadata(bearer_token)
        self._fork_guard = _common.ForkGuard(type(self).__name__)

    def search(self, queries: Optional[npt.NDArray[np.floating[Any]]] = None,
               k: int = 10, nprobe: Optional[int] = None, *,
               allowed_ids: Optional[npt.ArrayLike] = None,
               filter: Optional[FilterSpec] = None,
               refine_factor: Optional[int] = None,
               payloads: PayloadFields = None,
               allow_partial: Optional[bool] = None,
               text: Optional[TextQueries] = None,
               fusion: Optional[FusionName] = None,
               rrf_k: Optional[int] = None,
               vector_weight: Optional[float] = None,
               text_weight: Optional[float] = None,
               vector_window: Optional[int] = None,
               text_window: Optional[int] = None,
               timeout_s: Optional[float] = None) -> ResultT:
        """The k nearest neighbours of each row of `queries`, the k best
        BM25 matches of each `text`, or both fused (hybrid retrieval,
        docs/hybrid.md), as a SearchResult (ShardedSearchResult from a
        sharded client); awaited on an asyncio client.

        queries: float32 array of shape (num_queries, dim), any byte order
          or strides (sent as little-endian row-major bytes); a float16
          array is sent as float16 (vectors_f16le, half the bytes). None:
          text alone.
        k: results per query, 1 <= k <= the server's max_k (default 10).
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
          candidates from the raw vectors served beside the index
          (distances then exact); 0: off; None: the server's default.
          Needs an index built with its raw vectors (else
          FAILED_PRECONDITION).
        payloads: True: every field of each result's payload; a list of
          field names: those fields (a payload lacking one leaves it out);
          None: no payloads. Needs an index built with `knnctl build
          --payloads` (else FAILED_PRECONDITION); an unknown field is
          INVALID_ARGUMENT naming it and the index's fields.
        allow_partial: when a shard fails, answer from the others and name
          the missing ones in result.missing_shards instead of failing:
          from a sharded client, or from knnd serving as a front of shards
          (shard_targets); a knnd that serves an index ignores it. None:
          the client's default (False but for a sharded client made with
          allow_partial=True).
        text: a text query (an index built with `knnctl build --text`):
          a str for one query, or a sequence of str, one per query row;
          with queries, as many texts as rows. Without queries the answer
          is BM25's (distances: BM25 scores, larger first); with them each
          row's vector and text results are fused (distances: the fused
          score, larger first). The filter and allowed_ids apply to both
          retrievers; the result's vector_ranks, text_ranks, ... (and each
          Hit's) say where each retriever put each result.
        fusion: "rrf" (reciprocal rank fusion, the default) or "weighted"
          (weighted min-max normalised scores); with queries and text.
        rrf_k: RRF's constant, score = sum of 1 / (rrf_k + rank), 1 to
          100000; None: 60.
        vector_weight, text_weight: "weighted"'s weights, finite, >= 0, not
          both 0; None: 0.5 each.
        vector_window, text_window: the candidates each retriever gives
          the fusion, k to the server's max_k; None: k. text_window is the
          only one that applies to text alone.
        timeout_s: deadline of this call (retries included); None: the
          client's default.

        Raises TypeError / ValueError for bad arguments, at once and before
        any RPC (on an asyncio client too, before anything is awaited), and
        knnd_client.KnndError (a grpc.RpcError; ShardedSearchError from a
        sharded client) when the server refuses (INVALID_ARGUMENT names the
        field and limit) or the deadline passes (DEADLINE_EXCEEDED).
        """
        args = SearchArgs(queries=queries, k=k, nprobe=nprobe,
                          allowed_ids=allowed_ids, filter=filter,
                          refine_factor=refine_factor, payloads=payloads,
                          allow_partial=allow_partial, text=text,
                          fusion=fusion, rrf_k=rrf_k,
                          vector_weight=vector_weight,
                          text_weight=text_weight,
                          vector_window=vector_window,
                          text_window=text_window)
        return self._search(args, self._call_timeout_s(timeout_s))

    def info(self, timeout_s: Optional[float] = None) -> InfoT:
        """The served index (dim, metric, ntotal, ...) and the server's
        limits (max_k, max_queries_per_request, ...): a
        GetIndexInfoResponse, or from a sharded client every shard's, in
        the order of its targets, checked to be one set."""
        return self._info(self._call_timeout_s(timeout_s))

    def get(self, ids: npt.ArrayLike, *, payloads: PayloadFields = None,
            attributes: bool = False, vectors: bool = False,
            timeout_s: Optional[float] = None) -> GetT:
        """The stored records of `ids` (Chroma's get, Qdrant's retrieve):
        a GetResult whose records hold, per id the index holds, what was
        asked for; ids it does not hold are in result.missing (not an
        error); an id given twice is answered once. Awaited on an asyncio
        client; a sharded client asks every shard and merges.

        ids: 1-D integer ids (the index's: row numbers, or those given to
          `knnctl build --ids`), at least one, each >= 0, at most the
          server's max_get_ids (GetIndexInfo; INVALID_ARGUMENT beyond).
        payloads: as search()'s: True, field names, or None.
        attributes: each record's attributes as a dict (an index built
          with --attributes, else FAILED_PRECONDITION).
        vectors: each record's stored vector (an index served with its
          raw vectors, --keep_vectors, else FAILED_PRECONDITION).
        timeout_s: as search()'s.

        Raises TypeError / ValueError for bad arguments at once, and
        knnd_client.KnndError as search() does.
        """
        request = _records.get_request(ids, payloads, attributes, vectors)
        return self._get(request, self._call_timeout_s(timeout_s))

    def _get(self, request: pb.GetRequest, timeout_s: float) -> GetT:
        raise NotImplementedError

    def _search(self, args: SearchArgs, timeout_s: float) -> ResultT:
        """The call of search(): the request built from `args` (its checks
        raise here, at once), then sent (blocking), or the coroutine that
        sends it (asyncio)."""
        raise NotImplementedError

    def _info(self, timeout_s: float) -> InfoT:
        raise NotImplementedError

    def _call_timeout_s(self, timeout_s: Optional[float]) -> float:
        return (self._timeout_s if timeout_s is None else
                _common.positive_timeout_s("timeout_s", timeout_s))


class ShardedClientBase(ClientBase[ResultT, InfoT, GetT]):
    """What the two sharded clients add to ClientBase: their targets, the
    versions their calls pin, and the decisions of each call (a
    sharding.Scatter), which their I/O loops drive."""

    def __init__(self, targets: Sequence[str], *, timeout_s: float,
                 retry: RetryPolicy, bearer_token: Optional[str],
                 allow_partial: bool) -> None:
        self._targets = sharding.targets_list(targets)
        super().__init__(timeout_s=timeout_s, retry=retry,
                         bearer_token=bearer_token)
        self._allow_partial = bool(allow_partial)
        self._versions = sharding.ShardVersions(len(self._targets))

    @property
    def targets(self) -> List[str]:
        """The shards' targets, in the order given."""
        return list(self._targets)

    @property
    def versions(self) -> sharding.ShardVersions:
        """The serving version each shard last reported (for monitoring:
        versions.set_version() is what the next search pins)."""
        return self._versions

    def _search_scatter(self, args: SearchArgs, timeout_s: float
                        ) -> sharding.SearchScatter:
        """The decisions of one sharded search; its request is built (and
        every argument checked) here."""
        request = _common.search_request(args)
        allow_partial = (self._allow_partial if args.allow_partial is None
                         else bool(args.allow_partial))
        return sharding.SearchScatter(self._targets, self._versions,
                                      self._retry, timeout_s, request,
                                      allow_partial)

    def _get_scatter(self, request: pb.GetRequest, timeout_s: float
                     ) -> _records.GetScatter:
        return _records.GetScatter(self._targets, self._versions,
                                   self._retry, timeout_s, request)

    def _info_scatter(self, timeout_s: float) -> sharding.InfoScatter:
        return sharding.InfoScatter(self._targets, self._versions,
                                    self._retry, timeout_s)
