#!/usr/bin/env bash
# freshet compare against the store it measured: a redis-server and the dev
# broker on free loopback ports (deploy/stack.sh, stopped by PID), 16,000
# Fashion-MNIST samples produced once, then compare with modes async and
# sync, 2 workers, 1 seed, 10,000 samples per run (16 partitions: the dev
# broker keeps 5 MiB of each). Checks report.json
# against Redis (redis-cli) and the freshet commands, not against itself:
#   - each run's samples and versions against its versions stream, and its
#     samples against the positions its offsets hash records;
#   - each run's accuracy against freshet model export + freshet eval, to 1e-4;
#   - the curve's points against the evals stream and the versions stream;
#   - time to target: the first curve point at or above the target;
#   - bad arguments: exit 2 with the reason;
# and report.html in headless chromium (tests/integration/report_check.sh:
# 2 charts of 2 datasets, no page error), with its screenshot in $ARTIFACTS
# (default build/artifacts/compare). Nothing is skipped: the data, redis-server
# and chromium come from deploy/setup.sh, and a missing one fails the test.
# usage: $0 FRESHET
set -euo pipefail
F=$(realpath "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
fm=/usr/share/datasets/fashion-mnist
if [ ! -f "$fm/train-images-idx3-ubyte.gz" ] || ! command -v redis-server >/dev/null; then
    echo "FAIL: needs $fm (apt-get install dataset-fashion-mnist) and redis-server"
    exit 1
fi
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d /tmp/freshet-compare-XXXXXX)
# shellcheck source=deploy/stack.sh
. "$root/deploy/stack.sh"
trap 'stack_stop "$work"' EXIT
stack_start "$work" "$F" fashion:16
"$F" produce --bootstrap "$stack_bootstrap" --topic fashion --format idx --encode f32 \
    --data "$fm/train-images-idx3-ubyte.gz" --labels "$fm/train-labels-idx1-ubyte.gz" \
    --partitions-by roundrobin --limit 16000 >"$work/produce.log"
cat >"$work/c.conf" <<EOC
[model]
name = cmp
layers = 784-256-10
loss = softmax
[kafka]
bootstrap.servers = $stack_bootstrap
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
every = 20
EOC

fails=0
expect_usage() { # message args...
    local msg=$1 out rc=0
    shift
    out=$("$F" compare "$@" 2>&1) || rc=$?
    if [ "$rc" -ne 2 ] || ! grep -qF -- "$msg" <<<"$out"; then
        echo "FAIL: compare $* -> $rc: $out"
        fails=$((fails + 1))
    else
        echo "ok: compare $* -> 2: $msg"
    fi
}
expect_usage "unknown mode 'fast'" --config "$work/c.conf" --modes async,fast
expect_usage "--workers expects an integer in 1..1024, got '0'" --config "$work/c.conf" --workers 2,0
expect_usage "--config F is required" --modes async
expect_usage "unknown option '--bogus'" --config "$work/c.conf" --bogus
expect_usage "[eval] data is empty" --config "$work/c.conf" --set eval.data=
expect_usage "no-such.conf" --config "$work/no-such.conf"

start=$(date +%s)
"$F" compare --config "$work/c.conf" --modes async,sync --workers 2 --seeds 1 --samples 10000 \
    --out "$work/out"
echo "compare took $(($(date +%s) - start)) s"

# the store's view of each run: versions stream, offsets, export + eval
for model in $(python3 -c 'import json,sys; print(" ".join(r["model"] for r in json.load(open(sys.argv[1]))["runs"]))' "$work/out/report.json"); do
    redis-cli -p "$stack_port" --raw XRANGE "freshet:{$model}:versions" - + >"$work/$model.versions"
    redis-cli -p "$stack_port" --raw XRANGE "freshet:{$model}:evals" - + >"$work/$model.evals"
    redis-cli -p "$stack_port" --raw HVALS "freshet:{$model}:offsets" >"$work/$model.offsets"
    "$F" model export --redis "redis://127.0.0.1:$stack_port/0" --name "$model" \
        --out "$work/$model.safetensors" >/dev/null
    "$F" eval --weights "$work/$model.safetensors" --format idx --data "$fm/t10k-images-idx3-ubyte.gz" \
        --labels "$fm/t10k-labels-idx1-ubyte.gz" >"$work/$model.eval"
done

/usr/bin/python3 - "$work" <<'PY' || fails=$((fails + 1))
import json, math, re, sys
work = sys.argv[1]
rep = json.load(open(work + "/out/report.json"))
checks = []
def check(name, ok, value):
    checks.append((name, bool(ok), value))

def stream(path):
    """redis-cli --raw XRANGE output (an id line, then field and value lines) as dicts."""
    lines, out, i = open(path).read().split("\n"), [], 0
    while i < len(lines):
        if not re.fullmatch(r"\d+-\d+", lines[i]):
            i += 1
            continue
        e, i = {}, i + 1
        while i + 1 < len(lines) and lines[i] and not re.fullmatch(r"\d+-\d+", lines[i]):
            e[lines[i]] = lines[i + 1]
            i += 2
        out.append(e)
    return out

