#!/usr/bin/env bash
# The documents a clone needs are in the clone: no tracked file points
# outside the repository (the brief the project started from is not part of
# it), every docs/ citation (a file name and a quoted "Section") names a file
# and a heading that exist, and every relative Markdown link resolves (file,
# and #anchor where given). Every metric the code registers is in
# docs/operations.md, and every metric that page names is registered. The
# checkers also run on scratch repositories holding one bogus reference of
# each kind, which they must refuse.
# usage: $0 [FRESHET]   (the binary is not used; ctest passes it to every ref test)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
passed=0 failed=0
# shellcheck source=tests/ref/expect.sh
source "$root/tests/ref/expect.sh"

# check_tree DIR: prints one line per broken reference; exit status 1 if any.
check_tree() {
    local dir=$1
    (cd "$dir" && git ls-files -z) | (cd "$dir" && xargs -0 perl -e '
        use strict; use warnings;
        my $outside = "..\x2fshared";          # spelled so that this file does not match
        my $brief = "DESIGN" . ".md";
        my %headings;                          # file -> { heading text -> 1, slug -> 1 }
        sub headings {
            my ($f) = @_;
            return $headings{$f} if $headings{$f};
            my %h;
            local $/ = "\n";
            if (open(my $fh, "<", $f)) {
                my $fence = 0;
                while (my $l = <$fh>) {
                    $fence = !$fence if $l =~ /^```/;
                    next if $fence;
                    next unless $l =~ /^#{1,6}\s+(.*?)\s*#*\s*$/;
                    my $t = $1;
                    $h{"text:$t"} = 1;
                    (my $slug = lc $t) =~ s/[^\w\- ]//g;
                    $slug =~ s/ /-/g;
                    $h{"slug:$slug"} = 1;
                }
            }
            return $headings{$f} = \%h;
        }
        my $bad = 0;
        sub bad { print "$_[0]\n"; $bad = 1; }
        for my $f (@ARGV) {
            next if -l $f || ! -f $f || -B $f;
            open(my $fh, "<", $f) or next;
            local $/; my $text = <$fh>; close $fh;
            my @lines = split /\n/, $text, -1;
            for my $i (0 .. $#lines) {
                bad("$f:" . ($i + 1) . ": points outside the repository ($outside)")
                    if index($lines[$i], $outside) >= 0;
                bad("$f:" . ($i + 1) . ": cites $brief, which the repository does not have")
                    if index($lines[$i], $brief) >= 0;
            }
            # Citations may wrap: join lines, dropping comment leaders.
            (my $flat = $text) =~ s/\n[ \t]*(?:\*(?!\/)|\/\/|#(?!#))?[ \t]*/ /g;
            while ($flat =~ m{(?<![\w/.])(docs/[\w.-]+\.md)((?:\s*\(?\s*"[^"\n]+"\s*,?)*)}g) {
                my ($doc, $list) = ($1, $2);
                if (! -f $doc) { bad("$f: cites $doc, which does not exist"); next; }
                while ($list =~ /"([^"]+)"/g) {
                    bad("$f: cites $doc \"$1\", which has no such heading")
                        unless headings($doc)->{"text:$1"};
                }
            }
            next unless $f =~ /\.md$/;
            (my $dirname = $f) =~ s{[^/]*$}{};
            my $body = $text;
            $body =~ s/^```.*?^```//msg;       # code blocks hold no links
            $body =~ s/`[^`\n]*`//g;
            while ($body =~ /\]\(([^)\s]+)\)/g) {
                my $link = $1;
                next if $link =~ m{^(?:[a-z]+:|/)};
                my ($path, $anchor) = split /#/, $link, 2;
                my $target = $path eq "" ? $f : "$dirname$path";
                1 while $target =~ s{(^|/)(?!\.\./)[^/]+/\.\./}{$1};
                if (! -e $target) { bad("$f: links to $link, which does not exist"); next; }
                bad("$f: links to $link, which has no such heading")
                    if defined $anchor && -f $target && !headings($target)->{"slug:$anchor"};
            }
        }
        exit $bad;
    ')
}

# check_metrics DIR: the metric names in quotes in the C sources outside
# tests/ and bench/ against the ones docs/operations.md names; prints each
# one missing on either side; exit status 1 if any.
check_metrics() {
    local dir=$1 code docs
    code=$(cd "$dir" && git grep -ohE '"freshet_[a-z0-9_]+"' -- '*.c' ':!tests' ':!bench' |
        tr -d '"' | sort -u)
    docs=$(cd "$dir" && grep -ohE '`freshet_[a-z0-9_]+' docs/operations.md | tr -d '`' | sort -u)
    local missing extra
    missing=$(comm -23 <(printf '%s\n' "$code") <(printf '%s\n' "$docs") | sed '/^$/d')
    extra=$(comm -13 <(printf '%s\n' "$code") <(printf '%s\n' "$docs") | sed '/^$/d')
    [ -z "$missing" ] || printf 'metric %s is registered but not in docs/operations.md\n' $missing
    [ -z "$extra" ] || printf 'metric %s is in docs/operations.md but registered nowhere\n' $extra
    [ -z "$missing$extra" ]
}

expect 0 "the repository" check_tree "$root"
expect 0 "the repository's metrics" check_metrics "$root"
for doc in docs/design.md docs/operations.md docs/http.md bench/README.md; do
    if [ -f "$root/$doc" ]; then passed=$((passed + 1)); else
        failed=$((failed + 1)); echo "FAIL: $doc is missing"; fi
done

# The same checker refuses each kind of bogus reference.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mk() { # mk NAME FILE TEXT: a scratch repository with docs/ and one more file
    local d="$scratch/$1"
    mkdir -p "$d/docs" "$d/src"
    printf '# Design\n\n## Data flow\n\ntext\n\n## Redis layout\n' >"$d/docs/design.md"
    printf '%b' "$3" >"$d/$2"
    git -C "$d" init -q && git -C "$d" add -A
}
mk good src/a.c '/* see docs/design.md "Data flow", "Redis layout" and\n * docs/design.md\n * "Data flow" */\n'
expect 0 "valid citations" check_tree "$scratch/good"
mk section src/a.c '/* see docs/design.md\n * "Offsets" */\n'
expect 1 "a missing section" check_tree "$scratch/section" 'cites docs/design.md "Offsets", which has no such heading'
# (names that do not exist are spelled in pieces, so that this file cites none)
nowhere="docs/nowhere"".md" ops="docs/ops"".md" opsmd="docs/operations"".md"
mk file src/a.c "/* see $nowhere \"Data flow\" */\n"
expect 1 "a missing document" check_tree "$scratch/file" "cites $nowhere, which does not exist"
mk outside src/a.sh "# read ..\x2fshared/DESIGN\x2emd\n"
expect 1 "a path outside the repository" check_tree "$scratch/outside" "points outside the repository"
mk link README.md "See [the design](docs/design.md#redis-layout) and [ops]($ops).\n"
expect 1 "a dead link" check_tree "$scratch/link" "links to $ops, which does not exist"
mk anchor README.md 'See [the design](docs/design.md#no-such-part).\n'
expect 1 "a dead anchor" check_tree "$scratch/anchor" "links to docs/design.md#no-such-part, which has no such heading"

mk metric src/m.c 'r = fr_metrics_counter(reg, "freshet_bogus_total", "x");\n'
mkdir -p "$scratch/metric/docs" && printf '| `freshet_listed_total` | counter |\n' >"$scratch/metric/docs/operations.md"
git -C "$scratch/metric" add -A
expect 1 "an undocumented metric" check_metrics "$scratch/metric" \
    "metric freshet_bogus_total is registered but not in $opsmd"
expect 1 "a documented metric nobody registers" check_metrics "$scratch/metric" \
    "metric freshet_listed_total is in $opsmd but registered nowhere"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
