#!/usr/bin/env bash
# The Python client (clients/python) against a live freshet serve: installs
# the package with pip into a fresh venv (Debian's python3-venv, seeing
# Debian's numpy, torch and pytest; nothing downloaded), starts redis-server,
# the dev broker, two trainings that keep producing versions (a dense
# 4-16-3 softmax model from a looping csv stream, a sparse model from the
# synthetic click stream; both freshet run without HTTP) and one freshet
# serve for both, then runs the pytest suite clients/python/tests from
# outside the source tree, so that it imports the installed package. The
# suite also runs the README's client example.
# usage: bash tests/ref/test_python_client.sh FRESHET
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bin=$(realpath "${1:-build/freshet}")
py=/usr/bin/python3
if ! $py -c 'import numpy, pytest, venv' 2>/dev/null; then
    echo "test_python_client: needs Debian's python3-numpy, python3-pytest, python3-venv" >&2
    exit 1
fi
work=$(mktemp -d /tmp/freshet-pyclient-XXXXXX)
# shellcheck source=deploy/stack.sh
. deploy/stack.sh
trap 'stack_stop "$work"' EXIT
stack_start "$work" "$bin" dense:4
"$bin" broker --topic clicks:4 --bootstrap-file "$work/bootstrap2" >"$work/broker2.log" 2>&1 &
stack_pids+=($!)
for _ in $(seq 100); do [ -s "$work/bootstrap2" ] && break; sleep 0.1; done
url=redis://127.0.0.1:$stack_port/0

# three classes of four features, learnable in a few hundred samples
stack_produce_clouds "$work" "$bin" dense 300
"$bin" produce --bootstrap "$(cat "$work/bootstrap2")" --synthetic ctr --topic clicks --rate 500 \
    >"$work/produce2.log" 2>&1 &
stack_pids+=($!)

stack_conf "$work/dense.conf" "$stack_bootstrap" "$url" "[model]" "name = dense" "layers = 4-16-3" \
    "loss = softmax" "[ingest]" "topic = dense" "format = csv" "features = 4" "batch = 16" \
    "[psstore]" "snapshot_every = 20" "snapshot_seconds = 0" "[controller]" "lr = 0.05"
stack_conf "$work/sparse.conf" "$(cat "$work/bootstrap2")" "$url" "[model]" "name = clicks" \
    "sparse = fields:39,buckets:2^16,dim:4" "[ingest]" "topic = clicks" "format = criteo" \
    "batch = 64"
"$bin" run --config "$work/dense.conf" >"$work/run-dense.log" 2>&1 &
stack_pids+=($!)
"$bin" run --config "$work/sparse.conf" >"$work/run-sparse.log" 2>&1 &
stack_pids+=($!)
"$bin" model create --redis "$url" --name still --layers 4-16-3 --loss softmax >/dev/null
# port 0: serve binds a port the kernel picks and logs it, where a port
# picked free and closed could be taken by another process before the bind
FRESHET_TOKEN=py-client-token "$bin" serve --set "redis.url=$url" --set model.name=dense \
    --set "serve.listen=127.0.0.1:0" >"$work/serve.log" 2>&1 &
stack_pids+=($!)
port=$(stack_log_port "$work/serve.log") || stack_fail "$work" "test_python_client: serve did not start:"

# the package, installed as a user would (no index: Debian's numpy is it)
$py -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --no-index --no-build-isolation \
    "$root/clients/python" >"$work/pip.log" 2>&1 || { cat "$work/pip.log" >&2; exit 1; }
rm -rf "$root/clients/python/build" "$root/clients/python/"*.egg-info

# both models train and serve answers before the suite starts
for _ in $(seq 150); do
    ok=1
    for m in dense clicks; do
        v=$(curl -s "http://127.0.0.1:$port/v2/models/$m" |
            sed -n 's/.*"version":\([0-9]*\).*/\1/p')
        [ "${v:-0}" -ge 5 ] || ok=0
    done
    [ "$ok" = 1 ] && break
    sleep 0.2
done
[ "$ok" = 1 ] || stack_fail "$work" "test_python_client: the models did not train:"
cd "$work"
FRESHET_URL=http://127.0.0.1:$port FRESHET_TOKEN=py-client-token FRESHET_README=$root/README.md \
    "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/clients/python/tests"
