"""What the clients share below their one surface (_base.ClientBase):
argument validation, the request and the typed result, channel options,
bearer tokens, the retry decisions (deadline, attempts, backoff,
grpc-retry-pushback-ms) and the fork guard.

The path of a call that succeeds at once is kept short, since it runs in
every API worker for every query: the request is sent as bytes built from
a serialized head cached per (dim, k, nprobe, refine_factor) and the query
bytes (no message built per call), results come back as bytes fields
(results_as_bytes) read with numpy.frombuffer, and retry state is made only
after a first failure.

Only the I/O differs between the blocking and the asyncio clients (a
blocking call and time.sleep, or an awaited call and asyncio.sleep);
every decision about a call is made here, once, so that they cannot drift
apart.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import logging
import math
import numbers
import os
import random
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import grpc
import numpy as np
import numpy.typing as npt

from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
from knnd_client.types import Payload, RetryPolicy, SearchResult

LOG = logging.getLogger("knnd_client")

# Trailing metadata knnd sends with RESOURCE_EXHAUSTED (gate full): how long
# to wait before retrying, in ms. A negative value means "do not retry".
PUSHBACK_METADATA_KEY = "grpc-retry-pushback-ms"

_RETRYABLE = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)

_BIG_ENDIAN = sys.byteorder == "big"

# KnnService's methods: path, request and response types. The clients make
# their callables from this (unary_method) rather than from the generated
# KnnServiceStub, a module without types.
_METHODS: Dict[str, Tuple[str, Any, Any]] = {
    "Search": ("/knnd.v1.KnnService/Search", pb.SearchRequest,
               pb.SearchResponse),
    "GetIndexInfo": ("/knnd.v1.KnnService/GetIndexInfo",
                     pb.GetIndexInfoRequest, pb.GetIndexInfoResponse),
    "Get": ("/knnd.v1.KnnService/Get", pb.GetRequest, pb.GetResponse),
}

# Target schemes whose resolver can return several addresses: a Kubernetes
# headless Service behind "dns:///", or a static "ipv4:a:p,b:p" list. Calls
# on them are spread over every address (round_robin); a plain "host:port"
# keeps gRPC's default pick_first (one connection), as with a ClusterIP
# Service that already balances.
#
# With round_robin the channel also watches each replica's grpc.health.v1
# status (gRPC client-side health checking): a replica that answers
# NOT_SERVING (loading, or shutting down after SIGTERM) gets no new calls
# while its connection is still open, so a rolling restart moves the
# traffic before the replica stops listening. A server without the health
# service is used as if SERVING.
HEALTH_SERVICE_NAME = "knnd.v1.KnnService"
_MULTI_ADDRESS_SCHEMES = ("dns:", "ipv4:", "ipv6:")
_ROUND_ROBIN_SERVICE_CONFIG = json.dumps(
    {"loadBalancingConfig": [{"round_robin": {}}],
     "healthCheckConfig": {"serviceName": HEALTH_SERVICE_NAME}})

# knnd's rule for a bearer token (search_token_file): 16 to 4096 printable
# ASCII characters without spaces. Checked here so that a token read with
# its trailing newline fails at construction, not as UNAUTHENTICATED later.
_TOKEN_MIN_CHARS = 16
_TOKEN_MAX_CHARS = 4096


def pushback_ms(error: grpc.RpcError) -> Optional[int]:
    """The server's grpc-retry-pushback-ms of a failed call, or None.

    Works on the errors of both stacks: grpc.RpcError (a tuple of pairs) and
    grpc.aio.AioRpcError (grpc.aio.Metadata, which iterates as pairs)."""
    trailing = getattr(error, "trailing_metadata", None)
    for key, value in (trailing() if trailing else None) or ():
        if key == PUSHBACK_METADATA_KEY:
            try:
                return int(value)
            except ValueError:
                return None
    return None


# What gRPC reports when a server's transport refused or reset the stream
# under its memory quota (HTTP/2 RST_STREAM ENHANCE_YOUR_CALM, code 11):
# RESOURCE_EXHAUSTED with no pushback, since knnd never saw the call to
# answer it. knnd's calls are reads, so it is retried with backoff, as
# UNAVAILABLE is; another RESOURCE_EXHAUSTED without a pushback (a message
# over the size limit) would fail again and is not.
QUOTA_RESET_DETAILS = "RST_STREAM with error code 11"


def _retry_delay_s(error: grpc.RpcError, backoff_s: float,
                   policy: RetryPolicy) -> Optional[float]:
    """Seconds to wait before retrying `error`, or None: do not retry."""
    code = error.code() if hasattr(error, "code") else None
    if code not in _RETRYABLE:
        return None
    pushback = pushback_ms(error)
    if pushback is None:
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            details = error.details() if hasattr(error, "details") else None
            if QUOTA_RESET_DETAILS not in (details or ""):
                return None
        return random.uniform(0, backoff_s)
    if pushback < 0:
        return None
    return pushback / 1000 * (1 + random.uniform(0, policy.pushback_jitter))


class Attempts:
    """The retry state of one logical call: one deadline over every attempt
    and wait, the attempt count and the current backoff.

    The clients make one after a first attempt failed (a call that succeeds
    at once needs none); their loops are: on an RpcError ask
    `delay_before_retry_s(error)`; None means raise it, a number means
    sleep that long and try again within `remaining_s()`. `what` names the
    call in the log."""

    def __init__(self, policy: RetryPolicy, deadline: float,
                 what: str) -> None:
        self._policy = policy
        self._deadline = deadline
        self._backoff_s = policy.initial_backoff_s
        self._attempt = 1
        self._what = what

    def remaining_s(self) -> float:
        """Seconds left before the call's deadline (0 once it has passed)."""
        return max(self._deadline - time.monotonic(), 0.0)

    def delay_before_retry_s(self, error: grpc.RpcError) -> Optional[float]:
        """How long to wait before the next attempt after `error`, or None
        when `error` is final: not retryable, attempts used up, or the wait
        would end past the deadline (a retry then could only fail later)."""
        delay_s = _retry_delay_s(error, self._backoff_s, self._policy)
        if (delay_s is None or self._attempt >= self._policy.max_attempts
                or time.monotonic() + delay_s >= self._deadline):
            return None
        LOG.debug("retrying %s after %s in %.3f s (attempt %d of %d)",
                  self._what, error.code().name, delay_s, self._attempt + 1,
                  self._policy.max_attempts)
        self._backoff_s = min(self._backoff_s * self._policy.backoff_multiplier,
                              self._policy.max_backoff_s)
        self._attempt += 1
        return delay_s


