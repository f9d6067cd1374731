#!/bin/bash
# Issue 30: --tp N (kvmem run, kvmem bench engine). --tp 1 runs the
# tensor-parallel code with one rank (user/tp/: the split forward, the sum
# all-reduce of one partial), and on the cpu backend it is bit-exact with
# the path without --tp: the logits of every prompt position (cmp), the
# generated tokens, and an agent session's steps (selections, tokens) with
# a budget under the workspace; with a budget over it, --check-exact's
# logit difference is 0 at every step. --tp N > 1 is refused, saying why:
# the cpu backend runs one rank (run, bench engine, bench step), the
# model's KV heads do not split into N, N out of range. Needs $KVMEM; skipped (77) when it is missing.
. "$(dirname "$0")/lib.sh"
cli_setup tp

run() { timeout 120 "$KVMEM" run --model "$M" --backend cpu "$@"; }

# Plain runs: prompt logits and greedy tokens, chunks of 7 over 61 tokens.
for tp in "" "--tp 1"; do
	f=$tmp/plain${tp:+-tp}
	run --random 61 --seed "$seed" --decode 12 --chunk 7 --logits "$f.bin" $tp >"$f.out" 2>&1 ||
		bad "run ${tp:-without --tp}: $(tail -2 "$f.out")"
done
cmp -s "$tmp/plain.bin" "$tmp/plain-tp.bin" || bad "--tp 1: prompt logits differ from the run without it"
[ -s "$tmp/plain.bin" ] || bad "no logits written"
g0=$(grep '^generated:' "$tmp/plain.out") g1=$(grep '^generated:' "$tmp/plain-tp.out")
[ -n "$g0" ] && [ "$g0" = "$g1" ] || bad "--tp 1 generated '$g1', without it '$g0'"

# An agent session: 366 tokens, budget 96 (selection, entering and leaving
# blocks, moves), and the same steps with --tp 1.
cat >"$tmp/s.jsonl" <<'JSONL'
{"append_random": 150, "seed": 1}
{"decode": 8}
{"append_random": 100, "seed": 2}
{"decode": 8}
{"append_random": 90, "seed": 3}
{"decode": 10}
JSONL
for tp in "" "--tp 1"; do
	f=$tmp/sess${tp:+-tp}
	run --script "$tmp/s.jsonl" --budget 96 --block 16 --chunk 24 --json $tp >"$f.out" \
		2>"$f.err" || bad "session ${tp:-without --tp}: $(tail -2 "$f.err")"
	sed 's/"ms":[0-9.]*//' "$f.out" >"$f.steps"
done
[ "$(wc -l <"$tmp/sess.steps")" -eq 6 ] || bad "session: $(wc -l <"$tmp/sess.steps") steps, want 6"
cmp -s "$tmp/sess.steps" "$tmp/sess-tp.steps" || {
	bad "--tp 1: the session's steps differ"
	diff "$tmp/sess.steps" "$tmp/sess-tp.steps" | head -4
}
out=$(run --script "$tmp/s.jsonl" --budget 400 --block 16 --chunk 24 --check-exact --json \
	--tp 1 2>&1) || bad "--tp 1 --check-exact: $(echo "$out" | tail -2)"
n=$(echo "$out" | grep -c '"max_logit_diff":0,')
[ "$n" -eq 6 ] || bad "--tp 1 --check-exact: $n of 6 steps with logit difference 0"

# Refusals: exit 1 (or 2 for a value out of range) and a sentence.
refuse() {	# WANT_RC PATTERN ARGS...
	local want=$1 pat=$2 rc
	shift 2
	out=$(timeout 60 "$KVMEM" "$@" 2>&1)
	rc=$?
	[ $rc -eq "$want" ] || bad "$*: exit $rc, want $want ($out)"
	echo "$out" | grep -q -- "$pat" || bad "$*: says '$out', not '$pat'"
}
refuse 1 "this backend runs one rank (--tp 1); 2 ranks need the cuda backend and 2 GPUs" \
	run --model "$M" --backend cpu --random 8 --tp 2
refuse 1 "2 KV heads do not split into 4 ranks (the split is by KV heads; for this model: 1, 2)" \
	run --model "$M" --backend cpu --random 8 --tp 4
refuse 1 "this backend runs one rank" \
	run --model "$M" --backend cpu --script "$tmp/s.jsonl" --tp 2
refuse 2 "--tp wants an integer in 1..64" run --model "$M" --random 8 --tp 0
refuse 2 "--tp wants an integer in 1..64" run --model "$M" --random 8 --tp 65
refuse 1 "this backend runs one rank" \
	bench engine --backend cpu --model "$M" --prefill 32 --decode 32 --decode-tokens 2 --tp 2
refuse 1 "this backend runs one rank" bench step --backend cpu --model "$M" --only step --tp 2

# kvmem bench engine --tp 1 runs (the split code on the cpu backend).
timeout 120 "$KVMEM" bench engine --backend cpu --model "$M" --prefill 64 --decode 64 \
	--decode-tokens 4 --tp 1 >"$tmp/bench.out" 2>&1 || bad "bench engine --tp 1: $(tail -2 "$tmp/bench.out")"
cli_done tp
