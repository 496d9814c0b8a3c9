#!/usr/bin/env bash
# The dense tower (docs/design.md "The dense tower") against the FM alone:
# for each of SEEDS seeds, N synthetic click records (binary layout) and
# freshet fit-sparse over them twice, alternating, with SPEC and with
# SPEC,tower:TOWER (FTRL on the linear weights, Adagrad on embeddings and
# tower, batch 256, one thread). Prints each pass's progressive logloss
# over the records, over the last window (WINDOW records) and its
# samples/s, then per model the mean logloss with its spread over seeds,
# the median samples/s, and the tower's speed as a ratio of the FM's in
# the same rounds. The stream is an FM with a planted Bayes floor, printed
# per seed: the tower has nothing to find there that the FM cannot, so
# what this measures is its cost.
# usage: [SEEDS="1 2 3"] [N=1000000] [WINDOW=250000] [SPEC=fields:39,buckets:2^20,dim:8]
#        [TOWER=64-32] bash bench/sparse_tower.sh [FRESHET]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build/freshet}")
seeds=${SEEDS:-1 2 3}
n=${N:-1000000}
window=${WINDOW:-250000}
spec=${SPEC:-fields:39,buckets:2^20,dim:8}
tower=${TOWER:-64-32}
work=$(mktemp -d /tmp/freshet-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "sparse_tower.sh: $spec against $spec,tower:$tower; $n records a seed, seeds $seeds"
printf '%-6s %-6s %10s %10s %12s %8s\n' seed model logloss last floor samples/s
for s in $seeds; do
    "$bin" produce --synthetic ctr --seed "$s" --encode binary --limit "$n" \
        --out "$work/clicks.bin" >"$work/synth.log" 2>&1
    floor=$(tail -1 "$work/synth.log" | sed 's/.*logloss //')
    for model in fm tower; do
        sp=$spec
        [ "$model" = tower ] && sp="$spec,tower:$tower"
        "$bin" fit-sparse --sparse "$sp" --data "$work/clicks.bin" --format binary \
            --window "$window" >"$work/fit.log" 2>&1
        last=$(grep '^window' "$work/fit.log" | tail -1 | sed 's/.*logloss \([0-9.]*\).*/\1/')
        read -r loss rate < <(tail -1 "$work/fit.log" |
            sed 's/.*logloss \([0-9.]*\), \([0-9]*\) samples.*/\1 \2/')
        printf '%-6s %-6s %10s %10s %12s %8s\n' "$s" "$model" "$loss" "$last" "$floor" "$rate"
        echo "$s $model $loss $last $rate" >>"$work/all"
    done
done
awk '
{ loss[$2] += $3; last[$2] += $4; n[$2]++; sq[$2] += $3 * $3
  if (!($2 in lo) || $3 < lo[$2]) lo[$2] = $3
  if (!($2 in hi) || $3 > hi[$2]) hi[$2] = $3
  rate[$2, n[$2]] = $5; if ($2 == "tower") ratio[n[$2]] = $5 / fmrate[$1]; else fmrate[$1] = $5 }
function median(m,   i, j, k, a, t) {
  k = n[m]; for (i = 1; i <= k; i++) a[i] = rate[m, i]
  for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
  return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2 }
END {
  for (m in n)
    printf "%-6s mean progressive logloss %.5f (%.5f-%.5f over %d seeds), last window %.5f, median %.0f samples/s\n",
      m, loss[m] / n[m], lo[m], hi[m], n[m], last[m] / n[m], median(m)
  k = n["tower"]; for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (ratio[j] < ratio[i]) { t = ratio[i]; ratio[i] = ratio[j]; ratio[j] = t }
  printf "tower speed / FM speed, same seed: median %.3f (%.3f-%.3f)\n", k % 2 ? ratio[(k + 1) / 2] : (ratio[k / 2] + ratio[k / 2 + 1]) / 2, ratio[1], ratio[k]
}' "$work/all"
