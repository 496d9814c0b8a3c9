#!/usr/bin/env bash
# The Debian package (docs/operations.md "Service units and the package"):
# cpack -G DEB on this build writes freshet_<version>_<arch>.deb, whose
# control names the package, version and architecture, whose Depends holds
# the Debian package of every library the binary links (as dpkg -S finds
# them; NVIDIA's CUDA runtime under /usr/local is no Debian package) and
# libjs-chart.js, whose conffiles holds the configuration, and whose files
# are the binary, the four systemd units, the configuration and the docs;
# the units pass systemd-analyze verify, and the packaged binary runs.
# usage: $0 FRESHET (the build folder is its folder)
set -uo pipefail
F=$(realpath "$1")
build=$(dirname "$F")
[ -f "$build/CPackConfig.cmake" ] || { echo "FAIL: no CPackConfig.cmake in $build"; exit 1; }
for tool in cpack dpkg-deb dpkg-shlibdeps systemd-analyze; do
    command -v "$tool" >/dev/null || { echo "FAIL: $tool not installed (deploy/setup.sh)"; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
check() { # check WHAT COMMAND...: the command succeeds
    local what=$1
    shift
    if "$@" >"$work/out" 2>&1; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL: $what"
        head -20 "$work/out"
    fi
}

version=$("$F" version 2>/dev/null | sed -n 's/^freshet \([0-9.]*\).*/\1/p' | head -1)
arch=$(dpkg --print-architecture)
(cd "$work" && cpack --config "$build/CPackConfig.cmake" -G DEB -B "$work/pkg" >"$work/cpack.log" 2>&1) ||
    { echo "FAIL: cpack"; tail -30 "$work/cpack.log"; exit 1; }
deb="$work/pkg/freshet_${version}_${arch}.deb"
check "the package is $deb" test -s "$deb"
dpkg-deb --info "$deb" >"$work/info"
check "Package: freshet" grep -qx ' Package: freshet' "$work/info"
check "Version: $version" grep -qx " Version: $version" "$work/info"
check "Architecture: $arch" grep -qx " Architecture: $arch" "$work/info"
depends=$(sed -n 's/^ Depends: //p' "$work/info")
echo "Depends: $depends"
# the names Depends lists, one a line (alternatives split, versions cut)
sed 's/ *[,|] */\n/g' <<<"$depends" | sed 's/ *(.*//' >"$work/names"
# The package a library's users must depend on: what its package's shlibs
# or symbols file declares for its soname (libopenblas.so.0, shipped by
# libopenblas0-pthread, declares libopenblas0: any of its variants), else
# that package.
wanted() {
    local lib=$1 soname pkg info dep
    soname=$(basename "$lib")
    pkg=$(dpkg -S "$(realpath "$lib")" 2>/dev/null | head -1 | cut -d: -f1)
    [ -n "$pkg" ] || pkg=$(dpkg -S "$lib" 2>/dev/null | head -1 | cut -d: -f1)
    [ -n "$pkg" ] || return 1
    for info in /var/lib/dpkg/info/"$pkg".symbols /var/lib/dpkg/info/"$pkg":*.symbols; do
        [ -f "$info" ] || continue
        dep=$(awk -v s="$soname" '$1 == s {print $2; exit}' "$info")
        [ -n "$dep" ] && { echo "$dep"; return 0; }
    done
    for info in /var/lib/dpkg/info/"$pkg".shlibs /var/lib/dpkg/info/"$pkg":*.shlibs; do
        [ -f "$info" ] || continue
        # "libopenblas 0 libopenblas0": name and version make the soname
        dep=$(awk -v s="$soname" '!/^#/ && ($1 ".so." $2 == s || $1 "-" $2 ".so" == s) {print $3; exit}' "$info")
        [ -n "$dep" ] && { echo "$dep"; return 0; }
    done
    echo "$pkg"
}
# each library the binary itself needs, outside /usr/local (a library
# reached only through another one, as libgfortran through OpenBLAS, is
# that one's dependency, not ours)
for lib in $(ldd "$F" | awk '$3 ~ /^\// && $3 !~ /^\/usr\/local\// {print $3}'); do
    objdump -p "$F" | grep -q "NEEDED *$(basename "$lib")\$" || continue
    if ! dep=$(wanted "$lib"); then
        echo "FAIL: $lib belongs to no package"
        failed=$((failed + 1))
        continue
    fi
    check "Depends names $dep (for $(basename "$lib"))" grep -qxF "$dep" "$work/names"
done
check "Depends names libjs-chart.js" grep -qxF libjs-chart.js "$work/names"
check "Depends names nothing under /usr/local" bash -c "! grep -qi cuda '$work/names'"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles >"$work/conffiles" 2>/dev/null
check "conffiles: /etc/freshet/freshet.conf" grep -qx /etc/freshet/freshet.conf "$work/conffiles"
dpkg-deb -c "$deb" | awk '{print $6}' >"$work/files"
for f in ./usr/bin/freshet ./etc/freshet/freshet.conf \
    ./lib/systemd/system/freshet-run.service ./lib/systemd/system/freshet-serve.service \
    ./lib/systemd/system/freshet-ps@.service ./lib/systemd/system/freshet-train@.service \
    ./usr/share/doc/freshet/README.md ./usr/share/doc/freshet/design.md \
    ./usr/share/doc/freshet/http.md ./usr/share/doc/freshet/operations.md \
    ./usr/share/doc/freshet/prometheus/freshet.rules.yml; do
    check "the package holds $f" grep -qx "$f" "$work/files"
done
# the units as installed: systemd-analyze verify resolves ExecStart in the
# extracted tree (--root), beside this machine's own units (the targets
# ours are ordered after), a template as an instance; any warning (an
# unknown key, a bad value) fails as an error does
dpkg-deb -x "$deb" "$work/root"
check "the packaged binary runs" bash -c "'$work/root/usr/bin/freshet' version | grep -q '$version'"
# a CUDA build ships its backend as a module the installed binary finds
# relative to itself (trainer/backend.c), not in the build tree
if [ -f "$build/libfreshet_cuda.so" ]; then
    module=$(grep -x '\./usr/lib/.*freshet/libfreshet_cuda\.so' "$work/files" | head -1)
    check "the package holds the CUDA module" test -n "$module"
    check "the packaged binary finds its module" bash -c \
        "'$work/root/usr/bin/freshet' version | grep -qxF 'cuda module: $work/root${module#.}'"
fi
units="$work/root/lib/systemd/system"
for d in /lib/systemd/system /usr/lib/systemd/system; do
    [ -d "$d" ] && cp -rn "$d/." "$units/" 2>/dev/null
done
cp "$units/freshet-ps@.service" "$units/freshet-ps@clicks.service"
cp "$units/freshet-train@.service" "$units/freshet-train@clicks.service"
for u in freshet-run.service freshet-serve.service freshet-ps@clicks.service \
    freshet-train@clicks.service; do
    check "systemd-analyze verify $u, no warning" bash -c \
        "out=\$(cd '$work' && systemd-analyze verify --root='$work/root' '$units/$u' 2>&1) &&
         { [ -z \"\$out\" ] || { echo \"\$out\"; false; }; }"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
