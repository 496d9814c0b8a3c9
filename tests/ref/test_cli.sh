#!/usr/bin/env bash
# The freshet command's contract: --help everywhere, bad arguments and files
# give a one-line error and exit status 2 (never a signal), a diverging run
# exits 1, and malformed records are skipped with their count. Every block
# runs: a command that is missing fails its lines (no --help probe decides
# what is checked), and every expected text is written here, never taken
# from freshet's own output. Prints its counts.
# usage: $0 FRESHET
set -uo pipefail
F=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0

# expect STATUS PATTERN -- command...: exit status and a line of its stderr.
# An empty pattern is refused: grep -q "" would match any output.
expect() {
    local want=$1 pattern=$2
    shift 3
    if [ -z "$pattern" ]; then
        failed=$((failed + 1))
        echo "FAIL: '$*': an empty expected pattern"
        return
    fi
    "$@" >"$work/out" 2>"$work/err"
    local got=$?
    if [ "$got" -eq "$want" ] && grep -q -- "$pattern" "$work/err" "$work/out"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL: '$*' exited $got (want $want), output lacks '$pattern':"
        cat "$work/out" "$work/err" | head -5
    fi
}

printf '1,0.5,0.25\n0,-1,2\n1,3,1\n0,0,0\n' >"$work/good.csv"
printf '1,0.5,0.25\nx,1,2\n1,3\n0,nan,1\n2,1,1\n0,1,1\n' >"$work/bad.csv"
printf 'garbage' >"$work/bad.safetensors"

