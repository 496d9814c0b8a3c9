#!/usr/bin/env bash
# The cost of Kafka + Redis + asynchrony, measured: Fashion-MNIST streamed
# once (60,000 f32 records in 48 partitions of the dev broker, preloaded)
# through freshet run (784-256-10, softmax, sgd lr 0.1, batch 64, W async
# workers, policy as [controller] says) against freshet fit doing one epoch
# of the same training on one thread, in the same run. Prints both
# throughputs, their ratio and both test accuracies.
# usage: [MAX_PENDING=N] [QUEUE=N] [COMMIT_MS=N] [SYNC_LR_SCALE=linear] bench/run_vs_fit.sh [WORKERS] [MODE] [FRESHET]
#        (defaults: 2, adaptive, build/freshet; [psstore] max_pending 64,
#        [ingest] queue 16; KEEP_LOG=F keeps freshet run's log)
set -euo pipefail
cd "$(dirname "$0")/.."
workers=${1:-2}
mode=${2:-adaptive}
bin=$(realpath "${3:-build/freshet}")
fm=/usr/share/datasets/fashion-mnist
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d /tmp/freshet-bench-XXXXXX)
# shellcheck source=deploy/stack.sh
. deploy/stack.sh
trap 'stack_stop "$work"' EXIT
[ -n "${KEEP_LOG:-}" ] && trap 'cp "$work/run.log" "$KEEP_LOG"; stack_stop "$work"' EXIT
stack_start "$work" "$bin" fashion:48
port=$stack_port
bootstrap=$stack_bootstrap
"$bin" produce --bootstrap "$bootstrap" --topic fashion --format idx --encode f32 \
    --features 784 --data "$fm/train-images-idx3-ubyte.gz" \
    --labels "$fm/train-labels-idx1-ubyte.gz" --partitions-by roundrobin >"$work/produce.log"

cat >"$work/run.conf" <<EOF
[model]
name = bench
layers = 784-256-10
loss = softmax
seed = 42
[kafka]
bootstrap.servers = $bootstrap
session.timeout.ms = 6000
heartbeat.interval.ms = 500
[ingest]
topic = fashion
format = f32
batch = 64
queue = ${QUEUE:-16}
[redis]
url = redis://127.0.0.1:$port/0
[trainer]
workers = $workers
mode = $mode
backend = cpu
sync_lr_scale = ${SYNC_LR_SCALE:-none}
[controller]
lr = 0.1
[psstore]
max_pending = ${MAX_PENDING:-64}
${COMMIT_MS:+commit_ms = $COMMIT_MS}
EOF
# the clock runs from the first applied version to the last (group join
# excluded), read afterwards from the versions stream (each entry has its
# commit time t and samples n), so that nothing polls while it runs
watermarks() {
    redis-cli -p "$port" HVALS 'freshet:{bench}:offsets' | awk -F'[;@]' '{ s += $1 } END { print s + 0 }'
}
# fit runs once before and once after the run window is read back, and
# counts their mean: this machine's speed drifts within a minute
fit_once() {
    "$bin" fit --layers 784-256-10 --loss softmax --optimizer sgd --lr 0.1 --batch 64 \
        --epochs 1 --seed 42 --backend cpu --format idx \
        --data "$fm/train-images-idx3-ubyte.gz" --labels "$fm/train-labels-idx1-ubyte.gz" \
        --test-data "$fm/t10k-images-idx3-ubyte.gz" --test-labels "$fm/t10k-labels-idx1-ubyte.gz" \
        --out "$work/fit.safetensors" >"$work/fit.log"
    awk '$1 == "epoch" { for (i = 1; i < NF; i++) if ($i == "samples/s") print $(i + 1) }' "$work/fit.log"
}
fit_before=$(fit_once)
"$bin" run --config "$work/run.conf" >"$work/run.log" 2>&1 &
run_pid=$!
stack_pids+=($run_pid)
for _ in $(seq 1200); do
    [ "$(watermarks)" -ge 60000 ] && break
    sleep 0.5
done
kill -TERM "$run_pid" && wait "$run_pid"
"$bin" model export --redis "redis://127.0.0.1:$port/0" --name bench \
    --out "$work/run.safetensors" >/dev/null
run_acc=$("$bin" eval --weights "$work/run.safetensors" --format idx \
    --data "$fm/t10k-images-idx3-ubyte.gz" --labels "$fm/t10k-labels-idx1-ubyte.gz" |
    sed 's/.*"accuracy": *\([0-9.]*\).*/\1/')
run_rate=$(redis-cli -p "$port" XRANGE 'freshet:{bench}:versions' - + |
    awk 'prev == "n" { n = $1 } prev == "t" { if (t0 == "") { t0 = $1; n0 = n } t1 = $1; s += n }
         { prev = $1 } END { if (t1 > t0) printf "%.0f", (s - n0) * 1000 / (t1 - t0); else print "?" }')

fit_after=$(fit_once)
fit_rate=$(awk -v a="$fit_before" -v b="$fit_after" 'BEGIN { printf "%.0f", (a + b) / 2 }')
fit_acc=$(awk '$1 == "epoch" { for (i = 1; i < NF; i++) if ($i == "test_accuracy") print $(i + 1) }' "$work/fit.log")

echo "run vs fit: Fashion-MNIST once, 784-256-10 softmax, sgd lr 0.1, batch 64"
printf '  %-40s %10s  %13s\n' "" "samples/s" "test accuracy"
printf '  %-40s %10s  %13s\n' "freshet run ($workers workers, $mode, Kafka+Redis)" "$run_rate" "$run_acc"
printf '  %-40s %10s  %13s\n' "freshet fit (1 thread, offline; mean of $fit_before, $fit_after)" "$fit_rate" "$fit_acc"
awk -v r="$run_rate" -v f="$fit_rate" 'BEGIN { printf "  ratio run/fit: %.2f\n", r / f }'
awk -v r="$run_acc" -v f="$fit_acc" 'BEGIN { printf "  accuracy difference fit - run: %.2f points\n", 100 * (f - r) }'
