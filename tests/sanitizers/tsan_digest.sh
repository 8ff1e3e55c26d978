#!/bin/bash
# Prints the ThreadSanitizer reports in the files given (TSAN_OPTIONS
# log_path) so that a log cut to its last lines still holds what names a
# race: the heap block's and the threads' stacks first, a few frames each,
# then the two accesses' stacks, then the summary. Frames lose their
# directories and module offsets. Used by `make test-tsan` when a binary
# fails.
for report in "$@"; do
  [ -f "$report" ] || continue
  echo "== $report"
  awk '
    function shorten(line) {
      sub(/ \([^()]*\+0x[0-9a-f]+\)$/, "", line)
      gsub(/[^ ]*\/(src|tests|include)\//, "", line)
      gsub(/\.\.\/(\.\.\/)*src\/libsanitizer\/[^ ]*\//, "", line)
      return substr(line, 1, 180)
    }
    function flush(   i, limit) {
      if (n == 0) return
      limit = (block[1] ~ /^WARNING|^  (Read|Write|Atomic|Previous)/) ? 12 : 5
      out = (limit == 12) ? "late" : "early"
      for (i = 1; i <= n; ++i) {
        if (block[i] ~ /^ +#[0-9]+ / && block[i] !~ ("^ +#([0-9]|1[01]) ")) {
          continue
        }
        if (block[i] ~ /^ +#[0-9]+ / && limit == 5 &&
            block[i] !~ /^ +#[0-4] /) {
          continue
        }
        text[out] = text[out] shorten(block[i]) "\n"
      }
      n = 0
    }
    /^=+$/ { flush(); next }
    /^SUMMARY/ { flush(); summary = summary $0 "\n"; next }
    /^$/ { flush(); next }
    { block[++n] = $0 }
    END {
      flush()
      printf "%s%s%s", text["early"], text["late"], summary
    }
  ' "$report"
done