def positive_timeout_s(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a number of seconds, got {type(value).__name__}")
    seconds = float(value)
    if not seconds > 0:
        raise ValueError(f"{name}={value} must be > 0")
    if not math.isfinite(seconds):
        raise ValueError(f"{name}={value} must be finite (one deadline "
                         "bounds every call, retries included)")
    return seconds


def positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    number = int(value)
    if number < minimum:
        raise ValueError(f"{name}={number} must be >= {minimum}")
    return number


# The query matrix's fields by its numpy dtype's item size: float32 rows go
# as vectors_f32le, float16 rows as vectors_f16le (half the bytes; knnd
# widens them exactly), each with its wire dtype and field number.
_QUERY_FIELDS = {4: ("vectors_f32le", "<f4", 2), 2: ("vectors_f16le", "<f2", 14)}


def query_bytes(queries: Any) -> Tuple[bytes, int, int, str]:
    """`queries` as row-major little-endian bytes with its (num_queries,
    dim) and the SearchRequest field that carries them: float32 as
    vectors_f32le, float16 as vectors_f16le; or a TypeError / ValueError
    that says what is wrong and how to fix it. Few numpy calls on the way:
    each costs microseconds beside a gRPC call, whose work evicts numpy's
    from the caches."""
    if not isinstance(queries, np.ndarray):
        raise TypeError(
            "queries must be a numpy.ndarray of dtype float32 (or float16) "
            f"and shape (num_queries, dim), got {type(queries).__name__}")
    dtype = queries.dtype
    if dtype.kind != "f" or dtype.itemsize not in _QUERY_FIELDS:
        raise TypeError(
            f"queries must have dtype float32 or float16, got {dtype}; "
            "convert with queries.astype(numpy.float32)")
    if queries.ndim != 2:
        hint = ("; one vector is queries.reshape(1, -1)"
                if queries.ndim == 1 else "")
        raise ValueError(
            f"queries must be 2-D (num_queries, dim), got shape "
            f"{queries.shape}{hint}")
    rows, dim = queries.shape
    if rows == 0 or dim == 0:
        raise ValueError(f"queries has shape {queries.shape}: no values")
    # One reduction: a NaN or an infinity, and only they, make the sum
    # NaN or infinite (float64 does not overflow on float32 values).
    if not math.isfinite(queries.sum(dtype=np.float64)):
        row, col = np.argwhere(~np.isfinite(queries))[0]
        raise ValueError(
            f"queries[{row}, {col}] is {queries[row, col]}: every value must "
            "be finite")
    field, wire, _ = _QUERY_FIELDS[dtype.itemsize]
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and _BIG_ENDIAN):
        return queries.astype(wire).tobytes(), rows, dim, field
    # row-major whatever the strides
    return queries.tobytes(), rows, dim, field


def request_rows(request: pb.SearchRequest) -> int:
    """The number of query rows of a SearchRequest built by this client
    (from whichever of vectors_f32le and vectors_f16le holds them; its
    texts without vectors)."""
    if request.vectors_f16le:
        return len(request.vectors_f16le) // (2 * request.dim)
    if request.vectors_f32le:
        return len(request.vectors_f32le) // (4 * request.dim)
    return len(request.texts)


