"""The API service of bench/memory/designs_bench.py, in one of its three
designs (environment DESIGN):

  embedded  the module reads the FAISS index when it is imported: in every
            gunicorn worker, or once in the master with --preload (the
            workers then share its heap copy-on-write)
  knnd      no index: each worker calls one knnd through AsyncKnnClient,
            created in the ASGI lifespan (after the fork)

GET /search?rows=R&k=K&seed=S searches R query vectors drawn from a seeded
generator (the same for every design, so only the search differs) at
nprobe NPROBE and returns the first row's ids. GET /ready says the worker
has its index or its client. Other settings: INDEX (embedded), KNND_TARGET
(knnd), FAISS_THREADS (OpenMP threads per embedded worker, default 1),
WARM_IN_MASTER=1 (embedded: one search at import time, as a warm-up would
do before gunicorn forks).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, AsyncIterator, Dict

import numpy as np
from fastapi import FastAPI, Query

DESIGN = os.environ.get("DESIGN", "embedded")
NPROBE = int(os.environ.get("NPROBE", "16"))
DIM = int(os.environ.get("DIM", "128"))

INDEX = None
if DESIGN == "embedded":
    import faiss

    faiss.omp_set_num_threads(int(os.environ.get("FAISS_THREADS", "1")))
    # read_index copies the file into the heap (no mmap), as an API that
    # embeds its index does; the IVF-PQ precomputed table is built here.
    INDEX = faiss.read_index(os.environ["INDEX"])
    faiss.extract_index_ivf(INDEX).nprobe = NPROBE
    if os.environ.get("WARM_IN_MASTER") == "1":
        INDEX.search(np.zeros((64, INDEX.d), dtype=np.float32), 10)
elif DESIGN != "knnd":
    raise SystemExit(f"DESIGN={DESIGN!r}: expected embedded or knnd")


# Queries like the indexed vectors: around the same seeded centres as
# bench/memory/build_index.py draws (its --seed, default 1234), with the same
# noise. (Queries far from every centre would all probe the few largest
# lists and measure those instead.)
CENTRES = np.random.default_rng(int(os.environ.get("DATA_SEED", "1234"))).standard_normal(
    (1000, DIM), dtype=np.float32) * 2


def queries(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    which = rng.integers(0, len(CENTRES), rows)
    return CENTRES[which] + 0.5 * rng.standard_normal((rows, DIM), dtype=np.float32)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    if DESIGN == "knnd":
        from knnd_client import AsyncKnnClient, RetryPolicy
        # A refused call (knnd at its budget) is retried after knnd's
        # pushback until the 120 s deadline, so that a burst queues here as
        # it does in an embedded worker instead of failing.
        async with AsyncKnnClient(os.environ["KNND_TARGET"], timeout_s=120.0,
                                  retry=RetryPolicy(max_attempts=10000),
                                  max_concurrent_calls=64) as knn:
            app.state.knn = knn
            yield
    else:
        yield


app = FastAPI(lifespan=lifespan)


@app.get("/ready")
async def ready() -> Dict[str, Any]:
    return {"pid": os.getpid(), "design": DESIGN}


if DESIGN == "embedded":
    @app.get("/search")
    def search(rows: int = Query(1, ge=1, le=4096), k: int = Query(10, ge=1, le=100),
               seed: int = Query(0, ge=0)) -> Dict[str, Any]:
        # A plain def: FastAPI runs it on its thread pool, and FAISS
        # releases the GIL while it searches.
        _, ids = INDEX.search(queries(rows, seed), k)
        return {"rows": rows, "ids": ids[0].tolist()}
else:
    @app.get("/search")
    async def search(rows: int = Query(1, ge=1, le=4096), k: int = Query(10, ge=1, le=100),
                     seed: int = Query(0, ge=0)) -> Dict[str, Any]:
        result = await app.state.knn.search(queries(rows, seed), k, NPROBE)
        return {"rows": rows, "ids": result.ids[0].tolist()}
