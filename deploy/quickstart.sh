#!/usr/bin/env bash
# The main job on the embedded default: set up and build, start a local
# redis-server (temporary directory, free port) and the dev broker
# (freshet broker), stream the Fashion-MNIST training set (the Debian
# package dataset-fashion-mnist) into a 48-partition topic in a loop at a
# steady rate with freshet produce, and train 784-256-10 from it with
# freshet run: 2 asynchronous workers, the adaptive staleness controller,
# a progress line every 5 s with the holdout accuracy on the Fashion-MNIST
# test set, and the HTTP service on --listen (default 127.0.0.1:8080):
# the dashboard at /dashboard, the weights at /v2/models/fashion/weights.
# Replay and rollback take the token it prints. Ctrl-C (or --duration S)
# stops everything it started, by PID. --cluster keeps the model on a local
# Redis Cluster instead (3 masters with a replica each, free ports): try
# killing the master that serves it (freshet model show names it).
# --shards S cuts the model into S shards, an applier each (with
# --cluster, spread over the masters).
#
# usage: bash deploy/quickstart.sh [--duration S] [--rate N] [--workers W]
#        [--listen HOST:PORT] [--cluster] [--shards S] [--no-setup]
set -euo pipefail
cd "$(dirname "$0")/.."

duration=0
rate=1000
workers=2
listen=127.0.0.1:8080
setup=1
cluster=0
shards=1
while [ $# -gt 0 ]; do
    case "$1" in
    --duration) duration=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --listen) listen=$2; shift 2 ;;
    --no-setup) setup=0; shift ;;
    --cluster) cluster=1; shift ;;
    --shards) shards=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "quickstart: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done

if [ "$setup" = 1 ]; then
    bash deploy/setup.sh
    bash deploy/build.sh
fi
fm=/usr/share/datasets/fashion-mnist
bin=$PWD/build/freshet
work=$(mktemp -d /tmp/freshet-quickstart-XXXXXX)
# shellcheck source=deploy/stack.sh
. deploy/stack.sh
# the trainer is started last, so it is stopped first (it commits and
# leaves the group), then the producer, the broker and redis
trap 'stack_stop "$work"' EXIT
trap 'exit 130' INT TERM
stack_start "$work" "$bin" fashion:48
bootstrap=$stack_bootstrap
redis_url=redis://127.0.0.1:$stack_port/0
if [ "$cluster" = 1 ]; then
    stack_start_cluster "$work"
    redis_url=$stack_cluster_url
fi
echo "quickstart: redis at $redis_url; dev broker at $bootstrap; work dir $work"

"$bin" produce --bootstrap "$bootstrap" --topic fashion --format idx --encode f32 \
    --features 784 --data "$fm/train-images-idx3-ubyte.gz" \
    --labels "$fm/train-labels-idx1-ubyte.gz" --rate "$rate" --loop \
    --partitions-by sticky >"$work/produce.log" 2>&1 &
stack_pids+=($!)

cat >"$work/freshet.conf" <<EOF
[model]
name = fashion
layers = 784-256-10
loss = softmax
[kafka]
bootstrap.servers = $bootstrap
[ingest]
topic = fashion
format = f32
batch = 64
[redis]
url = $redis_url
[trainer]
workers = $workers
mode = adaptive
[controller]
lr = 0.1
[psstore]
shards = $shards
[serve]
listen = $listen
[eval]
data = $fm/t10k-images-idx3-ubyte.gz
labels = $fm/t10k-labels-idx1-ubyte.gz
format = idx
every = 200
EOF
echo "quickstart: streaming Fashion-MNIST at $rate samples/s; freshet run --config $work/freshet.conf"
# a token for this session's replay and rollback (kept out of the config file)
FRESHET_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export FRESHET_TOKEN
echo "quickstart: dashboard http://$listen/dashboard, weights http://$listen/v2/models/fashion/weights"
echo "quickstart: token for replay and rollback: $FRESHET_TOKEN"
"$bin" run --config "$work/freshet.conf" &
run_pid=$!
stack_pids+=($run_pid)
if [ "$duration" != 0 ]; then
    sleep "$duration"
    kill -TERM "$run_pid"
fi
wait "$run_pid"