def id_list(ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
    array = np.asarray(ids)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(
            "allowed_ids must be a 1-D sequence of integer ids, got "
            f"dtype {array.dtype} and shape {array.shape}")
    return array.astype(np.int64, copy=False)


def _search_head(dim: int, k: Any, nprobe: Any, refine_factor: Any
                 ) -> pb.SearchRequest:
    """A SearchRequest with every field of a search() call but the vectors
    and the allow-list, its arguments checked."""
    head = pb.SearchRequest(dim=dim, k=positive_int("k", k),
                            results_as_bytes=True)
    if nprobe is not None:
        head.nprobe = positive_int("nprobe", nprobe)
    if refine_factor is not None:
        head.refine_factor = positive_int("refine_factor", refine_factor,
                                          minimum=0)
    return head


@functools.lru_cache(maxsize=256, typed=True)
def _cached_head(dim: int, k: Any, nprobe: Any, refine_factor: Any) -> bytes:
    # typed: keyed by the arguments' types too, so that k=True is not
    # taken for k=1 (and still raises). An API worker uses a few keys.
    return _search_head(dim, k, nprobe, refine_factor).SerializeToString()


def _serialized_head(dim: int, k: Any, nprobe: Any,
                     refine_factor: Any) -> bytes:
    """_search_head() serialized, from the cache when the arguments are
    hashable; the checks name any argument that is not."""
    try:
        return _cached_head(dim, k, nprobe, refine_factor)
    except TypeError:
        return _search_head(dim, k, nprobe, refine_factor).SerializeToString()


# A length-delimited field's tag: (number << 3) | 2, one byte below 16.
_VECTORS_TAGS = {field: bytes([(number << 3) | 2])
                 for field, _, number in _QUERY_FIELDS.values()}


def _varint(value: int) -> bytes:
    """`value` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def payload_request(payloads: Any) -> Optional[pb.PayloadRequest]:
    """search()'s `payloads` argument as a PayloadRequest: None or False:
    none; True: every field; a sequence of field names: those fields."""
    if payloads is None or payloads is False:
        return None
    if payloads is True:
        return pb.PayloadRequest(all_fields=True)
    if isinstance(payloads, (str, bytes)) or not isinstance(payloads,
                                                              Sequence):
        raise TypeError(
            "payloads must be True (every field) or a list of field names, "
            f"got {type(payloads).__name__}")
    fields = list(payloads)
    if not fields or not all(isinstance(f, str) and f for f in fields):
        raise ValueError(
            "payloads must name at least one field, each a non-empty str, "
            f"got {fields!r}")
    return pb.PayloadRequest(fields=fields)


def payload_dicts(rows: Sequence[Sequence[bytes]]
                  ) -> List[List[Optional[Payload]]]:
    """Per query, each result's payload (compact JSON objects from knnd) as
    a dict; None for an empty one (a padding -1)."""
    return [[json.loads(p) if p else None for p in row] for row in rows]


def search_payloads(response: pb.SearchResponse, shape: Tuple[int, int]
                    ) -> List[List[Optional[Payload]]]:
    """The payloads of `response` (asked for with SearchRequest.payloads),
    per query, aligned with its ids. RuntimeError when there is not one per
    result."""
    rows, k = shape
    if len(response.payloads) != rows * k:
        raise RuntimeError(
            f"knnd answered {len(response.payloads)} payloads for {rows}x{k} "
            "results: is it a knnd older than payloads?")
    return payload_dicts([response.payloads[q * k:(q + 1) * k]
                          for q in range(rows)])


# The operators of a filter dict (filter_message), Chroma's and Qdrant's.
_RANGE_OPERATORS = {"$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}
_FIELD_OPERATORS = ("$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt",
                    "$lte", "$exists")


def _attribute_value(value: Any, where: str) -> pb.AttributeValue:
    """One value of a filter as knnd's AttributeValue: int, float, str, or
    a timezone-aware datetime (sent as RFC 3339, for timestamp columns)."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{where}: {value!r} is a boolean; attributes hold "
                         "integers, floats, strings and timestamps")
    if isinstance(value, numbers.Integral):
        return pb.AttributeValue(int_value=int(value))
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)):
            raise ValueError(f"{where}: {value!r} is not a finite number")
        return pb.AttributeValue(float_value=float(value))
    if isinstance(value, str):
        return pb.AttributeValue(keyword=value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise ValueError(f"{where}: datetime {value} has no timezone; "
                             "give an aware one (e.g. tzinfo=timezone.utc)")
        return pb.AttributeValue(keyword=value.isoformat())
    raise ValueError(f"{where}: {value!r} ({type(value).__name__}) is not an "
                     "int, float, str or datetime")


def _value_list(values: Any, where: str) -> pb.ValueList:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"{where}: expected a list of values, got {values!r}")
    if not values:
        raise ValueError(f"{where}: the list is empty; give at least one value")
    return pb.ValueList(values=[_attribute_value(v, f"{where}[{i}]")
                                for i, v in enumerate(values)])


