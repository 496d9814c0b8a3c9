#!/usr/bin/env bash
# The seed's comparison on Fashion-MNIST, as freshet compare runs it: a
# redis-server and the dev broker (deploy/stack.sh), the 60,000 training
# images preloaded 2.5 x SAMPLES / 60,000 times, at least twice (f32
# records, 48 partitions a copy, round-robin), 784-256-10 softmax, sgd lr
# 0.1, batch 64, every other setting at its default, the t10k images as the
# holdout; then
#   freshet compare --modes MODES --workers WORKERS --straggler 0:10
#                   --seeds SEEDS --samples SAMPLES --out OUT
# (defaults: every mode, 2,4,8 workers, 3 seeds, 120,000 samples, OUT
# freshet-compare). Prints report.md at the end; OUT keeps report.json,
# report.md, report.html and each run's log.
# usage: [MODES=..] [WORKERS=..] [SEEDS=N] [SAMPLES=N] [STRAGGLER=W:F|none]
#        [ARGS="--set S.K=V ..."] bench/compare.sh [OUT] [FRESHET]
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-freshet-compare}")
bin=$(realpath "${2:-build/freshet}")
fm=/usr/share/datasets/fashion-mnist
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d /tmp/freshet-bench-XXXXXX)
cp "$bin" "$work/freshet" # a rebuild meanwhile does not change the binary under test
bin=$work/freshet
# shellcheck source=deploy/stack.sh
. deploy/stack.sh
trap 'stack_stop "$work"' EXIT
# at least twice, and 2.5 x SAMPLES: runs that drop gradients read more records
# (backup at 2 workers with 1 backup drops about half)
copies=$(((${SAMPLES:-120000} * 5 / 2 + 59999) / 60000))
[ "$copies" -ge 2 ] || copies=2
stack_start_fashion "$work" "$bin" "$copies"
cat >"$work/compare.conf" <<EOF
[model]
name = fashion
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
[redis]
url = redis://127.0.0.1:$stack_port/0
[trainer]
backend = cpu
[controller]
lr = 0.1
[eval]
data = $fm/t10k-images-idx3-ubyte.gz
labels = $fm/t10k-labels-idx1-ubyte.gz
format = idx
EOF
straggler=()
[ "${STRAGGLER:-0:10}" = none ] || straggler=(--straggler "${STRAGGLER:-0:10}")
"$bin" compare --config "$work/compare.conf" \
    --modes "${MODES:-async,adaptive,sync,backup,groups,ssp,auto}" \
    --workers "${WORKERS:-2,4,8}" "${straggler[@]}" --seeds "${SEEDS:-3}" \
    --samples "${SAMPLES:-120000}" --cleanup --out "$out" ${ARGS:-}
cat "$out/report.md"
