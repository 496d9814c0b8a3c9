#!/usr/bin/env bash
# Freshness, measured: how long after a sample is produced to Kafka the
# model version that contains it is committed (visible to readers). The
# Fashion-MNIST training set streams at a steady rate (freshet produce
# --rate, 48 partitions of the dev broker, keyless records in sticky runs:
# see below) into freshet run (784-256-10,
# softmax, batch 64, W workers, MODE); the applier measures, per applied
# batch, the time from the Kafka timestamps of its oldest and newest
# samples to the commit of its version. Prints the p50 and p99 over the
# last 256 batches of each run and the throughput reached; ROUNDS rounds
# alternate the rates, and the summary gives per rate the median of the
# rounds with their range.
# usage: [ROUNDS=N] [BY=P] bash bench/freshness.sh [RATES] [SECONDS] [WORKERS] [MODE] [FRESHET]
#        (defaults: 3 rounds, sticky, "1000 4000", 30, 2, adaptive, build/freshet)
# BY is the producer's --partitions-by. sticky fills each produce batch with a
# run of records; with key or roundrobin each batch holds about one record,
# and the dev broker, which walks a partition's list of batches on every
# fetch, takes a whole core at 4,000/s within 20 s (bench/README.md, "Where
# the time goes"): the run then measures the dev broker, not freshet.
set -euo pipefail
cd "$(dirname "$0")/.."
rates=${1:-1000 4000}
seconds=${2:-30}
rounds=${ROUNDS:-3}
workers=${3:-2}
mode=${4:-adaptive}
by=${BY:-sticky}
bin=$(realpath "${5:-build/freshet}")
fm=/usr/share/datasets/fashion-mnist
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d /tmp/freshet-fresh-XXXXXX)
# shellcheck source=deploy/stack.sh
. deploy/stack.sh
trap 'stack_stop "$work"' EXIT

echo "freshness: Fashion-MNIST at a steady rate, 784-256-10, batch 64, $workers workers, $mode"
printf '  %-6s %-10s %12s %14s %14s\n' round "rate/s" "trained/s" "p50 (ms)" "p99 (ms)"
: >"$work/rounds"
for round in $(seq "$rounds"); do
for rate in $rates; do
    mkdir -p "$work/$rate"
    stack_start "$work/$rate" "$bin" fashion:48
    cat >"$work/$rate/run.conf" <<EOF
[model]
name = fresh
layers = 784-256-10
loss = softmax
[kafka]
bootstrap.servers = $stack_bootstrap
session.timeout.ms = 6000
heartbeat.interval.ms = 500
[ingest]
topic = fashion
format = f32
batch = 64
start = latest
[redis]
url = redis://127.0.0.1:$stack_port/0
[serve]
listen = 127.0.0.1:0
[trainer]
workers = $workers
mode = $mode
backend = cpu
[controller]
lr = 0.05
EOF
    "$bin" run --config "$work/$rate/run.conf" >"$work/$rate/run.log" 2>&1 &
    stack_pids+=($!)
    run_pid=$!
    # the group joins first (about 3 s), then the stream starts
    for _ in $(seq 100); do
        grep -q "starts at" "$work/$rate/run.log" && break
        sleep 0.1
    done
    "$bin" produce --bootstrap "$stack_bootstrap" --topic fashion --format idx --encode f32 \
        --features 784 --data "$fm/train-images-idx3-ubyte.gz" \
        --labels "$fm/train-labels-idx1-ubyte.gz" --rate "$rate" --loop \
        --partitions-by "$by" >"$work/$rate/produce.log" 2>&1 &
    stack_pids+=($!)
    sleep "$seconds"
    kill -TERM "$run_pid"
    wait "$run_pid" || true
    line=$(grep "run: .*freshness" "$work/$rate/run.log" | tail -1)
    trained=$(echo "$line" | sed -n 's/.*run: \([0-9]*\) samples\/s.*/\1/p')
    p50=$(echo "$line" | sed -n 's/.*freshness p50 \(-\{0,1\}[0-9]*\) ms.*/\1/p')
    p99=$(echo "$line" | sed -n 's/.*freshness p50 -\{0,1\}[0-9]* ms p99 \(-\{0,1\}[0-9]*\) ms.*/\1/p')
    printf '  %-6s %-10s %12s %14s %14s\n' "$round" "$rate" "${trained:-?}" "${p50:-?}" "${p99:-?}"
    echo "$rate ${trained:-nan} ${p50:-nan} ${p99:-nan}" >>"$work/rounds"
    stack_stop "$work/$rate"
    stack_pids=()
done
done
# per rate: the median of the rounds [lowest, highest]
med() {
    awk -v r="$1" -v k="$2" '$1 == r { print $k }' "$work/rounds" | sort -n |
        awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
              printf "%s [%s, %s]", m, v[1], v[NR] }'
}
echo "medians over $rounds round(s):"
for rate in $rates; do
    printf '  %-10s trained %s/s, freshness p50 %s ms, p99 %s ms\n' "$rate" "$(med "$rate" 2)" \
        "$(med "$rate" 3)" "$(med "$rate" 4)"
done
