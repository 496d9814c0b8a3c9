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
#
# Then predictions: POST /v2/models/bench/infer with one 784-feature sample
# (KServe v2 JSON), closed loop at 1, 16 and 64 connections (req/s, p50
# and p99 latency from wrk), and paced at about 1,000 req/s (16
# connections, each waiting 15 ms between requests); against the same
# prediction by PyTorch in-process on one thread (bench/torch_infer.py:
# the JSON parsed, the forward pass, the answer written), after checking
# that both give the same probabilities.
# usage: [ROUNDS=N] [SECONDS_EACH=S] [CONNECTIONS=C] [THREADS=T] [PARTS="weights infer"]
#        bench/serve.sh [FRESHET]
#        (defaults: 3 rounds of 5 s, 64 connections, 2 wrk threads, both parts,
#        build/freshet)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build/freshet}")
rounds=${ROUNDS:-3}
secs=${SECONDS_EACH:-5}
conns=${CONNECTIONS:-64}
threads=${THREADS:-2}
parts=${PARTS:-weights infer}
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

if [[ " $parts " == *" weights "* ]]; then
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
fi

[[ " $parts " == *" infer "* ]] || exit 0
# one sample of 784 features in [0, 1), as a client would send it
python3 -c 'import json, random
random.seed(7)
print(json.dumps({"inputs": [{"name": "x", "shape": [1, 784], "datatype": "FP32",
                              "data": [round(random.random(), 4) for _ in range(784)]}]}))' \
    >"$work/body.json"
curl -sf -o "$work/answer.json" -H 'Content-Type: application/json' \
    --data-binary @"$work/body.json" "$base/v2/models/bench/infer" ||
    { echo "serve.sh: infer failed (see $work/serve.log)" >&2; exit 1; }
cat >"$work/infer.lua" <<'LUA'
local f = io.open(os.getenv("INFER_BODY"), "rb")
wrk.body = f:read("*a")
f:close()
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local pause = tonumber(os.getenv("INFER_DELAY_MS") or "0")
if pause > 0 then
    function delay() return pause end
end
LUA
export INFER_BODY=$work/body.json
# wrk's latency percentile $1 ("50%") of the last run, in ms
pct() {
    awk -v p="$1" '$1 == p { v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v)
        print (u == "us" ? v / 1000 : u == "s" ? v * 1000 : u == "m" ? v * 60000 : v) }' "$work/wrk.txt"
}
# one infer run: $1 connections, $2 delay between a connection's requests (ms)
infer_run() {
    local t=$((threads < $1 ? threads : $1))
    INFER_DELAY_MS=$2 wrk -t"$t" -c"$1" -d"${secs}s" --latency -s "$work/infer.lua" \
        "$base/v2/models/bench/infer" >"$work/wrk.txt" 2>&1
    if grep -q "Non-2xx or 3xx" "$work/wrk.txt"; then
        echo "serve.sh: errors from infer:" >&2
        cat "$work/wrk.txt" >&2
        exit 1
    fi
    echo "$(awk '$1 == "Requests/sec:" { print $2 }' "$work/wrk.txt") $(pct 50%) $(pct 99%)"
}
echo
echo "freshet serve, POST /v2/models/bench/infer, one 784-feature sample a request, ${secs} s runs, $rounds rounds"
printf '%-6s %-9s %12s %10s %10s\n' round clients "req/s" "p50 ms" "p99 ms"
cases="1:0 16:0 64:0 16:15"
for r in $(seq "$rounds"); do
    for c in $cases; do
        out=$(infer_run "${c%%:*}" "${c##*:}")
        echo "$out" >>"$work/infer.$c"
        label=${c%%:*}
        [ "${c##*:}" = 0 ] || label="$label paced"
        read -r q p50 p99 <<<"$out"
        printf '%-6s %-9s %12.0f %10.2f %10.2f\n' "$r" "$label" "$q" "$p50" "$p99"
    done
done
col() { awk -v k="$1" '{ print $k }' | median; }
for c in $cases; do
    label=${c%%:*}
    [ "${c##*:}" = 0 ] || label="$label paced"
    printf '%-6s %-9s %12.0f %10.2f %10.2f   (spread of req/s %s-%s)\n' median "$label" \
        "$(col 1 <"$work/infer.$c")" "$(col 2 <"$work/infer.$c")" "$(col 3 <"$work/infer.$c")" \
        "$(awk '{ print $1 }' "$work/infer.$c" | sort -g | head -1 | xargs printf '%.0f')" \
        "$(awk '{ print $1 }' "$work/infer.$c" | sort -g | tail -1 | xargs printf '%.0f')"
done
read -r _ _ _ fw _ _ _ tq _ _ < <(/usr/bin/python3 bench/torch_infer.py "$work/static.bin" \
    "$work/body.json" "$rounds" 2000 "$work/answer.json" | tee "$work/torch.txt" | tail -1)
head -n -1 "$work/torch.txt"
q64=$(col 1 <"$work/infer.64:0")
p99paced=$(col 3 <"$work/infer.16:15")
qpaced=$(col 1 <"$work/infer.16:15")
awk -v q="$q64" -v fw="$fw" -v tq="$tq" -v p99="$p99paced" -v qp="$qpaced" -v cores="$(nproc)" 'BEGIN {
    printf "PyTorch in-process, one thread: forward %.1f us, with the JSON %.1f us a request\n", fw, tq
    printf "freshet at 64 clients: %.1f core-us a request (%d cores / req/s; wrk and the HTTP included)\n", cores * 1e6 / q, cores
    printf "per-request cost freshet/PyTorch (core-us against JSON and forward on one core): %.2f\n", (cores * 1e6 / q) / tq
    printf "paced at %.0f req/s: p99 %.2f ms   (target < 5 ms at 1,000 req/s)\n", qp, p99 }'
