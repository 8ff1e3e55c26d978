#!/bin/bash
# Two knnd processes on the same index, A with knnd's defaults and B with
# one thing changed outside its configuration (its environment, its listen
# address, its threads' scheduling policy), both started once and loaded in
# turn by load_gen (A then B in odd rounds, B then A in even ones), so the
# machine's drift falls on both alike. Prints per round each one's q/s and
# cores (load_gen's; knnd's, its workers', its other threads') and B / A.
# B_CONFIG adds configuration lines to B's (\n between fields): two
# processes alive side by side are steadier than bench/config_ab.sh's
# restarts.
#   B_ENV="GRPC_EXPERIMENTS=tcp_rcv_lowat" bench/pair_ab.sh
#   B_ADDR=unix:/tmp/knnd-b.sock bench/pair_ab.sh
#   B_SCHED=batch bench/pair_ab.sh   # B's threads but its workers: SCHED_BATCH
#   B_ENV="X=1" bench/pair_ab.sh     # A against A: the noise floor
#   B_CONFIG="malloc_top_pad_bytes: 0" bench/pair_ab.sh
#   env: INDEX QUERIES DIM (Fashion-MNIST from bench/peers_run.py's work
#        directory by default) CLIENTS (4) BATCH (256) NPROBE (8) REFINE (6)
#        DURATION (3 s) ROUNDS (6) BUILD (build) B_WIRE (load_gen's --wire
#        for B, f32)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
INDEX=${INDEX:-/tmp/knnd_peers/fashion/knnd.index}
QUERIES=${QUERIES:-/tmp/knnd_peers/fashion/queries.f32}
DIM=${DIM:-784} CLIENTS=${CLIENTS:-4} BATCH=${BATCH:-256}
NPROBE=${NPROBE:-8} REFINE=${REFINE:-6} DURATION=${DURATION:-3}
ROUNDS=${ROUNDS:-6} B_ENV=${B_ENV:-} B_SCHED=${B_SCHED:-} B_WIRE=${B_WIRE:-f32}
B_CONFIG=${B_CONFIG:-}
[ -f "$INDEX" ] || { echo "no $INDEX: run bench/peers_run.py once first" >&2; exit 1; }
work=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  rm -rf "$work"
}
trap cleanup EXIT

port_a=$((51200 + RANDOM % 400))
addr_a="127.0.0.1:$port_a"
addr_b=${B_ADDR:-127.0.0.1:$((port_a + 1000))}
start() {  # start NAME ADDRESS METRICS_PORT CONFIG [ENV...]: prints the pid
  local name=$1 address=$2 metrics=$3 extra=$4
  shift 4
  printf 'listen_address: "%s"\nmetrics_listen_address: "127.0.0.1:%d"\nadmin_listen_address: "127.0.0.1:0"\nlog_level: "warn"\nslow_request_ms: 0\nenable_reflection: false\nshutdown_delay_ms: 0\n%b\n' \
    "$address" "$metrics" "$extra" >"$work/$name.textproto"
  env "$@" OMP_NUM_THREADS=1 "$BUILD/knnd" --config "$work/$name.textproto" \
    --index "$INDEX" >"$work/$name.log" 2>&1 &
  echo $!
}
pid_a=$(start a "$addr_a" $((port_a + 500)) "")
pids+=("$pid_a")
# shellcheck disable=SC2086  # B_ENV is a list of VAR=value words
pid_b=$(start b "$addr_b" $((port_a + 1500)) "$B_CONFIG" $B_ENV)
pids+=("$pid_b")
for _ in $(seq 300); do
  "$BUILD/knnctl" health --addr "$addr_a" >/dev/null 2>&1 &&
    "$BUILD/knnctl" health --addr "$addr_b" >/dev/null 2>&1 && break
  sleep 0.1
done
"$BUILD/knnctl" health --addr "$addr_b" >/dev/null || { cat "$work/b.log" >&2; exit 1; }
if [ "$B_SCHED" = batch ]; then
  for task in /proc/"$pid_b"/task/*; do
    [ "$(cat "$task/comm")" = knnd-worker ] || chrt -b -p 0 "$(basename "$task")" >/dev/null
  done
fi

run() {  # run ADDRESS PID WIRE: "q/s load_gen knnd workers others"
  "$BUILD/bench/load_gen" --target "$1" --queries "$QUERIES" --d "$DIM" \
    --clients "$CLIENTS" --batch "$BATCH" --seconds "$DURATION" \
    --nprobe "$NPROBE" --refine_factor "$REFINE" --wire "$3" --server_pid "$2" |
    /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)
if r["errors"]:
    sys.exit("load_gen: " + r["first_error"])
w = r["server_threads"].get("knnd-worker", 0.0)
print("%.0f %.3f %.3f %.3f %.3f" % (r["qps"], r["client_cores"], r["server_cores"], w, r["server_cores"] - w))'
}
echo "A: $addr_a, defaults; B: $addr_b${B_CONFIG:+, config $B_CONFIG}${B_ENV:+, env $B_ENV}${B_SCHED:+, SCHED_$B_SCHED}, wire $B_WIRE"
echo "$CLIENTS clients x $BATCH rows, nprobe $NPROBE, refine_factor $REFINE, $DURATION s each; $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
echo "| round | A q/s | B q/s | B / A | load_gen cores A / B | knnd cores A / B | workers A / B | other threads A / B |"
echo "|---|---|---|---|---|---|---|---|"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then
    a=$(run "$addr_a" "$pid_a" f32); b=$(run "$addr_b" "$pid_b" "$B_WIRE")
  else
    b=$(run "$addr_b" "$pid_b" "$B_WIRE"); a=$(run "$addr_a" "$pid_a" f32)
  fi
  read -r qa ca sa wa oa <<<"$a"
  read -r qb cb sb wb ob <<<"$b"
  echo "| $r | $qa | $qb | $(awk "BEGIN{printf \"%.3f\", $qb/$qa}") | $ca / $cb | $sa / $sb | $wa / $wb | $oa / $ob |"
done