def _all_of(parts: List[pb.Filter]) -> pb.Filter:
    if len(parts) == 1:
        return parts[0]
    return pb.Filter(all_of=pb.FilterList(filters=parts))


def _field_filter(field: str, spec: Any, where: str) -> pb.Filter:
    """The filter of one field: a bare value (equality; for a keyword list:
    contains) or a dict of operators, ANDed."""
    if not isinstance(spec, Mapping):
        return pb.Filter(condition=pb.Condition(
            field=field, eq=_attribute_value(spec, where)))
    if not spec:
        raise ValueError(f"{where}: no operator; use one of "
                         f"{', '.join(_FIELD_OPERATORS)}")
    parts: List[pb.Filter] = []
    bounds = pb.Range()
    for op, value in spec.items():
        at = f"{where}[{op!r}]"
        if op in _RANGE_OPERATORS:
            getattr(bounds, _RANGE_OPERATORS[op]).CopyFrom(
                _attribute_value(value, at))
        elif op in ("$eq", "$ne"):
            eq = pb.Filter(condition=pb.Condition(
                field=field, eq=_attribute_value(value, at)))
            parts.append(eq if op == "$eq" else pb.Filter(negate=eq))
        elif op in ("$in", "$nin"):
            # "in" is a Python keyword: set through getattr.
            condition = pb.Condition(field=field)
            getattr(condition, "in").CopyFrom(_value_list(value, at))
            member = pb.Filter(condition=condition)
            parts.append(member if op == "$in" else pb.Filter(negate=member))
        elif op == "$exists":
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"{at}: expected True or False, got {value!r}")
            parts.append(pb.Filter(condition=pb.Condition(
                field=field, exists=bool(value))))
        else:
            raise ValueError(f"{at}: unknown operator; use one of "
                             f"{', '.join(_FIELD_OPERATORS)}")
    if ("$gt" in spec and "$gte" in spec) or ("$lt" in spec and "$lte" in spec):
        raise ValueError(f"{where}: give one of $gt and $gte, and one of $lt "
                         "and $lte")
    if bounds.ListFields():
        parts.append(pb.Filter(condition=pb.Condition(field=field,
                                                      range=bounds)))
    return _all_of(parts)


