#!/usr/bin/python3
"""Builds a FAISS index with python3-faiss, the way a user would outside knnd.

Tests use it to check that knnd serves files it did not write itself.
  make_index.py --output F [--factory IVF256,PQ56] [--metric l2|ip]
                (--fashion-mnist | --random N --dim D) [--nprobe P]
"""
import argparse
import gzip

import faiss
import numpy as np

FASHION = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndims)]
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndims)
    return arr.reshape(shape[0], -1).astype("float32")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--output", required=True)
    p.add_argument("--factory", default="IVF256,PQ56")
    p.add_argument("--metric", default="l2", choices=["l2", "ip"])
    p.add_argument("--fashion-mnist", action="store_true")
    p.add_argument("--random", type=int, default=0)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--nprobe", type=int, default=8)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args()
    if a.fashion_mnist:
        xb = read_idx(FASHION)
    else:
        xb = np.random.default_rng(a.seed).standard_normal((a.random, a.dim)).astype("float32")
    metric = faiss.METRIC_L2 if a.metric == "l2" else faiss.METRIC_INNER_PRODUCT
    index = faiss.index_factory(xb.shape[1], a.factory, metric)
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    if isinstance(ivf, faiss.IndexIVFPQ):
        # The factory's polysemous training takes minutes and is unused here.
        ivf.do_polysemous_training = False
    index.train(xb)
    index.add(xb)
    ivf.nprobe = a.nprobe
    faiss.write_index(index, a.output + ".tmp")
    import os
    os.replace(a.output + ".tmp", a.output)
    print(f"{a.output}: {a.factory} over {xb.shape[0]} x {xb.shape[1]}")


if __name__ == "__main__":
    main()
