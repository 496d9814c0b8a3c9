# shellcheck shell=bash
# stack.sh - sourced by deploy/quickstart.sh, the benchmarks and the
# reference tests: a redis-server (free loopback port, in the work folder,
# no persistence) and the dev broker with one topic, and their stop, by PID,
# in reverse order of start, with everything else the caller added to
# stack_pids.
#
#   stack_start WORK BIN TOPIC:PARTITIONS   sets stack_port and stack_bootstrap
#   stack_start_fashion WORK BIN COPIES     stack_start with topic fashion, and
#                                           the Fashion-MNIST training set
#                                           produced into it COPIES times (f32,
#                                           round-robin, 48 partitions a copy)
#   stack_pids+=($!)                        a process of the caller's, stopped too
#   stack_stop WORK                         SIGTERM and wait, last started first;
#                                           removes WORK

stack_pids=()

stack_start() {
    local work=$1 bin=$2 topic=$3
    stack_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    redis-server --port "$stack_port" --bind 127.0.0.1 --dir "$work" --save "" \
        --appendonly no >"$work/redis.log" 2>&1 &
    stack_pids+=($!)
    "$bin" broker --topic "$topic" --bootstrap-file "$work/bootstrap" >"$work/broker.log" 2>&1 &
    stack_pids+=($!)
    for _ in $(seq 100); do
        [ -s "$work/bootstrap" ] && redis-cli -p "$stack_port" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    if ! [ -s "$work/bootstrap" ] || ! redis-cli -p "$stack_port" ping >/dev/null 2>&1; then
        echo "stack: redis-server or the dev broker did not start (see $work)" >&2
        return 1
    fi
    stack_bootstrap=$(cat "$work/bootstrap")
}

# The dev broker keeps 5 MiB (1,670 f32 records of 784 features) a partition
# and drops older records, hence 48 partitions for each 60,000-record copy.
stack_start_fashion() {
    local work=$1 bin=$2 copies=$3 fm=/usr/share/datasets/fashion-mnist
    stack_start "$work" "$bin" "fashion:$((48 * copies))" || return 1
    for _ in $(seq "$copies"); do
        "$bin" produce --bootstrap "$stack_bootstrap" --topic fashion --format idx --encode f32 \
            --features 784 --data "$fm/train-images-idx3-ubyte.gz" \
            --labels "$fm/train-labels-idx1-ubyte.gz" --partitions-by roundrobin \
            >>"$work/produce.log" || return 1
    done
}

stack_stop() {
    local work=$1 i
    set +e
    for ((i = ${#stack_pids[@]} - 1; i >= 0; i--)); do
        kill -TERM "${stack_pids[$i]}" 2>/dev/null && wait "${stack_pids[$i]}" 2>/dev/null
    done
    rm -rf "$work"
}
