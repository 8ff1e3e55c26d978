#!/usr/bin/python3
"""Two or more knnd index recipes on the same data, in paired rounds.

  /usr/bin/python3 bench/recipe_ab.py --base BASE.npy --queries Q.npy \\
      --factories "IVF256,PQ64x4fs;IVF256,PQ128x4fs" [--pca 128] \\
      [--work /tmp/knnd_recipes] [--build build] [--targets 0.95,0.98]

Builds each factory with `knnctl build --factory` (with INDEX.vectors,
so re-ranked exactly as knnd's default recipe is), optionally on the base's
and queries' projection on their --pca leading principal components
(python3-faiss's PCAMatrix, trained on the base), and computes the exact
recall@10 ground truth. Then per mode, one query per call ("single") and
all queries in one call ("batch"), 1 thread, in build/bench/peers_bench
(IndexSnapshot::Search):
  - sweeps nprobe 1-24 x refine factor 2-24 for each index (the faster of
    two passes; a deeper re-ranking skipped once the highest target is
    reached), and picks each index's fastest setting reaching each target;
  - measures the picks again in 5 rounds, the indexes' order alternating,
    each for about 0.4 s of CPU, and prints each one's median q/s and the
    ratio of every other index to the first (median and range of the
    per-round ratios). q/s are from process CPU time.
Run by Debian's python3 (python3-faiss, python3-numpy).
"""
import argparse
import json
import os
import statistics
import subprocess

import numpy as np

from peers_run import K, REFINES, cpu_model, recall

NPROBES = (1, 2, 3, 4, 6, 8, 12, 16, 24)
ROUNDS = 5


class Searcher:
    """One peers_bench process serving one index."""

    def __init__(self, build, index, queries, ids_out):
        self.ids_out = ids_out
        self.proc = subprocess.Popen(
            [f"{build}/bench/peers_bench", "--index", index, "--queries",
             queries], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        ready = self.proc.stdout.readline().split()
        if ready[:1] != ["ready"]:
            raise SystemExit(f"peers_bench on {index}: {ready}")

    def run(self, rows, nprobe, refine, reps, keep_ids):
        out = self.ids_out if keep_ids else "-"
        self.proc.stdin.write(f"{rows} 1 {nprobe} {refine} {reps} {out}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def prepare(args):
    import faiss
    os.makedirs(args.work, exist_ok=True)
    base = np.ascontiguousarray(np.load(args.base), dtype=np.float32)
    queries = np.ascontiguousarray(np.load(args.queries), dtype=np.float32)
    if args.pca:
        pca = faiss.PCAMatrix(base.shape[1], args.pca)
        pca.train(base)
        base, queries = pca.apply_py(base), pca.apply_py(queries)
    base_npy, query_npy = f"{args.work}/base.npy", f"{args.work}/queries.npy"
    np.save(base_npy, base)
    np.save(query_npy, queries)
    flat = faiss.IndexFlatL2(base.shape[1])
    flat.add(base)
    truth = flat.search(queries, K)[1]
    indexes = []
    for i, factory in enumerate(args.factories.split(";")):
        index = f"{args.work}/r{i}.index"
        built = subprocess.run(
            [f"{args.build}/knnctl", "build", "--input", base_npy, "--output",
             index, "--factory", factory], capture_output=True, text=True)
        if built.returncode != 0:
            raise SystemExit(f"knnctl build --factory {factory}:\n"
                             f"{built.stdout}{built.stderr}")
        indexes.append((factory, index))
    return query_npy, truth, indexes


def sweep(searcher, rows, truth, top):
    found = []
    for nprobe in NPROBES:
        for refine in REFINES:
            first = searcher.run(rows, nprobe, refine, 1, True)
            ids = np.fromfile(searcher.ids_out, dtype=np.int64)
            rec = recall(ids.reshape(len(truth), K), truth)
            second = searcher.run(rows, nprobe, refine, 1, False)
            seconds = min(first["cpu_s"], second["cpu_s"])
            found.append((nprobe, refine, rec, len(truth) / seconds))
            if rec >= top:
                break
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--factories", required=True,
                   help="';'-separated FAISS factory strings")
    p.add_argument("--pca", type=int, default=0,
                   help="project on this many principal components first")
    p.add_argument("--work", default="/tmp/knnd_recipes")
    p.add_argument("--build", default="build")
    p.add_argument("--targets", default="0.95,0.98")
    args = p.parse_args()
    targets = [float(t) for t in args.targets.split(",")]
    query_npy, truth, indexes = prepare(args)
    print(f"# {cpu_model()}, {os.cpu_count()} vCPU; {len(truth)} queries of "
          f"{args.queries}{f', PCA {args.pca}' if args.pca else ''}", flush=True)
    searchers = [Searcher(args.build, index, query_npy,
                          f"{args.work}/ids{i}.bin")
                 for i, (_, index) in enumerate(indexes)]
    names = [factory for factory, _ in indexes]
    for mode, rows in (("single", 1), ("batch", 0)):
        swept = [sweep(s, rows, truth, max(targets)) for s in searchers]
        for target in targets:
            picks = [max((x for x in found if x[2] >= target),
                         key=lambda x: x[3], default=None) for found in swept]
            if any(pick is None for pick in picks):
                print(f"{mode} {target}: not reached by " + ", ".join(
                    n for n, pick in zip(names, picks) if pick is None))
                continue
            qps = [[] for _ in searchers]
            for rnd in range(ROUNDS):
                order = range(len(searchers))
                for i in (order if rnd % 2 == 0 else reversed(order)):
                    nprobe, refine, _, sweep_qps = picks[i]
                    reps = max(1, round(0.4 * sweep_qps / len(truth)))
                    r = searchers[i].run(rows, nprobe, refine, reps, False)
                    qps[i].append(r["queries"] / r["cpu_s"])
            line = [f"{mode} {target}:"]
            for i, (name, pick) in enumerate(zip(names, picks)):
                line.append(f"{name} ({pick[0]}, {pick[1]}) recall "
                            f"{pick[2]:.4f} {statistics.median(qps[i]):,.0f} q/s"
                            + (";" if i + 1 < len(names) else ""))
            for i in range(1, len(names)):
                ratio = sorted(qps[i][r] / qps[0][r] for r in range(ROUNDS))
                line.append(f"| {names[i]} / {names[0]} "
                            f"{statistics.median(ratio):.2f}x "
                            f"({ratio[0]:.2f}-{ratio[-1]:.2f})")
            print(" ".join(line), flush=True)
    for s in searchers:
        s.close()


if __name__ == "__main__":
    main()
