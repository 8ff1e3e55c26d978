#!/usr/bin/env python3
"""Paired A/B of two builds of knnd's search path: two peers_bench binaries
(bench/peers_bench.cc, e.g. one built before a change and one after) on the
indexes `make bench-peers` leaves under --work, in alternating rounds.

  peers_ab.py --a OLD_BIN --b NEW_BIN [--work /tmp/knnd_peers]
              [--b_work DIR] [--cases minilm:6:6,fashion:12:4] [--rounds 5]

For each case SET:NPROBE:REFINE both binaries load SET's index (each in its
own process, both kept running), then each mode (all queries in one call,
"batch", 3 passes a round; one query a call, "single") runs --rounds rounds,
the two in alternating order, 1 thread, k 10. q/s from each process's CPU
time; the ratio B / A is taken inside each round (median, min-max
printed). The last pass's ids of both are compared: "ids equal" says the
two builds answered every query alike. --b_work gives B the indexes of
another directory laid out alike (e.g. the same set built with
`--vectors_dtype f16`), to compare two indexes; --b may then be --a.
"""
import argparse
import filecmp
import json
import os
import platform
import statistics
import subprocess
import tempfile


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


class Bench:
    """One peers_bench process answering commands on stdin."""

    def __init__(self, binary, index, queries):
        self.proc = subprocess.Popen(
            [binary, "--index", index, "--queries", queries],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"{binary} exited before it was ready")
            if "ready" in line:
                break

    def run(self, rows, nprobe, refine, reps, ids_out="-"):
        self.proc.stdin.write(f"{rows} 1 {nprobe} {refine} {reps} {ids_out}\n")
        self.proc.stdin.flush()
        result = json.loads(self.proc.stdout.readline())
        return result["queries"] / result["cpu_s"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="peers_bench binary A (before)")
    p.add_argument("--b", required=True, help="peers_bench binary B (after)")
    p.add_argument("--work", default="/tmp/knnd_peers")
    p.add_argument("--b_work", default="",
                   help="B's indexes from this directory instead of --work")
    p.add_argument("--cases", default="minilm:6:6,fashion:12:4")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; "
          f"A = {args.a} on {args.work}, B = {args.b} on "
          f"{args.b_work or args.work}", flush=True)
    tmp = tempfile.mkdtemp(prefix="peers_ab_")
    for case in args.cases.split(","):
        name, nprobe, refine = case.split(":")
        queries = f"{args.work}/{name}/queries.npy"
        index = {tag: f"{work}/{name}/knnd.index"
                 for tag, work in (("A", args.work),
                                   ("B", args.b_work or args.work))}
        for path in index.values():
            if not os.path.exists(path):
                raise SystemExit(f"{path} is missing: run `make bench-peers` first")
        benches = {"A": Bench(args.a, index["A"], queries),
                   "B": Bench(args.b, index["B"], queries)}
        for mode, rows, reps in (("batch", 0, 3), ("single", 1, 1)):
            for tag, bench in benches.items():
                bench.run(rows, nprobe, refine, 1, f"{tmp}/ids_{tag}")
            same = filecmp.cmp(f"{tmp}/ids_A", f"{tmp}/ids_B", shallow=False)
            qps = {"A": [], "B": []}
            ratios = []
            for r in range(args.rounds):
                order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
                got = {tag: benches[tag].run(rows, nprobe, refine, reps)
                       for tag in order}
                for tag in qps:
                    qps[tag].append(got[tag])
                ratios.append(got["B"] / got["A"])
            print(f"{name} ({nprobe}, {refine}) {mode}: "
                  f"A {statistics.median(qps['A']):,.0f} q/s, "
                  f"B {statistics.median(qps['B']):,.0f} q/s, "
                  f"B / A {statistics.median(ratios):.3f} "
                  f"({min(ratios):.3f}-{max(ratios):.3f}), "
                  f"ids equal: {same}", flush=True)
        for bench in benches.values():
            bench.close()


if __name__ == "__main__":
    main()
