#!/usr/bin/env bash
# Sets up, builds and runs every test: the unit, integration and reference
# tests (freshet against PyTorch, Fashion-MNIST accuracy) on a warnings-as-
# errors build; the unit and integration tests again under AddressSanitizer
# and UndefinedBehaviorSanitizer; the short ThreadSanitizer profile; the
# fuzz targets for a bounded time (FUZZ_SECONDS each, default 10:
# bench/fuzz.sh is the long run); and the clang-format check.
#
# Nothing may pass by not running: every ctest call fails when it finds no
# test (--no-tests=error), and deploy/skips.sh lists every skip of every
# stage (tests ctest did not run, CMocka's skip(), a test's own "skipped:"
# lines, pytest's skipped count) at the end of every run, which fails on
# any of them except the GPU parity test's on a machine without a GPU.
#
# The short ThreadSanitizer profile runs the threaded tests that start no
# Kafka client in their own process (logging and metrics; serve's loop,
# follower, rows reader and inference workers; the in-memory channel and
# its applier; the rounds; the applier, the pull/push path, the sparse
# store and the model lifecycle), against the system's librdkafka: 131 s on
# 2 cores, its build included. --tsan runs only the full profile instead (for a
# release): those and the tests with a Kafka client in the process (the
# consumer, its failures, offsets and gap rule; freshet run's processes end
# to end). TSan cannot follow the threads of Debian's uninstrumented
# librdkafka, so for those deploy/tsan_rdkafka.sh first builds Debian's
# source of the same version with -fsanitize=thread (network once), which
# the TSan build's binaries load through their rpath (kcat keeps the
# system's). About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz_seconds=${FUZZ_SECONDS:-10}
jobs=$(nproc)
tsan_short="test_common test_metrics test_serve test_local test_rounds test_applier test_pull_push
    test_sparse_store test_model_lifecycle"

# The skips of every stage, printed when the run ends, however it ends.
skips=$(mktemp /tmp/freshet-skips-XXXXXX)
reported=0
finish() {
    [ "$reported" -eq 1 ] || bash deploy/skips.sh report "$skips" || true
    rm -f "$skips"
}
trap finish EXIT

# run_ctest STAGE BUILD ARGS...: ctest in BUILD, failing when it finds no
# test; then the stage's skips go to the list, whether ctest passed or not.
run_ctest() {
    local stage=$1 build=$2 status=0
    shift 2
    rm -f "$build/ctest-$stage.log"
    ctest --test-dir "$build" --output-on-failure --no-tests=error -O "$build/ctest-$stage.log" \
        "$@" || status=$?
    bash deploy/skips.sh collect "$stage" "$build" "$build/ctest-$stage.log" "$skips"
    return "$status"
}

# tsan_stage BUILD TESTS [CMAKE ARGS...]: TESTS (and freshet, which some of
# them start) in a -fsanitize=thread build in BUILD. Every report fails the
# run, those of the freshet processes the tests start included: they go to
# BUILD/tsan.<pid>, printed here.
tsan_stage() {
    local build=$1 tests=$2 status=0
    shift 2
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DFRESHET_WERROR=ON \
        -DFRESHET_SANITIZE=thread -DFRESHET_CUDA=OFF "$@" >/dev/null
    # shellcheck disable=SC2086
    cmake --build "$build" -j"$jobs" --target freshet $tests
    rm -f "$build"/tsan.*
    # shellcheck disable=SC2086
    TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 log_path=$PWD/$build/tsan" \
        run_ctest tsan "$build" -j"$jobs" -R "^($(echo $tests | tr ' ' '|'))\$" || status=$?
    if compgen -G "$build/tsan.*" >/dev/null; then
        cat "$build"/tsan.*
        echo "ThreadSanitizer reports: $(ls "$build"/tsan.*)"
        return 1
    fi
    [ "$status" -eq 0 ] && echo "no ThreadSanitizer report"
    return "$status"
}

if [ "${1:-}" = "--tsan" ]; then
    bash deploy/setup.sh
    echo "== threaded tests under ThreadSanitizer (the full profile)"
    rdkafka=$(bash deploy/tsan_rdkafka.sh build-tsan/rdkafka)
    tsan_stage build-tsan "$tsan_short test_consumer test_consumer_failures
        test_consumer_offsets test_run" -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath,$rdkafka"
    reported=1
    bash deploy/skips.sh report "$skips"
    exit 0
fi

bash deploy/setup.sh

echo "== build (warnings are errors; the benchmarks too, so that they never rot)"
bash deploy/build.sh -DFRESHET_WERROR=ON -DFRESHET_BENCH=ON

echo "== tests"
run_ctest tests build -j"$jobs"

echo "== unit and integration tests under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFRESHET_WERROR=ON \
    -DFRESHET_SANITIZE=address,undefined >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    run_ctest asan build-asan -j"$jobs" -L "unit|integration"

echo "== threaded tests under ThreadSanitizer (the short profile: no Kafka client in the process)"
start=$SECONDS
tsan_stage build-tsan-short "$tsan_short"
echo "ThreadSanitizer stage: $((SECONDS - start)) s"

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
reported=1
bash deploy/skips.sh report "$skips"
echo "all checks passed"