expect 2 "usage: freshet" -- "$F"
expect 0 "usage: freshet <command>" -- "$F" --help
expect 0 "freshet fit --layers" -- "$F" fit --help
expect 0 "freshet eval --weights" -- "$F" eval --help
expect 0 "backends: cpu" -- "$F" version
expect 0 "freshet run --config" -- "$F" run --help
expect 0 "freshet train --config" -- "$F" train --help
expect 0 "--samples N" -- "$F" run --help
expect 2 "--samples expects an integer" -- "$F" run --samples x
expect 0 "freshet compare --config" -- "$F" compare --help
expect 2 "unknown mode 'fast'" -- "$F" compare --config /dev/null --modes async,fast
expect 2 "--workers expects an integer in 1..1024, got '-1'" -- "$F" compare --config /dev/null --workers -1
expect 0 "freshet replay --model" -- "$F" replay --help
expect 0 "freshet serve --config" -- "$F" serve --help
expect 0 "freshet check --config" -- "$F" check --help
printf '[kafka]\nbootstrap.servers = k:9092\n[model]\nlayers = 4-8-3\n' >"$work/ok.conf"
expect 0 "ok: model default (4-8-3 softmax, 67 parameters), 1 shard, mode async; redis server; kafka k:9092, topic freshet.samples (f32)" -- "$F" check --config "$work/ok.conf"
expect 2 "bootstrap.servers is not set" -- "$F" check --set model.layers=4-8-3
expect 2 "a dense model reads csv, libsvm or f32" -- "$F" check --config "$work/ok.conf" --set ingest.format=criteo
expect 2 "\[model\] sparse" -- "$F" check --config "$work/ok.conf" --set model.sparse=fields:0
expect 2 "\[redis\] url" -- "$F" check --config "$work/ok.conf" --set redis.url=rediss://h:1
expect 2 "logistic" -- "$F" check --config "$work/ok.conf" --set model.loss=logistic
expect 2 "listen 'nowhere': expected host:port" -- "$F" serve --set serve.listen=nowhere
expect 2 "tls_cert and tls_key go together" -- "$F" serve --set serve.listen=127.0.0.1:0 --set serve.tls_cert=/x.pem
expect 2 "protect_reads needs \[serve\] token" -- "$F" serve --set serve.protect_reads=true
expect 2 "rediss:// is refused\|rediss" -- "$F" serve --set serve.listen=127.0.0.1:0 --set redis.url=rediss://h:1
expect 2 "max_pending (4) must be at least twice \[trainer\] workers (4)" -- "$F" run --set trainer.mode=sync --set trainer.workers=4 --set psstore.max_pending=4
expect 2 "a verb is required" -- "$F" replay --model m
expect 2 "one verb only" -- "$F" replay --model m --to-earliest --shift-by 3
expect 2 "unknown command 'fly'" -- "$F" fly
expect 2 "unknown option '--bogus'" -- "$F" fit --bogus
expect 2 "--data FILE is required" -- "$F" fit --layers 2-2 --format csv --out "$work/w"
expect 2 "--epochs expects an integer" -- "$F" fit --epochs x --layers 2-2
expect 2 "--lr expects a number" -- "$F" fit --lr nan --layers 2-2
expect 2 "bad layer list" -- "$F" fit --layers 2-x-2 --data "$work/good.csv" --format csv --out "$work/w"
expect 2 "--format must be" -- "$F" fit --layers 2-2 --data "$work/good.csv" --format xml --out "$work/w"
expect 2 "no-such.csv" -- "$F" fit --layers 2-2 --data "$work/no-such.csv" --format csv --out "$work/w"
expect 2 "--format idx needs --labels" -- "$F" fit --layers 2-2 --data "$work/good.csv" --format idx --out "$work/w"
expect 2 "--features 3 differs" -- "$F" fit --layers 2-2 --features 3 --data "$work/good.csv" --format csv --out "$work/w"
expect 2 "safetensors" -- "$F" fit --init "$work/bad.safetensors" --data "$work/good.csv" --format csv --out "$work/w"
expect 2 "safetensors" -- "$F" eval --weights "$work/bad.safetensors" --data "$work/good.csv" --format csv
expect 2 "unknown backend 'tpu'" -- "$F" fit --layers 2-2 --backend tpu --data "$work/good.csv" --format csv --out "$work/w"
# malformed records are skipped and counted by reason; the 2 good ones train
expect 0 "skipped 1 records of .* (bad_number; first at line 2)" -- "$F" fit --layers 2-2 --data "$work/bad.csv" --format csv --out "$work/w"
expect 0 "(label_range; first at line 5)" -- "$F" fit --layers 2-2 --data "$work/bad.csv" --format csv --out "$work/w"
expect 0 '"n": 2' -- "$F" eval --weights "$work/w" --data "$work/bad.csv" --format csv
expect 2 "holds a 2-2 softmax model, not 2-3-2" -- "$F" fit --layers 2-3-2 --init "$work/w" --data "$work/good.csv" --format csv --out "$work/w2"
expect 1 "diverged" -- "$F" fit --layers 2-1 --loss mse --lr 1e5 --epochs 50 --data "$work/good.csv" --format csv --out "$work/w3"
# the review's cases: --loss with --init, the labels option named, --out checked first
expect 2 "holds a 2-2 softmax model, not 2-2 mse" -- "$F" fit --init "$work/w" --loss mse --data "$work/good.csv" --format csv --out "$work/w4"
# Debian's dataset-fashion-mnist, which deploy/setup.sh installs: its absence is a failure
fm=/usr/share/datasets/fashion-mnist
if [ ! -f "$fm/t10k-images-idx3-ubyte.gz" ]; then
    failed=$((failed + 1))
    echo "FAIL: $fm/t10k-images-idx3-ubyte.gz is missing (apt-get install dataset-fashion-mnist)"
