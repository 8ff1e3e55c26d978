#!/usr/bin/python3
"""knnctl update's peak resident memory, before and after a change, in one
run (bench/RESULTS.md, "Update memory").

  /usr/bin/python3 bench/update_memory.py --knnctl build/knnctl \\
      [--knnctl-before OLD/knnctl] [--rows 1000000] [--dim 128] \\
      [--share 0.01] [--dir /tmp/update_memory]

1. Seeded clustered data (update_bench.py's): a base of --rows x --dim,
   and a delta of --share of the base each way: new rows (additions),
   new vectors for existing ids (upserts) and ids to delete.
2. knnctl build of the base (row ids, the default recipe, its
   INDEX.vectors).
3. knnctl update of base + delta, as it runs by default and with
   --recall_queries 0, by each knnctl given (--knnctl-before first), each
   under /usr/bin/time, whose peak RSS (%M: the child's ru_maxrss) and
   wall time are printed beside the base's INDEX.vectors size.
Imported by tests/python/update_memory_test.py (make_inputs, build_base,
run_update).
"""
import argparse
import os
import subprocess
import time

import numpy as np

from update_bench import clustered


def make_inputs(directory, rows, dim, share, seed=57):
    """Writes base.npy and the delta (delta.npy, delta_ids.npy, delete.npy)
    into `directory`; returns the delta's row counts."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((1000, dim)).astype(np.float32) * 4
    np.save(os.path.join(directory, "base.npy"),
            clustered(rng, centers, rows))
    n = max(1, int(rows * share))
    touched = rng.choice(rows, 2 * n, replace=False)
    upserted, deleted = np.sort(touched[:n]), np.sort(touched[n:])
    ids = np.concatenate([upserted, np.arange(rows, rows + n)])
    np.save(os.path.join(directory, "delta.npy"),
            clustered(rng, centers, 2 * n))
    np.save(os.path.join(directory, "delta_ids.npy"), ids.astype("<i8"))
    np.save(os.path.join(directory, "delete.npy"), deleted.astype("<i8"))
    return {"added": n, "upserted": n, "deleted": n}


def run_peak(command, log_path):
    """Runs `command` with OMP_NUM_THREADS=1 under /usr/bin/time, its output
    to `log_path`; returns (exit status, peak RSS in bytes, wall seconds).
    Not wait4's ru_maxrss of a child of this process: a child spawned from
    Python (vfork) starts its peak at this process's, which the data made
    large; time forks the command from its own small process."""
    rss_path = log_path + ".maxrss"
    start = time.monotonic()
    with open(log_path, "w") as log:
        status = subprocess.run(
            ["/usr/bin/time", "-f", "%M", "-o", rss_path, *command],
            stdout=log, stderr=subprocess.STDOUT,
            env=dict(os.environ, OMP_NUM_THREADS="1")).returncode
    seconds = time.monotonic() - start
    # %M is in KiB; a failed command's status line comes first.
    peak_kib = int(open(rss_path).read().split()[-1])
    return status, peak_kib * 1024, seconds


def build_base(knnctl, directory, extra=()):
    index = os.path.join(directory, "v1.index")
    if not os.path.exists(index + ".manifest.json"):
        status, _, seconds = run_peak(
            [knnctl, "build", "--input", os.path.join(directory, "base.npy"),
             "--output", index, *extra], os.path.join(directory, "build.log"))
        if status != 0:
            raise RuntimeError(open(os.path.join(directory, "build.log")).read())
        print("base build: %.1f s" % seconds, flush=True)
    return index


def run_update(knnctl, directory, extra=()):
    """knnctl update of v1.index + the delta into v2.index (removed after);
    returns (peak RSS bytes, wall seconds, output)."""
    path = lambda name: os.path.join(directory, name)
    log = path("update.log")
    status, peak, seconds = run_peak(
        [knnctl, "update", "--base", path("v1.index"), "--output",
         path("v2.index"), "--input", path("delta.npy"), "--ids",
         path("delta_ids.npy"), "--delete", path("delete.npy"), *extra], log)
    output = open(log).read()
    if status != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (knnctl, status, output))
    for name in os.listdir(directory):
        if name.startswith("v2.index"):
            os.remove(path(name))
    return peak, seconds, output


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--knnctl", required=True)
    parser.add_argument("--knnctl-before", default="")
    parser.add_argument("--rows", type=int, default=1000000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--share", type=float, default=0.01)
    parser.add_argument("--dir", default="/tmp/update_memory")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    delta = make_inputs(args.dir, args.rows, args.dim, args.share)
    index = build_base(args.knnctl, args.dir)
    vectors = os.path.getsize(index + ".vectors")
    print("base %d x %d, INDEX.vectors %.1f MiB; delta: %d added, %d "
          "upserted, %d deleted" % (args.rows, args.dim, vectors / 2**20,
                                    delta["added"], delta["upserted"],
                                    delta["deleted"]), flush=True)
    binaries = [("before", args.knnctl_before)] if args.knnctl_before else []
    binaries.append(("after", args.knnctl))
    print("%-8s %-22s %14s %10s" % ("knnctl", "flags", "peak RSS MiB",
                                    "wall s"))
    for flags in ((), ("--recall_queries", "0")):
        for name, knnctl in binaries:
            peak, seconds, _ = run_update(knnctl, args.dir, flags)
            print("%-8s %-22s %14.1f %10.1f" % (name, " ".join(flags) or
                                                "(default)", peak / 2**20,
                                                seconds), flush=True)


if __name__ == "__main__":
    main()
