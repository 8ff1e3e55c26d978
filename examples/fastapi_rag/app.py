"""A retrieval service over knnd: GET /search?q=...&k=5 asks knnd, in one
call through AsyncKnnClient, for the chunks that best match the query both
by embedding (embedder.py) and by its words (BM25 over the chunks' text),
fused by knnd, with their payloads (text, source, ordinal:
build_corpus.py stores them in the index with `knnctl build --payloads
--text text --attribute_fields source`), and returns them.

  GET /search?q=patent+license&k=5                      hybrid (the default)
  GET /search?q=patent+license&source=Apache-2.0        only that file's chunks
  GET /search?q=...&source=GPL-2&source=GPL-3           either file's
  GET /search?q=...&mode=vector                         embedding alone
  GET /search?q=...&mode=text                           words alone (BM25)

The filter is knnd's (an attribute of every chunk, applied to both
retrievers before fusion); a query parameter the service does not know is
refused (422), never ignored.

No worker holds the index or the chunks: each gunicorn worker has one gRPC
channel to knnd, so adding workers adds no index or text memory. Settings
come from the environment:

  KNND_TARGET     knnd's address; dns:///NAME:PORT spreads calls over every
                  replica of a headless Service (default dns:///localhost:50051)
  KNND_NPROBE     inverted lists per query (default: the index's stored one)
  KNND_REFINE     exact re-ranking factor (default 4; 0 for PQ distances)
  KNND_WINDOW     candidates each retriever gives the fusion, at least k
                  (default 50)
  KNND_TIMEOUT_S  deadline of one knnd call, retries included (default 1.0)
  KNND_MAX_CALLS  knnd calls in flight per worker (default 32)
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, AsyncIterator, Dict, List, Literal, Optional

import grpc
from fastapi import FastAPI, HTTPException, Query, Request

from embedder import embed
from knnd_client import AsyncKnnClient


def _env_int(name: str, default: Optional[int]) -> Optional[int]:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


KNND_TARGET = os.environ.get("KNND_TARGET", "dns:///localhost:50051")
NPROBE = _env_int("KNND_NPROBE", None)
REFINE = _env_int("KNND_REFINE", 4)
WINDOW = _env_int("KNND_WINDOW", 50)
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


# What /search takes: the query, k, the search mode, and the chunks'
# attributes it filters on (build_corpus.py's --attribute_fields).
_PARAMETERS = {"q", "k", "mode", "source"}


@app.get("/search")
async def search(request: Request,
                 q: str = Query(min_length=1, max_length=2000),
                 k: int = Query(5, ge=1, le=50),
                 mode: Literal["hybrid", "vector", "text"] = "hybrid",
                 source: Optional[List[str]] = Query(None)
                 ) -> Dict[str, Any]:
    unknown = sorted(set(request.query_params) - _PARAMETERS)
    if unknown:
        raise HTTPException(
            422, f"unknown query parameter {unknown[0]!r}: /search takes "
                 f"{', '.join(sorted(_PARAMETERS))}")
    arguments: Dict[str, Any] = dict(
        k=k, payloads=["text", "source", "ordinal"],
        filter=({"source": {"$in": source}} if source else None))
    if mode != "text":
        vector = embed(q)
        if not vector.any():
            raise HTTPException(422, "q has no words to search for")
        arguments.update(queries=vector.reshape(1, -1), nprobe=NPROBE,
                         refine_factor=REFINE)
    if mode != "vector":
        arguments["text"] = q
    if mode == "hybrid":
        window = max(k, WINDOW or k)
        arguments.update(vector_window=window, text_window=window)
    try:
        result = await app.state.knn.search(**arguments)
    except grpc.RpcError as error:
        status = 503 if error.code() in _UNAVAILABLE else 502
        raise HTTPException(status, f"knnd: {error.code().name}: "
                                    f"{error.details()}") from None
    # Each result's chunk came with its id, from the index version that
    # answered: nothing to look up, nothing to keep in step. A hybrid hit
    # says where each retriever ranked it (0: not in its window).
    results: List[Dict[str, Any]] = [
        {"id": hit.id, "score": hit.distance, **(hit.payload or {}),
         **({"vector_rank": hit.vector_rank, "text_rank": hit.text_rank}
            if mode == "hybrid" else {})}
        for hit in result.hits(0)]
    return {"query": q, "mode": mode, "worker_pid": os.getpid(),
            "results": results}


@app.get("/healthz")
async def healthz() -> Dict[str, Any]:
    """Ready when knnd answers: its index's size and version."""
    try:
        info = await app.state.knn.info()
    except grpc.RpcError as error:
        raise HTTPException(503, f"knnd: {error.code().name}") from None
    return {"ntotal": info.ntotal, "version": info.version}
