#!/usr/bin/env bash
# deploy/compose.yml, the distributed layout, validated without Docker
# running: docker-compose config (Debian's docker-compose) must accept it
# and refuse it without FRESHET_TOKEN; the resolved file must hold the
# layout docs/operations.md describes (Kafka in KRaft mode, six Redis
# Cluster nodes joined with a replica each, freshet ps, two freshet train,
# two freshet serve on 8081 and 8082, each reading the mounted
# configuration); the Redis seeds in deploy/compose/freshet.conf must be the
# six nodes' addresses; and freshet check must accept that configuration.
# usage: bash tests/ref/test_compose.sh FRESHET
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "${1:-build/freshet}")
command -v docker-compose >/dev/null ||
    { echo "test_compose: docker-compose not found (apt-get install docker-compose)" >&2; exit 1; }
/usr/bin/python3 -c 'import yaml' 2>/dev/null ||
    { echo "test_compose: /usr/bin/python3 has no yaml (apt-get install python3-yaml)" >&2; exit 1; }
work=$(mktemp -d /tmp/freshet-compose-XXXXXX)
trap 'rm -rf "$work"' EXIT

if env -u FRESHET_TOKEN docker-compose -f deploy/compose.yml config -q >"$work/out" 2>&1; then
    echo "test_compose: accepted without FRESHET_TOKEN" >&2
    exit 1
fi
grep -q "set FRESHET_TOKEN" "$work/out" ||
    { echo "test_compose: no word of FRESHET_TOKEN:" >&2; cat "$work/out" >&2; exit 1; }
FRESHET_TOKEN=compose-test docker-compose -f deploy/compose.yml config >"$work/resolved.yml"
"$bin" check --config deploy/compose/freshet.conf | tee "$work/check.txt"
grep -q "model fashion (784-256-10 softmax" "$work/check.txt"
grep -q "the cluster's seeds: 6" "$work/check.txt"

/usr/bin/python3 - "$work/resolved.yml" deploy/compose/freshet.conf "$PWD" <<'PY'
import re
import sys

import yaml

doc = yaml.safe_load(open(sys.argv[1]))
conf = open(sys.argv[2]).read()
root = sys.argv[3]  # the image is built from the repository
svc = doc["services"]
want = {"kafka", "redis-cluster-init", "ps", "train-1", "train-2", "serve-1", "serve-2", "produce"}
want |= {f"redis-{i}" for i in range(6)}
assert set(svc) == want, sorted(set(svc) ^ want)

k = svc["kafka"]["environment"]
assert "controller" in k["KAFKA_PROCESS_ROLES"] and "broker" in k["KAFKA_PROCESS_ROLES"], k
assert not any("ZOOKEEPER" in key for key in k), "KRaft: no ZooKeeper"
assert k["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092"

nodes = []
for i in range(6):
    r = svc[f"redis-{i}"]
    cmd = r["command"]
    assert cmd[cmd.index("--cluster-enabled") + 1] == "yes", cmd
    assert cmd[cmd.index("--appendonly") + 1] == "yes", cmd
    nodes.append(r["networks"]["freshet"]["ipv4_address"])
assert len(set(nodes)) == 6
subnet = doc["networks"]["freshet"]["ipam"]["config"][0]["subnet"]
assert subnet == "172.28.0.0/16" and all(n.startswith("172.28.") for n in nodes), nodes
init = " ".join(svc["redis-cluster-init"]["command"])
assert re.findall(r"(\d+\.\d+\.\d+\.\d+):6379", init) == nodes, init
assert "--cluster-replicas 1" in init
deps = svc["redis-cluster-init"]["depends_on"]
assert all(deps[f"redis-{i}"]["condition"] == "service_healthy" for i in range(6))

seeds = re.search(r"^url = redis://(\S+)$", conf, re.M).group(1).split(",")
assert [s.rsplit(":", 1)[0] for s in seeds] == nodes, (seeds, nodes)
assert re.search(r"^bootstrap.servers = kafka:9092$", conf, re.M)

roles = {"ps": "ps", "train-1": "train", "train-2": "train", "serve-1": "serve", "serve-2": "serve"}
for name, role in roles.items():
    s = svc[name]
    assert s["image"] == "freshet:latest" and s["build"]["dockerfile"] == "deploy/Dockerfile", name
    assert s["build"]["context"] == root, (name, s["build"]["context"])
    assert s["command"] == [role, "--config", "/etc/freshet/freshet.conf"], (name, s["command"])
    mounts = [v.split(":") for v in s["volumes"]]  # source:target:mode
    assert [m[1:] for m in mounts] == [["/etc/freshet/freshet.conf", "ro"]], (name, mounts)
    assert mounts[0][0].endswith("deploy/compose/freshet.conf"), (name, mounts)
    assert s["environment"]["FRESHET_TOKEN"] == "compose-test", name
assert svc["ps"]["depends_on"]["redis-cluster-init"]["condition"] == "service_completed_successfully"
for t in ("train-1", "train-2"):
    assert svc[t]["depends_on"]["kafka"]["condition"] == "service_healthy"
ports = sorted(int(p["published"]) for s in ("serve-1", "serve-2") for p in svc[s]["ports"])
assert ports == [8081, 8082], ports
assert all(p["target"] == 8080 for s in ("serve-1", "serve-2") for p in svc[s]["ports"])
assert svc["produce"]["profiles"] == ["demo"]
print("test_compose: %d services: KRaft Kafka, a 6-node Redis Cluster at %s, ps, 2 train, "
      "2 serve on %s" % (len(svc), ",".join(nodes), ports))
PY
