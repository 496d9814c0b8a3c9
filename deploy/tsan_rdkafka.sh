#!/usr/bin/env bash
# Builds Debian's own source of the installed librdkafka (the same upstream
# version as librdkafka1, from the Debian archive's pool, its SHA-256
# checked against the source package's .dsc) with -fsanitize=thread, into
# DIR/lib (default build-tsan/rdkafka): the ThreadSanitizer stage of
# deploy/test.sh --tsan loads it instead of the uninstrumented library
# (LD_LIBRARY_PATH; same soname), whose threads TSan cannot follow. Nothing
# is kept in the repository. Prints DIR/lib. Needs the network once; a
# second run reuses what it built.
# usage: bash deploy/tsan_rdkafka.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(realpath -m "${1:-build-tsan/rdkafka}")
if [ -f "$dir/lib/librdkafka.so.1" ]; then
    echo "$dir/lib"
    exit 0
fi
full=$(dpkg-query -W -f='${Version}' librdkafka1)   # e.g. 2.0.2-1
up=${full%-*}
up=${up#*:}
pool=${TSAN_RDKAFKA_POOL:-http://deb.debian.org/debian/pool/main/libr/librdkafka}
mkdir -p "$dir/src"
cd "$dir/src"
curl -sSfL -o dsc "$pool/librdkafka_${full#*:}.dsc"
curl -sSfL -o orig.tar.gz "$pool/librdkafka_${up}.orig.tar.gz"
want=$(awk '/^Checksums-Sha256:/ { on = 1; next } on && /orig\.tar/ { print $1; exit }' dsc)
got=$(sha256sum orig.tar.gz | cut -d' ' -f1)
if [ -z "$want" ] || [ "$want" != "$got" ]; then
    echo "tsan_rdkafka: librdkafka_${up}.orig.tar.gz does not match its .dsc (${want:-none} != $got)" >&2
    exit 1
fi
rm -rf "librdkafka-$up"
tar xzf orig.tar.gz
cd "librdkafka-$up"
# the plain-TCP client freshet uses; no optional codecs or SASL; threads
# through pthread_create (glibc's thrd_create bypasses TSan's interceptor,
# and a thread TSan never saw start crashes in its first instrumented call)
./configure --prefix="$dir" --CFLAGS="-fsanitize=thread -g -O1" --LDFLAGS="-fsanitize=thread" \
    --disable-ssl --disable-gssapi --disable-zstd --disable-lz4-ext --disable-curl \
    --disable-sasl --disable-c11threads >"$dir/configure.log" 2>&1
make -C src -j"$(nproc)" librdkafka.so.1 >"$dir/build.log" 2>&1
mkdir -p "$dir/lib"
cp src/librdkafka.so.1 "$dir/lib/"
echo "$dir/lib"
