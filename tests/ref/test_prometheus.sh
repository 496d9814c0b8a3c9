#!/usr/bin/env bash
# The Prometheus rules and a real Prometheus server (Debian's prometheus):
# promtool checks deploy/prometheus/freshet.rules.yml and runs its unit
# tests (freshet.rules.test.yml: every alert fires on what it watches for
# and not on healthy series); then a prometheus on a free loopback port,
# with those rules, scrapes a training freshet run every second, and its
# HTTP API must return freshet's series with the values freshet's own
# /metrics shows, the recording rules evaluated without error, and the
# target up.
# usage: bash tests/ref/test_prometheus.sh FRESHET
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bin=$(realpath "${1:-build/freshet}")
for t in promtool prometheus; do
    command -v $t >/dev/null || { echo "test_prometheus: $t not found (apt-get install prometheus)" >&2; exit 1; }
done
promtool check rules deploy/prometheus/freshet.rules.yml
(cd deploy/prometheus && promtool test rules freshet.rules.test.yml)

work=$(mktemp -d /tmp/freshet-prom-XXXXXX)
# shellcheck source=deploy/stack.sh
. deploy/stack.sh
trap 'stack_stop "$work"' EXIT
stack_start "$work" "$bin" pm:2
url=redis://127.0.0.1:$stack_port/0
stack_produce_clouds "$work" "$bin" pm 300
# Both servers listen on port 0 and log the port the kernel gave them: a
# port picked free and closed could be taken by another process (a test
# beside this one) before the server binds it.
stack_conf "$work/run.conf" "$stack_bootstrap" "$url" "[model]" "name = pm" "layers = 4-16-3" \
    "loss = softmax" "[ingest]" "topic = pm" "format = csv" "features = 4" "batch = 16" \
    "[serve]" "listen = 127.0.0.1:0"
"$bin" run --config "$work/run.conf" >"$work/run.log" 2>&1 &
stack_pids+=($!)
port=$(stack_log_port "$work/run.log") || stack_fail "$work" "test_prometheus: no HTTP port in run.log"

cat >"$work/prometheus.yml" <<CONF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $root/deploy/prometheus/freshet.rules.yml
scrape_configs:
  - job_name: freshet
    static_configs:
      - targets: ['127.0.0.1:$port']
CONF
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address=127.0.0.1:0 --log.level=info >"$work/prometheus.log" 2>&1 &
stack_pids+=($!)
# its log line 'msg="Listening on" address=127.0.0.1:N' (at level info)
pport=""
for _ in $(seq 300); do
    pport=$(sed -n 's/.*msg="Listening on" address=127\.0\.0\.1:\([0-9]*\).*/\1/p' \
        "$work/prometheus.log" | head -n 1)
    [ -n "$pport" ] && break
    sleep 0.1
done
[ -n "$pport" ] || stack_fail "$work" "test_prometheus: prometheus logged no port"
api=http://127.0.0.1:$pport/api/v1

# the value of an instant query's single sample ("" while there is none)
query() {
    curl -sf --get "$api/query" --data-urlencode "query=$1" |
        /usr/bin/python3 -c 'import json, sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if len(r) == 1 else "")'
}
fail() { stack_fail "$work" "test_prometheus: $*"; }

# training moves the version; Prometheus scrapes it
v=""
for _ in $(seq 120); do
    v=$(query 'freshet_model_version{job="freshet",model="pm"}' 2>/dev/null || true)
    [ -n "$v" ] && [ "${v%.*}" -ge 20 ] && break
    sleep 0.5
done
[ -n "$v" ] && [ "${v%.*}" -ge 20 ] || fail "no freshet_model_version >= 20 in Prometheus (got '$v')"
# what Prometheus holds is what freshet showed: never ahead of /metrics now,
# and within the versions a few scrapes make
now=$(curl -sf "http://127.0.0.1:$port/metrics" |
    awk '$1 == "freshet_model_version{model=\"pm\"}" { print $2 }')
[ -n "$now" ] || fail "freshet's /metrics lacks freshet_model_version"
awk -v p="$v" -v f="$now" 'BEGIN { exit !(p <= f && f - p < 2000) }' ||
    fail "Prometheus has version $v, freshet's /metrics $now"
echo "test_prometheus: freshet_model_version in Prometheus $v, in freshet's /metrics $now"
[ "$(query 'up{job="freshet"}')" = 1 ] || fail "the target is not up"
# a counter through a recording rule: applied gradients per second
rate=""
for _ in $(seq 60); do
    rate=$(query 'freshet:gradients_applied:rate5m{model="pm"}' || true)
    [ -n "$rate" ] && awk -v r="$rate" 'BEGIN { exit !(r > 0) }' && break
    sleep 0.5
done
[ -n "$rate" ] && awk -v r="$rate" 'BEGIN { exit !(r > 0) }' ||
    fail "freshet:gradients_applied:rate5m is '$rate'"
echo "test_prometheus: freshet:gradients_applied:rate5m = $rate gradients/s"
# every rule loaded and evaluated without error; no alert fires on a healthy run
curl -sf "$api/rules" | /usr/bin/python3 -c 'import json, sys
groups = json.load(sys.stdin)["data"]["groups"]
rules = [r for g in groups for r in g["rules"]]
bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
firing = [r["name"] for r in rules if r["type"] == "alerting" and r["state"] == "firing"]
assert len(rules) == 12, len(rules)
assert not bad, bad
assert not firing, firing
print("test_prometheus: %d rules loaded, all healthy, none firing" % len(rules))'
