#!/bin/bash
# make fuzz: runs the libFuzzer targets for SECONDS in all, each for its
# SHARE of them (default 1), from its committed seeds (corpus/<target>) plus
# a scratch corpus (the index seeds are generated here). Fails when a target
# finds a crash, leak or sanitizer report -- including one printed by the
# index loader's probe child.
#   run_fuzzers.sh BUILD_DIR SECONDS TARGET[:SHARE]...
set -euo pipefail
build=$1 total_seconds=$2
shift 2
shares=0
for spec in "$@"; do
  [[ $spec == *:* ]] && shares=$((shares + ${spec#*:})) || shares=$((shares + 1))
done
src=$(cd "$(dirname "$0")" && pwd)
san=$(cd "$src/../sanitizers" && pwd)
work=$(cd "$build" && pwd)/fuzz-work
rm -rf "$work"
mkdir -p "$work/artifacts"
/usr/bin/python3 "$src/gen_index_seeds.py" "$work/corpus/index_loader_fuzzer" 2>/dev/null

# Huge allocations asked for by a corrupt header fail (std::bad_alloc, which
# knnd turns into a status) as they would without ASan, instead of aborting.
export ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=2048:halt_on_error=1:detect_leaks=1
export LSAN_OPTIONS=suppressions=$san/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$san/ubsan.supp
export OMP_NUM_THREADS=1
export TEST_TMPDIR=$work

# A probe child that reads a header asking for terabytes gets an ASan
# out-of-memory report (ASan's throwing operator new reports instead of
# throwing std::bad_alloc, as it would in production); the parent refuses the
# file. The same in the loading process itself makes libFuzzer fail.
child_oom="allocator is out of memory|allocation-size-too-big|requested allocation size"

status=0
for spec in "$@"; do
  target=${spec%%:*} share=1
  [[ $spec == *:* ]] && share=${spec#*:}
  seconds=$((total_seconds * share / shares))
  [ "$seconds" -ge 1 ] || seconds=1
  corpus=$work/corpus/$target
  mkdir -p "$corpus"
  seeds=()
  [ -d "$src/corpus/$target" ] && seeds=("$src/corpus/$target")
  log=$work/$target.log
  echo "fuzz: $target for ${seconds}s"
  if ! "$build/tests/fuzz/$target" -max_total_time="$seconds" -timeout=30 \
      -rss_limit_mb=4096 -malloc_limit_mb=4096 -max_len=4096 -len_control=0 -print_final_stats=1 \
      -artifact_prefix="$work/artifacts/$target-" "$corpus" "${seeds[@]}" \
      >"$log" 2>&1; then
    echo "fuzz: $target FAILED; its log ($log) ends with:"
    tail -n 60 "$log"
    status=1
  elif grep -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$log" \
      | grep -qvE "$child_oom"; then
    echo "fuzz: $target: a sanitizer report in $log:"
    grep -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$log" \
      | grep -vE "$child_oom" | head -n 5
    status=1
  fi
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb)|cov: .*corp:" "$log" \
    | tail -n 3 | sed "s/^/fuzz: $target: /"
done
exit $status
