#!/bin/bash
# kvmem run --kv-dtype fp8 end to end on the tiny random model:
#  - a session over an fp8 workspace passes --check-exact (budget over the
#    workspace: equal to full attention over the same fp8 KV); its logits
#    differ from a bf16 (here f32) run's;
#  - kvmem stat says fp8 and counts the pages' bytes (scales included);
#    kvmem verify finds it whole;
#  - the workspace reopens with --kv-dtype fp8 and goes on, and is refused
#    without it (exit 1, naming both dtypes), as is a bf16 workspace asked
#    for fp8; a bad value is a usage error.
. "$(dirname "$0")/lib.sh"
cli_setup kv-dtype
run() { "$KVMEM" run --model "$M" --chunk 32 --backend cpu "$@"; }

cat >"$tmp/s1" <<'EOS'
{"append_random": 100, "seed": 1}
{"decode": 6}
{"append_random": 70, "seed": 2}
{"decode": 6}
EOS
cat >"$tmp/s2" <<'EOS'
{"append_random": 40, "seed": 3}
{"decode": 4}
EOS

out=$(run --script "$tmp/s1" --workspace "$tmp/fp8" --kv-dtype fp8 --check-exact --json 2>&1) ||
	bad "fp8 exact run: $(echo "$out" | tail -3)"
echo "$out" | grep -q "check-exact ok" || bad "fp8: check-exact not ok"
out=$("$KVMEM" stat "$tmp/fp8" 2>&1) || bad "stat: $out"
echo "$out" | grep -qw fp8 || bad "stat does not say fp8: $out"
# The tiny preset: 2 KV heads, head_dim 64; blocks of 32. A page is its K
# and V bytes plus a scale per row of each: 2*H*B*D + 8*H*B = 8704 (bf16:
# 16384).
echo "$out" | grep -q "pages of $((2 * 2 * 32 * 64 + 8 * 2 * 32)) bytes" ||
	bad "stat: page bytes are not 2HBD + 8HB: $(echo "$out" | grep committed)"
"$KVMEM" verify "$tmp/fp8" >/dev/null 2>&1 || bad "verify: the fp8 workspace is not whole"

out=$(run --script "$tmp/s2" --workspace "$tmp/fp8" --kv-dtype fp8 --json 2>&1) ||
	bad "fp8 reopen: $(echo "$out" | tail -3)"
echo "$out" | grep -q '"workspace_tokens":222,' || bad "fp8 reopen did not go on at 182 tokens"
out=$(run --script "$tmp/s2" --workspace "$tmp/fp8" --json 2>&1)
[ $? -eq 1 ] || bad "an fp8 workspace opened without --kv-dtype fp8 was not refused"
echo "$out" | grep -q "KV is fp8, this open asks for f32" ||
	bad "refusal does not name both: $out"

run --script "$tmp/s1" --workspace "$tmp/plain" --json >/dev/null 2>&1 || bad "plain run"
out=$(run --script "$tmp/s2" --workspace "$tmp/plain" --kv-dtype fp8 --json 2>&1)
[ $? -eq 1 ] || bad "an f32 workspace opened as fp8 was not refused"
echo "$out" | grep -q "KV is f32, this open asks for fp8" || bad "refusal: $out"

# Plain runs: fp8 changes the logits (the quantisation is there).
run --random 80 --seed 5 --logits "$tmp/l32" >/dev/null 2>&1 || bad "plain f32 run"
run --random 80 --seed 5 --kv-dtype fp8 --logits "$tmp/l8" >/dev/null 2>&1 || bad "plain fp8 run"
cmp -s "$tmp/l32" "$tmp/l8" && bad "fp8 KV gave the logits of f32 KV"
run --random 8 --kv-dtype fp4 >/dev/null 2>&1
[ $? -eq 2 ] || bad "--kv-dtype fp4 is not a usage error"
cli_done test_kv_dtype
