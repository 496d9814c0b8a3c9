#!/usr/bin/env bash
# A sparse model trained from Kafka (docs/design.md "Sparse models":
# its training from Kafka): N synthetic click records (binary layout,
# preloaded into the dev broker, 10,000 a partition to stay under its
# 5 MiB per partition) through freshet run (W sparse workers, the in-flight
# bound, FTRL, batch 256) against freshet fit-sparse over the same records
# in the same batches on one thread, measured in the same run. ROUNDS
# rounds alternate one fit-sparse pass and one run (a new model each,
# reading the same topic from its start); the figures are the medians.
# A run's samples/s is N over the span of its versions stream (first to
# last applied update: the consumer group's ~3 s first join is not
# training); its progressive logloss and staleness come from that stream
# too (each update's mean loss over its samples, scored before learning).
# Its Redis bytes/sample is everything Redis received and sent during the
# run (INFO stats) over N, printed beside what a dense model of the
# table's size would move (its weights pulled and its gradient pushed once
# a batch); its rows/s the rows its workers pulled (and pushed) a second.
# SPLIT=1 runs the split layout instead: freshet ps (the applier) and
# freshet train (the consumer and workers) as two processes, the gradients
# through the grads stream; their CPU is summed.
# The cpu limit, measured in the same round: cores / (fit-sparse's CPU a
# sample, one thread, + the CPU a record of a raw librdkafka read of the
# same topic, bench_rawconsume and the broker); the run's CPU a sample is
# its process's, the broker's and Redis's, split by thread (bench/cpu.sh).
# SHARDS > 1 cuts the table over that many shards (docs/design.md "Sparse
# models on shards"), an applier each; the rate and loss then come from
# shard 0's versions stream (every shard applies every batch).
# REDIS_DELAY_US=D puts a delay_proxy (tests/tools/delay_proxy.c) between
# freshet and its redis-server, every byte D us later each way: a store in
# another rack (bench/README.md "A distant store"; bench/distant.sh runs it).
# The bench's own redis-cli calls go straight to Redis.
# usage: [N=200000] [ROUNDS=3] [SPEC=fields:39,buckets:2^22,dim:8] [BATCH=256]
#        [SHARDS=1] [SPLIT=1] [REDIS_DELAY_US=D] [COMMIT_MS=N] bash bench/sparse_run.sh [WORKERS] [FRESHET]
set -euo pipefail
cd "$(dirname "$0")/.."
workers=${1:-2}
bin=$(realpath "${2:-build/freshet}")
n=${N:-200000}
rounds=${ROUNDS:-3}
spec=${SPEC:-fields:39,buckets:2^22,dim:8}
batch=${BATCH:-256}
shards=${SHARDS:-1}
split=${SPLIT:-0}
parts=$(((n + 9999) / 10000))
work=$(mktemp -d /tmp/freshet-bench-XXXXXX)
# shellcheck source=deploy/stack.sh
. deploy/stack.sh
# shellcheck source=bench/cpu.sh
. bench/cpu.sh
raw_bin=$(raw_consumer) || exit 1
ncpu=$(nproc)
trap 'stack_stop "$work"' EXIT
stack_start "$work" "$bin" "clicks:$parts"
redis_url=redis://127.0.0.1:$stack_port/0
store="loopback Redis"
if [ -n "${REDIS_DELAY_US:-}" ]; then
    stack_start_proxy "$work" "$stack_port" "$REDIS_DELAY_US" "$bin" || exit 1
    redis_url=redis://127.0.0.1:$stack_proxy_port/0
    store="Redis behind delay_proxy, $REDIS_DELAY_US us each way"
fi
"$bin" produce --synthetic ctr --seed 4 --encode binary --limit "$n" --out "$work/clicks.bin" \
    >"$work/synth.log" 2>&1
"$bin" produce --data "$work/clicks.bin" --format binary --encode binary \
    --bootstrap "$stack_bootstrap" --topic clicks --partitions-by roundrobin >>"$work/produce.log"
echo "sparse_run.sh: $n records in $parts partitions, $spec, $shards shard(s), batch $batch, $workers worker(s)," \
    "$rounds rounds, $store; floor: $(tail -1 "$work/synth.log")"

# Bytes Redis received and sent so far (INFO stats): a run's traffic is the
# difference, every client included (workers, applier, consumer).
redis_bytes() {
    redis-cli -p "$stack_port" INFO stats | tr -d '\r' |
        awk -F: '/^total_net_(input|output)_bytes:/ {s += $2} END {print s}'
}

# Bytes a sample of a dense model as large as the table (2^B rows of 1 + D
# floats, plus the bias) would move: its weights pulled and its gradient
# pushed once a batch.
dense_bytes() {
    echo "$spec" | awk -F'[:,^]' -v b="$batch" '{printf "%.0f", 2 * 4 * (2 ^ $5 * (1 + $7) + 1) / b}'
}

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

