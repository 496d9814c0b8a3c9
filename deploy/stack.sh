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
#   stack_start_cluster WORK                a Redis Cluster beside: 3 masters with a
#                                           replica each on free loopback ports;
#                                           sets stack_cluster_url (every node a
#                                           seed) and stack_cluster_port (one node)
#   stack_produce_clouds WORK BIN TOPIC RATE
#                                           a small dense stream for tests: 3 classes
#                                           of 4 features (Gaussian clouds), csv,
#                                           produced into TOPIC at RATE a second,
#                                           in a loop, until stack_stop
#   stack_log_port LOG                      the port freshet serves on with [serve]
#                                           listen = 127.0.0.1:0, from its log
#   stack_start_proxy WORK PORT DELAY_US FRESHET
#                                           a delay_proxy (tests/tools/delay_proxy.c) on a
#                                           loopback port the kernel picks, in front of
#                                           127.0.0.1:PORT, every byte DELAY_US later each
#                                           way (bench/README.md "A distant store"): the
#                                           binary is $DELAY_PROXY, or tests/delay_proxy
#                                           beside FRESHET; sets stack_proxy_port and
#                                           stack_proxy_pid; its log is WORK/proxyDELAY_US.log
#   stack_proxy_cpu                         CPU seconds the delay_proxy has used so far
#   stack_conf FILE BOOTSTRAP URL [LINE]... a freshet configuration for tests: the
#                                           broker, the group's timeouts, Redis,
#                                           no HTTP, one worker, then the lines
#   stack_fail WORK MESSAGE                 MESSAGE and the last lines of every log in
#                                           WORK on stderr, then exit 1
#   stack_pids+=($!)                        a process of the caller's, stopped too
#   stack_stop WORK                         SIGTERM and wait, last started first;
#                                           removes WORK

stack_pids=()

# Nonzero unless the redis-server on port $1 is the one whose folder is $2:
# a free port may be taken by another process (a test beside this one)
# before ours binds it, and then another's server answers the ping.
stack_redis_ours() {
    [ "$(redis-cli -p "$1" config get dir 2>/dev/null | tail -1)" = "$(cd "$2" && pwd -P)" ]
}

# A redis-server on $stack_port in folder $1, without persistence, in the
# background ($! is its PID).
stack_redis_launch() {
    redis-server --port "$stack_port" --bind 127.0.0.1 --dir "$1" --save "" \
        --appendonly no >"$1/redis.log" 2>&1 &
}

