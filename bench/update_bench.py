#!/usr/bin/python3
"""knnctl update against a full rebuild (bench/RESULTS.md, "Updates").

  /usr/bin/python3 bench/update_bench.py --knnctl build/knnctl \\
      [--rows 1000000] [--dim 128] [--rounds 2] [--dir /tmp/update_bench]

1. Seeded clustered data: a base of --rows vectors, 1% more of the same
   clusters (additions), 1% of the base's ids to delete (seeded), 1,000
   held-out queries.
2. knnctl build of the base (row ids, the default recipe), then knnctl tune
   (--target_recall, 200 sampled rows): v1, whose tuned nprobe and
   refine_factor the update keeps.
3. --rounds rounds, taking turns: knnctl update (v1 + additions - deletions
   -> v2) with --recall_queries 0, the same update as it runs by default
   (its drift report's recall estimate included), and a full knnctl build
   of the same final corpus (the kept rows in order, then the additions,
   with the ids v2 gives them: the old row numbers and the next ids), each
   timed (wall clock of the command). The last default update's report is
   printed.
4. knnctl eval of v2 and of the rebuild at v1's tuned setting against
   exact ground truth over the final corpus, in the same ids.
Prints the median times, their ratios, both recalls and their difference.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import time

import numpy as np


def clustered(rng, centers, rows):
    out = np.empty((rows, centers.shape[1]), dtype=np.float32)
    for b in range(0, rows, 100000):
        n = min(100000, rows - b)
        c = rng.integers(0, len(centers), n)
        out[b:b + n] = centers[c] + rng.standard_normal(
            (n, centers.shape[1])).astype(np.float32)
    return out


def run(cmd):
    start = time.monotonic()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return time.monotonic() - start, out.stdout + out.stderr


def recall_at(eval_output, nprobe, refine):
    # eval's table: nprobe, refine_factor, then recall@1 and @10 (--k 10).
    for line in eval_output.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0] == str(nprobe) and \
                fields[1] == str(refine):
            return float(fields[3])
    raise RuntimeError("no row for nprobe %d refine %d in:\n%s" %
                       (nprobe, refine, eval_output))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--knnctl", required=True)
    parser.add_argument("--rows", type=int, default=1000000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default="/tmp/update_bench")
    # This data's neighbours are hard for 4-bit PQ (recall@10 stops near
    # 0.74 at any nprobe), so the tuned target is below knnctl's default.
    parser.add_argument("--target_recall", type=float, default=0.7)
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    path = lambda name: os.path.join(args.dir, name)
    rng = np.random.default_rng(34)
    centers = rng.standard_normal((1000, args.dim)).astype(np.float32) * 4
    base = clustered(rng, centers, args.rows)
    delta = args.rows // 100
    additions = clustered(rng, centers, delta)
    queries = clustered(rng, centers, 1000)
    deleted = np.sort(rng.choice(args.rows, delta, replace=False))
    np.save(path("base.npy"), base)
    np.save(path("add.npy"), additions)
    np.save(path("queries.npy"), queries)
    np.save(path("delete.npy"), deleted.astype("<i8"))
    kept = np.setdiff1d(np.arange(args.rows), deleted)
    final_ids = np.concatenate(
        [kept, np.arange(args.rows, args.rows + delta)]).astype("<i8")
    np.save(path("final.npy"), np.concatenate([base[kept], additions]))
    np.save(path("final_ids.npy"), final_ids)
    del base

    if not os.path.exists(path("v1.index.meta.json")):
        t, _ = run([args.knnctl, "build", "--input", path("base.npy"),
                    "--output", path("v1.index")])
        print("base build (v1): %.1f s" % t, flush=True)
    _, out = run([args.knnctl, "tune", "--index", path("v1.index"),
                  "--sample", "200", "--target_recall",
                  str(args.target_recall)])
    meta = json.load(open(path("v1.index.meta.json")))
    nprobe = int(meta.get("tunedNprobe", meta.get("tuned_nprobe", 0)))
    refine = int(meta.get("tunedRefineFactor",
                          meta.get("tuned_refine_factor", 0)))
    print("tuned: nprobe %d, refine_factor %d" % (nprobe, refine), flush=True)

    update = [args.knnctl, "update", "--base", path("v1.index"), "--output",
              path("v2.index"), "--input", path("add.npy"), "--delete",
              path("delete.npy")]
    # Each round takes turns: the update without the recall estimate, the
    # default update (its drift report with the recall estimate: one exact
    # search over the new INDEX.vectors), then the full rebuild.
    update_s, default_s, rebuild_s = [], [], []
    default_out = ""
    for r in range(args.rounds):
        t, _ = run(update + ["--recall_queries", "0"])
        update_s.append(t)
        t, default_out = run(update)
        default_s.append(t)
        t, _ = run([args.knnctl, "build", "--input", path("final.npy"),
                    "--ids", path("final_ids.npy"), "--output",
                    path("rebuilt.index")])
        rebuild_s.append(t)
        print("round %d: update %.1f s, default update %.1f s, full "
              "rebuild %.1f s: ratios %.3f, %.3f" %
              (r + 1, update_s[-1], default_s[-1], rebuild_s[-1],
               update_s[-1] / rebuild_s[-1], default_s[-1] / rebuild_s[-1]),
              flush=True)
    print(default_out)
    recalls = {}
    for name in ("v2", "rebuilt"):
        _, out = run([
            args.knnctl, "eval", "--index", path(name + ".index"),
            "--queries", path("queries.npy"), "--base", path("final.npy"),
            "--nprobes", str(nprobe),
            "--refine_factors", str(refine)])
        recalls[name] = recall_at(out, nprobe, refine)
    u, b = statistics.median(update_s), statistics.median(rebuild_s)
    d = statistics.median(default_s)
    print("rows %d x %d, +%d -%d" % (args.rows, args.dim, delta, delta))
    print("median update (--recall_queries 0) %.2f s, default update %.2f "
          "s, full rebuild %.2f s: ratios %.3f, %.3f" %
          (u, d, b, u / b, d / b))
    print("recall@10 at nprobe %d refine %d: update %.4f, rebuild %.4f, "
          "difference %+.4f" % (nprobe, refine, recalls["v2"],
                                recalls["rebuilt"],
                                recalls["v2"] - recalls["rebuilt"]))


if __name__ == "__main__":
    main()
