"""knnd_client's errors: a failed call as an exception of its own type, with
knnd's status code and message, without gRPC's debug blob.

KnnClient and AsyncKnnClient raise a subclass of KnndError for each status
code (InvalidArgument, ResourceExhausted, Unavailable, ...); the sharded
clients raise ShardedSearchError, which names the shard that failed.
Both are grpc.aio.AioRpcError, itself a grpc.RpcError, so code that
catches those (and reads code(), details(), trailing_metadata()) keeps
working:

    try:
        result = client.search(queries, k=10)
    except knnd_client.InvalidArgument as e:
        ...  # e.details(): "k=5000 exceeds max_k=1024"
    except knnd_client.ResourceExhausted as e:
        ...  # e.pushback_ms: knnd's grpc-retry-pushback-ms, or None
"""
from typing import Any, Dict, Optional, Type

import grpc
import grpc.aio

from knnd_client import _common


class KnndError(grpc.aio.AioRpcError):
    """A call that failed: code(), details() (knnd's message, naming the
    input and the limit), trailing_metadata(); str() is "CODE: details".
    `cause`: the gRPC error it was made from, when there was one."""

    def __init__(self, code: grpc.StatusCode, details: str,
                 trailing_metadata: Any = (),
                 cause: Optional[BaseException] = None) -> None:
        super().__init__(code, grpc.aio.Metadata(),
                         _aio_metadata(trailing_metadata), details=details)
        self.cause = cause

    def __str__(self) -> str:
        return f"{self.code().name}: {self.details()}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    @property
    def pushback_ms(self) -> Optional[int]:
        """knnd's grpc-retry-pushback-ms: how long to wait before trying
        again (a refusal of a full gate), or None."""
        return _common.pushback_ms(self)


class Cancelled(KnndError):
    """CANCELLED: the call was cancelled (by the client, or by a server
    shutting down)."""


class Unknown(KnndError):
    """UNKNOWN."""


class InvalidArgument(KnndError):
    """INVALID_ARGUMENT: the request is wrong (a dim, k, filter or limit);
    the message names the input and the limit. Do not retry it as is."""


class DeadlineExceeded(KnndError):
    """DEADLINE_EXCEEDED: the call's deadline passed."""


class NotFound(KnndError):
    """NOT_FOUND."""


class AlreadyExists(KnndError):
    """ALREADY_EXISTS."""


class PermissionDenied(KnndError):
    """PERMISSION_DENIED: the bearer token may not call this method."""


class ResourceExhausted(KnndError):
    """RESOURCE_EXHAUSTED: knnd's gate is full (pushback_ms says when to
    try again; the client retried within its RetryPolicy already), or a
    message over a size limit."""


class FailedPrecondition(KnndError):
    """FAILED_PRECONDITION: the index cannot serve this (no raw vectors for
    refine_factor, no payloads, a version not loaded)."""


class Aborted(KnndError):
    """ABORTED."""


class OutOfRange(KnndError):
    """OUT_OF_RANGE."""


class Unimplemented(KnndError):
    """UNIMPLEMENTED: knnd does not have this method (an older knnd)."""


class Internal(KnndError):
    """INTERNAL: a failure inside knnd."""


class Unavailable(KnndError):
    """UNAVAILABLE: knnd is not serving (starting, draining, unreachable);
    the client retried within its RetryPolicy already."""


class DataLoss(KnndError):
    """DATA_LOSS: a file knnd serves failed its checksum."""


class Unauthenticated(KnndError):
    """UNAUTHENTICATED: no bearer token, or one knnd does not know."""


_BY_CODE: Dict[grpc.StatusCode, Type[KnndError]] = {
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNKNOWN: Unknown,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}


class ShardedSearchError(grpc.aio.AioRpcError):
    """The failure of a sharded call, as a grpc.RpcError.

    A subclass of grpc.aio.AioRpcError (itself a grpc.RpcError), so that
    the `except grpc.RpcError` of KnnClient callers and the `except
    grpc.aio.AioRpcError` of AsyncKnnClient callers both catch it unchanged
    when they move to a sharded index. code(), details() and
    trailing_metadata() are those of the shard that failed (its
    grpc-retry-pushback-ms or knnd-serving-version included), with the
    details prefixed by the shard's id and target; for a failure of the
    merge itself (rule 4) they are the merger's own.

    target, shard_id: the shard that failed (shard_id None when it never
      answered, so its id is unknown); None for a merge failure.
    cause: the shard's own error; None when the merger made this one (a
      check of rule 4, or a shard that did not answer by the deadline).
    """

    def __init__(self, code: grpc.StatusCode, details: str, *,
                 target: Optional[str] = None,
                 shard_id: Optional[int] = None,
                 cause: Optional[BaseException] = None,
                 trailing_metadata: Any = ()) -> None:
        super().__init__(code, grpc.aio.Metadata(),
                         _aio_metadata(trailing_metadata), details=details)
        self.target = target
        self.shard_id = shard_id
        self.cause = cause


def error_for(code: grpc.StatusCode) -> Type[KnndError]:
    """The KnndError subclass of a status code."""
    return _BY_CODE.get(code, KnndError)


def from_rpc_error(error: grpc.RpcError) -> KnndError:
    """`error` (either stack's; a KnndError is returned as it is) as the
    KnndError of its code, with its details and trailing metadata."""
    if isinstance(error, KnndError):
        return error
    code = _code(error) or grpc.StatusCode.UNKNOWN
    return error_for(code)(code, _details(error), _trailing(error), cause=error)


# An error's code(), details() and trailing_metadata(), read from either
# stack's errors (and tolerating errors that lack them).
def _trailing(error: BaseException) -> Any:
    trailing = getattr(error, "trailing_metadata", None)
    return (trailing() if callable(trailing) else None) or ()


def _code(error: BaseException) -> Optional[grpc.StatusCode]:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def _details(error: BaseException) -> str:
    details = getattr(error, "details", None)
    return (details() if callable(details) else None) or str(error)


def _aio_metadata(metadata: Any) -> grpc.aio.Metadata:
    """Metadata of either stack (a tuple of pairs, grpc.aio.Metadata) as
    grpc.aio.Metadata, which AioRpcError's trailing_metadata() returns."""
    if isinstance(metadata, grpc.aio.Metadata):
        return metadata
    return grpc.aio.Metadata(*((key, value) for key, value in metadata or ()))
