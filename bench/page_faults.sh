#!/bin/bash
# Minor page faults per request, q/s and latency of two knnd binaries (or
# one), side by side: each serves the make-bench index (run `make bench`
# once first) with the same config; load_gen offers BATCH-row requests from
# CLIENTS clients for SECONDS, in ROUNDS rounds that alternate which runs
# first.
#   bench/page_faults.sh [KNND_A [KNND_B]]   (default build/knnd)
#   env: BATCH (256) CLIENTS (4) DURATION (6 s) ROUNDS (4) BUILD (build)
#        INDEX QUERIES (the make-bench files under /tmp/knnd_bench)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
INDEX=${INDEX:-/tmp/knnd_bench/base_200000x128_IVF1024_PQ32.index}
QUERIES=${QUERIES:-/tmp/knnd_bench/queries_128.f32}
BATCH=${BATCH:-256} CLIENTS=${CLIENTS:-4} DURATION=${DURATION:-6} ROUNDS=${ROUNDS:-4}
bins=("${1:-$BUILD/knnd}")
[ $# -ge 2 ] && bins+=("$2")
[ -f "$INDEX" ] || { echo "no $INDEX: run make bench first" >&2; exit 1; }
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for i in "${!bins[@]}"; do
  port=$((50690 + i))
  cat >"$work/$i.textproto" <<CFG
listen_address: "127.0.0.1:$port"
metrics_listen_address: "127.0.0.1:0"
admin_listen_address: "127.0.0.1:0"
log_level: "warn"
default_nprobe: 16
CFG
  OMP_NUM_THREADS=1 "${bins[$i]}" --config "$work/$i.textproto" --index "$INDEX" \
    >"$work/$i.log" 2>&1 &
  pids+=($!)
done
sleep 3
# run I: "q/s p50-ms p99-ms faults-per-request" of binary I (faults: minflt
# of /proc/PID/stat)
run() {
  local pid=${pids[$1]} f0 f1 out
  f0=$(awk '{print $10}' /proc/$pid/stat)
  out=$("$BUILD/bench/load_gen" --target "127.0.0.1:$((50690 + $1))" --queries "$QUERIES" \
    --d 128 --k 10 --nprobe 16 --seconds "$DURATION" --batch "$BATCH" --clients "$CLIENTS")
  f1=$(awk '{print $10}' /proc/$pid/stat)
  /usr/bin/python3 -c "import json,sys; a=json.loads(sys.argv[1]); n=a['rps']*a['wall_s']; print(f\"{a['qps']:.0f} {a['p50_ms']:.3f} {a['p99_ms']:.2f} {(int(sys.argv[2])-int(sys.argv[3]))/n:.1f}\")" "$out" "$f1" "$f0"
}
echo "batch $BATCH x $CLIENTS clients, $DURATION s per run; binaries: ${bins[*]}"
for r in $(seq "$ROUNDS"); do
  order=("${!bins[@]}")
  [ $((r % 2)) = 0 ] && order=($(printf '%s\n' "${order[@]}" | tac))
  declare -A res=()
  for i in "${order[@]}"; do res[$i]=$(run "$i"); done
  line="round $r:"
  for i in "${!bins[@]}"; do
    set -- ${res[$i]}
    line+=" [$i] $1 q/s, p50 $2 ms, p99 $3 ms, $4 faults/request;"
  done
  if [ ${#bins[@]} = 2 ]; then
    set -- ${res[0]}; a=$1; set -- ${res[1]}
    line+=" [1]/[0] $(/usr/bin/python3 -c "print(f'{$1/$a:.3f}')")"
  fi
  echo "$line"
done
