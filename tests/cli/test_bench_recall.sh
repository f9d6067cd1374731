#!/bin/bash
# kvmem bench recall on the shipped model, small: one depth, a few questions
# at the native window and 2x. The CSV has a row per cell with the needle's
# rank and the pages read; full context needs no pages; --trace shows what
# outranked the needle; bad options and training seeds are refused.
set -u
KVMEM=${KVMEM:-build/kvmem}
[ -x "$KVMEM" ] || { echo "no $KVMEM"; exit 77; }
tmp=$(mktemp -d /tmp/kvmem-recall.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "bench recall test: $*"; exit 1; }
model=models/agentlang

out=$("$KVMEM" bench recall --model $model --sizes 1,2 --depths 0.5 --questions 3 \
	--policies full,meank,refine --csv "$tmp/r.csv" --quiet 2>&1) || fail "run failed: $out"
head -1 "$tmp/r.csv" | grep -q ',needle_rank_median$' || fail "no rank column: $(head -1 "$tmp/r.csv")"
# full at 1x only (2x does not fit the window), meank and refine at both.
[ "$(tail -n +2 "$tmp/r.csv" | wc -l)" -eq 5 ] || fail "expected 5 cells: $(cat "$tmp/r.csv")"
awk -F, 'NR > 1 {
	if ($6 != 3) { print "cell " $2 "x " $4 ": " $6 " questions"; bad = 1 }
	if ($4 == "full" && ($9 != 0 || $10 != -1)) { print "full read pages or ranked"; bad = 1 }
	if ($4 != "full" && ($10 < 0 || $9 <= 0)) { print $4 " " $2 "x: rank " $10 " MB " $9; bad = 1 }
	if ($5 < 0 || $5 > 1 || $7 < 0 || $7 > 1) { print "out of range: " $0; bad = 1 }
} END { exit bad }' "$tmp/r.csv" || fail "bad cells: $(cat "$tmp/r.csv")"
# refine reads the keys it scores on top of the view's pages.
mb() { awk -F, -v p="$1" '$2 == 2 && $4 == p { print $9 }' "$tmp/r.csv"; }
awk -v r="$(mb refine)" -v m="$(mb meank)" 'BEGIN { exit !(r > m) }' ||
	fail "refine read no more than meank: $(mb refine) vs $(mb meank) MB"

out=$("$KVMEM" bench recall --model $model --sizes 2 --depths 0.5 --questions 2 \
	--policies subblock --trace 3 --quiet 2>&1) || fail "trace run failed: $out"
[ "$(grep -c '^trace: needle at' <<<"$out")" -eq 2 ] || fail "no trace per question: $out"
grep -q '^  #2 block' <<<"$out" || fail "trace lists no third block: $out"

"$KVMEM" bench recall --model $model --seed 5 >/dev/null 2>&1
[ $? -ne 0 ] || fail "a training seed was accepted"
"$KVMEM" bench recall --model $model --trace 0 >/dev/null 2>&1
[ $? -ne 0 ] || fail "--trace 0 was accepted"
"$KVMEM" bench recall --model $model --policies nosuch >/dev/null 2>&1
[ $? -ne 0 ] || fail "an unknown policy was accepted"
echo "bench recall: all checks passed"
