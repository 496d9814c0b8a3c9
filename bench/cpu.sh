# CPU accounting for the benchmarks that measure freshet against its cpu
# limit (run_vs_fit.sh, sparse_run.sh): sourced after deploy/stack.sh's
# stack_start, whose pids it reads (stack_pids[1] is the dev broker, the
# others redis-servers). All figures are CPU seconds (user + system) from
# /proc; the cpu limit is cores / (CPU a sample of the one-thread offline
# trainer + CPU a record of the raw read, broker included).
# shellcheck shell=bash

hz=$(getconf CLK_TCK)

# CPU seconds a process has used (user + system, its exited threads too)
cpu_s() { awk -v hz="$hz" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / hz }' "/proc/$1/stat"; }

# the CPU seconds of each of process $1's threads, summed by kind of thread
# (workers, dense or sparse; applier; freshet's consume and decode threads;
# librdkafka's; the rest), one "kind seconds" a line
thread_cpu() {
    for f in /proc/"$1"/task/*/stat; do cat "$f" || true; done 2>/dev/null |
        awk -v hz="$hz" '{ name = $0; sub(/^[0-9]+ \(/, "", name); sub(/\) .*$/, "", name)
            rest = $0; sub(/^.*\) /, "", rest); split(rest, f, " ")
            kind = "other"
            if (name ~ /^fr-(worker|sparse)/) kind = "workers"
            else if (name ~ /^fr-applier/) kind = "applier"
            else if (name ~ /^fr-(consume|decode)/) kind = "consume"
            else if (name ~ /^rdk:/) kind = "librdkafka"
            s[kind] += (f[12] + f[13]) / hz }
            END { for (k in s) printf "%s %.2f\n", k, s[k] }'
}

# CPU seconds of every redis-server (the stack's processes but the broker
# and a delay_proxy, whose CPU stack_proxy_cpu gives apart)
redis_cpu() {
    local i t=0
    for i in "${!stack_pids[@]}"; do
        [ "$i" = 1 ] && continue
        [ "${stack_pids[$i]}" = "${stack_proxy_pid:-}" ] && continue
        t=$(awk -v t="$t" -v c="$(cpu_s "${stack_pids[$i]}")" 'BEGIN { print t + c }')
    done
    echo "$t"
}
broker_cpu() { cpu_s "${stack_pids[1]}"; } # stack_start's second process
side_cpu() { awk -v a="$(redis_cpu)" -v b="$(broker_cpu)" 'BEGIN { print a + b }'; }

# The raw librdkafka consumer (bench_rawconsume, path $1) over the whole of
# topic $3 at bootstrap $2, N = $4 records: prints "records/s cpu", cpu the
# microseconds of CPU a record, the consumer's and the broker's. $5: a
# folder for its output.
raw_read() {
    local bin=$1 bootstrap=$2 topic=$3 n=$4 dir=$5 b0
    b0=$(side_cpu)
    local TIMEFORMAT='%U %S'
    { time "$bin" --bootstrap "$bootstrap" --topic "$topic" >"$dir/raw.out"; } 2>"$dir/raw.time"
    awk -v b0="$b0" -v b1="$(side_cpu)" -v n="$n" \
        'FNR == NR { for (i = 1; i < NF; i++) if ($i == "records_per_s") r = $(i + 1); next }
         { c = $1 + $2 } END { printf "%s %.2f\n", r, (c + b1 - b0) * 1e6 / n }' \
        "$dir/raw.out" "$dir/raw.time"
}

# The raw consumer: $RAWCONSUME, or the first built one
raw_consumer() {
    local c
    for c in "${RAWCONSUME:-}" build-bench/bench/bench_rawconsume build/bench/bench_rawconsume; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
    done
    echo "bench: bench_rawconsume not found; build it with cmake -DFRESHET_BENCH=ON" >&2
    return 1
}

# OpenBLAS's fastest kernel for this CPU unless OPENBLAS_CORETYPE is set
blas_kernel() {
    if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
        if grep -qw avx512f /proc/cpuinfo; then
            export OPENBLAS_CORETYPE=SkylakeX
        elif grep -qw avx2 /proc/cpuinfo; then
            export OPENBLAS_CORETYPE=Haswell
        fi
    fi
}
