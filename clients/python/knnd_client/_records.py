"""get()'s request and result, apart from any I/O: the GetRequest built
from get()'s arguments (checked before anything is sent), the GetResult of
one knnd's GetResponse, and the sharded clients' Scatter, which asks every
shard for every id and merges the records (each id lives in one shard).
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Sequence, Set

import numpy as np

from knnd_client import _common, sharding
from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
from knnd_client.types import GetResult, Record, RetryPolicy

__all__ = ["get_request", "get_result", "GetScatter"]


def get_request(ids: Any, payloads: Any, attributes: Any,
                vectors: Any) -> pb.GetRequest:
    """get()'s arguments as a GetRequest. TypeError for ids that are not a
    1-D sequence of integers, ValueError for none or a negative one (the
    server's own refusals, made before sending)."""
    array = np.asarray(ids)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(
            "ids must be a 1-D sequence of integer ids, got "
            f"dtype {array.dtype} and shape {array.shape}")
    if array.size == 0:
        raise ValueError("ids is empty: name at least one id")
    if array.dtype.kind == "u" and array.max() > np.iinfo(np.int64).max:
        raise ValueError(f"ids holds {array.max()}, more than int64 holds")
    array = array.astype(np.int64, copy=False)
    if (array < 0).any():
        i = int(np.argmax(array < 0))
        raise ValueError(f"ids[{i}]={array[i]} is negative: ids are >= 0")
    request = pb.GetRequest(ids=array.tolist(),
                            with_attributes=bool(attributes),
                            with_vectors=bool(vectors))
    asked = _common.payload_request(payloads)
    if asked is not None:
        request.payloads.CopyFrom(asked)
    return request


def _record(r: pb.Record, request: pb.GetRequest) -> Record:
    return Record(
        id=r.id,
        payload=(json.loads(r.payload) if request.HasField("payloads")
                 and r.payload else None),
        attributes=(json.loads(r.attributes) if request.with_attributes
                    else None),
        vector=(np.asarray(r.vector, dtype=np.float32)
                if request.with_vectors else None))


def get_result(response: pb.GetResponse, request: pb.GetRequest
               ) -> GetResult:
    """The GetResult of one knnd's (or a front of shards') answer."""
    return GetResult(records=tuple(_record(r, request)
                                   for r in response.records),
                     missing=tuple(response.missing),
                     index_version=response.index_version)


def merge_get_answers(answers: Sequence[pb.GetResponse],
                      request: pb.GetRequest) -> GetResult:
    """The shards' answers as one GetResult: each id's record from the
    shard that holds it, in the order of the request's first mention of
    each id; an id no shard holds is missing."""
    found: Dict[int, pb.Record] = {}
    for answer in answers:
        for r in answer.records:
            found.setdefault(r.id, r)
    records: List[Record] = []
    missing: List[int] = []
    seen: Set[int] = set()
    for i in request.ids:
        if i in seen:
            continue
        seen.add(i)
        if i in found:
            records.append(_record(found[i], request))
        else:
            missing.append(i)
    versions = [a.index_version for a in answers if a.index_version > 0]
    return GetResult(records=tuple(records), missing=tuple(missing),
                     index_version=min(versions) if versions else 0)


class GetScatter(sharding.Scatter):
    """One sharded get(): every shard is asked for every id, and all must
    answer (an id of a shard that did not answer cannot be told missing);
    UNAVAILABLE and RESOURCE_EXHAUSTED are retried as a search's are."""

    def __init__(self, targets: Sequence[str],
                 versions: sharding.ShardVersions, policy: RetryPolicy,
                 timeout_s: float, request: pb.GetRequest) -> None:
        super().__init__(targets, versions, policy, timeout_s, request,
                         allow_partial=False)
        self._get_request = request

    def _request(self, target: int) -> pb.GetRequest:
        return self._get_request

    def answered(self, target: int, response: Any) -> None:
        # A GetResponse names no shard: only its serving version is news.
        self.versions.record(target, response.serving_version)
        self.answers[target] = response

    def _finish(self) -> GetResult:
        return merge_get_answers(
            [self.answers[i] for i in sorted(self.answers)],
            self._get_request)
