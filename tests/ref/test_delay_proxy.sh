#!/usr/bin/env bash
# delay_proxy (tests/tools/delay_proxy.c), the distant Redis of bench/README.md
# "A distant store", in front of a real redis-server: with 1000 us each way a
# PING's round trip (timed by tests/ref/proxy_client.py on a bare socket) is
# at least 2 ms, its median under 20 ms; 1 MB set with redis-cli comes back
# byte for byte through it and is stored byte for byte; 2,000 pipelined
# INCRs are answered in order and 32 MiB of pipelined values come back
# exact; a client that closes closes its Redis connection, and a Redis
# connection killed closes the client's; a target that reads nothing leaves
# the proxy taking 64 MiB or more and holding at most 128 MiB resident;
# with 0 us the median round trip is under 2 ms; bad arguments exit 2 and
# SIGTERM exits 0 with its counts. Prints its counts.
# usage: [DELAY_PROXY=P] bash tests/ref/test_delay_proxy.sh [FRESHET]
#        (FRESHET, build/freshet by default, starts the stack's dev broker;
#        the proxy is DELAY_PROXY, which ctest sets, or tests/delay_proxy
#        beside FRESHET)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
bin=$(realpath "${1:-build/freshet}")
proxy=$(realpath "${DELAY_PROXY:-$(dirname "$bin")/tests/delay_proxy}")
client=(python3 tests/ref/proxy_client.py)
passed=0 failed=0
[ -x "$proxy" ] || { echo "FAIL: no delay_proxy at $proxy (cmake --build build)"; exit 1; }
export DELAY_PROXY=$proxy # for stack_start_proxy
work=$(mktemp -d /tmp/freshet-proxy-XXXXXX)
# shellcheck source=deploy/stack.sh
. deploy/stack.sh
trap 'stack_stop "$work"' EXIT
stack_start "$work" "$bin" proxy:1 || stack_fail "$work" "test_delay_proxy: no redis-server"

# check NAME CONDITION...: counts the test command's outcome
check() {
    local name=$1
    shift
    if "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL: $name"
    fi
}
# awk_true EXPRESSION: exit status 0 where the awk expression holds
awk_true() { awk "BEGIN { exit !($1) }"; }
# numbers VALUE...: exit status 0 where every value is a decimal number (awk
# would take a word for 0)
numbers() {
    local v
    for v; do [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || return 1; done
}

# start_proxy DELAY_US: a delay_proxy on a port the kernel picks, in front
# of the redis-server; sets pport and proxy_pid
start_proxy() {
    stack_start_proxy "$work" "$stack_port" "$1" "$bin" ||
        stack_fail "$work" "test_delay_proxy: no delay_proxy"
    pport=$stack_proxy_port proxy_pid=$stack_proxy_pid
}

# client_gone NAME: exit status 0 once no client named NAME is connected
# to the redis-server (within 3 s)
client_gone() {
    for _ in $(seq 60); do
        redis-cli -p "$stack_port" CLIENT LIST | grep -q "name=$1 " || return 0
        sleep 0.05
    done
    return 1
}

start_proxy 1000
grep -q "listening on 127.0.0.1:$pport" "$work/proxy1000.log"
check "the proxy prints the port it wrote" test $? -eq 0

read -r lo med hi < <("${client[@]}" ping "$pport" 200)
echo "1000 us each way: PING round trip min $lo ms, median $med, max $hi"
check "the client timed its PINGs ($lo $med $hi)" numbers "$lo" "$med" "$hi"
check "every round trip through 1000 us each way takes at least 2 ms (min $lo)" awk_true "$lo >= 2"
check "the median round trip is under 20 ms ($med)" awk_true "$med < 20"

head -c 1000000 /dev/urandom >"$work/blob"
redis-cli -p "$pport" -x SET proxy:blob <"$work/blob" >"$work/set.out"
check "SET of 1 MB through the proxy answers OK" grep -qx OK "$work/set.out"
redis-cli -p "$pport" --raw GET proxy:blob | head -c 1000000 >"$work/blob.proxy"
check "GET of 1 MB through the proxy returns the bytes set" cmp -s "$work/blob" "$work/blob.proxy"
redis-cli -p "$stack_port" --raw GET proxy:blob | head -c 1000000 >"$work/blob.direct"
check "the server holds the bytes set through the proxy" cmp -s "$work/blob" "$work/blob.direct"
check "its length is the bytes set" test "$(redis-cli -p "$stack_port" STRLEN proxy:blob)" = 1000000

out=$("${client[@]}" pipeline "$pport")
check "pipelined INCRs in order, 32 MiB of pipelined values exact ($out)" test "$out" = ok

# the client closes: its Redis connection closes (after the delay)
out=$("${client[@]}" name "$pport")
check "a client names itself through the proxy ($out)" test "$out" = ok
check "a client that closes leaves no connection at the server" client_gone proxytest
# the server closes: the client's connection closes
: >"$work/closed.out"
"${client[@]}" closed "$pport" >"$work/closed.out" &
cpid=$!
for _ in $(seq 100); do
    grep -q named "$work/closed.out" && break
    sleep 0.05
done
id=$(redis-cli -p "$stack_port" CLIENT LIST | sed -n 's/^id=\([0-9]*\) .*name=proxytest .*/\1/p')
redis-cli -p "$stack_port" CLIENT KILL ID "$id" >/dev/null
wait "$cpid"
check "a connection the server closes closes the client's ($(tail -1 "$work/closed.out"))" \
    grep -q "closed after" "$work/closed.out"
check "... and the server has no connection left of it" client_gone proxytest

read -r sent _ _ _ peak _ _ status < <("${client[@]}" flood "$proxy" 1000)
echo "a target that reads nothing: $sent bytes taken, proxy peak $peak KiB"
check "the client measured the flood ($sent $peak)" numbers "$sent" "$peak" "$status"
check "a target that reads nothing: the proxy takes its 64 MiB ($sent bytes)" \
    awk_true "$sent >= 64 * 1048576"
# unbounded, it would take hundreds of MB a second for 20 s; 128 MiB leaves
# room for a sanitizer's shadow memory
check "... and holds at most 128 MiB ($peak KiB)" awk_true "$peak <= 128 * 1024"
check "... and exits 0 on SIGTERM with 64 MiB queued (exit $status)" test "$status" = 0

kill -TERM "$proxy_pid"
wait "$proxy_pid"
check "SIGTERM: the proxy exits 0" test $? -eq 0
check "... with its counts" grep -q "connections (0 failed), [0-9]* bytes to the target" \
    "$work/proxy1000.log"

start_proxy 0
read -r lo med hi < <("${client[@]}" ping "$pport" 200)
echo "0 us: PING round trip min $lo ms, median $med, max $hi"
check "the client timed its PINGs ($lo $med $hi)" numbers "$lo" "$med" "$hi"
check "with no delay the median round trip is under 2 ms ($med)" awk_true "$med < 2"

"$proxy" --listen 0 --to nowhere --delay-us 1 >/dev/null 2>&1
check "--to without a port exits 2" test $? -eq 2
"$proxy" --listen 0 --to 127.0.0.1:1 >/dev/null 2>&1
check "no --delay-us exits 2" test $? -eq 2
"$proxy" --listen 70000 --to 127.0.0.1:1 --delay-us 1 >/dev/null 2>&1
check "--listen 70000 exits 2" test $? -eq 2

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