def filter_message(spec: Any, where: str = "filter") -> pb.Filter:
    """A filter dict in the style of Chroma and Qdrant as knnd's Filter:
    {"genre": "news"} (equality; on a keyword list: contains),
    {"year": {"$gte": 2020, "$lt": 2024}}, {"tags": {"$in": ["a", "b"]}},
    {"$and": [...]}, {"$or": [...]}, {"$not": {...}}; the operators $eq $ne
    $in $nin $gt $gte $lt $lte $exists. Several keys in one dict are ANDed.
    ValueError naming the key for anything else."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: expected a dict, got {spec!r}")
    if not spec:
        raise ValueError(f"{where}: the dict is empty; give a field or "
                         "$and / $or / $not")
    parts: List[pb.Filter] = []
    for key, value in spec.items():
        at = f"{where}[{key!r}]"
        if not isinstance(key, str) or not key:
            raise ValueError(f"{at}: keys are attribute names or $and, $or, "
                             "$not")
        if key in ("$and", "$or"):
            if isinstance(value, (str, bytes, Mapping)) or \
                    not isinstance(value, Sequence) or not value:
                raise ValueError(f"{at}: expected a non-empty list of filter "
                                 "dicts")
            items = pb.FilterList(filters=[
                filter_message(item, f"{at}[{i}]")
                for i, item in enumerate(value)])
            parts.append(pb.Filter(all_of=items) if key == "$and"
                         else pb.Filter(any_of=items))
        elif key == "$not":
            parts.append(pb.Filter(negate=filter_message(value, at)))
        elif key.startswith("$"):
            raise ValueError(f"{at}: unknown operator; at the top use $and, "
                             "$or, $not or an attribute name")
        else:
            parts.append(_field_filter(key, value, at))
    return _all_of(parts)


@dataclasses.dataclass(frozen=True)
class SearchArgs:
    """The arguments of one search() call as the caller gave them, not yet
    checked: what the four clients' one search() (ClientBase) hands to
    their I/O, and what search_request() turns into a SearchRequest. A new
    argument is added here, beside ClientBase.search()'s keyword arguments
    and search_request()'s fields: three places, each in one file,
    whatever the client."""
    queries: Any
    k: Any
    nprobe: Any = None
    allowed_ids: Any = None
    filter: Any = None
    refine_factor: Any = None
    payloads: Any = None
    allow_partial: Optional[bool] = None
    # Hybrid retrieval (docs/hybrid.md).
    text: Any = None
    fusion: Any = None
    rrf_k: Any = None
    vector_weight: Any = None
    text_weight: Any = None
    vector_window: Any = None
    text_window: Any = None

    @property
    def wants_payloads(self) -> bool:
        return payload_request(self.payloads) is not None

    def hybrid_fields(self) -> Dict[str, Any]:
        """The fusion arguments the caller set (not None), by name."""
        return {name: getattr(self, name) for name in _FUSION_ARGUMENTS
                if getattr(self, name) is not None}

    def needs_message(self) -> bool:
        """Whether the request needs fields that the cached serialized head
        does not hold (serialized_search_request builds a message then)."""
        # Attribute by attribute: this runs in every call.
        return (self.allowed_ids is not None or self.wants_payloads
                or bool(self.allow_partial) or self.queries is None
                or self.text is not None or self.fusion is not None
                or self.rrf_k is not None or self.vector_weight is not None
                or self.text_weight is not None
                or self.vector_window is not None
                or self.text_window is not None)


# search()'s arguments of hybrid retrieval besides text, each a
# SearchRequest field of the same name; and what `fusion` may be.
_FUSION_ARGUMENTS = ("fusion", "rrf_k", "vector_weight", "text_weight",
                     "vector_window", "text_window")
FUSIONS = {"rrf": pb.FUSION_RRF, "weighted": pb.FUSION_WEIGHTED}
FUSION_NAMES: Dict[int, str] = {int(value): name
                                for name, value in FUSIONS.items()}
# knnd's limit on rrf_k (src/index/hybrid_fusion.h), checked here too.
MAX_RRF_K = 100000


def text_list(text: Any, rows: Optional[int]) -> List[str]:
    """search()'s `text` as one text per query row: a str is one query, a
    sequence of str one per row; with queries (`rows` of them) as many
    texts as rows. TypeError / ValueError naming `text` otherwise."""
    if isinstance(text, str):
        texts = [text]
    elif isinstance(text, (bytes, bytearray)) or not isinstance(
            text, Sequence):
        raise TypeError("text must be a str (one query) or a sequence of "
                        f"str (one per query row), got {type(text).__name__}")
    else:
        texts = list(text)
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad:
            raise TypeError(f"text[{bad[0]}] must be a str, got "
                            f"{type(texts[bad[0]]).__name__}")
        if not texts:
            raise ValueError("text is empty: give one text per query row")
    if rows is not None and len(texts) != rows:
        raise ValueError(
            f"text holds {len(texts)} texts but queries has {rows} rows: "
            "give one text per query row")
    return texts


def _weight(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    weight = float(value)
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(f"{name}={value} must be finite and >= 0")
    return weight


def _set_hybrid_fields(request: pb.SearchRequest, args: SearchArgs,
                       with_vectors: bool) -> None:
    """The fusion arguments of `args` into `request` (its texts and k set),
    checked as knnd checks them, except a window's upper bound (the
    server's max_k, which the client does not know)."""
    given = args.hybrid_fields()
    vector_side = [name for name in given if name != "text_window"]
    if vector_side and not with_vectors:
        raise ValueError(
            f"{vector_side[0]} is set without queries: it fuses the vector "
            "and text results of hybrid search; with text alone the answer "
            "is BM25's")
    if args.fusion is not None:
        if args.fusion not in FUSIONS:
            raise ValueError(f"fusion={args.fusion!r} is not one of "
                             f"{', '.join(map(repr, FUSIONS))}")
        request.fusion = FUSIONS[args.fusion]
    if args.rrf_k is not None:
        request.rrf_k = positive_int("rrf_k", args.rrf_k)
        if request.rrf_k > MAX_RRF_K:
            raise ValueError(f"rrf_k={request.rrf_k} must be <= {MAX_RRF_K}")
    weights = {name: _weight(name, given[name])
               for name in ("vector_weight", "text_weight") if name in given}
    if weights and all(weights.get(name, 0.5) == 0
                       for name in ("vector_weight", "text_weight")):
        raise ValueError("vector_weight and text_weight are both 0: nothing "
                         "would rank")
    for weight_field, weight in weights.items():
        setattr(request, weight_field, weight)
    for window_field in ("vector_window", "text_window"):
        if window_field in given:
            window = positive_int(window_field, given[window_field])
            if window < request.k:
                raise ValueError(
                    f"{window_field}={window} must be >= k={request.k} (a "
                    "window is k to the server's max_k)")
            setattr(request, window_field, window)


