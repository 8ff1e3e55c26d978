#!/usr/bin/python3
"""Builds a seeded synthetic IVF-PQ index for the memory benchmarks.

Vectors are drawn around 1000 seeded Gaussian centres (clustered, so that
IVF lists are uneven as in real data) and generated and added in chunks, so
that a 10M-vector index builds without holding its raw vectors in memory.
  build_index.py --output F --n N --dim D --factory IVF4096,PQ32
"""
import argparse
import os
import time

import faiss
import numpy as np


def chunk(rng, centres, n):
    which = rng.integers(0, len(centres), n)
    noise = rng.standard_normal((n, centres.shape[1]), dtype=np.float32)
    return centres[which] + 0.5 * noise


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--output", required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--factory", default="IVF4096,PQ32")
    p.add_argument("--train", type=int, default=200000)
    p.add_argument("--nprobe", type=int, default=16)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args()
    if os.path.exists(a.output):
        print(f"{a.output} exists; not rebuilt")
        return
    start = time.time()
    rng = np.random.default_rng(a.seed)
    centres = rng.standard_normal((1000, a.dim), dtype=np.float32) * 2
    index = faiss.index_factory(a.dim, a.factory)
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    ivf.do_polysemous_training = False
    index.train(chunk(rng, centres, min(a.train, a.n)))
    done = 0
    while done < a.n:
        m = min(1000000, a.n - done)
        index.add(chunk(rng, centres, m))
        done += m
        print(f"  added {done}/{a.n} ({time.time() - start:.0f} s)", flush=True)
    ivf.nprobe = a.nprobe
    faiss.write_index(index, a.output + ".tmp")
    os.rename(a.output + ".tmp", a.output)
    print(f"{a.output}: {a.n} x {a.dim} {a.factory}, "
          f"{os.path.getsize(a.output) / 2**20:.1f} MiB, "
          f"{time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