check("two runs", len(rep["runs"]) == 2, len(rep["runs"]))
mid = 0  # curve points between the first and the final, over the runs
for r in rep["runs"]:
    m = r["model"]
    check(m + " measured", r["ok"], r.get("error"))
    if not r["ok"]:
        continue
    vs = [e for e in stream(work + "/" + m + ".versions") if "rollback_from" not in e]
    n = sum(int(e["n"]) for e in vs)
    check(m + " samples == sum of n in the versions stream", r["samples"] == n, (r["samples"], n))
    check(m + " samples >= --samples", r["samples"] >= rep["samples"], r["samples"])
    # run --samples stops on the applier's own count: the summary agrees with the store,
    # and the applier took at most one update past the limit (a batch, or a round of 2)
    su = json.load(open(work + "/out/runs/" + m + ".summary.json"))
    check(m + " run stopped by --samples", su["stopped_by"] == "samples", su["stopped_by"])
    check(m + " summary applied_samples == the versions stream's", su["applied_samples"] == n, (su["applied_samples"], n))
    check(m + " at most one update past --samples", n - rep["samples"] < 2 * 64, n)
    check(m + " versions == entries of the versions stream", r["versions"] == len(vs), (r["versions"], len(vs)))
    check(m + " final_version == the last entry's version", r["final_version"] == int(vs[-1]["version"]), (r["final_version"], vs[-1]["version"]))
    pos = 0
    for v in open(work + "/" + m + ".offsets").read().split():
        w, _, rest = v.partition(";")
        pos += int(w) + sum(int(b) - int(a) for a, b in (iv.split("-") for iv in rest.split(",") if iv))
    check(m + " samples == positions recorded in the offsets hash", r["samples"] == pos, (r["samples"], pos))
    ev = json.load(open(work + "/" + m + ".eval"))
    check(m + " accuracy == freshet eval of the exported weights (1e-4)", abs(r["accuracy"] - ev["accuracy"]) < 1e-4, (r["accuracy"], ev["accuracy"]))
    t = [int(e["t"]) for e in vs]
    check(m + " wall_s == last t - first t", abs(r["wall_s"] - (t[-1] - t[0]) / 1000) < 1e-6, (r["wall_s"], t[0], t[-1]))
    sps = (n - int(vs[0]["n"])) / ((t[-1] - t[0]) / 1000)
    check(m + " samples_per_s from the versions stream", abs(r["samples_per_s"] - sps) < 1e-6 * sps, (r["samples_per_s"], sps))
    taus = sorted(int(e["tau"]) for e in vs)
    p99 = taus[max(0, math.ceil(0.99 * len(taus)) - 1)]
    check(m + " tau_p99 by nearest rank", r["tau_p99"] == p99, (r["tau_p99"], p99))
    cum, by_v = 0, {}
    for e in vs:
        cum += int(e["n"])
        by_v[int(e["version"])] = (cum, (int(e["t"]) - t[0]) / 1000)
    by_v[0] = (0, 0.0)
    evals = {int(e["version"]): float(e["accuracy"]) for e in stream(work + "/" + m + ".evals")}
    curve = r["curve"]
    # the evaluation at version 0 and the final weights at least; run's
    # holdout looks every 50 ms for 20 new versions, and a run here takes
    # a quarter of a second: a point between them is checked over both runs
    # below
    check(m + " curve has its first and final points", len(curve) >= 2, len(curve))
    mid += len(curve) - 2
    bad = [p for p in curve if by_v.get(p["version"]) != (p["samples"], p["t_s"])]
    check(m + " curve stamped with the versions' samples and time", not bad, bad[:2])
    bad = [p for p in curve[:-1] if abs(evals.get(p["version"], -1) - p["accuracy"]) > 1e-6]
    check(m + " curve accuracies from the evals stream", not bad, bad[:2])
    check(m + " curve ends at the final weights", curve[-1]["version"] == r["final_version"] and abs(curve[-1]["accuracy"] - r["accuracy"]) < 1e-9, curve[-1])
    first = next((p for p in curve if p["accuracy"] >= rep["target"]), None)
    want = (first["t_s"], first["samples"]) if first else (None, None)
    check(m + " time and samples to target at the first crossing", (r["target_t_s"], r["target_samples"]) == want, ((r["target_t_s"], r["target_samples"]), want))
check("the curves have points between their first and final", mid >= 1, mid)
best = max(a["accuracy_mean"] for a in rep["aggregates"])
check("default target == 0.98 x the best mean", abs(rep["target"] - 0.98 * best) < 1e-9, (rep["target"], best))
for a in rep["aggregates"]:
    r = next(r for r in rep["runs"] if r["mode"] == a["mode"])
    check(a["mode"] + " aggregate of one seed == its run", a["accuracy_mean"] == r["accuracy"] and a["accuracy_sd"] == 0, (a["accuracy_mean"], r["accuracy"]))
check("a verdict", any(v["question"] == "ended most accurate" for v in rep["verdict"]), len(rep["verdict"]))
failed = 0
for name, ok, value in checks:
    print(f"{'ok' if ok else 'FAIL'}: {name} ({value})")
    failed += not ok
print(f"{len(checks) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
for f in report.md report.html; do
    [ -s "$work/out/$f" ] || { echo "FAIL: $f missing"; fails=$((fails + 1)); }
done
art=${ARTIFACTS:-$root/build/artifacts/compare}
mkdir -p "$art"
cp "$work/out/report.md" "$work/out/report.json" "$work/out/report.html" "$art/"
if [ -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
    bash "$root/tests/integration/report_check.sh" "$work/out/report.html" "$art" 2 2 ||
        fails=$((fails + 1))
else
    echo "FAIL: the report's chromium check: no ${CHROMIUM:-/usr/bin/chromium} (apt-get install chromium)"
    fails=$((fails + 1))
fi
[ "$fails" -eq 0 ] && echo "test_compare: all checks passed"
exit $((fails > 0))
