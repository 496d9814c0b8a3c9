#!/usr/bin/env bash
# Sparse models' quality on the synthetic click stream (docs/design.md
# "Sparse models"): per seed, N records of `freshet produce --synthetic ctr`
# (written to a file once), then on that same stream, in the same order,
# with progressive validation (every batch scored before it is learned):
#   freshet fit-sparse: hashed LR by FTRL and by Adagrad, and an FM (D = 8)
#   with FTRL on its linear weights and Adagrad on its embeddings, 2^BITS
#   rows, batches of 256;
#   scikit-learn: SGDClassifier(loss='log_loss') on FeatureHasher features
#   of the same columns, partial_fit in batches of 1024 (bench/sklearn_ctr.py);
#   and the floor: the Bayes-optimal logloss of the planted model.
# Prints, per seed, each learner's progressive logloss over the last window
# and over all records, then the mean and sd over the seeds of the last
# window's figure and its gap to the floor. With DRIFT > 0 (radians a
# window, see `freshet produce --help`) it adds "fm-frozen": the FM trained
# on the first FREEZE records only and scoring the rest frozen, and writes
# each window's floor, live and frozen logloss of the last seed to
# CURVE=file (CSV): the gap is what training online buys.
# usage: [N=2000000] [WINDOW=200000] [BITS=22] [SEEDS="1 2 3"] [DRIFT=0]
#        [FREEZE=N/5] [CURVE=sparse_drift.csv] bash bench/sparse_quality.sh [FRESHET]
# The long profile of issue 17's figure: N=10000000 WINDOW=1000000.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build/freshet}")
n=${N:-2000000}
window=${WINDOW:-200000}
bits=${BITS:-22}
seeds=${SEEDS:-1 2 3}
drift=${DRIFT:-0}
freeze=${FREEZE:-$((n / 5))}
curve=${CURVE:-sparse_drift.csv}
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# learners: name and fit-sparse options ("sklearn" is the peer)
learners=(
    "lr-ftrl|--sparse fields:39,buckets:2^$bits,dim:0 --optimizer ftrl"
    "lr-adagrad|--sparse fields:39,buckets:2^$bits,dim:0 --optimizer adagrad --lr 0.05"
    "fm-ftrl|--sparse fields:39,buckets:2^$bits,dim:8 --optimizer ftrl"
)
if [ "$drift" != 0 ]; then
    learners+=("fm-frozen|--sparse fields:39,buckets:2^$bits,dim:8 --optimizer ftrl --freeze-after $freeze")
fi
have_sklearn=0
if $py -c 'import sklearn' 2>/dev/null; then
    have_sklearn=1
else
    echo "sparse_quality: no scikit-learn for $py (apt-get install python3-sklearn): its column is skipped" >&2
fi

echo "# $n records a seed, windows of $window, 2^$bits rows, drift $drift, seeds: $seeds"
printf '%-6s %-12s %10s %10s\n' seed learner last_window all
for seed in $seeds; do
    data=$work/ctr-$seed.txt
    "$bin" produce --synthetic ctr --seed "$seed" --drift "$drift" --window "$window" \
        --limit "$n" --out "$data" >"$work/produce.out" 2>"$work/produce.log"
    floor_last=$(grep -o 'Bayes-optimal logloss [0-9.]*' "$work/produce.log" | tail -1 | awk '{print $3}')
    floor_all=$(grep -o 'Bayes-optimal logloss [0-9.]*' "$work/produce.out" | awk '{print $3}')
    printf '%-6s %-12s %10s %10s\n' "$seed" floor "$floor_last" "$floor_all" | tee -a "$work/rows"
    for l in "${learners[@]}"; do
        name=${l%%|*} opts=${l#*|}
        # shellcheck disable=SC2086
        "$bin" fit-sparse $opts --data "$data" --format criteo --window "$window" >"$work/fit.out"
        last=$(grep '^window' "$work/fit.out" | tail -1 | grep -o 'logloss [0-9.]*' | awk '{print $2}')
        all=$(tail -1 "$work/fit.out" | grep -o 'logloss [0-9.]*' | awk '{print $2}')
        rate=$(tail -1 "$work/fit.out" | grep -o '[0-9]* samples/s')
        printf '%-6s %-12s %10s %10s   (%s)\n' "$seed" "$name" "$last" "$all" "$rate" | tee -a "$work/rows"
        grep '^window' "$work/fit.out" | grep -o 'logloss [0-9.]*' | awk '{print $2}' >"$work/curve-$name"
    done
    if [ "$drift" != 0 ]; then
        grep -o 'window [0-9]*: Bayes-optimal logloss [0-9.]*' "$work/produce.log" | awk '{print $5}' >"$work/curve-floor"
        { echo "window,records,floor,live,frozen"
          paste -d, "$work/curve-floor" "$work/curve-fm-ftrl" "$work/curve-fm-frozen" |
              awk -F, -v w="$window" '{printf "%d,%d,%s,%s,%s\n", NR - 1, NR * w, $1, $2, $3}'
        } >"$curve"
        echo "# per window (floor, live, frozen after $freeze) of seed $seed: $curve"
    fi
    if [ $have_sklearn = 1 ]; then
        $py bench/sklearn_ctr.py "$data" "$bits" "$window" >"$work/sk.out"
        last=$(grep '^window' "$work/sk.out" | tail -1 | grep -o 'logloss [0-9.]*' | awk '{print $2}')
        all=$(tail -1 "$work/sk.out" | grep -o 'logloss [0-9.]*' | awk '{print $2}')
        printf '%-6s %-12s %10s %10s\n' "$seed" sklearn "$last" "$all" | tee -a "$work/rows"
    fi
    rm -f "$data"
done

echo
echo "# the last window's progressive logloss over the seeds: mean (sd), and its gap to the floor"
awk '
    { last[$2] = last[$2] " " $3; if (!($2 in seen)) { order[++k] = $2; seen[$2] = 1 } }
    $2 == "floor" { fl[$1] = $3 }
    { gap[$2] = gap[$2] " " ($3 - fl[$1]) }
    function stats(list, out,   n, i, a, s, ss, m) {
        n = split(list, a, " "); s = 0; ss = 0
        for (i = 1; i <= n; i++) s += a[i]
        m = s / n
        for (i = 1; i <= n; i++) ss += (a[i] - m) ^ 2
        out[1] = m; out[2] = n > 1 ? sqrt(ss / (n - 1)) : 0
    }
    END {
        for (j = 1; j <= k; j++) {
            name = order[j]; stats(last[name], a); stats(gap[name], g)
            printf "%-12s %.5f (%.5f)   gap to floor %+.5f (%.5f)\n", name, a[1], a[2], g[1], g[2]
        }
    }' "$work/rows"