def search_request(args: SearchArgs) -> pb.SearchRequest:
    """The SearchRequest of one search() call, every argument checked
    before any RPC (TypeError / ValueError naming the argument); it asks
    for the results as bytes (results_as_bytes)."""
    if args.queries is None and args.text is None:
        raise TypeError("search() needs queries (vectors), text (a text "
                        "query per row) or both")
    rows: Optional[int] = None
    if args.queries is None:
        request = _search_head(0, args.k, args.nprobe, args.refine_factor)
    else:
        vectors, rows, dim, field = query_bytes(args.queries)
        request = _search_head(dim, args.k, args.nprobe, args.refine_factor)
        setattr(request, field, vectors)
    if args.text is not None:
        request.texts.extend(text_list(args.text, rows))
        _set_hybrid_fields(request, args, with_vectors=rows is not None)
    elif args.hybrid_fields():
        raise ValueError(f"{next(iter(args.hybrid_fields()))} is set "
                         "without text: it applies to hybrid search "
                         "(search(text=...))")
    if args.allowed_ids is not None:
        request.allowed_ids.extend(id_list(args.allowed_ids).tolist())
    asked = payload_request(args.payloads)
    if asked is not None:
        request.payloads.CopyFrom(asked)
    if args.filter is not None:
        request.filter.CopyFrom(filter_message(args.filter))
    if args.allow_partial:
        request.allow_partial_results = True
    return request


# SearchRequest.filter is field 12, length-delimited.
_FILTER_TAG = bytes([(12 << 3) | 2])


# Leaf types whose values are hashable as they are: checked by exact type
# first, which costs a third of the isinstance() tests against Mapping.
_PLAIN_LEAVES = frozenset((str, int, float, bool, type(None)))


def _frozen_filter(spec: Any) -> Any:
    """A filter dict as a hashable value that keeps every key, value and
    type (1, 1.0 and "1" stay apart), from which _thawed_filter() builds
    an equal dict; TypeError for a value that cannot be hashed."""
    kind = type(spec)
    if kind is dict or (kind not in _PLAIN_LEAVES and
                        isinstance(spec, Mapping)):
        return (dict, tuple([(type(key), key, _frozen_filter(value))
                             for key, value in spec.items()]))
    if kind in _PLAIN_LEAVES:
        return (kind, spec)
    if isinstance(spec, (list, tuple)):
        return (list, tuple([_frozen_filter(value) for value in spec]))
    hash(spec)
    return (kind, spec)


def _thawed_filter(frozen: Any) -> Any:
    kind, content = frozen
    if kind is dict:
        return {key: _thawed_filter(value) for _, key, value in content}
    if kind is list:
        return [_thawed_filter(value) for value in content]
    return content


@functools.lru_cache(maxsize=256)
def _cached_filter_bytes(frozen: Any) -> bytes:
    # A filter an API worker sends again (a tenant, a category) is
    # converted and checked once: its conversion costs 10-15 us, as much as
    # the rest of the request. A bad filter raises and is not kept.
    return filter_message(_thawed_filter(frozen)).SerializeToString()


def _filter_bytes(spec: Any) -> Optional[bytes]:
    """filter_message(spec) serialized, from the cache when every part of
    `spec` is hashable; None when one is not (the caller builds the
    message)."""
    try:
        frozen = _frozen_filter(spec)
    except TypeError:
        return None
    return _cached_filter_bytes(frozen)


def serialized_search_request(args: SearchArgs
                              ) -> Tuple[bytes, Tuple[int, int]]:
    """search_request() serialized, and the (num_queries, k) shape its
    answer must have. Without an allow-list, payloads or allow_partial no
    message is built: the serialized head of (dim, k, nprobe,
    refine_factor), cached, then the filter's bytes, cached by its dict's
    content, then the vectors field (fields may come in any order on the
    wire)."""
    filter_bytes = None if args.filter is None else _filter_bytes(args.filter)
    if args.needs_message() or (args.filter is not None
                                and filter_bytes is None):
        request = search_request(args)
        return request.SerializeToString(), (request_rows(request),
                                             request.k)
    vectors, rows, dim, field = query_bytes(args.queries)
    head = _serialized_head(dim, args.k, args.nprobe, args.refine_factor)
    parts = [head]
    if filter_bytes is not None:
        parts += [_FILTER_TAG, _varint(len(filter_bytes)), filter_bytes]
    parts += [_VECTORS_TAGS[field], _varint(len(vectors)), vectors]
    return b"".join(parts), (rows, int(args.k))


# Each result column: its bytes field (results_as_bytes), the wire dtype
# of that field, its values' size and the dtype of the array handed to
# the caller.
_RESULT_COLUMNS: Dict[str, Tuple[str, np.dtype[Any], int, Any]] = {
    "ids": ("ids_i64le", np.dtype("<i8"), 8, np.int64),
    "distances": ("distances_f32le", np.dtype("<f4"), 4, np.float32),
    "approx_distances": ("approx_distances_f32le", np.dtype("<f4"), 4,
                         np.float32),
}


