#!/bin/bash
# knnd builds or configurations side by side, measured in interleaved
# rounds: q/s, p50 and p99 from load_gen, and knnd's CPU per request (from
# /proc/PID/stat), for single-query requests from 1 and 32 clients. Every
# variant runs as its own knnd for the whole run, on the make-bench index
# (run `make bench` once first, or bench/run_bench.py with every case
# skipped); rounds alternate the order.
#   bench/transport_ab.sh VARIANT...
#   VARIANT: BINARY[@CONFIG] where CONFIG is config lines separated by ';'
#     bench/transport_ab.sh /tmp/old/build/knnd build/knnd
#     bench/transport_ab.sh "build/knnd@enable_reflection: false" \
#                           "build/knnd@enable_reflection: true"
#   A BINARY named noop_server (the transport floor) takes CONFIG as its
#   flags instead, separated by ';':
#     bench/transport_ab.sh "build/bench/noop_server@--poll_us=0" \
#                           "build/bench/noop_server@--poll_us=100"
#   and with --index it is the bare FAISS server (searches inline):
#     bench/transport_ab.sh build/knnd \
#       "build/bench/noop_server@--index=$INDEX;--nprobe=16"
#   env: NPROBE (1) REFINE (0) CLIENTS ("1 32") SECONDS_PER_RUN (3)
#        ROUNDS (3) BUILD (build) INDEX QUERIES
# A small nprobe and no re-ranking keep FAISS's share small, so that what
# differs between variants (the transport, the handlers) shows.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
INDEX=${INDEX:-/tmp/knnd_bench/base_200000x128_IVF1024_PQ32.index}
QUERIES=${QUERIES:-/tmp/knnd_bench/queries_128.f32}
NPROBE=${NPROBE:-1} REFINE=${REFINE:-0} CLIENTS=${CLIENTS:-1 32}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-3} ROUNDS=${ROUNDS:-3}
[ -f "$INDEX" ] || { echo "no $INDEX: run make bench first" >&2; exit 1; }
[ $# -ge 1 ] || { sed -n 2,24p "$0" >&2; exit 2; }
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
base_port=$((50800 + RANDOM % 400))
variants=("$@")
for i in "${!variants[@]}"; do
  variant=${variants[$i]}
  binary=${variant%%@*}
  config=""
  [[ $variant == *@* ]] && config=${variant#*@}
  if [[ $(basename "$binary") == noop_server ]]; then
    IFS=';' read -r -a flags <<<"$config"
    OMP_NUM_THREADS=1 "$binary" --port $((base_port + i)) "${flags[@]}" \
      >"$work/$i.log" 2>&1 &
    pids+=($!)
    echo "[$i] $variant"
    continue
  fi
  {
    printf 'listen_address: "127.0.0.1:%d"\n' $((base_port + i))
    printf 'metrics_listen_address: "127.0.0.1:0"\nadmin_listen_address: "127.0.0.1:0"\n'
    printf 'log_level: "warn"\nslow_request_ms: 0\n'
    printf '%s\n' "${config//;/$'\n'}"
  } >"$work/$i.textproto"
  OMP_NUM_THREADS=1 "$binary" --config "$work/$i.textproto" --index "$INDEX" \
    >"$work/$i.log" 2>&1 &
  pids+=($!)
  echo "[$i] $variant"
done
sleep 3
for i in "${!pids[@]}"; do
  kill -0 "${pids[$i]}" 2>/dev/null || { echo "variant $i did not start:" >&2; cat "$work/$i.log" >&2; exit 1; }
done
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
echo "nprobe $NPROBE, refine_factor $REFINE, $SECONDS_PER_RUN s per run; knnd CPU per request in us"
for r in $(seq "$ROUNDS"); do
  order=("${!pids[@]}")
  [ $((r % 2)) = 0 ] && order=($(printf '%s\n' "${order[@]}" | tac))
  for clients in $CLIENTS; do
    declare -A res=()
    for i in "${order[@]}"; do
      t0=$(ticks "${pids[$i]}")
      json=$("$BUILD/bench/load_gen" --target "127.0.0.1:$((base_port + i))" \
        --queries "$QUERIES" --d 128 --k 10 --nprobe "$NPROBE" \
        --refine_factor "$REFINE" --seconds "$SECONDS_PER_RUN" --clients "$clients")
      t1=$(ticks "${pids[$i]}")
      res[$i]=$(/usr/bin/python3 -c "
import json, os, sys
a = json.loads(sys.argv[1]); n = a['rps'] * a['wall_s']
cpu = (int(sys.argv[3]) - int(sys.argv[2])) / os.sysconf('SC_CLK_TCK') * 1e6 / n
print(f\"{a['qps']:.0f} q/s p50 {a['p50_ms'] * 1000:.0f} p99 {a['p99_ms'] * 1000:.0f} cpu {cpu:.0f} err {a['errors']}\")
" "$json" "$t0" "$t1")
    done
    line="round $r, $clients clients:"
    for i in "${!pids[@]}"; do line+=" [$i] ${res[$i]};"; done
    echo "$line"
  done
done
