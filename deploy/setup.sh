#!/usr/bin/env bash
# Installs every Debian package freshet needs to build, test and run its
# quickstart. Idempotent: packages already installed are skipped, and apt is
# not touched at all when nothing is missing. Run as root (or with sudo).
set -euo pipefail

packages=(
    build-essential cmake pkg-config git   # toolchain
    libopenblas-dev                        # CPU backend (sgemm)
    zlib1g-dev                             # .gz data files
    libjansson-dev                         # the safetensors header's JSON (reading model files)
    libxxhash-dev                          # sparse models: hashing categorical values
    libhiredis-dev                         # the Redis parameter store
    libevent-dev libssl-dev                # the HTTP service (TLS through OpenSSL)
    libjs-chart.js                         # the dashboard's charts, served by freshet
    librdkafka-dev kcat                    # Kafka client; kcat as an independent client in tests
    redis-server                           # integration tests start their own on free ports
    libcmocka-dev                          # unit tests
    clang libclang-rt-14-dev               # fuzz targets (libFuzzer) and sanitizer runtimes
    clang-format                           # style check
    dataset-fashion-mnist                  # the quickstart's data set
    python3 python3-numpy python3-torch    # reference tests and benchmarks (/usr/bin/python3)
    python3-prometheus-client              # parses /metrics in the serve test
    python3-pytest python3-venv            # the Python client's tests, in a venv (clients/python)
    python3-wheel                          # pip builds the client in that venv (bdist_wheel)
    python3-yaml                           # test_compose.sh reads the resolved compose file
    python3-sklearn python3-matplotlib     # bench/sparse_quality.sh: its peer (SGDClassifier), the drift plot
    curl openssl chromium                  # serve test: HTTP client, TLS certificate, the dashboard
    wrk                                    # bench/serve.sh load generator
    systemd                                # systemd-analyze verify of the service units
    prometheus                             # promtool and a real server for the alert rules' tests
    docker-compose                         # docker-compose config checks deploy/compose.yml
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: all ${#packages[@]} packages present"
    exit 0
fi

echo "setup: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
