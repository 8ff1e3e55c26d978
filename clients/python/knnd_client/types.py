"""The types of knnd_client's public surface, defined here and nowhere
else: what a search returns (SearchResult, ShardedSearchResult, Hit), what
get() returns (GetResult, Record), how
the clients retry (RetryPolicy) and the shapes of search()'s arguments
(Payload, PayloadFields, FilterSpec, TextQueries, FusionName).

Results are frozen dataclasses: their fields cannot be reassigned, and
each one is typed, so a type checker sees `result.ids` as an int64 array
and `hit.payload` as an optional dict. The arrays themselves are numpy's
(writable, owned by the result): read them, or copy them before changing
them in place if the result is shared.
"""
from __future__ import annotations

import dataclasses
from typing import (TYPE_CHECKING, Any, Dict, List, Literal, Mapping,
                    Optional, Sequence, Tuple, Union)

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # errors.py imports the clients' helpers, not the reverse
    from knnd_client.errors import ShardedSearchError

__all__ = ["Hit", "SearchResult", "ShardedSearchResult", "Record",
           "GetResult", "RetryPolicy", "Payload", "PayloadFields", "FilterSpec", "TextQueries",
           "FusionName"]

# One result's payload (`knnctl build --payloads`): its JSON object.
Payload = Dict[str, Any]
# search(payloads=...): True (every field), field names, or None / False.
PayloadFields = Union[bool, Sequence[str], None]
# search(filter=...): a filter dict, {"genre": "news"}, {"$and": [...]} ...
FilterSpec = Mapping[str, Any]
# search(text=...): one text query, or one per query row.
TextQueries = Union[str, Sequence[str]]
# search(fusion=...): how hybrid results are fused.
FusionName = Literal["rrf", "weighted"]


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
    smaller is closer; inner product or cosine, larger is closer; of a
    hybrid search, its fused score, larger first) and, when the search
    asked for payloads, its payload (None otherwise, and for a payload-less
    row).

    Of a hybrid search (search(text=...)), where each retriever put it:
    vector_rank / text_rank from 1, 0 when it was not in that retriever's
    window; vector_score (its vector distance) / text_score (its BM25
    score), None when its rank is 0. All four are None when the search was
    not hybrid, and the vector ones for text alone."""
    id: int
    distance: float
    payload: Optional[Payload] = None
    vector_rank: Optional[int] = None
    vector_score: Optional[float] = None
    text_rank: Optional[int] = None
    text_score: Optional[float] = None


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
    fusion: of a hybrid search with queries and text, how its results were
      fused: "rrf" or "weighted"; None for text alone (BM25's answer, in
      distances) and without text.
    vector_ranks, vector_scores, text_ranks, text_scores: of a hybrid
      search, arrays of shape (num_queries, k) like ids: each result's rank
      in the vector and the text retriever (int32, from 1; 0: not in that
      retriever's window) and its score there (float32: the vector
      distance, the BM25 score; 0 where the rank is 0). None without text;
      the vector ones None for text alone.
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
    fusion: Optional[str] = None
    vector_ranks: Optional[npt.NDArray[np.int32]] = None
    vector_scores: Optional[npt.NDArray[np.float32]] = None
    text_ranks: Optional[npt.NDArray[np.int32]] = None
    text_scores: Optional[npt.NDArray[np.float32]] = None

    @property
    def num_queries(self) -> int:
        return int(self.ids.shape[0])

    @property
    def k(self) -> int:
        return int(self.ids.shape[1])

    def hits(self, query: int) -> List[Hit]:
        """The neighbours of query row `query`, closest first (best fused
        score first of a hybrid search), padding (id -1) left out."""
        ids = self.ids[query].tolist()
        distances = self.distances[query].tolist()
        payloads = (self.payloads[query] if self.payloads is not None
                    else [None] * len(ids))
        vector_ranks, vector_scores = _retriever_columns(
            self.vector_ranks, self.vector_scores, query, len(ids))
        text_ranks, text_scores = _retriever_columns(
            self.text_ranks, self.text_scores, query, len(ids))
        return [Hit(*fields) for fields in zip(
                    ids, distances, payloads, vector_ranks, vector_scores,
                    text_ranks, text_scores) if fields[0] >= 0]


def _retriever_columns(ranks: Optional[npt.NDArray[np.int32]],
                       scores: Optional[npt.NDArray[np.float32]],
                       query: int, count: int
                       ) -> Tuple[List[Optional[int]], List[Optional[float]]]:
    """The Hit fields of one retriever for query row `query`: its ranks and
    scores, a score None where the rank is 0 (not in its window); all None
    without that retriever."""
    if ranks is None or scores is None:
        return [None] * count, [None] * count
    row = ranks[query].tolist()
    return row, [s if r else None
                 for r, s in zip(row, scores[query].tolist())]


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


@dataclasses.dataclass(frozen=True, eq=False)
class Record:
    """One stored record of get(): its id and what get() asked for.

    payload: the payload's asked fields (None when payloads were not
      asked for).
    attributes: its attributes (`knnctl build --attributes`) as the
      attributes file holds them, timestamps as RFC 3339 UTC strings
      (None when not asked for; {} for a row without any).
    vector: its stored vector, float32 of the index's dim (the re-ranking
      vectors: L2-normalised for a cosine index); None when not asked for.
    """
    id: int
    payload: Optional[Payload] = None
    attributes: Optional[Dict[str, Any]] = None
    vector: Optional[npt.NDArray[np.float32]] = None


@dataclasses.dataclass(frozen=True, eq=False)
class GetResult:
    """What get() returns: the records of the ids the index holds, once
    each, in the order of their first mention; the ids it does not hold
    (missing, not an error), in the order asked; and the index version
    that answered (a sharded client: the lowest of the shards').
    """
    records: Tuple[Record, ...]
    missing: Tuple[int, ...]
    index_version: int

    def by_id(self) -> Dict[int, Record]:
        """The records keyed by id."""
        return {r.id: r for r in self.records}
