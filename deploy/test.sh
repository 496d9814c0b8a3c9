#!/usr/bin/env bash
# Sets up, builds and runs every test: the unit, integration and reference
# tests (freshet against PyTorch, Fashion-MNIST accuracy) on a warnings-as-
# errors build; the unit and integration tests again under AddressSanitizer
# and UndefinedBehaviorSanitizer; the fuzz targets for a bounded time
# (FUZZ_SECONDS each, default 10: bench/fuzz.sh is the long run); and the
# clang-format check.
#
# --tsan runs only the ThreadSanitizer stage instead: the threaded tests
# (serve's loop, follower, rows reader and inference workers; the
# in-memory channel and its applier; the rounds; the consumer, its
# failures, offsets and gap rule; freshet run's processes end to end; the
# logging and metrics units) in a -fsanitize=thread build, any report
# failing the run. TSan cannot follow the threads of Debian's
# uninstrumented librdkafka, so deploy/tsan_rdkafka.sh first builds
# Debian's source of the same version with -fsanitize=thread (network
# once), which the TSan build's binaries load through their rpath (kcat
# keeps the system's). About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz_seconds=${FUZZ_SECONDS:-10}
jobs=$(nproc)

if [ "${1:-}" = "--tsan" ]; then
    bash deploy/setup.sh
    echo "== threaded tests under ThreadSanitizer"
    tsan_tests="test_common test_metrics test_serve test_local test_rounds test_consumer
        test_consumer_failures test_consumer_offsets test_run"
    rdkafka=$(bash deploy/tsan_rdkafka.sh build-tsan/rdkafka)
    cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DFRESHET_WERROR=ON \
        -DFRESHET_SANITIZE=thread -DFRESHET_CUDA=OFF \
        -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath,$rdkafka" >/dev/null
    # shellcheck disable=SC2086
    cmake --build build-tsan -j"$jobs" --target freshet $tsan_tests
    TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1" \
        ctest --test-dir build-tsan --output-on-failure -j"$jobs" \
        -R "^($(echo $tsan_tests | tr ' ' '|'))\$"
    echo "no ThreadSanitizer report"
    exit 0
fi

bash deploy/setup.sh

echo "== build (warnings are errors; the benchmarks too, so that they never rot)"
bash deploy/build.sh -DFRESHET_WERROR=ON -DFRESHET_BENCH=ON

echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== unit and integration tests under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFRESHET_WERROR=ON \
    -DFRESHET_SANITIZE=address,undefined >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -L "unit|integration"

echo "== fuzz targets, ${fuzz_seconds} s each"
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DFRESHET_FUZZ=ON >/dev/null
targets=$(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//')
# shellcheck disable=SC2086
cmake --build build-fuzz -j"$jobs" --target $targets
for t in $targets; do
    corpus=$(mktemp -d)
    cp -r "tests/fuzz/corpus/${t#fuzz_}/." "$corpus/" 2>/dev/null || true
    status=0
    ./build-fuzz/tests/"$t" -max_total_time="$fuzz_seconds" -print_final_stats=1 -artifact_prefix=build-fuzz/ \
        "$corpus" >"$corpus.log" 2>&1 || status=$?
    grep -E "^(stat::number_of_executed_units|Done)|ERROR|SUMMARY" "$corpus.log" || true
    if [ "$status" -ne 0 ]; then
        tail -50 "$corpus.log"
    fi
    rm -f "$corpus.log"
    rm -rf "$corpus"
    if [ "$status" -ne 0 ]; then
        echo "fuzz target $t failed (status $status)"
        exit 1
    fi
    echo "fuzz target $t: no crash in ${fuzz_seconds} s"
done

echo "== clang-format"
git ls-files '*.c' '*.h' | xargs clang-format --dry-run --Werror
echo "all checks passed"
