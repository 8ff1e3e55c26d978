"""A retrieval service over knnd: GET /search?q=...&k=5 embeds the query
(embedder.py), asks knnd for the nearest chunk vectors and their payloads
(text, source, ordinal: build_corpus.py stores them in the index with
`knnctl build --payloads`) through AsyncKnnClient, and returns them.

No worker holds the index or the chunks: each gunicorn worker has one gRPC
channel to knnd, so adding workers adds no index or text memory. Settings
come from the environment:

  KNND_TARGET     knnd's address; dns:///NAME:PORT spreads calls over every
                  replica of a headless Service (default dns:///localhost:50051)
  KNND_NPROBE     inverted lists per query (default: the index's stored one)
  KNND_REFINE     exact re-ranking factor (default 4; 0 for PQ distances)
  KNND_TIMEOUT_S  deadline of one knnd call, retries included (default 1.0)
  KNND_MAX_CALLS  knnd calls in flight per worker (default 32)
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, AsyncIterator, Dict, List, Optional

import grpc
from fastapi import FastAPI, HTTPException, Query

from embedder import embed
from knnd_client import AsyncKnnClient


def _env_int(name: str, default: Optional[int]) -> Optional[int]:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


KNND_TARGET = os.environ.get("KNND_TARGET", "dns:///localhost:50051")
NPROBE = _env_int("KNND_NPROBE", None)
REFINE = _env_int("KNND_REFINE", 4)
TIMEOUT_S = float(os.environ.get("KNND_TIMEOUT_S", "1.0"))
MAX_CALLS = _env_int("KNND_MAX_CALLS", 32)

# knnd statuses that mean "try again shortly" (capacity, draining, slow):
# the client already retried them within its deadline, so the service says
# 503 and lets its own caller (or load balancer) decide.
_UNAVAILABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.DEADLINE_EXCEEDED}


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Runs in each worker's own event loop after gunicorn forked it (even
    # with preload_app, where this module was imported in the master): the
    # one place to create the client, since a gRPC channel made before a
    # fork is unusable in the child.
    async with AsyncKnnClient(KNND_TARGET, timeout_s=TIMEOUT_S,
                              max_concurrent_calls=MAX_CALLS) as knn:
        app.state.knn = knn
        yield


app = FastAPI(title="knnd RAG example", lifespan=lifespan)


@app.get("/search")
async def search(q: str = Query(min_length=1, max_length=2000),
                 k: int = Query(5, ge=1, le=50)) -> Dict[str, Any]:
    vector = embed(q)
    if not vector.any():
        raise HTTPException(422, "q has no words to search for")
    try:
        result = await app.state.knn.search(
            vector.reshape(1, -1), k, NPROBE, refine_factor=REFINE,
            payloads=["text", "source", "ordinal"])
    except grpc.RpcError as error:
        status = 503 if error.code() in _UNAVAILABLE else 502
        raise HTTPException(status, f"knnd: {error.code().name}: "
                                    f"{error.details()}") from None
    # Each result's chunk came with its id, from the index version that
    # answered: nothing to look up, nothing to keep in step.
    results: List[Dict[str, Any]] = [
        {"id": hit.id, "score": hit.distance, **(hit.payload or {})}
        for hit in result.hits(0)]
    return {"query": q, "worker_pid": os.getpid(), "results": results}


@app.get("/healthz")
async def healthz() -> Dict[str, Any]:
    """Ready when knnd answers: its index's size and version."""
    try:
        info = await app.state.knn.info()
    except grpc.RpcError as error:
        raise HTTPException(503, f"knnd: {error.code().name}") from None
    return {"ntotal": info.ntotal, "version": info.version}