def result_column(response: pb.SearchResponse, name: str,
                  rows: int = -1, columns: int = -1) -> npt.NDArray[Any]:
    """One result column of `response` ("ids", "distances" or
    "approx_distances") as a writable array of shape (rows, columns), or
    1-D by default: from its bytes field when that is set, else from the
    repeated field (a knnd older than results_as_bytes, which ignores the
    flag). RuntimeError when the values do not fill that shape."""
    field, wire, size, dtype = _RESULT_COLUMNS[name]
    packed = getattr(response, field)
    if packed:
        count, partial = divmod(len(packed), size)
        if not partial and (rows < 0 or count == rows * columns):
            # Over a bytearray (one copy, no numpy call but this one):
            # writable, as an array made from the repeated field is.
            return np.ndarray((count,) if rows < 0 else (rows, columns),
                              wire, bytearray(packed))
        got = f"{len(packed)} bytes of {field}"
    else:
        values = np.array(getattr(response, name), dtype=dtype)
        if rows < 0:
            return values
        if values.size == rows * columns:
            return values.reshape(rows, columns)
        got = f"{values.size} {name}"
    raise RuntimeError(f"knnd answered {got} for {rows}x{columns} results")


def result_arrays(response: pb.SearchResponse, shape: Tuple[int, int]
                  ) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """(ids, distances) of `response` as arrays of `shape` (num_queries,
    k), after checking that they answer that request (a proxy or a server
    bug must not hand back rows of another shape)."""
    if response.num_queries != shape[0] or response.k != shape[1]:
        raise RuntimeError(
            f"knnd answered {response.num_queries}x{response.k} results "
            f"for {shape[0]} queries at k={shape[1]}")
    return (result_column(response, "ids", *shape),
            result_column(response, "distances", *shape))


# SearchResult's per-result columns of hybrid retrieval: the
# SearchResponse field of each (the same name) and the array's dtype.
_HYBRID_COLUMNS = (("vector_ranks", np.int32), ("vector_scores", np.float32),
                   ("text_ranks", np.int32), ("text_scores", np.float32))


def hybrid_result_fields(response: pb.SearchResponse,
                         shape: Tuple[int, int]) -> Dict[str, Any]:
    """SearchResult's fields of a hybrid search from `response` (its
    answer to texts): fusion and the per-retriever columns as arrays of
    `shape`, the vector ones left unset for texts alone. RuntimeError when
    a column does not fill the shape (a knnd older than hybrid retrieval
    answers none)."""
    rows, k = shape
    fields: Dict[str, Any] = {"fusion": FUSION_NAMES.get(response.fusion)}
    for name, dtype in _HYBRID_COLUMNS:
        values = getattr(response, name)
        if name.startswith("vector") and not response.vector_ranks:
            continue
        if len(values) != rows * k:
            raise RuntimeError(
                f"knnd answered {len(values)} {name} for {rows}x{k} results "
                "of a hybrid search: is it a knnd older than texts?")
        fields[name] = np.array(values, dtype).reshape(rows, k)
    return fields


def search_result(response: pb.SearchResponse, shape: Tuple[int, int],
                  with_payloads: bool, hybrid: bool = False) -> SearchResult:
    """What search() returns for `response`: result_arrays(), the
    payloads (search_payloads()) when `with_payloads`, each retriever's
    ranks and scores (hybrid_result_fields()) when `hybrid` (the search
    had text), and what the response says about the search."""
    ids, distances = result_arrays(response, shape)
    return SearchResult(
        ids=ids, distances=distances,
        payloads=(search_payloads(response, shape) if with_payloads
                  else None),
        index_version=response.index_version, metric=response.metric,
        nprobe=response.nprobe, refine_factor=response.refine_factor,
        filter_plan=response.filter_plan,
        filter_matched_rows=response.filter_matched_rows,
        missing_shards=tuple(response.missing_shards),
        **(hybrid_result_fields(response, shape) if hybrid else {}))


# How soon a channel connects again to a knnd it lost (a restart, a
# rollout). gRPC's defaults wait 1 s after the first failed attempt, then
# 1.6 times longer each time up to 120 s: after a 30 s outage, clients
# found knnd 13-18 s after it served again. Here the waits start at
# 100 ms and stop growing at 1 s (gRPC adds +-20% jitter), so a client is
# back within about a second of knnd serving, whatever the outage's
# length, for one connection attempt a second while knnd is down.
# min_reconnect_backoff_ms is gRPC's minimum connect timeout: an attempt
# that hangs (the address of a pod that is gone) is abandoned after 1 s
# instead of 20 s.
RECONNECT_BACKOFF_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 1000,
    "grpc.max_reconnect_backoff_ms": 1000,
}


def unary_method(channel: Any, name: str, serialized: bool = False) -> Any:
    """KnnService's method `name` ("Search", "GetIndexInfo") on `channel`
    (a blocking or a grpc.aio one), called with the request message, or
    with its bytes already serialized when `serialized` (the fast path of
    search(), see serialized_search_request)."""
    path, request, response = _METHODS[name]
    return channel.unary_unary(
        path,
        request_serializer=None if serialized else request.SerializeToString,
        response_deserializer=response.FromString)