fi
expect 2 "needs --test-labels FILE" -- "$F" fit --layers 784-10 --format idx --data "$fm/t10k-images-idx3-ubyte.gz" --labels "$fm/t10k-labels-idx1-ubyte.gz" --test-data "$fm/t10k-images-idx3-ubyte.gz" --out "$work/w5"
expect 2 "cannot write into $work/missing" -- "$F" fit --layers 2-2 --data "$work/good.csv" --format csv --out "$work/missing/w"
expect 0 "wrote" -- "$F" fit --layers 2-2 --batch 65536 --data "$work/good.csv" --format csv --out "$work/w6"
# produce: idx takes --features from the images header; these fail before
# any broker is needed
# 2 images of 2x3 pixels, and their 2 labels
printf '\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x02\x00\x00\x00\x03abcdefghijkl' >"$work/img.idx"
printf '\x00\x00\x08\x01\x00\x00\x00\x02\x01\x00' >"$work/lab.idx"
expect 0 "idx takes it from the images" -- "$F" produce --help
expect 2 "--features D is required for --format csv" -- "$F" produce --bootstrap 127.0.0.1:1 --topic t --data "$work/good.csv" --format csv --encode csv
expect 2 "--features 5 disagrees with .*img.idx, whose images are 6 features" -- "$F" produce --bootstrap 127.0.0.1:1 --topic t --data "$work/img.idx" --labels "$work/lab.idx" --format idx --encode f32 --features 5
expect 2 "an images file has at least 2 dimensions" -- "$F" produce --bootstrap 127.0.0.1:1 --topic t --data "$work/lab.idx" --labels "$work/lab.idx" --format idx --encode f32
# the synthetic click stream: Criteo lines, the same for the same seed
expect 0 "--synthetic ctr" -- "$F" produce --help
expect 2 "--out needs --limit N" -- "$F" produce --synthetic ctr --out "$work/ctr"
expect 2 "--synthetic must be ctr, got 'img'" -- "$F" produce --synthetic img --out "$work/ctr" --limit 1
expect 2 "--synthetic needs --topic T or --out F" -- "$F" produce --synthetic ctr --limit 1
expect 2 "--synthetic replaces --data, --format" -- "$F" produce --synthetic ctr --out "$work/ctr" --limit 1 --format csv
expect 2 "--drift expects a number in \[0, 1\]" -- "$F" produce --synthetic ctr --out "$work/ctr" --limit 1 --drift 2
expect 2 "--seed, --drift and --window go with --synthetic" -- "$F" produce --topic t --data "$work/good.csv" --format csv --encode csv --features 2 --seed 3
expect 2 "--out writes a file: --bootstrap" -- "$F" produce --synthetic ctr --out "$work/ctr" --limit 1 --bootstrap 127.0.0.1:1
expect 2 "--partitions-by must be key, roundrobin or sticky, got 'x'" -- "$F" produce --synthetic ctr --topic t --partitions-by x
expect 2 "--out goes with --synthetic" -- "$F" produce --topic t --data "$work/good.csv" --format csv --encode csv --features 2 --out "$work/x"
expect 0 "synthetic ctr: 3000 records, click rate 0\.03167, Bayes-optimal logloss 0\.11254" -- "$F" produce --synthetic ctr --seed 5 --out "$work/ctr1" --limit 3000
"$F" produce --synthetic ctr --seed 5 --out "$work/ctr2" --limit 1000 >/dev/null 2>&1
"$F" produce --synthetic ctr --seed 6 --out "$work/ctr3" --limit 1000 >/dev/null 2>&1
lines=$(wc -l <"$work/ctr1") cols=$(awk -F'\t' '{print NF}' "$work/ctr1" | sort -u)
same=$(head -n 1000 "$work/ctr1" | cmp -s - "$work/ctr2" && echo yes)
other=$(cmp -s "$work/ctr2" "$work/ctr3" || echo yes)
if [ "$lines" = 3000 ] && [ "$cols" = 40 ] && [ "$same" = yes ] && [ "$other" = yes ]; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "FAIL: synthetic ctr: $lines lines, columns '$cols', seed 5 twice the same: '$same', seed 6 another: '$other'"
fi
# fit-sparse learns it with progressive validation, skipping malformed lines
{ cat "$work/ctr1"; printf '1\t2\t3\n'; } >"$work/ctr1bad"
expect 0 "3000 records, progressive logloss 0\.[0-9]*, [0-9]* samples/s" -- "$F" fit-sparse --sparse fields:39,buckets:2^16,dim:4 --data "$work/ctr1bad" --format criteo --window 1000 --out "$work/sp.safetensors"
expect 0 "1 records skipped: columns" -- "$F" fit-sparse --sparse fields:39,buckets:2^16 --data "$work/ctr1bad" --format criteo
# frozen after 512 records (two batches), it ends worse than learning throughout
live=$("$F" fit-sparse --sparse fields:39,buckets:2^16 --data "$work/ctr1" --format criteo | tail -1 | grep -o 'logloss [0-9.]*' | cut -d' ' -f2)
frozen=$("$F" fit-sparse --sparse fields:39,buckets:2^16 --data "$work/ctr1" --format criteo --freeze-after 512 | tail -1 | grep -o 'logloss [0-9.]*' | cut -d' ' -f2)
num='^0\.[0-9]+$'
if [[ $live =~ $num ]] && [[ $frozen =~ $num ]] &&
    awk -v a="$frozen" -v b="$live" 'BEGIN { exit !(a > b + 0.005) }'; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "FAIL: fit-sparse --freeze-after 512 ended at logloss '$frozen', learning throughout at '$live'"
