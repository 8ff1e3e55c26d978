"""KnnClient: k-NN search against knnd from an API process that holds no
index.

One KnnClient owns one gRPC channel (HTTP/2 connections to one or more knnd
replicas). It is safe to use from many threads at once; create it once per
process (after a fork: gRPC channels do not survive fork()), and close() it
when done.
"""
from __future__ import annotations

import dataclasses
import logging
import numbers
import random
import time
from typing import Any, Callable, Optional, Sequence, Tuple

import grpc
import numpy as np
import numpy.typing as npt

from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
from knnd_client._generated.knnd.v1 import knn_service_pb2_grpc as pb_grpc

_LOG = logging.getLogger("knnd_client")

# Trailing metadata knnd sends with RESOURCE_EXHAUSTED (gate full): how long
# to wait before retrying, in ms. A negative value means "do not retry".
PUSHBACK_METADATA_KEY = "grpc-retry-pushback-ms"

_RETRYABLE = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """When and how long KnnClient waits before trying a call again.

    Retried: RESOURCE_EXHAUSTED that carries grpc-retry-pushback-ms (knnd at
    capacity; other RESOURCE_EXHAUSTED, e.g. a message over the size limit,
    would fail again) and UNAVAILABLE (not loaded yet, draining, connection
    lost). With a pushback the wait is pushback * (1 + U(0, pushback_jitter)),
    never shorter than the server asked; without one it is
    U(0, min(max_backoff_s, initial_backoff_s * backoff_multiplier**n)) after
    the n-th failure (gRPC's jittered exponential backoff). A wait that would
    end past the call's deadline is not started: the last error is raised.
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


class KnnClient:
    """Client of knnd.v1.KnnService.

    target: a gRPC target. "dns:///knnd-headless.NAMESPACE.svc:50051" (a
      Kubernetes headless Service) resolves every replica and spreads calls
      over them round-robin; "host:port" uses gRPC's default pick_first.
    timeout_s: default deadline of one call, retries and waits included.
    retry: RetryPolicy; RetryPolicy(max_attempts=1) turns retries off.
    credentials: grpc.ssl_channel_credentials(...) for TLS; None: plaintext.
    options: extra gRPC channel arguments, appended to the client's own.
    """

    def __init__(self, target: str, *, timeout_s: float = 2.0,
                 retry: RetryPolicy = RetryPolicy(),
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 options: Sequence[Tuple[str, Any]] = ()) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0")
        self._timeout_s = timeout_s
        self._retry = retry
        channel_options = [
            # Results are nq * k * 12 bytes: more than gRPC's 4 MiB default
            # for a batch of 4096 queries at k=100. knnd bounds requests.
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
        ]
        if target.startswith("dns:"):
            channel_options.append(("grpc.lb_policy_name", "round_robin"))
        channel_options.extend(options)
        if credentials is None:
            self._channel = grpc.insecure_channel(target, channel_options)
        else:
            self._channel = grpc.secure_channel(target, credentials,
                                                channel_options)
        self._stub = pb_grpc.KnnServiceStub(self._channel)

    def search(self, queries: npt.NDArray[np.float32], k: int,
               nprobe: Optional[int] = None, *,
               allowed_ids: Optional[npt.ArrayLike] = None,
               refine_factor: Optional[int] = None,
               timeout_s: Optional[float] = None,
               ) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """The k nearest neighbours of each row of `queries`.

        queries: float32 array of shape (num_queries, dim), any byte order
          or strides (sent as little-endian row-major bytes).
        k: neighbours per query, 1 <= k <= the server's max_k.
        nprobe: inverted lists to visit; None: the server's default.
        allowed_ids: optional 1-D integer ids; only these can be returned.
        refine_factor: exact re-ranking of refine_factor * k IVF-PQ
          candidates from the raw vectors served beside the index (distances
          then exact); 0: off; None: the server's default. Needs an index
          built with `knnctl build --keep_vectors` (else FAILED_PRECONDITION).
        timeout_s: deadline of this call (retries included); None: the
          client's default.

        Returns (ids, distances): int64 and float32 arrays of shape
        (num_queries, k), closest first; a row with fewer than k neighbours
        is padded with id -1 and distance +inf (L2) or -inf (inner product).

        Raises TypeError / ValueError for bad arguments, before any RPC, and
        grpc.RpcError when the server refuses (INVALID_ARGUMENT names the
        field and limit) or the deadline passes (DEADLINE_EXCEEDED).
        """
        matrix = _query_matrix(queries)
        request = pb.SearchRequest(
            vectors_f32le=matrix.tobytes(), dim=matrix.shape[1],
            k=_positive_int("k", k))
        if nprobe is not None:
            request.nprobe = _positive_int("nprobe", nprobe)
        if refine_factor is not None:
            request.refine_factor = _positive_int("refine_factor",
                                                  refine_factor, minimum=0)
        if allowed_ids is not None:
            request.allowed_ids.extend(_id_list(allowed_ids).tolist())
        response = self._call(self._stub.Search, request, timeout_s)
        shape = (matrix.shape[0], request.k)
        if response.num_queries != shape[0] or response.k != shape[1]:
            raise RuntimeError(
                f"knnd answered {response.num_queries}x{response.k} results "
                f"for {shape[0]} queries at k={shape[1]}")
        ids = np.array(response.ids, dtype=np.int64).reshape(shape)
        distances = np.array(response.distances, dtype=np.float32).reshape(shape)
        return ids, distances

    def info(self, timeout_s: Optional[float] = None) -> pb.GetIndexInfoResponse:
        """The served index (dim, metric, ntotal, ...) and the server's limits
        (max_k, max_queries_per_request, ...)."""
        return self._call(self._stub.GetIndexInfo, pb.GetIndexInfoRequest(),
                          timeout_s)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "KnnClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Callable[..., Any], request: Any,
              timeout_s: Optional[float]) -> Any:
        """Calls `method` within one deadline, retrying per the RetryPolicy."""
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0")
        deadline = time.monotonic() + timeout_s
        policy = self._retry
        backoff_s = policy.initial_backoff_s
        attempt = 1
        while True:
            try:
                return method(request,
                              timeout=max(deadline - time.monotonic(), 0.0))
            except grpc.RpcError as error:
                delay_s = _retry_delay_s(error, backoff_s, policy)
                if (delay_s is None or attempt >= policy.max_attempts
                        or time.monotonic() + delay_s >= deadline):
                    raise
                _LOG.debug("retrying %s after %s in %.3f s (attempt %d of %d)",
                           type(request).__name__, error.code().name, delay_s,
                           attempt + 1, policy.max_attempts)
                time.sleep(delay_s)
                backoff_s = min(backoff_s * policy.backoff_multiplier,
                                policy.max_backoff_s)
                attempt += 1


def pushback_ms(error: grpc.RpcError) -> Optional[int]:
    """The server's grpc-retry-pushback-ms of a failed call, or None."""
    trailing = getattr(error, "trailing_metadata", None)
    for key, value in (trailing() if trailing else None) or ():
        if key == PUSHBACK_METADATA_KEY:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _retry_delay_s(error: grpc.RpcError, backoff_s: float,
                   policy: RetryPolicy) -> Optional[float]:
    """Seconds to wait before retrying `error`, or None: do not retry."""
    code = error.code() if hasattr(error, "code") else None
    if code not in _RETRYABLE:
        return None
    pushback = pushback_ms(error)
    if pushback is None:
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return None
        return random.uniform(0, backoff_s)
    if pushback < 0:
        return None
    return pushback / 1000 * (1 + random.uniform(0, policy.pushback_jitter))


