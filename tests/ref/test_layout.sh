#!/usr/bin/env bash
# The layout stays a map (issue 41): no product source (.c, .h, .cu, .cuh
# outside tests/; bench/ programs count) over 1,000 lines, no such header over
# 400, README.md at most 300 lines, no include cycle between folders, and
# every source path that README.md, bench/README.md and docs/*.md name exists.
# The folder graph: the folder of each including file -> the folder of each
# header it names by a path from the root (`#include "psstore/store/store.h"`)
# or relative to itself (`"../tests/integration/harness.h"`); folders are
# the leaf directories, so psstore/store and psstore/redis are two. The
# checkers also run on scratch repositories holding one violation of each
# kind, which they must refuse, so this cannot pass by checking nothing.
# usage: $0 [FRESHET]   (the binary is not used; ctest passes it to every ref test)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
passed=0 failed=0
# shellcheck source=tests/ref/expect.sh
source "$root/tests/ref/expect.sh"
max_source=1000 max_header=400 max_readme=300

# product DIR: the product sources of DIR's tree, NUL-separated.
product() {
    (cd "$1" && git ls-files -z -- '*.c' '*.h' '*.cu' '*.cuh' ':!tests')
}

# check_sizes DIR: one line per file over its limit; exit status 1 if any.
check_sizes() {
    local dir=$1
    {
        product "$dir"
        (cd "$dir" && git ls-files -z -- README.md)
    } | (cd "$dir" && perl -e '
        my @files = do { local $/ = "\0"; my @f = <STDIN>; chomp @f; @f };
        my $bad = 0;
        for my $f (@files) {
            open(my $fh, "<", $f) or next;
            my $n = 0; $n++ while <$fh>; close $fh;
            my ($limit, $what) = $f eq "README.md" ? ('"$max_readme"', "README.md")
                : $f =~ /\.(h|cuh)$/ ? ('"$max_header"', "a header")
                : ('"$max_source"', "a source file");
            next if $n <= $limit;
            print "$f: $n lines, over the $limit of $what\n";
            $bad = 1;
        }
        exit $bad;
    ')
}

# check_cycles DIR: prints a folder-level include cycle as a path
# (a -> b -> a) with the include that makes each edge; exit status 1 if any.
check_cycles() {
    local dir=$1
    (cd "$dir" && git ls-files -z -- '*.c' '*.h' '*.cu' '*.cuh') | (cd "$dir" && perl -e '
        use strict; use warnings;
        my @files = do { local $/ = "\0"; my @f = <STDIN>; chomp @f; @f };
        my %tracked = map { $_ => 1 } @files;
        my (%edge, %why);                      # folder -> { folder -> 1 }; "a b" -> example
        sub folder { my ($p) = @_; return $p =~ m{^(.*)/[^/]*$} ? $1 : "." }
        for my $f (@files) {
            open(my $fh, "<", $f) or next;
            my $from = folder($f);
            while (my $l = <$fh>) {
                next unless $l =~ /^\s*#\s*include\s+"([^"]+)"/;
                my $inc = $1;
                my $target;
                if ($tracked{$inc}) {
                    $target = $inc;           # from the root
                } else {
                    (my $rel = "$from/$inc") =~ s{^\./}{};
                    1 while $rel =~ s{(^|/)(?!\.\./)[^/]+/\.\./}{$1};
                    $target = $rel if $tracked{$rel};
                }
                next unless defined $target;
                my $to = folder($target);
                next if $to eq $from;
                $edge{$from}{$to} = 1;
                $why{"$from $to"} //= "$f includes \"$inc\"";
            }
            close $fh;
        }
        # depth-first search; a grey folder met again closes a cycle
        my (%state, @stack);
        my $found;
        sub visit {
            my ($v) = @_;
            $state{$v} = 1; push @stack, $v;
            for my $w (sort keys %{ $edge{$v} || {} }) {
                last if $found;
                if (($state{$w} // 0) == 1) {
                    my ($i) = grep { $stack[$_] eq $w } 0 .. $#stack;
                    $found = [@stack[$i .. $#stack], $w];
                } elsif (!$state{$w}) {
                    visit($w);
                }
            }
            pop @stack; $state{$v} = 2;
        }
        for my $v (sort keys %edge) { visit($v) unless $state{$v} || $found; }
        exit 0 unless $found;
        print "folder include cycle: ", join(" -> ", @$found), "\n";
        for my $i (0 .. $#$found - 1) {
            print "  ", $why{"$found->[$i] $found->[$i + 1]"}, "\n";
        }
        exit 1;
    ')
}

# check_paths DIR: every path into the tree that README.md, bench/README.md
# or docs/*.md names (a token whose first part is a tracked top-level folder,
# as serve/http.c or psstore/store/) is a tracked file or a folder holding
# one; prints each that is not; exit status 1 if any. Tokens with a
# wildcard or a placeholder (psstore/applier*.c, tests/unit/test_<x>.c) name
# no one path and are skipped.
check_paths() {
    local dir=$1
    (cd "$dir" && git ls-files -z) | (cd "$dir" && perl -e '
        use strict; use warnings;
        my @files = do { local $/ = "\0"; my @f = <STDIN>; chomp @f; @f };
        my (%file, %folder, %top);
        for my $f (@files) {
            $file{$f} = 1;
            my @p = split m{/}, $f;
            $top{$p[0]} = 1 if @p > 1;
            $folder{join "/", @p[0 .. $_]} = 1 for 0 .. $#p - 1;
        }
        my @docs = grep { m{^(README\.md|bench/README\.md|docs/[^/]+\.md)$} } sort @files;
        my $bad = 0;
        for my $doc (@docs) {
            open(my $fh, "<", $doc) or next;
            my $n = 0;
            while (my $l = <$fh>) {
                $n++;
                while ($l =~ m|(?<![\w./:\$\{~-])((\w[\w.-]*)(?:/[\w.-]+)*/?)(?=([*<{\$]?))|g) {
                    my ($tok, $first, $next) = ($1, $2, $3);
                    next unless $tok =~ m{/};
                    next unless $top{$first};
                    next if $next ne "";       # a pattern, not a path
                    $tok =~ s{[.]+$}{};        # a full stop after the path
                    (my $p = $tok) =~ s{/$}{};
                    next if $file{$p} || $folder{$p};
                    print "$doc:$n: names $tok, which is not in the tree\n";
                    $bad = 1;
                }
            }
            close $fh;
        }
        exit $bad;
    ')
}

expect 0 "the repository's file sizes" check_sizes "$root"
expect 0 "the repository's folder includes" check_cycles "$root"
expect 0 "the paths the repository's documents name" check_paths "$root"

# The same checkers refuse each kind of violation.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
lines() { # lines N: N lines of C
    local i
    for ((i = 0; i < $1; i++)); do echo "int x$i;"; done
}
mk() { # mk NAME: a clean scratch repository that the next commands may spoil
    local d="$scratch/$1"
    mkdir -p "$d/docs" "$d/a" "$d/b/c" "$d/tests"
    printf '# scratch\n\nThe code is in a/a.c and b/c/ (a/a.h, b/c/c.h); see docs/design.md.\n' >"$d/README.md"
    printf '# Design\n\n`a/` includes `b/c/`, never the reverse.\n' >"$d/docs/design.md"
    printf '#include "a/a.h"\n#include "b/c/c.h"\n' >"$d/a/a.c"
    lines 400 >"$d/a/a.h"
    printf '#include "../c/c.h"\n' >"$d/b/c/c.h"
    lines 1000 >"$d/b/c/c.c"
    lines 1500 >"$d/tests/test_long.c" # tests/ is not product: no limit
    git -C "$d" init -q
}
add() { git -C "$scratch/$1" add -A; }

mk good && add good
for c in check_sizes check_cycles check_paths; do
    expect 0 "a clean scratch tree ($c)" "$c" "$scratch/good"
done
mk source && lines 1001 >"$scratch/source/b/c/c.c" && add source
expect 1 "a source file over $max_source lines" check_sizes "$scratch/source" \
    "b/c/c.c: 1001 lines, over the $max_source of a source file"
mk header && lines 401 >"$scratch/header/a/a.h" && add header
expect 1 "a header over $max_header lines" check_sizes "$scratch/header" \
    "a/a.h: 401 lines, over the $max_header of a header"
mk cuda && lines 1001 >"$scratch/cuda/b/k.cu" && add cuda
expect 1 "a CUDA source over $max_source lines" check_sizes "$scratch/cuda" "b/k.cu: 1001 lines"
mk readme && lines $((max_readme + 1)) >>"$scratch/readme/README.md" && add readme
expect 1 "a README.md over $max_readme lines" check_sizes "$scratch/readme" \
    "README.md: $((max_readme + 4)) lines, over the $max_readme of README.md"
mk cycle && printf '#include "a/a.h"\n' >>"$scratch/cycle/b/c/c.c" && add cycle
expect 1 "a two-folder include cycle" check_cycles "$scratch/cycle" \
    "folder include cycle: a -> b/c -> a"
mk cycle3 && mkdir -p "$scratch/cycle3/d" && printf '#include "a/a.h"\n' >"$scratch/cycle3/d/d.h" &&
    printf '#include "d/d.h"\n' >>"$scratch/cycle3/b/c/c.h" && add cycle3
expect 1 "a three-folder include cycle, one include relative" check_cycles "$scratch/cycle3" \
    "folder include cycle: a -> b/c -> d -> a"
mk path && printf 'The applier is in a/applier.c.\n' >>"$scratch/path/docs/design.md" && add path
expect 1 "a document naming a file not in the tree" check_paths "$scratch/path" \
    "docs/design.md:4: names a/applier.c, which is not in the tree"
mk folder && printf 'See b/d/ for the rest.\n' >>"$scratch/folder/README.md" && add folder
expect 1 "a document naming a folder not in the tree" check_paths "$scratch/folder" \
    "README.md:4: names b/d/, which is not in the tree"
mk untracked && printf 'int y;\n' >"$scratch/untracked/a/new.c" &&
    printf 'New: a/new.c.\n' >>"$scratch/untracked/README.md" &&
    git -C "$scratch/untracked" add README.md docs a/a.c a/a.h b tests
expect 1 "a document naming a file not tracked" check_paths "$scratch/untracked" \
    "README.md:4: names a/new.c, which is not in the tree"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
