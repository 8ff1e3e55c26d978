"""The types of knnd_client's public surface, defined here and nowhere
else: what a search returns (SearchResult, ShardedSearchResult, Hit), how
the clients retry (RetryPolicy) and the shapes of search()'s arguments
(Payload, PayloadFields, FilterSpec).

Results are frozen dataclasses: their fields cannot be reassigned, and
each one is typed, so a type checker sees `result.ids` as an int64 array
and `hit.payload` as an optional dict. The arrays themselves are numpy's
(writable, owned by the result): read them, or copy them before changing
them in place if the result is shared.
"""
from __future__ import annotations

import dataclasses
from typing import (TYPE_CHECKING, Any, Dict, List, Mapping, Optional,
                    Sequence, Tuple, Union)

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # errors.py imports the clients' helpers, not the reverse
    from knnd_client.errors import ShardedSearchError

__all__ = ["Hit", "SearchResult", "ShardedSearchResult", "RetryPolicy",
           "Payload", "PayloadFields", "FilterSpec"]

# One result's payload (`knnctl build --payloads`): its JSON object.
Payload = Dict[str, Any]
# search(payloads=...): True (every field), field names, or None / False.
PayloadFields = Union[bool, Sequence[str], None]
# search(filter=...): a filter dict, {"genre": "news"}, {"$and": [...]} ...
FilterSpec = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """When and how long a client waits before trying a call again.

    Retried: RESOURCE_EXHAUSTED that carries grpc-retry-pushback-ms (knnd at
    capacity), RESOURCE_EXHAUSTED from a stream gRPC reset under the
    server's memory quota (QUOTA_RESET_DETAILS; other RESOURCE_EXHAUSTED,
    e.g. a message over the size limit, would fail again) and UNAVAILABLE
    (not loaded yet, draining, connection lost). With a pushback the wait is
    pushback * (1 + U(0, pushback_jitter)), never shorter than the server
    asked (the jitter spreads the clients that were refused together, so
    they do not come back together); without one it is
    U(0, min(max_backoff_s, initial_backoff_s * backoff_multiplier**n))
    after the n-th failure (gRPC's jittered exponential backoff). A wait
    that would end past the call's deadline is not started: the last error
    is raised at once.
    """
    max_attempts: int = 5
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    backoff_multiplier: float = 2.0
    pushback_jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts={self.max_attempts} must be >= 1")
        if self.initial_backoff_s <= 0 or self.max_backoff_s <= 0:
            raise ValueError("initial_backoff_s and max_backoff_s must be > 0")
        if self.backoff_multiplier < 1 or self.pushback_jitter < 0:
            raise ValueError(
                "backoff_multiplier must be >= 1 and pushback_jitter >= 0")


@dataclasses.dataclass(frozen=True)
class Hit:
    """One neighbour of one query: its id (the index's: a row number, or
    the id given to `knnctl build --ids`), its distance (squared L2,
    smaller is closer; inner product or cosine, larger is closer) and, when
    the search asked for payloads, its payload (None otherwise, and for a
    payload-less row)."""
    id: int
    distance: float
    payload: Optional[Payload] = None
    # Hybrid retrieval (issue 54) adds each hit's per-retriever rank and
    # score here, beside the fused distance.


@dataclasses.dataclass(frozen=True, eq=False)
class SearchResult:
    """The answer of one search() call: the k nearest neighbours of each
    query row, closest first, and what the server says about how it got
    them.

    ids, distances: int64 and float32 arrays of shape (num_queries, k); a
      row with fewer than k neighbours is padded with id -1 and distance
      +inf (L2) or -inf (inner product, cosine).
    payloads: with search(payloads=...), per query the k results' payloads
      (payloads[q][j] belongs to ids[q, j]; None for a padding -1); None
      when no payloads were asked for.
    index_version: the index version that answered.
    metric: the index's metric, a knnd.v1 Metric value (1 L2, 2 inner
      product, 3 cosine; docs/api.md).
    nprobe, refine_factor: the values the server searched with (its
      defaults where the call left them unset).
    filter_plan, filter_matched_rows: with a filter, the plan the server
      chose (a knnd.v1 FilterPlan value: 1 exact, 2 IVF, 3 mixed, 4 flat)
      and how many rows the filter admitted; 0 without one.
    missing_shards: from a front of shards with allow_partial=True, the
      ids of the shards whose results are missing (empty otherwise).
    """
    ids: npt.NDArray[np.int64]
    distances: npt.NDArray[np.float32]
    payloads: Optional[List[List[Optional[Payload]]]] = None
    index_version: int = 0
    metric: int = 0
    nprobe: int = 0
    refine_factor: int = 0
    filter_plan: int = 0
    filter_matched_rows: int = 0
    missing_shards: Tuple[int, ...] = ()
    # Hybrid retrieval (issue 54) adds its per-result columns here (the
    # vector and text retrievers' ranks and scores, (num_queries, k) arrays
    # like ids), read from SearchResponse where ids are.

    @property
    def num_queries(self) -> int:
        return int(self.ids.shape[0])

    @property
    def k(self) -> int:
        return int(self.ids.shape[1])

    def hits(self, query: int) -> List[Hit]:
        """The neighbours of query row `query`, closest first, padding
        (id -1) left out."""
        ids = self.ids[query].tolist()
        distances = self.distances[query].tolist()
        payloads = (self.payloads[query] if self.payloads is not None
                    else [None] * len(ids))
        return [Hit(i, d, p) for i, d, p in zip(ids, distances, payloads)
                if i >= 0]


@dataclasses.dataclass(frozen=True, eq=False)
class ShardedSearchResult(SearchResult):
    """A SearchResult merged from the shards of one index by a sharded
    client, and where it came from.

    index_version: the one version every answering shard served (pinned).
    filter_plan, filter_matched_rows: the shards' plan (3, mixed, when they
      differ) and their matched rows added up, as knnd's front reports.
    build_id: the build of the shard set.
    missing_shards: ids of the shards whose answers are missing (only with
      allow_partial; empty when every shard answered), ascending. The
      results are then those of the index without those shards' id ranges.
    missing_targets: the targets that did not answer, in the order given.
    failures: why, one ShardedSearchError per missing target.
    """
    build_id: str = ""
    missing_targets: Tuple[str, ...] = ()
    failures: Tuple["ShardedSearchError", ...] = ()

    @property
    def complete(self) -> bool:
        """Whether every shard answered (the unsharded index's answer)."""
        return not self.missing_targets
