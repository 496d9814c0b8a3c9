#!/usr/bin/env bash
# freshet fit-sparse's factorization machine against a numpy reference:
# initial rows bit for bit, the first batch's loss and gradient signs, and
# the table after 8 batches of Adagrad within 1e-4 (sparse_numpy.py).
# usage: $0 FRESHET
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
    echo "FAIL: /usr/bin/python3 has no numpy (apt-get install python3-numpy)"
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 "$here/sparse_numpy.py" "$1" "$work"