fi
expect 2 "--freeze-after expects an integer in 1" -- "$F" fit-sparse --sparse fields:39,buckets:2^16 --data "$work/ctr1" --format criteo --freeze-after 0
# seed 5's 3000 records at dim 4 end at these figures (written here, not
# read from freshet): from the file, gzip-compressed and from standard input
want="3000 records, progressive logloss 0\.19371,"
expect 0 "$want" -- "$F" fit-sparse --sparse fields:39,buckets:2^16,dim:4 --data "$work/ctr1" --format criteo
gzip -c "$work/ctr1" >"$work/ctr1.gz"
expect 0 "$want" -- "$F" fit-sparse --sparse fields:39,buckets:2^16,dim:4 --data "$work/ctr1.gz" --format criteo
expect 0 "$want" -- sh -c "\"$F\" fit-sparse --sparse fields:39,buckets:2^16,dim:4 --data - --format criteo <\"$work/ctr1\""
# the binary record: the same rows, so the same figures; a cut file is refused
"$F" produce --synthetic ctr --seed 5 --encode binary --out "$work/ctr1.bin" --limit 3000 >/dev/null 2>&1
expect 0 "$want" -- "$F" fit-sparse --sparse fields:39,buckets:2^16,dim:4 --data "$work/ctr1.bin" --format binary
head -c 1000 "$work/ctr1.bin" >"$work/cut.bin"
expect 2 "cut.bin: record [0-9]*: a length of [0-9]* bytes, cut short" -- "$F" fit-sparse --sparse fields:39,buckets:2^16 --data "$work/cut.bin" --format binary
expect 2 "record 1: a length of [0-9]* bytes, more than [0-9]*: not records each after their length" -- "$F" fit-sparse --sparse fields:39,buckets:2^16 --data "$work/ctr1" --format binary
expect 2 "--synthetic encodes criteo or binary, got 'f32'" -- "$F" produce --synthetic ctr --encode f32 --out "$work/x" --limit 1
head -c 2000 "$work/ctr1.gz" >"$work/cut.gz"
expect 2 "cut.gz: gzip: unexpected end of file" -- "$F" fit-sparse --sparse fields:39,buckets:2^16 --data "$work/cut.gz" --format criteo
expect 2 "good.csv: no record of format criteo" -- "$F" fit-sparse --sparse fields:39,buckets:2^16 --data "$work/good.csv" --format criteo
# gzip is read by its content, from a pipe too
expect 0 "$want" -- sh -c "\"$F\" fit-sparse --sparse fields:39,buckets:2^16,dim:4 --data - --format criteo <\"$work/ctr1.gz\""
# produce refuses a cut or foreign sparse file at once (nothing is sent; no broker needed)
expect 2 "cut.gz: gzip: unexpected end of file" -- "$F" produce --data "$work/cut.gz" --format criteo --encode binary --bootstrap 127.0.0.1:9 --topic t
expect 2 "record 1: a length of [0-9]* bytes, more than [0-9]*: not records each after their length" -- "$F" produce --data "$work/ctr1" --format binary --encode binary --bootstrap 127.0.0.1:9 --topic t
expect 2 "binary records hold the values' ids" -- "$F" produce --data "$work/ctr1.bin" --format binary --encode criteo --bootstrap 127.0.0.1:9 --topic t
# rows 2^16 x (1 + 4) floats and the bias, after a header: the exact size
size=$(stat -c %s "$work/sp.safetensors")
if [ "$size" -gt $((65536 * 5 * 4 + 4)) ] && [ "$size" -lt $((65536 * 5 * 4 + 4 + 400)) ]; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "FAIL: fit-sparse --out wrote $size bytes"
fi
expect 0 "progressive validation" -- "$F" fit-sparse --help
expect 2 "--sparse, --data and --format are required" -- "$F" fit-sparse --data x
expect 2 "--format criteo needs fields:39 or more, got 26" -- "$F" fit-sparse --sparse fields:26,buckets:2^10 --data x --format criteo
expect 2 "sparse: buckets must be 2^4..2^30" -- "$F" fit-sparse --sparse fields:39,buckets:2^40 --data x --format criteo
expect 2 "--optimizer must be ftrl or adagrad, got 'sgd'" -- "$F" fit-sparse --sparse fields:39,buckets:2^10 --data x --format criteo --optimizer sgd
expect 2 "--format must be criteo, libsvm or binary" -- "$F" fit-sparse --sparse fields:39,buckets:2^10 --data x --format csv
expect 2 "no-such.txt" -- "$F" fit-sparse --sparse fields:39,buckets:2^10 --data "$work/no-such.txt" --format criteo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
