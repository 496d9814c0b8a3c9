#!/usr/bin/env bash
# Every libFuzzer target (tests/fuzz/fuzz_*.c) for RUNS executions each,
# from a copy of its corpus (tests/fuzz/corpus/<name>), in the clang
# ASan/UBSan fuzz build (build-fuzz, configured here when missing): prints
# per target the executions, the time, executions a second, the inputs that
# found new coverage and the outcome; exits 1 at the first crash (the input
# is left in build-fuzz/crash-*). A release check runs RUNS=10000000.
# usage: [RUNS=N] [TARGETS="http replay"] bash bench/fuzz.sh   (default 1,000,000 each, all)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-1000000}
targets=${TARGETS:-$(cd tests/fuzz && ls fuzz_*.c | sed 's/^fuzz_//; s/\.c$//' | tr '\n' ' ')}
command -v clang >/dev/null || { echo "fuzz.sh: clang not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
[ -f build-fuzz/CMakeCache.txt ] ||
    CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DFRESHET_FUZZ=ON >/dev/null
# shellcheck disable=SC2086
cmake --build build-fuzz -j"$(nproc)" --target $(printf 'fuzz_%s ' $targets) >/dev/null
work=$(mktemp -d /tmp/freshet-fuzz-XXXXXX)
trap 'rm -rf "$work"' EXIT
printf '%-12s %12s %9s %12s %10s  %s\n' target executions seconds "execs/s" "new units" outcome
for t in $targets; do
    mkdir -p "$work/$t"
    cp -r "tests/fuzz/corpus/$t/." "$work/$t/" 2>/dev/null || true
    start=$(date +%s.%N)
    set +e
    ./build-fuzz/tests/"fuzz_$t" "$work/$t" -runs="$runs" -print_final_stats=1 \
        -artifact_prefix=build-fuzz/ >"$work/$t.log" 2>&1
    status=$?
    set -e
    secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
    n=$(awk '/number_of_executed_units/ { print $NF }' "$work/$t.log")
    units=$(awk '/new_units_added/ { print $NF }' "$work/$t.log")
    outcome=ok
    [ "$status" = 0 ] || outcome="CRASH (status $status): see build-fuzz/crash-*"
    printf '%-12s %12s %9s %12.0f %10s  %s\n' "$t" "${n:-0}" "$secs" \
        "$(awk -v n="${n:-0}" -v s="$secs" 'BEGIN { print (s > 0 ? n / s : 0) }')" "${units:-0}" "$outcome"
    if [ "$status" != 0 ]; then
        tail -30 "$work/$t.log" >&2
        exit 1
    fi
done
