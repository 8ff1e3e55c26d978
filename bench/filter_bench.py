#!/usr/bin/python3
"""Filtered search on Fashion-MNIST at selectivities 0.1% to 99%, measured
in one run (bench/RESULTS.md, "Filters").

  /usr/bin/python3 bench/filter_bench.py --build build [--nq 400] \\
      [--rounds 3]

1. knnctl build (the default recipe, IVF256,PQ196x4fs with INDEX.vectors)
   over the 60,000 training images with --attributes: one integer "u"
   per row, uniform in [0, 100000) from a fixed seed, so that u < 100000*s
   admits a fraction s of the rows; knnctl tune --target_recall 0.95
   records its defaults. A second copy of the same files without
   INDEX.attrs (its sidecar says attributes: false).
2. knnd serves each copy. Per selectivity, the first --nq test images, one
   query per call (as an API worker sends them), k=10, recall@10 against
   an exact search (FAISS IndexFlatL2) of the admitted rows, and queries/s:
     knnd filter   SearchRequest.filter {u < 100000*s}
     post-filter   knnd unfiltered with k' = min(max_k, 10/s), the first 10
                   admitted kept (what a client does without filters)
     faiss sel     python3-faiss IndexIVFPQ IVF256,PQ49 (8-bit: FAISS 1.7.3
                   takes no SearchParameters on FastScan) searched with an
                   IDSelectorBitmap at nprobe 16
     unfiltered    knnd, no filter (the q/s every ratio is taken against)
   The methods take turns every --chunk queries, --rounds times, so that
   other load on the machine slows each alike.
3. RssAnon of both knnd processes (/proc/PID/status) after the same load.
Prints a Markdown table.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from knnd_harness import Daemon, install_client  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"
SELECTIVITIES = (0.001, 0.01, 0.1, 0.5, 0.99)
K = 10


def read_idx(path):
    import gzip
    with gzip.open(path) as f:
        data = f.read()
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
            for i in range(data[3])]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * len(dims)).reshape(
        dims[0], -1).astype("float32")


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def rss_anon_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return -1


def recall(got, truth):
    hits = [len(set(a) & set(b) - {-1}) / max(1, len(set(b) - {-1}))
            for a, b in zip(got, truth)]
    return float(np.mean(hits))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--nq", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=50)
    parser.add_argument("--workdir", default="")
    parser.add_argument("--nprobe", type=int, default=0,
                        help="every knnd search's nprobe; 0: the tuned one")
    parser.add_argument("--refine_factor", type=int, default=-1,
                        help="every knnd search's refine_factor; -1: the "
                             "tuned one")
    args = parser.parse_args()
    import faiss
    faiss.omp_set_num_threads(1)
    knnctl = os.path.join(args.build, "knnctl")
    knnd = os.path.join(args.build, "knnd")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    tmp = tempfile.TemporaryDirectory()
    work = args.workdir or tmp.name
    os.makedirs(work, exist_ok=True)
    install_client(os.path.join(HERE, ".."), os.path.join(tmp.name, "client"))
    from knnd_client import KnnClient

    xb = read_idx(f"{FASHION}/train-images-idx3-ubyte.gz")
    xq = read_idx(f"{FASHION}/t10k-images-idx3-ubyte.gz")[:args.nq]
    rng = np.random.default_rng(2026)
    u = rng.integers(0, 100000, len(xb))
    base = os.path.join(work, "base.npy")
    attrs = os.path.join(work, "attrs.jsonl")
    np.save(base, xb)
    with open(attrs, "w") as f:
        for value in u:
            f.write(json.dumps({"u": int(value)}) + "\n")
    with_attrs = os.path.join(work, "with.index")
    if not os.path.exists(with_attrs):
        subprocess.run([knnctl, "build", "--input", base, "--output",
                        with_attrs, "--attributes", attrs], check=True,
                       env=env, stdout=subprocess.DEVNULL)
        subprocess.run([knnctl, "tune", "--index", with_attrs,
                        "--target_recall", "0.95"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    without = os.path.join(work, "without.index")
    for suffix in ("", ".vectors"):
        shutil.copyfile(with_attrs + suffix, without + suffix)
    with open(with_attrs + ".meta.json") as f:
        meta = json.load(f)
    meta.pop("attributes", None)
    with open(without + ".meta.json", "w") as f:
        json.dump(meta, f)

    daemons = {name: Daemon(knnd, ["--index", path], knnctl=knnctl, env=env,
                            log_path=os.path.join(work, name + ".log"))
               for name, path in (("with", with_attrs), ("without", without))}
    for name, daemon in daemons.items():
        if not daemon.wait_serving(300):
            raise RuntimeError(f"knnd ({name}): " + daemon.read_log())
    client = KnnClient(daemons["with"].address, timeout_s=60)
    plain = KnnClient(daemons["without"].address, timeout_s=60)
    max_k = client.info().max_k
    setting = {}
    if args.nprobe > 0:
        setting["nprobe"] = args.nprobe
    if args.refine_factor >= 0:
        setting["refine_factor"] = args.refine_factor

    # FAISS's own filtered search: 8-bit IVF-PQ with an IDSelectorBitmap.
    faiss_path = os.path.join(work, "faiss_ivfpq.index")
    if os.path.exists(faiss_path):
        ivfpq = faiss.read_index(faiss_path)
    else:
        ivfpq = faiss.index_factory(xb.shape[1], "IVF256,PQ49")
        ivfpq.train(xb)
        ivfpq.add(xb)
        faiss.write_index(ivfpq, faiss_path)

    def one_by_one(search):
        def run(rows):
            return np.vstack([search(xq[i:i + 1]) for i in rows])
        return run

    flat_all = faiss.IndexFlatL2(xb.shape[1])
    flat_all.add(xb)
    truth_all = flat_all.search(xq, K)[1]
    table = []
    unfiltered_qps = []
    unfiltered_recall = []
    for s in SELECTIVITIES:
        bound = int(100000 * s)
        mask = u < bound
        rows = np.flatnonzero(mask)
        flat = faiss.IndexFlatL2(xb.shape[1])
        flat.add(xb[rows])
        truth = rows[flat.search(xq, K)[1]]
        bits = np.packbits(mask.astype(np.uint8), bitorder="little")
        selector = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(bits))
        params = faiss.SearchParametersIVF(sel=selector, nprobe=16)
        k_post = min(max_k, int(np.ceil(K / s)))

        def post_filter(q):
            ids, _ = client.search(q, k_post, **setting)
            kept = [i for i in ids[0] if i >= 0 and mask[i]][:K]
            return np.array(kept + [-1] * (K - len(kept)))[None]
        methods = {
            "knnd filter": one_by_one(lambda q: client.search(
                q, K, filter={"u": {"$lt": bound}}, **setting)[0]),
            "post-filter": one_by_one(post_filter),
            "faiss sel": one_by_one(
                lambda q: ivfpq.search(q, K, params=params)[1]),
            "unfiltered": one_by_one(
                lambda q: client.search(q, K, **setting)[0]),
        }
        results = {m: np.full((len(xq), K), -1) for m in methods}
        seconds = {m: 0.0 for m in methods}
        order = list(methods)
        for r in range(args.rounds):
            for begin in range(0, len(xq), args.chunk):
                chunk = range(begin, min(len(xq), begin + args.chunk))
                for m in order:
                    start = time.perf_counter()
                    results[m][chunk.start:chunk.stop] = methods[m](chunk)
                    seconds[m] += time.perf_counter() - start
                order = order[1:] + order[:1]
        qps = {m: args.rounds * len(xq) / seconds[m] for m in methods}
        unfiltered_qps.append(qps["unfiltered"])
        unfiltered_recall.append(recall(results["unfiltered"], truth_all))
        table.append((s, mask.sum(), {m: (recall(results[m], truth), qps[m])
                                      for m in methods if m != "unfiltered"}
                      | {"unfiltered": (0.0, qps["unfiltered"])}))
        # The same unfiltered load on the copy without attributes.
        for i in range(len(xq)):
            plain.search(xq[i:i + 1], K, **setting)

    print(f"Fashion-MNIST 60,000 x 784, {args.nq} queries one per call, "
          f"k={K}, knnd {setting or 'tuned defaults'}, "
          f"{args.rounds} rounds interleaved by {args.chunk}; "
          f"{cpu_model()}; {time.strftime('%Y-%m-%d')}")
    print()
    print("| selectivity | rows | knnd filter recall | q/s | x unfiltered "
          "| post-filter recall | q/s | faiss sel recall | q/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s, n, r in table:
        f, p, fs, un = (r["knnd filter"], r["post-filter"], r["faiss sel"],
                        r["unfiltered"])
        print(f"| {s:.1%} | {n} | {f[0]:.3f} | {f[1]:.0f} | "
              f"{f[1] / un[1]:.2f} | {p[0]:.3f} | {p[1]:.0f} | {fs[0]:.3f} | "
              f"{fs[1]:.0f} |")
    print()
    print(f"unfiltered knnd: {np.median(unfiltered_qps):.0f} q/s (median "
          f"of the five runs), recall@10 {np.mean(unfiltered_recall):.3f}")
    rss = {name: rss_anon_kib(d.proc.pid) for name, d in daemons.items()}
    print(f"RssAnon: with attributes {rss['with']} KiB, without "
          f"{rss['without']} KiB ({rss['with'] / rss['without']:.3f}x); "
          f"INDEX.attrs {os.path.getsize(with_attrs + '.attrs')} bytes")
    for daemon in daemons.values():
        daemon.stop(10)
    tmp.cleanup()


if __name__ == "__main__":
    main()
