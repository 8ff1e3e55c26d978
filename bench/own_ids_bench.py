#!/usr/bin/python3
"""Own ids against row ids on Fashion-MNIST, measured in one run
(bench/RESULTS.md, "Own ids").

  /usr/bin/python3 bench/own_ids_bench.py --build build [--nq 2000] [--rounds 5]

1. knnctl build (the default recipe, IVF256,PQ196x4fs with INDEX.vectors)
   three times over the same 60,000 training images: with row ids, with
   --ids 7*row+3 and with --ids of seeded random 63-bit ids. The three index
   files must be byte for byte the same (the lists hold rows); the two
   own-id builds add INDEX.ids.
2. knnctl tune --dry_run on each (knnd's own search path in process: one
   OpenMP thread, one query per call, exact neighbours from INDEX.vectors
   translated through the id table) over the first --nq test images, at
   every (nprobe, refine_factor) of --nprobes x --refine_factors, in
   --rounds rounds whose order of the three builds rotates, so that a
   noisy machine slows each alike.
Prints a Markdown table: recall@10 of each build and the median queries/s,
with the own-id builds' ratios to row ids, and each own-id build's
geometric mean ratio over all settings.
"""
import argparse
import os
import platform
import re
import statistics
import subprocess
import tempfile
import time

import numpy as np

FASHION = "/usr/share/datasets/fashion-mnist"
ROWS = 60000


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def tune_rows(output):
    """{(nprobe, refine): (recall@10, queries/s)} of a tune's table."""
    rows = {}
    for line in output.splitlines():
        m = re.match(r"\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s*$", line)
        if m:
            rows[(int(m[1]), int(m[2]))] = (float(m[3]), float(m[4]))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build",
                        help="CMake build directory holding knnctl")
    parser.add_argument("--nq", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nprobes", default="8,16,32")
    parser.add_argument("--refine_factors", default="0,4,8")
    parser.add_argument("--workdir", default="",
                        help="keep the indexes here (default: a temporary "
                             "directory, removed)")
    args = parser.parse_args()
    knnctl = os.path.join(args.build, "knnctl")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    tmp = None
    work = args.workdir
    if not work:
        tmp = tempfile.TemporaryDirectory()
        work = tmp.name
    train = f"{FASHION}/train-images-idx3-ubyte.gz"
    test = f"{FASHION}/t10k-images-idx3-ubyte.gz"
    rng = np.random.default_rng(33)
    hashes = rng.integers(0, 2**63 - 1, ROWS, dtype=np.int64)
    assert len(np.unique(hashes)) == ROWS
    variants = {
        "row ids": None,
        "ids 7*row+3": 7 * np.arange(ROWS, dtype=np.int64) + 3,
        "random 63-bit ids": hashes,
    }
    paths = {}
    for name, ids in variants.items():
        tag = name.split()[0]
        path = os.path.join(work, f"{tag}.index")
        cmd = [knnctl, "build", "--input", train, "--output", path]
        if ids is not None:
            ids_path = os.path.join(work, f"{tag}.ids.npy")
            np.save(ids_path, ids)
            cmd += ["--ids", ids_path]
        start = time.time()
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        print(f"built {name}: {path} in {time.time() - start:.0f} s")
        paths[name] = path
    with open(paths["row ids"], "rb") as f:
        reference = f.read()
    for name, path in paths.items():
        with open(path, "rb") as f:
            assert f.read() == reference, f"{name}: index differs from row ids"
    print("the three index files are identical (lists of rows)")

    measured = {name: {} for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        order = names[r % 3:] + names[:r % 3]
        for name in order:
            out = subprocess.run(
                [knnctl, "tune", "--index", paths[name], "--queries", test,
                 "--limit", str(args.nq), "--nprobes", args.nprobes,
                 "--refine_factors", args.refine_factors,
                 "--target_recall", "1.0", "--dry_run"],
                check=True, capture_output=True, text=True, env=env).stdout
            for setting, value in tune_rows(out).items():
                measured[name].setdefault(setting, []).append(value)
        print(f"round {r + 1} of {args.rounds} done")

    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{cpu_model()}, {os.cpu_count()} cores; {args.nq} test queries, "
          f"k=10, 1 thread, 1 query per call, median of {args.rounds} "
          "rounds\n")
    own = names[1:]
    print("| nprobe | refine | recall@10 " + " / ".join(names)
          + " | q/s row ids | " + " | ".join(f"q/s {n} (ratio)" for n in own)
          + " |")
    print("|---|---|---|---|" + "---|" * len(own))
    for setting in sorted(measured[names[0]]):
        recalls = [measured[n][setting][0][0] for n in names]
        qps = {n: statistics.median(v[1] for v in measured[n][setting])
               for n in names}
        base = qps[names[0]]
        cells = [f"{qps[n]:,.0f} ({qps[n] / base:.3f})" for n in own]
        print(f"| {setting[0]} | {setting[1]} | "
              + " / ".join(f"{r:.4f}" for r in recalls)
              + f" | {base:,.0f} | " + " | ".join(cells) + " |")
    # One figure per build: the geometric mean of its ratios over every
    # setting (each setting's noise averages out across settings).
    for n in own:
        ratios = [statistics.median(v[1] for v in measured[n][s])
                  / statistics.median(v[1] for v in measured[names[0]][s])
                  for s in measured[names[0]]]
        mean = float(np.exp(np.mean(np.log(ratios))))
        print(f"\n{n}: queries/s {mean:.3f}x row ids (geometric mean over "
              f"{len(ratios)} settings; range {min(ratios):.3f} to "
              f"{max(ratios):.3f})")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
