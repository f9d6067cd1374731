#!/bin/bash
# Issue 9 item 8: a NaN in the weights is refused with the tensor's name
# (info and run); logits that come out NaN or infinite at run time stop the
# run with an error instead of decoding token 0 (plain and session runs).
. "$(dirname "$0")/lib.sh"
cli_setup nonfinite

f="$M/model.safetensors"
cp -r "$M" "$tmp/nan"
off=$(tensor_offset "$tmp/nan/model.safetensors" model.layers.1.mlp.up_proj.weight $((seed % 100)))
poke "$tmp/nan/model.safetensors" "$off" c0 7f	# a bf16 NaN
for cmd in "info $tmp/nan" "run --model $tmp/nan --random 4"; do
	out=$("$KVMEM" $cmd 2>&1) && bad "$cmd: a NaN weight was accepted: $out"
	grep -q "tensor 'model.layers.1.mlp.up_proj.weight' holds 1 NaN or infinite value" <<<"$out" ||
		bad "$cmd: the refusal does not name the tensor: $out"
done

# Finite weights whose products overflow: the embedding row of the last
# token (tied: also its lm_head row) all at the largest bf16, 3.39e38.
cp -r "$M" "$tmp/big"
off=$(tensor_offset "$tmp/big/model.safetensors" model.embed_tokens.weight 0)
poke "$tmp/big/model.safetensors" $((off + 1023 * 256 * 2)) $(for i in $(seq 512); do echo 7f; done)
"$KVMEM" info "$tmp/big" >/dev/null || bad "finite weights refused"
out=$("$KVMEM" run --model "$tmp/big" --random 16 --decode 4 2>&1) &&
	bad "plain run decoded from non-finite logits: $out"
grep -q "logits .*hold NaN or infinite values" <<<"$out" || bad "plain run: $out"
printf '{"append_random": 40, "seed": 3}\n{"decode": 4}\n' >"$tmp/s"
out=$("$KVMEM" run --model "$tmp/big" --script "$tmp/s" --json 2>&1) &&
	bad "session decoded from non-finite logits: $out"
grep -q "s:1: the logits hold NaN or infinite values" <<<"$out" || bad "session: $out"
grep -q '"tokens":\[0' <<<"$out" && bad "session printed token 0 from NaN logits: $out"
cli_done "item 8 non-finite values"
