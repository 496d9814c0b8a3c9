# expect.sh - sourced by the reference tests that check a checker (test_docs.sh,
# test_layout.sh): each runs its checkers on the repository and on scratch
# repositories that hold one violation each, which they must refuse.
#
# expect WANT NAME CHECKER DIR [PATTERN]: runs CHECKER DIR. WANT 0: it must
# pass; WANT 1: it must fail with a report that contains PATTERN. Counts the
# outcome in the caller's passed and failed, and prints the whole report of
# an outcome that is not the one wanted.
expect() {
    local want=$1 name=$2 checker=$3 dir=$4 pattern=${5:-}
    local out status
    out=$("$checker" "$dir")
    status=$?
    if [ "$want" -eq 0 ] && [ "$status" -eq 0 ]; then
        passed=$((passed + 1))
    elif [ "$want" -ne 0 ] && [ "$status" -ne 0 ] && grep -qF -- "$pattern" <<<"$out"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL: $name: status $status (want $want), report:"
        printf '%s\n' "$out"
    fi
}
