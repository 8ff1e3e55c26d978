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

import time
from typing import Any, Callable, Optional, Sequence, Tuple, cast

import grpc
import numpy as np
import numpy.typing as npt

from knnd_client import _common
from knnd_client._common import PUSHBACK_METADATA_KEY, RetryPolicy, pushback_ms
from knnd_client._generated.knnd.v1 import knn_service_pb2 as pb
from knnd_client._generated.knnd.v1 import knn_service_pb2_grpc as pb_grpc

__all__ = ["KnnClient", "RetryPolicy", "PUSHBACK_METADATA_KEY", "pushback_ms"]


class KnnClient:
    """Client of knnd.v1.KnnService.

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
        self._timeout_s = _common.positive_timeout_s("timeout_s", timeout_s)
        self._retry = retry
        self._metadata = _common.call_metadata(bearer_token)
        self._fork_guard = _common.ForkGuard("KnnClient")
        channel_options = _common.channel_options(target, options)
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
        request = _common.search_request(queries, k, nprobe, allowed_ids,
                                         refine_factor)
        response = self._call(self._stub.Search, request, timeout_s)
        return _common.search_result(request, response)

    def info(self, timeout_s: Optional[float] = None) -> pb.GetIndexInfoResponse:
        """The served index (dim, metric, ntotal, ...) and the server's limits
        (max_k, max_queries_per_request, ...)."""
        return cast(pb.GetIndexInfoResponse,
                    self._call(self._stub.GetIndexInfo,
                               pb.GetIndexInfoRequest(), timeout_s))

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
              timeout_s: Optional[float]) -> Any:
        """Calls `method` within one deadline, retrying per the RetryPolicy."""
        self._fork_guard.check()
        attempts = _common.Attempts(
            self._retry, self._timeout_s if timeout_s is None else
            _common.positive_timeout_s("timeout_s", timeout_s), request)
        while True:
            try:
                return method(request, timeout=attempts.remaining_s(),
                              metadata=self._metadata)
            except grpc.RpcError as error:
                delay_s = attempts.delay_before_retry_s(error)
                if delay_s is None:
                    raise
                time.sleep(delay_s)