def _query_matrix(queries: Any) -> npt.NDArray[np.float32]:
    """`queries` as a C-contiguous little-endian float32 matrix, or a
    TypeError / ValueError that says what is wrong and how to fix it."""
    if not isinstance(queries, np.ndarray):
        raise TypeError(
            "queries must be a numpy.ndarray of dtype float32 and shape "
            f"(num_queries, dim), got {type(queries).__name__}")
    if queries.dtype.kind != "f" or queries.dtype.itemsize != 4:
        raise TypeError(
            f"queries must have dtype float32, got {queries.dtype}; convert "
            "with queries.astype(numpy.float32)")
    if queries.ndim != 2:
        hint = ("; one vector is queries.reshape(1, -1)"
                if queries.ndim == 1 else "")
        raise ValueError(
            f"queries must be 2-D (num_queries, dim), got shape "
            f"{queries.shape}{hint}")
    if queries.shape[0] == 0 or queries.shape[1] == 0:
        raise ValueError(f"queries has shape {queries.shape}: no values")
    finite = np.isfinite(queries)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise ValueError(
            f"queries[{row}, {col}] is {queries[row, col]}: every value must "
            "be finite")
    return np.ascontiguousarray(queries, dtype="<f4")


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return int(value)


def _id_list(ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
    array = np.asarray(ids)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(
            "allowed_ids must be a 1-D sequence of integer ids, got "
            f"dtype {array.dtype} and shape {array.shape}")
    return array.astype(np.int64, copy=False)
