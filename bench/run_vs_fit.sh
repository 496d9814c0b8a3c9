#!/usr/bin/env bash
# The cost of Kafka + Redis + asynchrony, measured: Fashion-MNIST streamed
# once (60,000 f32 records in 48 partitions of the dev broker, preloaded;
# COPIES=N preloads it N times, 48 partitions a copy, and run reads it all:
# N epochs, so its accuracy is then not comparable with fit's one)
# through freshet run (784-256-10, softmax, sgd lr 0.1, batch 64, W
# workers in MODE) against two baselines measured in the same run: freshet
# fit doing one epoch of the same training on one thread, and a raw
# librdkafka consumer (bench_rawconsume) reading the same topic from the
# same broker. This machine's speed drifts by tens of percent within a
# minute, so ROUNDS rounds alternate one fit epoch, one raw read and one
# run (a new model each, reading the same preloaded topic from its start),
# and the figures are the medians. Prints each round, the medians, run/fit
# and run against min(W x fit, raw consume), the limit the pipeline could
# reach if neither side took CPU from the other, and the test accuracies.
# Each round also counts CPU time (/proc, user + system): fit's a sample
# (its one thread, 1 / rate), the raw read's a record (the consumer and
# the broker) and run's a sample (its process, the broker and Redis); the
# cpu limit, cores / (fit's + the raw read's), is what the box gives when
# training and reading share its cores and run costs nothing beyond them.
# The last run's CPU is split by thread kind (workers, applier, freshet's
# consume and decode threads, librdkafka's, the rest; broker + Redis).
# OpenBLAS's fastest kernel for the CPU is set for both sides (SkylakeX
# with AVX-512, Haswell with AVX2) unless OPENBLAS_CORETYPE is set already;
# the kernel is printed.
# REDIS=cluster runs freshet against a Redis Cluster (3 masters, a replica
# each) instead of one redis-server. SHARDS=S cuts the model into S shards
# (docs/design.md "Shards"), an applier each; the rate and staleness are then
# shard 0's. Each run's staleness p50/p99 comes from its versions stream.
# REDIS_DELAY_US=D puts a delay_proxy (tests/tools/delay_proxy.c) between
# freshet and its redis-server, every byte D us later each way: a store in
# another rack (bench/README.md "A distant store"; bench/distant.sh runs
# it). The bench's own redis-cli calls go straight to Redis; the proxy's CPU
# is printed apart, not counted in run's.
# usage: [ROUNDS=N] [COPIES=N] [MAX_PENDING=N] [QUEUE=N] [COMMIT_MS=N] [SYNC_LR_SCALE=linear] [SERVE_LISTEN=]
#        [AVERAGE=N] [RAWCONSUME=path] [REDIS=single|cluster] [SHARDS=S] [REDIS_DELAY_US=D]
#        bash bench/run_vs_fit.sh [WORKERS] [MODE] [FRESHET]
#        (defaults: 3 rounds, 2 workers, adaptive, build/freshet; [psstore]
#        max_pending 64, commit_ms freshet's (10 for this dense model); [controller] average:
#        freshet's (AVERAGE=0: none);
#        [ingest] queue 16; [serve] listen
#        127.0.0.1:0, SERVE_LISTEN= for none; RAWCONSUME: the first of
#        build-bench/bench/bench_rawconsume and build/bench/bench_rawconsume
#        (cmake -DFRESHET_BENCH=ON); KEEP_LOG=F keeps the last run's log)
set -euo pipefail
cd "$(dirname "$0")/.."
workers=${1:-2}
mode=${2:-adaptive}
bin=$(realpath "${3:-build/freshet}")
rounds=${ROUNDS:-3}
copies=${COPIES:-1}
shards=${SHARDS:-1}
fm=/usr/share/datasets/fashion-mnist
ncpu=$(nproc)
export OPENBLAS_NUM_THREADS=1
# shellcheck source=bench/cpu.sh
. bench/cpu.sh
blas_kernel
raw_bin=$(raw_consumer) || exit 1
if [ -n "${REDIS_DELAY_US:-}" ] && [ "${REDIS:-single}" = cluster ]; then
    echo "run_vs_fit.sh: REDIS_DELAY_US needs one redis-server: a cluster's MOVED names the" \
        "nodes' own ports, past the proxy" >&2
    exit 2