: >"$work/fit.txt"
: >"$work/run.txt"
: >"$work/cpu.txt"
for r in $(seq "$rounds"); do
    out=$("$bin" fit-sparse --sparse "$spec" --data "$work/clicks.bin" --format binary \
        --batch "$batch" --window "$n" 2>/dev/null | tail -1)
    # "N records, progressive logloss L, R samples/s"
    fit_rate=$(echo "$out" | awk -F', ' '{print $3 + 0}')
    fit_loss=$(echo "$out" | awk -F', ' '{split($2, a, " "); print a[3]}')
    echo "$fit_rate $fit_loss" >>"$work/fit.txt"
    model="clicks$r"
    cat >"$work/run.conf" <<CONF
[model]
name = $model
sparse = $spec
[kafka]
bootstrap.servers = $stack_bootstrap
session.timeout.ms = 6000
heartbeat.interval.ms = 500
[ingest]
topic = clicks
format = binary
batch = $batch
[redis]
url = $redis_url
[serve]
listen =
[trainer]
workers = $workers
[psstore]
shards = $shards
${COMMIT_MS:+commit_ms = $COMMIT_MS}
CONF
    vtag=$model
    [ "$shards" -gt 1 ] && vtag="$model/s0"
    redis-cli -p "$stack_port" CONFIG RESETSTAT >/dev/null # commandstats and the bytes
    before=$(redis_bytes)
    read -r raw_rate raw_cpu < <(raw_read "$raw_bin" "$stack_bootstrap" clicks "$n" "$work")
    side0=$(side_cpu)
    redis0=$(redis_cpu)
    broker0=$(broker_cpu)
    # the run's CPU: its process (time), the broker and Redis; its threads'
    # split sampled from /proc while it runs (per kind, the most any sample
    # saw: a thread's CPU leaves /proc when it is joined, before the process
    # exits). SPLIT=1: freshet ps and freshet train, stopped once the
    # store's watermarks cover the topic
    : >"$work/threads$r"
    sample_threads() { # a process that exits meanwhile leaves the last sample
        local p
        {
            for p in "$@"; do thread_cpu "$p" 2>/dev/null || true; done
            cat "$work/threads$r"
        } | awk '{ if (!($1 in m) || $2 > m[$1]) m[$1] = $2 } END { for (k in m) print k, m[k] }' \
            >"$work/threads.new" || true
        if [ -s "$work/threads.new" ]; then mv "$work/threads.new" "$work/threads$r"; fi
    }
    if [ "$split" = 1 ]; then
        "$bin" ps --config "$work/run.conf" >"$work/ps$r.log" 2>&1 &
        ppid=$!
        "$bin" train --config "$work/run.conf" >"$work/run$r.log" 2>&1 &
        rpid=$!
        for _ in $(seq 3000); do
            got=$(redis-cli -p "$stack_port" HVALS "freshet:{$vtag}:offsets" |
                awk -F'[;@]' '{ s += $1 } END { print s + 0 }')
            [ "$got" -ge "$n" ] && break
            sample_threads "$ppid" "$rpid"
            sleep 0.1
        done
        sample_threads "$ppid" "$rpid"
        awk -v a="$(cpu_s "$ppid")" -v b="$(cpu_s "$rpid")" 'BEGIN { print a + b, 0 }' >"$work/time$r"
        kill -TERM "$rpid" "$ppid"
        wait "$rpid" "$ppid" || true
    else
        (
            TIMEFORMAT='%U %S'
            time "$bin" run --config "$work/run.conf" --samples "$n" >"$work/run$r.log" 2>&1
        ) 2>"$work/time$r" &
        tpid=$!
        rpid=
        for _ in $(seq 100); do
            rpid=$(pgrep -P "$tpid" | head -1) && [ -n "$rpid" ] && break
            sleep 0.02
        done
        while [ -n "$rpid" ] && kill -0 "$rpid" 2>/dev/null; do
            sample_threads "$rpid"
            sleep 0.1
        done
        wait "$tpid"
    fi
    run_cpu=$(awk -v b="$(side_cpu)" -v s0="$side0" -v n="$n" \
        '{ printf "%.2f", ($1 + $2 + b - s0) * 1e6 / n }' "$work/time$r")
    {
        awk -v n="$n" '{ printf "%s %.2f\n", $1, $2 * 1e6 / n }' "$work/threads$r" 2>/dev/null
        awk -v b="$(broker_cpu)" -v s0="$broker0" -v n="$n" 'BEGIN { printf "broker %.2f\n", (b - s0) * 1e6 / n }'
        awk -v b="$(redis_cpu)" -v s0="$redis0" -v n="$n" 'BEGIN { printf "redis %.2f\n", (b - s0) * 1e6 / n }'
    } >"$work/split$r"
    moved=$(($(redis_bytes) - before))
    # versions entries: version, epoch, tau, lr_eff, loss, n, worker, t (ms)
    redis-cli -p "$stack_port" --no-raw XRANGE "freshet:{$vtag}:versions" - + |
        awk '/"tau"/ {getline; gsub(/"/, ""); tau = $2}
             /"loss"/ {getline; gsub(/"/, ""); loss = $2}
             /"n"$/ {getline; gsub(/"/, ""); m = $2}
             /"t"$/ {getline; gsub(/"/, ""); t = $2;
                     if (first == "") first = t; last = t; s += loss * m; k += m; print tau > "/dev/stderr"}
             END {printf "%.0f %.5f", k / ((last - first) / 1000), s / k}' \
            2>"$work/taus$r.txt" >>"$work/run.txt"
    # rows pulled (and pushed: a gradient carries the rows pulled) a second:
    # the rows a sample of the progress lines (rows/s over samples/s, both
    # over a line's interval) times the run's samples/s
    per=$(grep -o '[0-9]* samples/s, progressive logloss [0-9.]*, [0-9]* rows/s' "$work/run$r.log" |
        awk '$1 > 0 {r += $(NF - 1); s += $1} END {print (s > 0 ? r / s : 0)}')
    rate=$(tail -1 "$work/run.txt" | awk '{print $1}')
    echo " $((moved / n)) $(awk -v p="$per" -v r="$rate" 'BEGIN {printf "%.0f", p * r}')" \
        >>"$work/run.txt"
    p50=$(median <"$work/taus$r.txt")
    p99=$(sort -g "$work/taus$r.txt" | awk '{a[NR] = $1} END {i = int(NR * 0.99); if (i < 1) i = 1; print a[i]}')
    # the cpu limit: cores / (fit-sparse's CPU a sample, its one thread, +
    # the raw read's a record, broker included)
    fr_cpu=$(awk -v f="$fit_rate" -v c="$raw_cpu" 'BEGIN { printf "%.2f", 1e6 / f + c }')
    cpu_lim=$(awk -v k="$ncpu" -v u="$fr_cpu" 'BEGIN { printf "%.0f", k * 1e6 / u }')
    echo "$run_cpu $fr_cpu $cpu_lim $raw_rate $raw_cpu" >>"$work/cpu.txt"
    echo "round $r: fit-sparse $fit_rate samples/s, logloss $fit_loss;" \
        "run $(tail -1 "$work/run.txt" | awk '{print $1 " samples/s, logloss " $2 ", Redis " $3 " bytes/sample, " $4 " rows/s pulled and pushed"}')," \
        "staleness p50 $p50 p99 $p99; raw read $raw_rate records/s;" \
        "CPU a sample: run $run_cpu us, fit-sparse + raw read $fr_cpu us; cpu limit $cpu_lim samples/s," \
        "run/cpu limit $(tail -1 "$work/run.txt" | awk -v c="$cpu_lim" '{printf "%.2f", $1 / c}')"
    echo "  run's CPU a sample by thread (us): $(sort "$work/split$r" | tr '\n' ' ')"
    # where Redis's time went: its commands by total time, us a sample
    echo "  Redis's commands (us a sample): $(redis-cli -p "$stack_port" INFO commandstats | tr -d '\r' |
        awk -F'[:=,]' -v n="$n" '/^cmdstat_/ { sub(/^cmdstat_/, "", $1); printf "%s %.2f %d\n", $1, $5 / n, $3 }' |
        sort -k2 -g -r | head -6 | awk '{ printf "%s %s (%d calls) ", $1, $2, $3 }')"
done
fit_med=$(awk '{print $1}' "$work/fit.txt" | median)
run_med=$(awk '{print $1}' "$work/run.txt" | median)
echo "median: fit-sparse $fit_med samples/s (logloss $(awk '{print $2}' "$work/fit.txt" | median))," \
    "run $run_med samples/s (logloss $(awk '{print $2}' "$work/run.txt" | median)," \
    "Redis $(awk '{print $3}' "$work/run.txt" | median) bytes/sample," \
    "$(awk '{print $4}' "$work/run.txt" | median) rows/s pulled and pushed; a dense model of the" \
    "table's size would move $(dense_bytes) bytes/sample: one pull and one push a batch);" \
    "run/fit $(awk -v a="$run_med" -v b="$fit_med" 'BEGIN {printf "%.2f", a / b}')"
lim_med=$(awk '{print $3}' "$work/cpu.txt" | median)
echo "median: CPU a sample: run $(awk '{print $1}' "$work/cpu.txt" | median) us" \
    "($(awk '{print $1}' "$work/cpu.txt" | sort -g | sed -n '1p;$p' | tr '\n' '-' | sed 's/-$//'))," \
    "fit-sparse + raw read $(awk '{print $2}' "$work/cpu.txt" | median) us" \
    "(raw read $(awk '{print $5}' "$work/cpu.txt" | median) us a record); cpu limit $lim_med samples/s;" \
    "run/cpu limit $(paste -d' ' "$work/run.txt" "$work/cpu.txt" | awk '{print $1 / $7}' | median)" \
    "($(paste -d' ' "$work/run.txt" "$work/cpu.txt" | awk '{printf "%.2f\n", $1 / $7}' | sort -g | sed -n '1p;$p' | tr '\n' '-' | sed 's/-$//'))"
if [ -n "${REDIS_DELAY_US:-}" ]; then
    echo "delay_proxy: $(stack_proxy_cpu) s of CPU in all (every round's fit-sparse and run)"
fi
