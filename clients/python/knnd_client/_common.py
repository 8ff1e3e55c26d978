"""What KnnClient and AsyncKnnClient share: argument validation, the
request and the result arrays, channel options, bearer tokens, the retry
decisions (deadline, attempts, backoff, grpc-retry-pushback-ms) and the
fork guard.

Only the I/O differs between the two clients (a blocking call and
time.sleep, or an awaited call and asyncio.sleep); every decision about a
call is made here, once, so that the two cannot drift apart.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import numbers
import os
import random
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np
import numpy.typing as npt

from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb

LOG = logging.getLogger("knnd_client")

# Trailing metadata knnd sends with RESOURCE_EXHAUSTED (gate full): how long
# to wait before retrying, in ms. A negative value means "do not retry".
PUSHBACK_METADATA_KEY = "grpc-retry-pushback-ms"

_RETRYABLE = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)

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


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """When and how long a client waits before trying a call again.

    Retried: RESOURCE_EXHAUSTED that carries grpc-retry-pushback-ms (knnd at
    capacity), RESOURCE_EXHAUSTED from a stream gRPC reset under the
    server's memory quota (QUOTA_RESET_DETAILS; other RESOURCE_EXHAUSTED,
    e.g. a message over the size limit, would fail again) and UNAVAILABLE
    (not loaded yet, draining, connection lost). With a pushback the wait is pushback * (1 + U(0, pushback_jitter)),
    never shorter than the server asked (the jitter spreads the clients that
    were refused together, so they do not come back together); without one
    it is U(0, min(max_backoff_s, initial_backoff_s * backoff_multiplier**n))
    after the n-th failure (gRPC's jittered exponential backoff). A wait that
    would end past the call's deadline is not started: the last error is
    raised at once.
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

    The clients' loops are: try `remaining_s()`; on an RpcError ask
    `delay_before_retry_s(error)`; None means raise it, a number means
    sleep that long and try again."""

    def __init__(self, policy: RetryPolicy, timeout_s: float,
                 request: Any) -> None:
        self._policy = policy
        self._deadline = time.monotonic() + timeout_s
        self._backoff_s = policy.initial_backoff_s
        self._attempt = 1
        self._what = type(request).__name__

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


def query_matrix(queries: Any) -> npt.NDArray[np.float32]:
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


def id_list(ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
    array = np.asarray(ids)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(
            "allowed_ids must be a 1-D sequence of integer ids, got "
            f"dtype {array.dtype} and shape {array.shape}")
    return array.astype(np.int64, copy=False)


def search_request(queries: Any, k: Any, nprobe: Any, allowed_ids: Any,
                   refine_factor: Any) -> pb.SearchRequest:
    """The SearchRequest of one search() call, every argument checked
    before any RPC (TypeError / ValueError naming the argument)."""
    matrix = query_matrix(queries)
    request = pb.SearchRequest(vectors_f32le=matrix.tobytes(),
                               dim=matrix.shape[1], k=positive_int("k", k))
    if nprobe is not None:
        request.nprobe = positive_int("nprobe", nprobe)
    if refine_factor is not None:
        request.refine_factor = positive_int("refine_factor", refine_factor,
                                             minimum=0)
    if allowed_ids is not None:
        request.allowed_ids.extend(id_list(allowed_ids).tolist())
    return request


def search_result(request: pb.SearchRequest, response: pb.SearchResponse
                  ) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """(ids, distances) of `response` as (num_queries, k) arrays, after
    checking that they answer `request` (a proxy or a server bug must not
    hand back rows of another shape)."""
    shape = (len(request.vectors_f32le) // (4 * request.dim), request.k)
    if response.num_queries != shape[0] or response.k != shape[1]:
        raise RuntimeError(
            f"knnd answered {response.num_queries}x{response.k} results "
            f"for {shape[0]} queries at k={shape[1]}")
    ids = np.array(response.ids, dtype=np.int64).reshape(shape)
    distances = np.array(response.distances, dtype=np.float32).reshape(shape)
    return ids, distances


def channel_options(target: str, options: Sequence[Tuple[str, Any]]
                    ) -> List[Tuple[str, Any]]:
    """The client's channel arguments with the caller's `options` applied
    over them (a key given in `options` replaces the client's own)."""
    merged: Dict[str, Any] = {
        # Results are nq * k * 12 bytes: more than gRPC's 4 MiB default
        # for a batch of 4096 queries at k=100. knnd bounds requests.
        "grpc.max_receive_message_length": -1,
        "grpc.max_send_message_length": -1,
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
