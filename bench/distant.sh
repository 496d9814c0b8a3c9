#!/usr/bin/env bash
# A distant store (bench/README.md "A distant store"): freshet run's
# samples/s with its Redis behind delay_proxy (tests/tools/delay_proxy.c),
# every byte D us later each way, against the same runs on loopback Redis
# measured in the same invocation. This kernel has no tc netem, and
# loopback hides the round trips a deployment pays to a Redis in the same
# zone (0.2-1 ms each way and back). Two benchmarks: the sparse one
# (bench/sparse_run.sh: N synthetic click records, FTRL, batch 256, W
# workers) and the dense one (bench/run_vs_fit.sh: Fashion-MNIST COPIES
# times, 4 by default as that bench advises, 784-256-10, W workers,
# adaptive). The machine's speed drifts, so rounds
# alternate: each round runs both benchmarks once (ROUNDS=1) at every delay
# in turn; the figures are the medians over rounds (min-max in brackets),
# and "vs loopback" is a delay's median over loopback's median (the range
# of the rounds' own ratios in brackets). Each invocation's whole output
# is kept in OUT. Only freshet's connections go through the proxy: the
# benchmarks' own redis-cli calls go straight to Redis.
# usage: [DELAYS="loopback 250 1000"] [ROUNDS=3] [N=100000] [COPIES=4] [WORKERS=2]
#        [BENCHES="sparse dense"] [OUT=folder] bash bench/distant.sh [FRESHET]
#        (DELAYS: microseconds each way, "loopback" for no proxy, which the
#        list must hold; 0 is the proxy alone, with no delay. The dense one
#        needs build/bench/bench_rawconsume: cmake -DFRESHET_BENCH=ON)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build/freshet}")
delays=${DELAYS:-loopback 250 1000}
rounds=${ROUNDS:-3}
n=${N:-100000}
copies=${COPIES:-4}
workers=${WORKERS:-2}
benches=${BENCHES:-sparse dense}
out=${OUT:-$(mktemp -d /tmp/freshet-distant-XXXXXX)}
mkdir -p "$out"
case " $delays " in
*" loopback "*) ;;
*)
    echo "distant.sh: DELAYS must hold loopback, the baseline" >&2
    exit 2
    ;;
esac

# one_run BENCH DELAY ROUND: runs BENCH once at DELAY; prints its samples/s,
# its baseline's (fit-sparse, or fit) and the proxy's CPU (sparse: seconds
# over the invocation; dense: us a sample of the run; - for loopback), its
# log in OUT
one_run() {
    local bench=$1 delay=$2 r=$3 log="$out/$1-$2-$3.log" us=""
    [ "$delay" = loopback ] || us=$delay
    if [ "$bench" = sparse ]; then
        ROUNDS=1 N=$n REDIS_DELAY_US=$us bash bench/sparse_run.sh "$workers" "$bin" >"$log" 2>&1 ||
            { tail -n 20 "$log" >&2; return 1; }
        # "median: fit-sparse F samples/s (logloss L), run R samples/s (logloss ..."
        echo "$(sed -n 's/^median: fit-sparse \([0-9.]*\) samples\/s.*, run \([0-9.]*\) samples\/s.*/\2 \1/p' "$log")" \
            "$(sed -n 's/^delay_proxy: \([0-9.]*\) s of CPU.*/\1 s/p' "$log" | grep . || echo -)"
    else
        ROUNDS=1 COPIES=$copies REDIS_DELAY_US=$us bash bench/run_vs_fit.sh "$workers" adaptive "$bin" >"$log" 2>&1 ||
            { tail -n 20 "$log" >&2; return 1; }
        # "  median: run R samples/s (rounds R), fit F, raw consume C records/s"
        echo "$(sed -n 's/^  median: run \([0-9]*\) samples\/s.*, fit \([0-9]*\), raw.*/\1 \2/p' "$log")" \
            "$(sed -n 's/.*CPU went.*delay_proxy \([0-9.]*\).*/\1 us a sample/p' "$log" | grep . || echo -)"
    fi
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "distant.sh: freshet's Redis behind delay_proxy, delays (us each way): $delays;" \
    "$rounds rounds; sparse N=$n, dense Fashion-MNIST x $copies; $workers workers; logs in $out"
: >"$out/rates"
for r in $(seq "$rounds"); do
    for d in $delays; do
        for b in $benches; do
            read -r rate base cpu < <(one_run "$b" "$d" "$r") || true
            if ! [[ ${rate:-} =~ ^[0-9.]+$ ]]; then
                echo "distant.sh: no rate from $out/$b-$d-$r.log" >&2
                exit 1
            fi
            echo "$b $d $r $rate $base" >>"$out/rates"
            echo "round $r, $d: $b $rate samples/s (its baseline in the same invocation: $base;" \
                "delay_proxy CPU: $cpu)"
        done
    done
done

# the table: a line per delay, for each bench its median (min-max) and vs loopback
printf '%-10s' "store"
for b in $benches; do printf ' %28s %22s' "$b run/s (min-max)" "vs loopback (rounds)"; done
echo
for d in $delays; do
    printf '%-10s' "$([ "$d" = loopback ] && echo loopback || echo "$d us")"
    for b in $benches; do
        med=$(awk -v b="$b" -v d="$d" '$1 == b && $2 == d { print $4 }' "$out/rates" | median)
        base=$(awk -v b="$b" '$1 == b && $2 == "loopback" { print $4 }' "$out/rates" | median)
        span=$(awk -v b="$b" -v d="$d" '$1 == b && $2 == d { print $4 }' "$out/rates" | sort -g |
            awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.0f-%.0f", lo, hi }')
        # each round's rate over the same round's loopback rate
        ratios=$(awk -v b="$b" -v d="$d" '$1 == b && $2 == "loopback" { l[$3] = $4 }
                 $1 == b && $2 == d { x[$3] = $4 }
                 END { for (r in x) if (l[r] > 0) printf "%.2f\n", x[r] / l[r] }' "$out/rates" |
            sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s-%s", lo, hi }')
        printf ' %28s %22s' "$(printf '%.0f (%s)' "$med" "$span")" \
            "$(awk -v a="$med" -v c="$base" 'BEGIN { printf "%.2f", a / c }') ($ratios)"
    done
    echo
done
