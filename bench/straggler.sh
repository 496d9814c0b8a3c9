#!/usr/bin/env bash
# Rounds a round mode closes per gradient of a straggler: how much backup
# gains over sync when one worker is slow. tests/integration/test_run.c
# (test_backup_does_not_wait_for_a_straggler_and_sync_does) judges only
# counts (backup closes rounds without the straggler, sync never does);
# the ratio is a speed, which depends on the machine and its load, so it
# is measured here. The test's run: 3 workers of a 3-512-512-1 model (mse,
# lr 0.005, batch 256), worker 2's gradient slowed FACTOR times ([trainer]
# slowdown = 2:FACTOR), backups = 1, round_timeout = 30, over N records of
# a 3-feature regression stream in 3 partitions. ROUNDS rounds, each a run
# in backup then one in sync, each on a new model reading the same topic
# from its start. A run is read once every record is applied (the store's
# watermarks), before its stop: the rounds its applier closed and the
# straggler's gradients (its clock in the members hash). Prints each run
# and the median ratio of each mode.
# usage: [ROUNDS=N] [FACTOR=F] [N=records] bash bench/straggler.sh [FRESHET]
#        (defaults: 3 rounds, factor 30, 12000 records, build/freshet)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
factor=${FACTOR:-30}
n=${N:-12000}
bin=$(realpath "${1:-build/freshet}")
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d /tmp/freshet-straggler-XXXXXX)
# shellcheck source=deploy/stack.sh
. deploy/stack.sh
trap 'stack_stop "$work"' EXIT
stack_start "$work" "$bin" strag:3
python3 -c 'import random
random.seed(5)
for i in range('"$n"'):
    x = [random.uniform(-1, 1) for _ in range(3)]
    print(",".join(["%.5f" % (0.5 * x[0] - 0.3 * x[1] + 0.2 * x[2])] + ["%.5f" % v for v in x]))' \
    >"$work/strag.csv"
"$bin" produce --bootstrap "$stack_bootstrap" --topic strag --data "$work/strag.csv" \
    --format csv --encode f32 --features 3 --partitions-by roundrobin >"$work/produce.log" 2>&1 ||
    stack_fail "$work" "straggler: produce failed"
rcli() { redis-cli -p "$stack_port" "$@"; }

# one run: prints "rounds slow"
one_run() {
    local mode=$1 model=$2 conf=$work/$2.conf log=$work/$2.log pid sum p v
    stack_conf "$conf" "$stack_bootstrap" "redis://127.0.0.1:$stack_port/0" \
        "[model]" "name = $model" "layers = 3-512-512-1" "loss = mse" \
        "[ingest]" "topic = strag" "format = f32" "batch = 256" "linger_ms = 100" \
        "[trainer]" "workers = 3" "mode = $mode" "backend = cpu" "slowdown = 2:$factor" \
        "backups = 1" "round_timeout = 30" "[controller]" "lr = 0.005" \
        "[psstore]" "max_pending = 6"
    "$bin" run --config "$conf" >"$log" 2>&1 &
    pid=$!
    trap 'kill -TERM "$pid" 2>/dev/null' EXIT # (a subshell: stack_stop does not know it)
    for _ in $(seq 3000); do
        sum=0
        for p in 0 1 2; do
            v=$(rcli HGET "freshet:{$model}:offsets" "strag/$p")
            v=${v%%[!0-9]*} # the watermark, before the intervals applied above it
            sum=$((sum + ${v:-0}))
        done
        [ "$sum" -ge "$n" ] && break
        sleep 0.1
    done
    [ "$sum" -ge "$n" ] || stack_fail "$work" "straggler: $mode applied $sum of $n records in 300 s"
    local r s
    r=$(rcli HGET "freshet:{$model}:rounds" 0)
    s=$(rcli HGET "freshet:{$model}:members" "$(hostname)/$pid/2" | awk '{ print $3 }')
    kill -TERM "$pid"
    wait "$pid" || true
    echo "${r:-0} ${s:-0}"
}

echo "straggler: 3 workers, 3-512-512-1, batch 256, worker 2 slowed ${factor}x, $n records"
printf '  %-6s %-7s %8s %20s %18s\n' round mode rounds "straggler gradients" "rounds/gradient"
: >"$work/ratios"
for round in $(seq "$rounds"); do
    for mode in backup sync; do
        out=$(one_run "$mode" "st$mode$round") # (exits here when the run failed)
        read -r r s <<<"$out"
        ratio=$(awk -v r="$r" -v s="$s" 'BEGIN { printf "%.2f", (s > 0 ? r / s : 0) }')
        printf '  %-6s %-7s %8s %20s %18s\n' "$round" "$mode" "$r" "$s" "$ratio"
        echo "$mode $ratio" >>"$work/ratios"
    done
done
for mode in backup sync; do
    awk -v m="$mode" '$1 == m { print $2 }' "$work/ratios" | sort -g | awk -v m="$mode" \
        '{ v[NR] = $1 } END { printf "%s: median %.2f rounds per straggler gradient (%.2f-%.2f)\n",
          m, NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[1], v[NR] }'
done
