#!/usr/bin/env bash
# freshet fit --init --no-shuffle takes the same steps as PyTorch, for every
# loss x optimizer (final weights within 1e-4 relative). usage: $0 FRESHET
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
    echo "FAIL: /usr/bin/python3 has no torch/numpy (apt-get install python3-torch)"
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 "$here/torch_parity.py" "$1" "$work"
