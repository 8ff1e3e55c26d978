#!/usr/bin/env python3
"""FAISS's own filtered search over a knnd FastScan index, the baseline of
bench/filter_bench.py, run as its child under a Python whose faiss
searches IVF FastScan with an IDSelector (faiss-cpu from PyPI; FAISS 1.7.3,
Debian's python3-faiss, refuses SearchParameters on FastScan).

  PYTHON bench/filter_faiss.py --index INDEX --queries Q.npy --attr U.npy \\
      --nprobe N --refine_factor R [--k 10]

The index is knnd's own file (docs/fastscan_format.md) read into FAISS:
the FAISS blob (coarse centroids, PQ codebooks) by faiss.deserialize_index,
then every list's packed codes and ids, as they are in the file, added to
its BlockInvertedLists; with R > 0 an IndexRefineFlat over INDEX.vectors
re-ranks k * R candidates (k_factor = R), as knnd's refine_factor does.
So FAISS searches the same codes as knnd, at the same nprobe and
re-ranking, with an IDSelectorBitmap of the rows admitted by u < bound.

Protocol, one line per request on stdin: "BOUND BEGIN END" searches queries
[BEGIN, END) one per call (k, admitted rows u < BOUND); the answer on
stdout is one line "SECONDS ID ID ...", the wall-clock seconds of the
searches (perf_counter) and (END - BEGIN) * k ids, row-major. The first
line written is "ready FAISS_VERSION", or "error MESSAGE".
"""
import argparse
import struct
import sys
import time

import numpy as np

HEADER_BYTES = 128
VECTORS_HEADER_BYTES = 64


def read_knnd_fastscan(faiss, path):
    """The knnd FastScan file at `path` as a FAISS index holding its lists."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    header = bytes(raw[:HEADER_BYTES])
    if header[:8] != b"KNNDFSIX":
        raise ValueError(f"{path} is not a knnd FastScan file")
    table_offset, nlist, blob_offset, blob_bytes = struct.unpack_from(
        "<QQQQ", header, 24)
    ntotal, code_size = struct.unpack_from("<QQ", header, 72)
    block_vectors = struct.unpack_from("<I", header, 88)[0]
    index = faiss.deserialize_index(
        np.array(raw[blob_offset:blob_offset + blob_bytes]))
    ivf = faiss.extract_index_ivf(index)
    table = np.frombuffer(raw[table_offset:table_offset + 24 * nlist],
                          dtype="<u8").reshape(nlist, 3)
    for list_no, (n, codes_offset, ids_offset) in enumerate(table):
        if n == 0:
            continue
        blocks = (int(n) + block_vectors - 1) // block_vectors
        codes = np.array(raw[codes_offset:codes_offset +
                             blocks * block_vectors * code_size])
        ids = np.frombuffer(raw[ids_offset:ids_offset + 8 * int(n)],
                            dtype="<i8").copy()
        # An empty BlockInvertedLists takes whole packed blocks as they are.
        ivf.invlists.add_entries(list_no, int(n), faiss.swig_ptr(ids),
                                 faiss.swig_ptr(codes))
    ivf.ntotal = int(ntotal)
    index.ntotal = int(ntotal)
    return index


def read_vectors(path, dim):
    with open(path, "rb") as f:
        header = f.read(VECTORS_HEADER_BYTES)
    dtype = struct.unpack_from("<I", header, 12)[0]
    if header[:8] != b"KNNDVEC\0" or dtype != 1:
        raise ValueError(f"{path}: not float32 knnd vectors")
    return np.ascontiguousarray(np.memmap(
        path, dtype="<f4", mode="r", offset=VECTORS_HEADER_BYTES).reshape(
            -1, dim))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--index", required=True)
    parser.add_argument("--queries", required=True)
    parser.add_argument("--attr", required=True)
    parser.add_argument("--nprobe", type=int, required=True)
    parser.add_argument("--refine_factor", type=int, required=True)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    try:
        import faiss
        faiss.omp_set_num_threads(1)
        base = read_knnd_fastscan(faiss, args.index)
        xq = np.load(args.queries).astype(np.float32)
        u = np.load(args.attr)
        index = base
        if args.refine_factor > 0:
            xb = read_vectors(args.index + ".vectors", base.d)
            index = faiss.IndexRefineFlat(base, faiss.swig_ptr(xb))
        # Probe the selector support once, so a FAISS without it says so.
        bits = np.packbits(np.ones(len(u), np.uint8), bitorder="little")
        probe = faiss.IDSelectorBitmap(len(u), faiss.swig_ptr(bits))
        faiss.extract_index_ivf(base).search(
            xq[:1], args.k, params=faiss.SearchParametersIVF(sel=probe))
    except Exception as e:  # noqa: BLE001 (reported to the parent)
        print("error " + " ".join(str(e).split()), flush=True)
        return 1
    print("ready " + faiss.__version__, flush=True)
    selectors = {}
    for line in sys.stdin:
        bound, begin, end = (int(x) for x in line.split())
        if bound not in selectors:
            bits = np.packbits((u < bound).astype(np.uint8),
                               bitorder="little")
            sel = faiss.IDSelectorBitmap(len(u), faiss.swig_ptr(bits))
            ivf_params = faiss.SearchParametersIVF(sel=sel,
                                                   nprobe=args.nprobe)
            params = ivf_params if args.refine_factor <= 0 else \
                faiss.IndexRefineSearchParameters(
                    k_factor=args.refine_factor, base_index_params=ivf_params)
            # The bitmap and selector must outlive the parameters.
            selectors[bound] = (bits, sel, ivf_params, params)
        params = selectors[bound][3]
        ids = np.empty((end - begin, args.k), dtype=np.int64)
        start = time.perf_counter()
        for i in range(begin, end):
            ids[i - begin] = index.search(xq[i:i + 1], args.k,
                                          params=params)[1][0]
        seconds = time.perf_counter() - start
        print(f"{seconds:.6f} " + " ".join(map(str, ids.ravel())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