stack_start() {
    local work=$1 bin=$2 topic=$3 attempt r
    stack_port=$(stack_free_port)
    stack_redis_launch "$work"
    stack_pids+=($!)
    r=$((${#stack_pids[@]} - 1)) # Redis first, the broker second (benchmarks count on it)
    "$bin" broker --topic "$topic" --bootstrap-file "$work/bootstrap" >"$work/broker.log" 2>&1 &
    stack_pids+=($!)
    for attempt in 1 2 3; do
        for _ in $(seq 100); do
            redis-cli -p "$stack_port" ping >/dev/null 2>&1 && break
            sleep 0.1
        done
        stack_redis_ours "$stack_port" "$work" && break
        [ "$attempt" = 3 ] && break
        echo "stack: port $stack_port answered by another redis-server; another port" >&2
        kill -TERM "${stack_pids[$r]}" 2>/dev/null && wait "${stack_pids[$r]}" 2>/dev/null
        stack_port=$(stack_free_port)
        stack_redis_launch "$work"
        stack_pids[r]=$!
    done
    for _ in $(seq 100); do
        [ -s "$work/bootstrap" ] && break
        sleep 0.1
    done
    if ! [ -s "$work/bootstrap" ] || ! stack_redis_ours "$stack_port" "$work"; then
        echo "stack: redis-server or the dev broker did not start (see $work)" >&2
        return 1
    fi
    stack_bootstrap=$(cat "$work/bootstrap")
}

stack_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The port of a freshet server started with [serve] listen = 127.0.0.1:0:
# the kernel picks a free port as it binds, so no other process can take it
# between a pick and the bind, as it can one from stack_free_port. Waits up
# to 30 s for the "serve: listening on ... (port N)" line in log $1 and
# prints N; nonzero without one.
stack_log_port() {
    local port
    for _ in $(seq 300); do
        port=$(sed -n 's/.*serve: listening on .*(port \([0-9]*\)).*/\1/p' "$1" 2>/dev/null | tail -n 1)
        [ -n "$port" ] && echo "$port" && return 0
        sleep 0.1
    done
    echo "stack: no \"serve: listening on ... (port N)\" in $1" >&2
    return 1
}

stack_start_cluster() {
    local work=$1 i port ports=() seeds=() ok
    for i in 0 1 2 3 4 5; do
        port=$(stack_free_port)
        mkdir -p "$work/cluster$i"
        # the bus port is not port + 10000, which may pass 65535
        redis-server --port "$port" --bind 127.0.0.1 --dir "$work/cluster$i" --save "" \
            --appendonly no --cluster-enabled yes --cluster-config-file nodes.conf \
            --cluster-node-timeout 2000 --cluster-port "$(stack_free_port)" \
            --repl-diskless-sync-delay 0 >"$work/cluster$i.log" 2>&1 &
        stack_pids+=($!)
        ports+=("$port")
        seeds+=("127.0.0.1:$port")
    done
    for port in "${ports[@]}"; do
        for _ in $(seq 100); do
            redis-cli -p "$port" ping >/dev/null 2>&1 && break
            sleep 0.1
        done
    done
    redis-cli --cluster create "${seeds[@]}" --cluster-replicas 1 --cluster-yes \
        >"$work/cluster-create.log" 2>&1 || {
        echo "stack: redis-cli --cluster create failed (see $work/cluster-create.log)" >&2
        return 1
    }
    for _ in $(seq 200); do
        ok=1
        for port in "${ports[@]}"; do
            redis-cli -p "$port" cluster info | grep -q cluster_state:ok || ok=0
            if redis-cli -p "$port" info replication | grep -q role:slave; then
                redis-cli -p "$port" info replication | grep -q master_link_status:up || ok=0
            fi
        done
        [ "$ok" = 1 ] && break
        sleep 0.1
    done
    [ "$ok" = 1 ] || { echo "stack: the Redis Cluster did not come up (see $work)" >&2; return 1; }
    # shellcheck disable=SC2034 # both are the caller's
    stack_cluster_url="redis://$(IFS=,; echo "${seeds[*]}")" stack_cluster_port=${ports[0]}
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

stack_produce_clouds() {
    local work=$1 bin=$2 topic=$3 rate=$4
    python3 -c 'import random
random.seed(3)
c = [(2, 0, 0, 1), (0, 2, 1, 0), (-1, -1, 2, 2)]
for i in range(3000):
    y = i % 3
    print(",".join([str(y)] + ["%.4f" % (v + random.gauss(0, 0.7)) for v in c[y]]))' \
        >"$work/$topic.csv"
    "$bin" produce --bootstrap "$stack_bootstrap" --topic "$topic" --data "$work/$topic.csv" \
        --format csv --encode csv --features 4 --rate "$rate" --loop >"$work/produce-$topic.log" 2>&1 &
    stack_pids+=($!)
}

stack_start_proxy() {
    local work=$1 port=$2 delay=$3 proxy=${DELAY_PROXY:-$(dirname "$4")/tests/delay_proxy}
    if ! [ -x "$proxy" ]; then
        echo "stack: no delay_proxy at $proxy (cmake --build builds it beside freshet)" >&2
        return 1
    fi
    rm -f "$work/proxy.port"
    "$proxy" --listen 0 --to "127.0.0.1:$port" --delay-us "$delay" \
        --port-file "$work/proxy.port" >"$work/proxy$delay.log" 2>&1 &
    stack_pids+=($!)
    stack_proxy_pid=$!
    for _ in $(seq 100); do
        [ -s "$work/proxy.port" ] && break
        sleep 0.05
    done
    if ! [ -s "$work/proxy.port" ]; then
        echo "stack: delay_proxy wrote no port (see $work/proxy$delay.log)" >&2
        return 1
    fi
    # shellcheck disable=SC2034 # the caller's
    stack_proxy_port=$(cat "$work/proxy.port")
}

stack_proxy_cpu() {
    awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / hz }' \
        "/proc/$stack_proxy_pid/stat"
}

stack_conf() {
    local file=$1 bootstrap=$2 url=$3
    shift 3
    {
        printf '[kafka]\nbootstrap.servers = %s\nsession.timeout.ms = 6000\n' "$bootstrap"
        printf 'heartbeat.interval.ms = 500\n[redis]\nurl = %s\n[serve]\nlisten =\n' "$url"
        printf '[trainer]\nworkers = 1\n'
        printf '%s\n' "$@"
    } >"$file"
}

stack_fail() {
    local work=$1 f
    echo "$2" >&2
    for f in "$work"/*.log; do
        echo "== $f" >&2
        tail -n 5 "$f" >&2
    done
    exit 1
}

stack_stop() {
    local work=$1 i
    set +e
    for ((i = ${#stack_pids[@]} - 1; i >= 0; i--)); do
        kill -TERM "${stack_pids[$i]}" 2>/dev/null && wait "${stack_pids[$i]}" 2>/dev/null
    done
    rm -rf "$work"
}
