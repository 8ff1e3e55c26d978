#!/usr/bin/python3
"""Writes the index loader fuzzer's seeds into DIR: tiny IVF-PQ files of the
kinds knnd serves (L2, inner product behind OPQ), each also truncated, and
one knnd refuses (a flat index). Generated, not committed: they are binary
and a few KiB each.

  gen_index_seeds.py DIR
"""
import os
import sys

import faiss
import numpy as np


def build(factory, metric, rng):
    x = rng.standard_normal((256, 8)).astype("float32")
    index = faiss.index_factory(8, factory, metric)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        # index_factory turns polysemous training on; useless and slow.
        faiss.downcast_index(ivf).do_polysemous_training = False
    index.train(x)
    index.add(x)
    return index


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(9)
    seeds = {
        "ivfpq_l2": build("IVF4,PQ2x4", faiss.METRIC_L2, rng),
        "opq_ivfpq_ip": build("OPQ2,IVF4,PQ2x4", faiss.METRIC_INNER_PRODUCT, rng),
        "flat_refused": build("Flat", faiss.METRIC_L2, rng),
    }
    for name, index in seeds.items():
        data = faiss.serialize_index(index).tobytes()
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        with open(os.path.join(out, name + "_truncated"), "wb") as f:
            f.write(data[: len(data) * 2 // 3])


if __name__ == "__main__":
    main()