fi
work=$(mktemp -d /tmp/freshet-bench-XXXXXX)
# shellcheck source=deploy/stack.sh
. deploy/stack.sh
trap 'stack_stop "$work"' EXIT
[ -n "${KEEP_LOG:-}" ] && trap 'cp "$work/run.log" "$KEEP_LOG"; stack_stop "$work"' EXIT
stack_start_fashion "$work" "$bin" "$copies"
bootstrap=$stack_bootstrap
if [ "${REDIS:-single}" = cluster ]; then
    stack_start_cluster "$work"
    redis_url=$stack_cluster_url
    rcli=(redis-cli -c -p "$stack_cluster_port") # -c: follows MOVED to the model's master
else
    redis_url=redis://127.0.0.1:$stack_port/0
    rcli=(redis-cli -p "$stack_port")
fi
if [ -n "${REDIS_DELAY_US:-}" ]; then
    stack_start_proxy "$work" "$stack_port" "$REDIS_DELAY_US" "$bin" || exit 1
    redis_url=redis://127.0.0.1:$stack_proxy_port/0
fi

# one epoch of freshet fit; prints "samples/s accuracy"
fit_once() {
    "$bin" fit --layers 784-256-10 --loss softmax --optimizer sgd --lr 0.1 --batch 64 \
        --epochs 1 --seed 42 --backend cpu --format idx \
        --data "$fm/train-images-idx3-ubyte.gz" --labels "$fm/train-labels-idx1-ubyte.gz" \
        --test-data "$fm/t10k-images-idx3-ubyte.gz" --test-labels "$fm/t10k-labels-idx1-ubyte.gz" \
        --out "$work/fit.safetensors" >"$work/fit.log"
    awk '$1 == "epoch" { for (i = 1; i < NF; i++) {
             if ($i == "samples/s") r = $(i + 1); if ($i == "test_accuracy") a = $(i + 1) }
         print r, a }' "$work/fit.log"
}

