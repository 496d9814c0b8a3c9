#!/usr/bin/env bash
# Delta freshness of a sparse model (docs/design.md "Serving sparse
# models"): the synthetic click stream produced live at RATE records a
# second (binary layout, Kafka timestamps of the moment each is sent) into
# the dev broker, freshet run training it (2 workers, FTRL, batch 256,
# commits as they come) with its HTTP server, and a client polling
# /delta?since=V every PERIOD ms for SECONDS seconds (bench/delta_poll.py).
# Prints, over ROUNDS rounds (a new model and topic each), the time from a
# record's Kafka timestamp to the delta that carried its rows (p50 and p99
# of each batch's newest and oldest record) and the deltas' bytes a second;
# the medians last; and the applier's own freshness, Kafka timestamp to the
# committed version (its progress line, the last 256 batches), per round.
# usage: [RATE=10000] [DURATION=20] [PERIOD=50] [ROUNDS=3] [COMMIT_MS=ms]
#        [SPEC=fields:39,buckets:2^22,dim:8] [BY=sticky] bash bench/sparse_delta.sh [FRESHET]
# COMMIT_MS sets [psstore] commit_ms (the default's when unset).
# BY is the producer's --partitions-by: sticky (keyless runs, full batches) by
# default; with key, small batches make the dev broker's fetches walk ever
# longer lists (bench/README.md, "Where the time goes").
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/freshet}
rate=${RATE:-10000}
seconds=${DURATION:-20}
period=${PERIOD:-50}
rounds=${ROUNDS:-3}
spec=${SPEC:-fields:39,buckets:2^22,dim:8}
by=${BY:-sticky}
work=$(mktemp -d /tmp/freshet-bench-XXXXXX)
# shellcheck source=deploy/stack.sh
. deploy/stack.sh
trap 'stack_stop "$work"' EXIT
stack_start "$work" "$bin" "live1:4"
http=$(stack_free_port)
echo "sparse_delta.sh: $rate records/s live, $spec, batch 256, 2 workers, a /delta poll every" \
    "$period ms for $seconds s, $rounds rounds"

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

: >"$work/figures.txt"
: >"$work/committed.txt"
for r in $(seq "$rounds"); do
    model="live$r"
    cat >"$work/run.conf" <<CONF
[model]
name = $model
sparse = $spec
[kafka]
bootstrap.servers = $stack_bootstrap
session.timeout.ms = 6000
heartbeat.interval.ms = 500
[ingest]
topic = live$r
format = binary
batch = 256
[redis]
url = redis://127.0.0.1:$stack_port/0
[serve]
listen = 127.0.0.1:$http
[trainer]
workers = 2
CONF
    if [ -n "${COMMIT_MS:-}" ]; then
        printf '[psstore]\ncommit_ms = %s\n' "$COMMIT_MS" >>"$work/run.conf"
    fi
    "$bin" run --config "$work/run.conf" >"$work/run$r.log" 2>&1 &
    run_pid=$!
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$http/readyz" >/dev/null 2>&1 && break
        sleep 0.2
    done
    sleep 4 # the consumer group's first join
    "$bin" produce --synthetic ctr --seed "$r" --encode binary --rate "$rate" --partitions-by "$by" \
        --bootstrap "$stack_bootstrap" --topic "live$r" >"$work/produce$r.log" 2>&1 &
    produce_pid=$!
    out=$(/usr/bin/python3 bench/delta_poll.py "$http" "$stack_port" "$model" "$seconds" "$period")
    kill "$produce_pid" 2>/dev/null || true
    wait "$produce_pid" 2>/dev/null || true
    kill "$run_pid"
    wait "$run_pid" || true
    # the committed version's freshness (the applier's, the run's last
    # progress line: Kafka timestamp to the commit, last 256 batches)
    committed=$(grep -o 'freshness p50 -\{0,1\}[0-9]* ms p99 -\{0,1\}[0-9]* ms' "$work/run$r.log" |
        tail -1 | awk '{print $3, $6}' || true)
    echo "${committed:-nan nan}" >>"$work/committed.txt"
    echo "round $r: $(echo "$out" | tr '\n' ' ')committed: p50 ${committed% *} ms p99 ${committed#* } ms"
    echo "$out" | awk '/^freshness/ {gsub(/;/, ""); print $13, $15, $18, $20}
                      /^delta_poll/ {kb = $(NF - 3)} END {print kb > "/dev/stderr"}' \
        >>"$work/figures.txt" 2>>"$work/kb.txt"
done
for i in 1 2 3 4; do
    meds[$i]=$(awk -v i="$i" '{print $i}' "$work/figures.txt" | median)
done
echo "median: newest record p50 ${meds[1]} ms p99 ${meds[2]} ms; oldest record p50 ${meds[3]}" \
    "ms p99 ${meds[4]} ms; deltas $(median <"$work/kb.txt") KB/s; Kafka timestamp to the committed" \
    "version p50 $(awk '{print $1}' "$work/committed.txt" | median) ms" \
    "p99 $(awk '{print $2}' "$work/committed.txt" | median) ms"
