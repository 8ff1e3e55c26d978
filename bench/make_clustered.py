#!/usr/bin/python3
"""Seeded clustered float32 vectors as a .npy, written in chunks through a
numpy memmap (bounded memory, any size): 1,000 centres of N(0, 4^2) per
dimension, each row a centre plus N(0, 1) noise (bench/RESULTS.md,
"Streaming build").

  /usr/bin/python3 bench/make_clustered.py ROWS DIM SEED PATH [CENTRES_SEED]

Rows of equal CENTRES_SEED (default SEED) share the clusters.
"""
import sys

import numpy as np


def main():
    rows, dim, seed, path = (int(sys.argv[1]), int(sys.argv[2]),
                             int(sys.argv[3]), sys.argv[4])
    centres_seed = int(sys.argv[5]) if len(sys.argv) > 5 else seed
    centres = np.random.default_rng(centres_seed).standard_normal(
        (1000, dim)).astype(np.float32) * 4
    rng = np.random.default_rng(seed)
    if centres_seed == seed:
        rng.standard_normal((1000, dim))  # the draw the centres took
    out = np.lib.format.open_memmap(path, mode="w+", dtype="<f4",
                                    shape=(rows, dim))
    for begin in range(0, rows, 100000):
        n = min(100000, rows - begin)
        chosen = rng.integers(0, 1000, n)
        out[begin:begin + n] = centres[chosen] + rng.standard_normal(
            (n, dim)).astype(np.float32)
    out.flush()


if __name__ == "__main__":
    main()
