#!/usr/bin/env bash
# Instruction counts of the hot paths (benches/core.rs) under callgrind:
# repeatable for the same binary and inputs however busy the machine is.
# Only the measured function is counted (request bytes are built before it),
# and the figure is the difference between two op counts, so set-up cost
# cancels out. Prints instructions per operation for each workload.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
bin=$(cargo bench --bench core --no-run --message-format=json 2>/dev/null \
  | grep '"name":"core"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "could not build benches/core.rs" >&2; exit 1; }
total() { # workload ops -> total instructions
  local out; out=$(mktemp)
  valgrind --tool=callgrind --collect-atstart=no --toggle-collect="core::measure_$1" \
    --callgrind-out-file="$out" "$bin" "$1" "$2" >/dev/null 2>&1
  sed -n 's/^summary: //p' "$out"; rm -f "$out"
}
lo=${LO:-1000}; hi=${HI:-6000}
for w in ${WORKLOADS:-ingest prompt cancel ask reply roundtrip part answer token}; do
  a=$(total $w $lo); b=$(total $w $hi)
  printf '%-10s %8d instructions/op\n' "$w" $(( (b - a) / (hi - lo) ))
done
