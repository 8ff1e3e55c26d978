#!/bin/bash
# knnd under closed-loop load with one or more configurations, one after
# the other on the same index: q/s and latency (load_gen), knnd's CPU
# seconds, and from its metrics the FAISS calls' rows (coalescing), queue
# and execution time per request. Each argument is config lines added to
# the defaults ("" for knnd's defaults; \n between fields).
#   bench/config_ab.sh "" "inline_max_rows: 0" "coalesce_requests: false"
#   env: INDEX QUERIES DIM (the frontier's Fashion-MNIST knnd-fastscan files
#        under /tmp/knnd_frontier: run make bench-frontier once first)
#        CLIENTS (32) BATCH (1) NPROBE (8) REFINE (4) DURATION (3 s) BUILD (build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
INDEX=${INDEX:-/tmp/knnd_frontier/fashion/knnd-fastscan.index}
QUERIES=${QUERIES:-/tmp/knnd_frontier/fashion/queries.f32}
DIM=${DIM:-784} CLIENTS=${CLIENTS:-32} BATCH=${BATCH:-1}
NPROBE=${NPROBE:-8} REFINE=${REFINE:-4} DURATION=${DURATION:-3}
[ -f "$INDEX" ] || { echo "no $INDEX: run make bench-frontier first" >&2; exit 1; }
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
echo "| config | q/s | p50 ms | p99 ms | knnd CPU s | load_gen cores | rows per FAISS call | queue us | execution us |"
echo "|---|---|---|---|---|---|---|---|---|"
for extra in "$@"; do
  port=$((50700 + RANDOM % 500))
  printf 'listen_address: "127.0.0.1:%d"\nmetrics_listen_address: "127.0.0.1:%d"\nadmin_listen_address: "127.0.0.1:0"\nlog_level: "warn"\nslow_request_ms: 0\nenable_reflection: false\nshutdown_delay_ms: 0\n%b\n' \
    "$port" $((port + 500)) "$extra" >"$work/knnd.textproto"
  OMP_NUM_THREADS=1 "$BUILD/knnd" --config "$work/knnd.textproto" --index "$INDEX" \
    >"$work/knnd.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do
    "$BUILD/knnctl" health --addr "127.0.0.1:$port" >/dev/null 2>&1 && break
    sleep 0.1
  done
  t0=$(ticks "$pid")
  result=$("$BUILD/bench/load_gen" --target "127.0.0.1:$port" --queries "$QUERIES" \
    --d "$DIM" --clients "$CLIENTS" --batch "$BATCH" --seconds "$DURATION" \
    --nprobe "$NPROBE" --refine_factor "$REFINE")
  t1=$(ticks "$pid")
  metrics=$(curl -s "127.0.0.1:$((port + 500))/metrics")
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  /usr/bin/python3 - "$extra" "$result" "$metrics" $((t1 - t0)) <<'PY'
import json, sys
extra, result, metrics, ticks = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
m = {}
for line in metrics.splitlines():
    if line.startswith("knnd_search_") and ("_sum " in line or "_count " in line):
        name, value = line.rsplit(" ", 1)
        m[name] = float(value)
def per(name, scale=1.0):
    count = m.get(f"knnd_search_{name}_count", 0)
    return m.get(f"knnd_search_{name}_sum", 0) / count * scale if count else 0
print(f"| {extra.replace(chr(92) + 'n', '; ') or 'defaults'} | {result['qps']:.0f} | "
      f"{result['p50_ms']:.3f} | {result['p99_ms']:.2f} | {ticks / 100:.2f} | "
      f"{result['client_cores']:.2f} | {per('batch_rows'):.2f} | "
      f"{per('queue_duration_seconds', 1e6):.1f} | {per('execution_duration_seconds', 1e6):.1f} |")
PY
done