def channel_options(target: str, options: Sequence[Tuple[str, Any]]
                    ) -> List[Tuple[str, Any]]:
    """The client's channel arguments with the caller's `options` applied
    over them (a key given in `options` replaces the client's own)."""
    merged: Dict[str, Any] = {
        # Results are nq * k * 12 bytes: more than gRPC's 4 MiB default
        # for a batch of 4096 queries at k=100. knnd bounds requests.
        "grpc.max_receive_message_length": -1,
        "grpc.max_send_message_length": -1,
        **RECONNECT_BACKOFF_OPTIONS,
    }
    if target.startswith(_MULTI_ADDRESS_SCHEMES):
        # In the default service config rather than grpc.lb_policy_name: a
        # service config published by the name's owner (DNS TXT) still
        # takes precedence, as gRPC intends.
        merged["grpc.service_config"] = _ROUND_ROBIN_SERVICE_CONFIG
    merged.update(dict(options))
    return list(merged.items())


def open_channel(api: Any, target: str,
                 credentials: Optional[grpc.ChannelCredentials],
                 options: Sequence[Tuple[str, Any]]) -> Any:
    """A channel to `target` from `api`, the module grpc (a blocking
    client's channel) or grpc.aio (an asyncio client's): plaintext without
    `credentials`, else secured with them; channel_options() applied."""
    arguments = channel_options(target, options)
    if credentials is None:
        return api.insecure_channel(target, arguments)
    return api.secure_channel(target, credentials, arguments)


def sleep_polling(channel: grpc.Channel, delay_s: float) -> None:
    """time.sleep(delay_s) while `channel` is watched, and so polled.

    A blocking channel of grpcio before its EventEngine (Debian's 1.51)
    makes progress on a reconnection only while something polls it: a call
    in flight or a connectivity watcher. Calls that fail at once while knnd
    is down poll too briefly, and KnnClient answered 4-5 s after knnd
    served again, whatever the backoff. A watcher kept for the channel's
    life would cost every call CPU (and grpcio 1.51 then hangs at exit
    unless the client is closed), so one watches only while a retry
    waits.

    The watcher asks for no connection attempt (try_to_connect=False, where
    grpc.channel_ready_future asks for one): grpcio's poller thread lives
    up to 0.2 s past the last unsubscribe, a subscription asking to connect
    while it lives leaves it an attempt to make, and it made that attempt
    even after close(), on the closed channel, dying with "Cannot invoke
    RPC: Channel closed!" on stderr (every close() right after a call
    retried twice, grpcio 1.51 and 1.85). Polling is what reconnecting
    needs; the retried call itself connects a channel left idle."""
    def ignore(connectivity: grpc.ChannelConnectivity) -> None:
        del connectivity  # the watch only keeps the channel polled

    channel.subscribe(ignore, try_to_connect=False)
    try:
        time.sleep(delay_s)
    finally:
        channel.unsubscribe(ignore)


def call_metadata(bearer_token: Optional[str]
                  ) -> Optional[Tuple[Tuple[str, str], ...]]:
    """The per-call metadata that carries `bearer_token`, checked against
    knnd's token rule; the error never contains the token itself."""
    if bearer_token is None:
        return None
    if not isinstance(bearer_token, str):
        raise TypeError(
            f"bearer_token must be a str, got {type(bearer_token).__name__}")
    bad = [c for c in bearer_token if not ("!" <= c <= "~")]
    if bad:
        raise ValueError(
            "bearer_token holds a character that is not printable ASCII "
            f"or is whitespace ({bad[0]!r}); a token read from a file "
            "needs .strip()")
    if not _TOKEN_MIN_CHARS <= len(bearer_token) <= _TOKEN_MAX_CHARS:
        raise ValueError(
            f"bearer_token has {len(bearer_token)} characters; knnd accepts "
            f"{_TOKEN_MIN_CHARS} to {_TOKEN_MAX_CHARS}")
    return (("authorization", f"Bearer {bearer_token}"),)


# Incremented in every child process that fork() makes, so that a client
# can tell in one integer comparison that it was created before the fork.
_fork_generation = 0


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class ForkGuard:
    """Remembers the process a client was created in. gRPC channels do not
    survive fork(): a call on a channel inherited from the parent can hang
    or fail in ways that look like a server fault. Checking first turns that
    into a RuntimeError that says what to do."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._generation = _fork_generation
        self._pid = os.getpid()

    def forked(self) -> bool:
        """Whether this process is a fork of the one that made the client."""
        return _fork_generation != self._generation

    def check(self) -> None:
        if self.forked():
            raise RuntimeError(
                f"this {self._owner} was created in process {self._pid} and "
                f"is used in process {os.getpid()}, a fork of it; gRPC "
                "channels do not survive fork(): create the client in each "
                "worker after the fork (gunicorn --preload: in a post_fork "
                "hook or the app's startup / lifespan), see the README of "
                "knnd-client")
