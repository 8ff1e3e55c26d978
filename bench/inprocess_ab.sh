#!/bin/bash
# knnd's in-process search (peers_bench) under different environments, in
# alternating rounds: 2 threads x 256-row calls, one thread with all
# queries in one call, and one query per call. Each argument is the
# environment of one side: one VAR=VALUE, or "" for none; e.g. OpenBLAS's kernels
# (OPENBLAS_CORETYPE; unset, knnd chooses: UseBlasKernelsForThisCpu) or
# FAISS's FastScan kernel instead of knnd's AVX-512 one:
#   bench/inprocess_ab.sh "" OPENBLAS_CORETYPE=Prescott
#   bench/inprocess_ab.sh "" KNND_FASTSCAN_AVX512=0
#   env: INDEX QUERIES (.npy) NPROBE REFINE ROUNDS (5) BUILD (build)
#        (defaults: peers_run.py's Fashion-MNIST index under /tmp/knnd_peers)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
INDEX=${INDEX:-/tmp/knnd_peers/fashion/knnd.index}
QUERIES=${QUERIES:-/tmp/knnd_peers/fashion/queries.npy}
NPROBE=${NPROBE:-12} REFINE=${REFINE:-4} ROUNDS=${ROUNDS:-5}
[ -f "$INDEX" ] || { echo "no $INDEX: run make bench-peers once first" >&2; exit 1; }
[ $# -ge 1 ] || set -- "" OPENBLAS_CORETYPE=Prescott
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) vCPU); $INDEX, nprobe $NPROBE, refine $REFINE"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for round in $(seq "$ROUNDS"); do
  for side in "$@"; do
    printf '256 2 %d %d 8 -\n0 1 %d %d 4 -\n1 1 %d %d 1 -\n' \
      "$NPROBE" "$REFINE" "$NPROBE" "$REFINE" "$NPROBE" "$REFINE" |
      env $side OMP_NUM_THREADS=1 \
        "$BUILD/bench/peers_bench" --index "$INDEX" --queries "$QUERIES" |
      sed "s/^/$round ${side:-defaults} /" >>"$out"
  done
done
/usr/bin/python3 - "$out" "$@" <<'PY'
import json, statistics, sys
rows = {}
kernels = {}
for line in open(sys.argv[1]):
    rnd, name, rest = line.split(" ", 2)
    if rest.startswith("ready"):
        kernels[name] = rest.split()[1]
        i = 0
        continue
    r = json.loads(rest)
    mode = ("2 threads x 256 rows (wall)", "1 thread, one call (CPU)", "1 query per call (CPU)")[i]
    qps = r["queries"] / (r["wall_s"] if i == 0 else r["cpu_s"])
    rows.setdefault(mode, {}).setdefault(name, []).append(qps)
    i += 1
names = [a or "defaults" for a in sys.argv[2:]]
base = names[-1]
print("| mode | " + " | ".join(f"{n} (OpenBLAS {kernels[n]}) q/s" for n in names) +
      " | " + " | ".join(f"{n} / {base}" for n in names[:-1]) + " |")
print("|---" * (2 * len(names)) + "|")
for mode, by in rows.items():
    cells = [f"{statistics.median(by[n]):,.0f} ({min(by[n]):,.0f}-{max(by[n]):,.0f})" for n in names]
    ratios = []
    for n in names[:-1]:
        per = [a / b for a, b in zip(by[n], by[base])]
        ratios.append(f"**{statistics.median(per):.2f}x** ({min(per):.2f}-{max(per):.2f})")
    print(f"| {mode} | " + " | ".join(cells + ratios) + " |")
PY
