#!/usr/bin/env bash
# Weights requests/s of freshet serve for a 784-256-10 model (813 KB of
# safetensors), measured with wrk (Debian's wrk) against the same server
# answering a static file of exactly the same bytes from memory (its
# /dashboard/chart.min.js route, pointed at a copy of the weights): the
# ratio is what finding the model's current weights and writing their
# headers costs over serving a file. The 304 path (If-None-Match with the
# current ETag) is measured against the server's smallest static answer,
# /livez. The machine drifts, so ROUNDS rounds alternate the four runs and
# the figures are medians.
# usage: [ROUNDS=N] [SECONDS_EACH=S] [CONNECTIONS=C] [THREADS=T] bench/serve.sh [FRESHET]
#        (defaults: 3 rounds of 5 s, 64 connections, 2 wrk threads, build/freshet)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build/freshet}")
rounds=${ROUNDS:-3}
secs=${SECONDS_EACH:-5}
conns=${CONNECTIONS:-64}
threads=${THREADS:-2}
command -v wrk >/dev/null || { echo "serve.sh: wrk not found (apt-get install wrk)" >&2; exit 2; }
work=$(mktemp -d /tmp/freshet-serve-bench-XXXXXX)
pids=()
cleanup() {
    set +e
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        kill -TERM "${pids[$i]}" 2>/dev/null && wait "${pids[$i]}" 2>/dev/null
    done
    rm -rf "$work"
}
trap cleanup EXIT
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --dir "$work" --save "" --appendonly no \
    >"$work/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
url=redis://127.0.0.1:$rport/0
"$bin" model create --redis "$url" --name bench --layers 784-256-10 --loss softmax >/dev/null

# serve on a free port with Chart.js's route pointed at $1
start_serve() {
    hport=$(free_port)
    "$bin" serve --set model.name=bench --set "redis.url=$url" \
        --set "serve.listen=127.0.0.1:$hport" --set "serve.chartjs=$1" >"$work/serve.log" 2>&1 &
    spid=$!
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$hport/readyz" >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    echo "serve.sh: freshet serve did not become ready (see $work/serve.log)" >&2
    cat "$work/serve.log" >&2
    exit 1
}
# the weights as served, to make the static file of the same bytes
start_serve ""
base=http://127.0.0.1:$hport
curl -sf -o "$work/static.bin" "$base/v2/models/bench/weights"
etag=$(curl -sf -D - -o /dev/null "$base/v2/models/bench/weights" | tr -d '\r' |
    awk -F': ' 'tolower($1) == "etag" { print $2 }')
kill -TERM "$spid" && wait "$spid" 2>/dev/null || true
start_serve "$work/static.bin"
pids+=("$spid")
base=http://127.0.0.1:$hport
size=$(stat -c %s "$work/static.bin")
got=$(curl -sf "$base/dashboard/chart.min.js" | cmp - "$work/static.bin" && echo same)
[ "$got" = same ] || { echo "serve.sh: the static route does not serve the file" >&2; exit 1; }

# requests/s of one wrk run: $1 path, $2.. extra wrk arguments
rps() {
    local path=$1
    shift
    wrk -t"$threads" -c"$conns" -d"${secs}s" --latency "$@" "$base$path" >"$work/wrk.txt" 2>&1
    if grep -q "Non-2xx or 3xx" "$work/wrk.txt"; then
        echo "serve.sh: errors from $path:" >&2
        cat "$work/wrk.txt" >&2
        exit 1
    fi
    awk '$1 == "Requests/sec:" { print $2 }' "$work/wrk.txt"
}
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

echo "freshet serve, 784-256-10 weights ($size bytes of safetensors), wrk -t$threads -c$conns, ${secs} s runs, $rounds rounds"
printf '%-6s %14s %14s %14s %14s\n' round "static 200" "weights 200" "livez 200" "weights 304"
: >"$work/static" >"$work/weights" >"$work/livez" >"$work/nm"
for r in $(seq "$rounds"); do
    s=$(rps /dashboard/chart.min.js)
    w=$(rps /v2/models/bench/weights)
    l=$(rps /livez)
    n=$(rps /v2/models/bench/weights -H "If-None-Match: $etag")
    echo "$s" >>"$work/static"
    echo "$w" >>"$work/weights"
    echo "$l" >>"$work/livez"
    echo "$n" >>"$work/nm"
    printf '%-6s %14.0f %14.0f %14.0f %14.0f\n' "$r" "$s" "$w" "$l" "$n"
done
ms=$(median <"$work/static")
mw=$(median <"$work/weights")
ml=$(median <"$work/livez")
mn=$(median <"$work/nm")
printf '%-6s %14.0f %14.0f %14.0f %14.0f\n' median "$ms" "$mw" "$ml" "$mn"
awk -v s="$ms" -v w="$mw" -v l="$ml" -v n="$mn" 'BEGIN {
    printf "weights/static (200, same bytes): %.2f   (target >= 0.8)\n", w / s
    printf "weights 304/livez (smallest static answer): %.2f\n", n / l
    printf "weights throughput: %.0f MB/s\n", w * '"$size"' / 1e6 }'