# freshet run over the whole topic as model $1; prints "samples/s accuracy".
# The clock runs from its first applied version to its last (the group
# join excluded), read afterwards from the versions stream (each entry has
# its time t and samples n), so that nothing polls while it runs.
run_once() {
    local model=$1
    cat >"$work/run.conf" <<EOF
[model]
name = $model
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
url = $redis_url
[serve]
listen = ${SERVE_LISTEN-127.0.0.1:0}
[trainer]
workers = $workers
mode = $mode
backend = cpu
sync_lr_scale = ${SYNC_LR_SCALE:-none}
[controller]
lr = 0.1
${AVERAGE:+average = $AVERAGE}
[psstore]
max_pending = ${MAX_PENDING:-64}
shards = $shards
${COMMIT_MS:+commit_ms = $COMMIT_MS}
EOF
    local side0 redis0 broker0 proxy0=0
    if [ -n "${REDIS_DELAY_US:-}" ]; then
        proxy0=$(stack_proxy_cpu)
    fi
    redis0=$(redis_cpu)
    broker0=$(broker_cpu)
    side0=$(side_cpu)
    "$bin" run --config "$work/run.conf" --summary "$work/summary.json" >"$work/run.log" 2>&1 &
    local pid=$!
    # run_once runs in a subshell (< <(...)): should it end early, the run
    # must not outlive it
    run_pid=$pid
    trap '[ -n "$run_pid" ] && kill -TERM "$run_pid" 2>/dev/null' EXIT
    # the shards' tags ({M} for one shard); done once every shard's watermarks cover the topic
    local tags=("$model") least
    [ "$shards" -gt 1 ] && mapfile -t tags < <(seq 0 $((shards - 1)) | sed "s|^|$model/s|")
    for _ in $(seq 1200); do
        least=$(for t in "${tags[@]}"; do
            "${rcli[@]}" HVALS "freshet:{$t}:offsets" | awk -F'[;@]' '{ s += $1 } END { print s + 0 }'
        done | sort -n | head -1)
        [ "$least" -ge $((60000 * copies)) ] && break
        sleep 0.5
    done
    # CPU of the run's process, the broker and Redis, per sample of the topic
    local cpu
    cpu=$(awk -v a="$(cpu_s "$pid")" -v b="$(side_cpu)" -v s0="$side0" -v n=$((60000 * copies)) \
        'BEGIN { printf "%.2f", (a + b - s0) * 1e6 / n }')
    {
        thread_cpu "$pid"
        awk -v b="$(broker_cpu)" -v s0="$broker0" 'BEGIN { printf "broker %.2f\n", b - s0 }'
        awk -v b="$(redis_cpu)" -v s0="$redis0" 'BEGIN { printf "redis %.2f\n", b - s0 }'
        if [ -n "${REDIS_DELAY_US:-}" ]; then
            awk -v b="$(stack_proxy_cpu)" -v s0="$proxy0" 'BEGIN { printf "delay_proxy %.2f\n", b - s0 }'
        fi
    } >"$work/threads"
    kill -TERM "$pid" && wait "$pid"
    run_pid=
    "$bin" model export --redis "$redis_url" --name "$model" \
        --out "$work/run.safetensors" >/dev/null
    local acc rate
    acc=$("$bin" eval --weights "$work/run.safetensors" --format idx 2>/dev/null \
        --data "$fm/t10k-images-idx3-ubyte.gz" --labels "$fm/t10k-labels-idx1-ubyte.gz" |
        sed 's/.*"accuracy": *\([0-9.]*\).*/\1/')
    "${rcli[@]}" XRANGE "freshet:{${tags[0]}}:versions" - + >"$work/versions.txt"
    rate=$(awk 'prev == "n" { n = $1 } prev == "t" { if (t0 == "") { t0 = $1; n0 = n } t1 = $1; s += n }
             { prev = $1 } END { if (t1 > t0) printf "%.0f", (s - n0) * 1000 / (t1 - t0); else print 0 }' \
        "$work/versions.txt")
    # staleness of every update (field tau), p50/p99
    tau=$(awk 'prev == "tau" { print $1 } { prev = $1 }' "$work/versions.txt" | sort -n |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else
             printf "%d/%d", v[int((NR - 1) * 0.5) + 1], v[int((NR - 1) * 0.99) + 1] }')
    echo "$rate $acc $tau $cpu"
}

# the raw librdkafka consumer over the whole topic: "records/s cpu" (bench/cpu.sh)
raw_once() { raw_read "$raw_bin" "$bootstrap" fashion $((60000 * copies)) "$work"; }

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "run vs fit: Fashion-MNIST x $copies, 784-256-10 softmax, sgd lr 0.1, batch 64;" \
    "freshet run with $workers workers, $mode, Kafka + Redis (${REDIS:-single}), $shards" \
    "shard(s)${REDIS_DELAY_US:+, Redis behind delay_proxy, $REDIS_DELAY_US us each way}"
echo "OpenBLAS kernel: ${OPENBLAS_CORETYPE:-as detected}; limit = min($workers x fit, raw consume);" \
    "cpu limit = $ncpu cores / (CPU a sample of fit + of the raw read, broker included)"
printf '  %-5s %8s %7s %8s %7s %8s %7s %9s %9s %6s %6s %8s %9s\n' round "run/s" "run acc" "fit/s" \
    "fit acc" "raw/s" run/fit run/limit "tau 50/99" "us run" "us f+r" "cpulimit" run/cpulim
: >"$work/rounds"
for r in $(seq "$rounds"); do
    read -r fit_rate fit_acc < <(fit_once)
    read -r raw_rate raw_cpu < <(raw_once)
    read -r run_rate run_acc run_tau run_cpu < <(run_once "bench$r")
    # CPU a sample: fit's is its one thread's time; the cpu limit is what the
    # cores would give if run cost no more than training and reading do
    fr_cpu=$(awk -v f="$fit_rate" -v c="$raw_cpu" 'BEGIN { printf "%.2f", 1e6 / f + c }')
    cpu_lim=$(awk -v n="$ncpu" -v u="$fr_cpu" 'BEGIN { printf "%.0f", n * 1e6 / u }')
    echo "$run_rate $run_acc $fit_rate $fit_acc $raw_rate $run_tau $run_cpu $fr_cpu $cpu_lim" >>"$work/rounds"
    printf '  %-5s %8s %7s %8s %7s %8s %7s %9s %9s %6s %6s %8s %9s\n' "$r" "$run_rate" "$run_acc" \
        "$fit_rate" "$fit_acc" "$raw_rate" \
        "$(awk -v a="$run_rate" -v b="$fit_rate" 'BEGIN { printf "%.2f", a / b }')" \
        "$(awk -v a="$run_rate" -v f="$fit_rate" -v w="$workers" -v c="$raw_rate" \
            'BEGIN { l = w * f; if (c < l) l = c; printf "%.2f", a / l }')" "$run_tau" \
        "$run_cpu" "$fr_cpu" "$cpu_lim" \
        "$(awk -v a="$run_rate" -v b="$cpu_lim" 'BEGIN { printf "%.2f", a / b }')"
done
run_med=$(awk '{ print $1 }' "$work/rounds" | median)
fit_med=$(awk '{ print $3 }' "$work/rounds" | median)
raw_med=$(awk '{ print $5 }' "$work/rounds" | median)
acc_med=$(awk '{ print $2 }' "$work/rounds" | median)
fit_acc=$(awk 'NR == 1 { print $4 }' "$work/rounds")
limit=$(awk -v f="$fit_med" -v w="$workers" -v c="$raw_med" 'BEGIN { l = w * f; if (c < l) l = c; print l }')
printf '  median: run %.0f samples/s (rounds %s), fit %.0f, raw consume %.0f records/s\n' \
    "$run_med" "$(awk '{ print $1 }' "$work/rounds" | sort -n | paste -sd- -)" "$fit_med" "$raw_med"
printf '  ratio run/fit %.2f; run/min(%d x fit, raw) %.2f (limit %.0f)\n' \
    "$(awk -v a="$run_med" -v b="$fit_med" 'BEGIN { print a / b }')" "$workers" \
    "$(awk -v a="$run_med" -v b="$limit" 'BEGIN { print a / b }')" "$limit"
printf '  CPU a sample: run %s us (broker and Redis included), fit + raw read %s us;' \
    "$(awk '{ print $7 }' "$work/rounds" | median)" "$(awk '{ print $8 }' "$work/rounds" | median)"
printf ' cpu limit %.0f samples/s, run/cpu limit %.2f (rounds %s);' \
    "$(awk '{ print $9 }' "$work/rounds" | median)" \
    "$(awk '{ print $1 / $9 }' "$work/rounds" | median)" \
    "$(awk '{ printf "%.2f\n", $1 / $9 }' "$work/rounds" | sort -n | paste -sd' ' -)"
printf ' cores busy in run %.2f of %d\n' \
    "$(awk '{ print $1 * $7 / 1e6 }' "$work/rounds" | median)" "$ncpu"
printf '  where the last run'"'"'s CPU went, us a sample: %s\n' \
    "$(sort "$work/threads" | awk -v n=$((60000 * copies)) '{ printf "%s%s %.1f", sep, $1, $2 * 1e6 / n; sep = ", " }')"
# a worker's time a batch, from run --summary's counters (wall clock)
printf '  a worker'"'"'s time a batch in the last run, us: %s\n' "$(sed 's/.*"trainer":{\([^}]*\)}.*/\1/' \
    "$work/summary.json" | grep -o '"[a-z]*_ns":[0-9]*\|"batches":[0-9]*' | tr -d '"' | awk -F: '$1 == "batches" { b = $2; next }
        { v[$1] = $2; k[++n] = $1 } END { for (i = 1; i <= n; i++) {
            name = k[i]; sub(/_ns$/, "", name); printf "%s%s %.0f", sep, name, v[k[i]] / b / 1e3; sep = ", " } }')"
printf '  its applier: %s\n' "$(sed 's/.*"applier":{\([^}]*\)}.*/\1/' "$work/summary.json" |
    grep -o '"commits":[0-9]*\|"commit_ns":[0-9]*\|"applied":[0-9]*' | tr -d '"' |
    awk -F: '{ v[$1] = $2 } END { if (v["commits"] > 0)
        printf "%d gradients, %d commits of %.0f us each, blocking %.1f us a gradient",
            v["applied"], v["commits"], v["commit_ns"] / v["commits"] / 1e3, v["commit_ns"] / v["applied"] / 1e3 }')"
printf '  staleness p50/p99 of each run (versions): %s\n' "$(awk '{ print $6 }' "$work/rounds" | paste -sd' ' -)"
printf '  test accuracy: run median %s, fit %s (difference fit - run %.2f points)\n' \
    "$acc_med" "$fit_acc" "$(awk -v a="$acc_med" -v b="$fit_acc" 'BEGIN { print 100 * (b - a) }')"
