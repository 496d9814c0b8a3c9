#!/usr/bin/env bash
# The prepared GPU check, for a machine with an NVIDIA GPU, the CUDA toolkit
# and python3 with PyTorch, and no network, Kafka or Redis: builds the
# compute core with the CUDA backend (FRESHET_CORE_ONLY, no OpenBLAS needed),
# runs the parity tests (the CUDA backend against the CPU backend; the
# script stops if any differs), then times training steps of 784-256-10 and
# 784-1024-1024-10 at batch 64 and 1024, with one worker and with 4 workers
# sharing the GPU, against PyTorch taking the same steps on the same GPU in
# the same run. A step is the gradient of a batch from host samples to a
# host gradient (what a freshet worker pushes). Prints one table; finishes
# within 5 minutes (SECONDS_EACH per measurement, default 5).
# usage: [SECONDS_EACH=S] [PYTHON=python3] [BUILD=build-gpu] bash bench/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${SECONDS_EACH:-5}
py=${PYTHON:-python3}
build=${BUILD:-build-gpu}
export PATH=$PATH:/usr/local/cuda/bin
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

echo "== build ($build: FRESHET_CORE_ONLY, CUDA)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFRESHET_CORE_ONLY=ON -DFRESHET_CUDA=ON \
    -DFRESHET_BENCH=ON >"$build.cmake.log" 2>&1 || { cat "$build.cmake.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" --target test_gpu_parity bench_gpu >"$build.build.log" 2>&1 ||
    { tail -40 "$build.build.log"; exit 1; }

echo "== parity: cuda against cpu (|gpu - cpu| <= 1e-5 + 1e-4 |cpu|)"
status=0
"$build/tests/test_gpu_parity" || status=$?
if [ "$status" -eq 77 ]; then
    echo "gpu.sh: no CUDA device visible: nothing to measure" >&2
    exit 1
elif [ "$status" -ne 0 ]; then
    echo "gpu.sh: parity failed: no timings" >&2
    exit 1
fi

echo "== training steps/s, ${secs} s each"
printf '%-18s %6s %8s %16s %16s %7s\n' model batch workers "freshet samp/s" "torch samp/s" ratio
for layers in 784-256-10 784-1024-1024-10; do
    for batch in 64 1024; do
        for workers in 1 4; do
            f=$("$build/bench/bench_gpu" "$layers" "$batch" "$workers" "$secs" cuda |
                awk '{ print $(NF - 1) }')
            t=$("$py" bench/torch_gpu.py "$layers" "$batch" "$workers" "$secs" |
                awk '{ print $(NF - 1) }')
            printf '%-18s %6d %8d %16.0f %16.0f %7.2f\n' "$layers" "$batch" "$workers" "$f" "$t" \
                "$(awk -v f="$f" -v t="$t" 'BEGIN { print f / t }')"
        done
    done
done
