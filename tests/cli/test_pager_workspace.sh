#!/bin/bash
# kvmem run --workspace DIR end to end on the tiny random model, with a host
# pool far smaller than the workspace:
#  - --check-exact holds (budget over the workspace);
#  - a session run in two parts, with the workspace closed and reopened in
#    between (no re-prefill: the history is adopted from the pages), decodes
#    exactly the tokens of the same session run in one go; with a small
#    budget too, in four parts, every step's output equal (the session
#    state stored at each commit); other options on reopen: one warning and
#    a fresh selection;
#  - with a small budget (pages are re-read through the pager at every
#    selection), tokens and logit differences equal a run without a workspace;
#  - kvmem verify and kvmem stat on the result; a flipped byte is found by
#    verify and refused by the next run; another model's workspace is refused
#    naming both fingerprints;
#  - the USDT probes are in the binary.
# Needs $KVMEM; skipped (77) when the model generator does not work.
set -u
. "$(dirname "$0")/lib.sh"	# flip_byte
KVMEM=${KVMEM:-build/kvmem}
[ -x "$KVMEM" ] || { echo "no kvmem binary at $KVMEM"; exit 77; }
tmp=$(mktemp -d /var/tmp/kvmem-pager-cli.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if ! "$KVMEM" generate --preset tiny --out "$tmp/model" >/dev/null 2>&1; then
	echo "kvmem generate does not work yet: skipping"
	exit 77
fi
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
fail=0
bad() { echo "FAIL: $*"; fail=1; }
run() { "$KVMEM" run --model "$tmp/model" --chunk 48 --host-cap 128k "$@"; }
tokens() { grep -o '"tokens":\[[0-9,]*\]' | grep -v '\[\]'; }

cat >"$tmp/part1" <<'EOS'
{"append_random": 20, "seed": 1, "pin": true}
{"append_random": 150, "seed": 2}
{"decode": 10}
{"append_random": 198, "seed": 3}
{"decode": 12}
EOS
cat >"$tmp/part2" <<'EOS'
{"append_random": 77, "seed": 4}
{"decode": 20}
{"append_random": 129, "seed": 5}
{"decode": 15}
EOS
cat "$tmp/part1" "$tmp/part2" >"$tmp/whole"

# One go, exact, through a 128 KiB pool (the workspace is 2.5 MiB of pages).
out=$(run --script "$tmp/whole" --workspace "$tmp/one" --check-exact --json 2>&1) ||
	bad "one-go exact run: $(echo "$out" | tail -3)"
echo "$out" | grep -q "check-exact ok" || bad "one go: check-exact not ok"
echo "$out" | tokens >"$tmp/one.tokens"

# Two parts with a reopen: the same tokens, the history adopted, not re-run.
out=$(run --script "$tmp/part1" --workspace "$tmp/two" --json 2>&1) || bad "part 1: $out"
echo "$out" | tokens >"$tmp/two.tokens"
out=$(run --script "$tmp/part2" --workspace "$tmp/two" --json 2>&1) || bad "part 2: $out"
echo "$out" | tokens >>"$tmp/two.tokens"
echo "$out" | grep -q '"workspace_tokens":467,' || bad "part 2 did not continue at 390 tokens"
[ "$(grep -c . "$tmp/one.tokens")" -eq 4 ] || bad "one go: expected 4 decode steps"
cmp -s "$tmp/one.tokens" "$tmp/two.tokens" || {
	bad "two parts decode other tokens than one go"
	diff "$tmp/one.tokens" "$tmp/two.tokens"
}

# Small budget (64 of 631 tokens): four parts with three reopens, ending
# mid-tail, right after a selection ({"decode": 0}) and after a decode,
# print exactly what one go prints (every step's plan, diff and tokens):
# each reopen restores the session state stored with the last commit.
cat >"$tmp/s1" <<'EOS'
{"append_random": 20, "seed": 1, "pin": true}
{"append_random": 150, "seed": 2}
EOS
cat >"$tmp/s2" <<'EOS'
{"decode": 10}
{"append_random": 198, "seed": 3}
{"decode": 0}
EOS
cat >"$tmp/s3" <<'EOS'
{"decode": 12}
{"append_random": 77, "seed": 4}
{"decode": 20}
EOS
cat >"$tmp/s4" <<'EOS'
{"append_random": 129, "seed": 5}
{"decode": 15}
EOS
cat "$tmp/s1" "$tmp/s2" "$tmp/s3" "$tmp/s4" >"$tmp/swhole"
steps() { sed 's/"step":[0-9]*,"line":[0-9]*,//; s/,"ms":[0-9.]*//' "$@"; }
for pol in meank quest random; do
	small=(--budget 64 --block 16 --policy "$pol" --seed 11)
	[ "$pol" = random ] && small+=(--temperature 0.8)
	run --script "$tmp/swhole" "${small[@]}" --json --workspace "$tmp/sone-$pol" \
		>"$tmp/sone.json" 2>"$tmp/sone.err" || bad "$pol one go: $(tail -2 "$tmp/sone.err")"
	: >"$tmp/stwo.json"
	for part in s1 s2 s3 s4; do
		run --script "$tmp/$part" "${small[@]}" --json --workspace "$tmp/stwo-$pol" \
			>>"$tmp/stwo.json" 2>"$tmp/stwo.err" ||
			bad "$pol part $part: $(tail -2 "$tmp/stwo.err")"
		grep -q warning "$tmp/stwo.err" && bad "$pol part $part warned: $(grep warning "$tmp/stwo.err")"
	done
	[ "$(grep -c . "$tmp/sone.json")" -eq 10 ] || bad "$pol one go: expected 10 steps"
	cmp -s <(steps "$tmp/sone.json") <(steps "$tmp/stwo.json") || {
		bad "$pol: four parts with a small budget differ from one go"
		diff <(steps "$tmp/sone.json") <(steps "$tmp/stwo.json") | head -6
	}
	grep -q '"forced":[1-9]' "$tmp/sone.json" || bad "$pol: no forced selection: budget too large?"
done
# Other options on reopen: the saved state is refused with one warning
# naming what differs, and the run goes on from a fresh selection.
out=$(run --script "$tmp/s4" --budget 96 --block 16 --policy meank --seed 11 --json \
	--workspace "$tmp/sone-meank" 2>&1 >/dev/null) || bad "other options on reopen: $out"
[ "$(echo "$out" | grep -c warning)" -eq 1 ] || bad "other options: not one warning: $out"
echo "$out" | grep -q "saved with other options: budget 64 (this session: 96)" ||
	bad "other options: the warning does not name the budget: $out"

# Small budget: selection re-reads pages through the 128 KiB pool; the
# results are those of the same run over plain memory.
run --script "$tmp/whole" --budget 96 --check-exact --json >"$tmp/mem.json" 2>/dev/null ||
	bad "small budget without workspace"
run --script "$tmp/whole" --budget 96 --check-exact --json --workspace "$tmp/small" \
	>"$tmp/ws.json" 2>"$tmp/ws.err" || bad "small budget with workspace: $(tail -2 "$tmp/ws.err")"
strip() { sed 's/"ms":[0-9.]*,//' "$1"; }
cmp -s <(strip "$tmp/mem.json") <(strip "$tmp/ws.json") || bad "paging changed the results"
reads=$(grep -o '[0-9]* pages read' "$tmp/ws.err" | cut -d' ' -f1)
[ "${reads:-0}" -gt 0 ] || bad "small budget: no page was read back through the pager"

# verify / stat.
"$KVMEM" verify "$tmp/two" >"$tmp/v.out" || bad "verify of a good workspace: $(cat "$tmp/v.out")"
grep -q "631 tokens" "$tmp/v.out" || bad "verify: wrong token count: $(cat "$tmp/v.out")"
"$KVMEM" stat "$tmp/two" >"$tmp/s.out" || bad "stat failed"
grep -q "^commits  *9 " "$tmp/s.out" || bad "stat: expected 9 commits: $(grep commits "$tmp/s.out")"
grep -q "^pages_in" "$tmp/s.out" || bad "stat: no pages_in counter"

# Another model (same geometry, other weights) is refused, naming both.
"$KVMEM" generate --preset tiny --seed 7 --out "$tmp/model7" >/dev/null 2>&1
if out=$("$KVMEM" run --model "$tmp/model7" --script "$tmp/part2" --workspace "$tmp/two" 2>&1); then
	bad "another model's workspace was accepted"
elif [ "$(echo "$out" | grep -o 'fingerprint [0-9a-f]\{16\}' | sort -u | wc -l)" -ne 2 ]; then
	bad "refusal does not name both fingerprints: $out"
fi

# A flipped byte: verify names it, the next run refuses to use it.
flip_byte "$tmp/two/pages" 40000
if "$KVMEM" verify -q "$tmp/two" >"$tmp/v.out"; then
	bad "verify missed a flipped byte"
fi
# Which page holds byte 40000 depends on the page size: f32 pages from the
# CPU engine, bf16 from a GPU's (4 layers in the tiny model).
pb=$("$KVMEM" stat "$tmp/two" | grep -o 'pages of [0-9]* bytes' | awk '{ print $3 }')
pg=$((40000 / pb))
grep -q "pages: page $pg (block $((pg / 4)), layer $((pg % 4)))" "$tmp/v.out" ||
	bad "verify output: $(cat "$tmp/v.out")"
if out=$(run --script "$tmp/part2" --workspace "$tmp/two" 2>&1); then
	bad "a corrupt page was used"
fi
echo "$out" | grep -q "checksum mismatch" || bad "no checksum message: $out"

# The USDT probes.
if command -v readelf >/dev/null; then
	notes=$(readelf -n "$KVMEM")
	for p in hit miss tier_move page_in evict stage_out backpressure prefetch io_error commit step; do
		echo "$notes" | grep -q "Name: $p\$" || bad "USDT probe kvmem:$p missing"
	done
fi

[ $fail -eq 0 ] && echo "pager workspace: all checks passed"
exit $fail
