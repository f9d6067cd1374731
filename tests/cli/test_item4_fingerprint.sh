#!/bin/bash
# Issue 9 item 4: the model fingerprint covers every byte. One bit changed
# in the middle of layer 0's q_proj (128 KiB, far from the first and last
# 4 KiB the old fingerprint read) changes `kvmem info`'s fingerprint, and a
# workspace made with the model is then refused as another model's. Put
# back, the model opens the workspace again.
. "$(dirname "$0")/lib.sh"
cli_setup fingerprint

printf '{"append_random": 100, "seed": 1}\n{"decode": 2}\n' >"$tmp/s"
"$KVMEM" run --model "$M" --script "$tmp/s" --workspace "$tmp/ws" >/dev/null 2>&1 ||
	bad "first run failed"
fp0=$("$KVMEM" info "$M" | sed -n 's/^fingerprint *\([0-9a-f]*\).*/\1/p')
f="$M/model.safetensors"
pct=$((30 + seed % 41))
off=$(tensor_offset "$f" model.layers.0.self_attn.q_proj.weight $pct)
old=$(od -An -tx1 -j "$off" -N1 "$f" | tr -d ' ')
poke "$f" "$off" "$(printf '%02x' $((0x$old ^ 1)))"
fp1=$("$KVMEM" info "$M" | sed -n 's/^fingerprint *\([0-9a-f]*\).*/\1/p')
[ -n "$fp0" ] && [ "$fp0" != "$fp1" ] || bad "one bit at $pct% of q_proj: fingerprint $fp0 -> $fp1"
out=$("$KVMEM" run --model "$M" --script "$tmp/s" --workspace "$tmp/ws" 2>&1) &&
	bad "the workspace reopened under other weights: $out"
grep -q "fingerprint" <<<"$out" || bad "the refusal does not name the fingerprint: $out"
poke "$f" "$off" "$old"
[ "$("$KVMEM" info "$M" | sed -n 's/^fingerprint *\([0-9a-f]*\).*/\1/p')" = "$fp0" ] ||
	bad "the byte put back did not restore the fingerprint"
"$KVMEM" run --model "$M" --script "$tmp/s" --workspace "$tmp/ws" >/dev/null 2>&1 ||
	bad "the original model no longer opens its workspace"
cli_done "item 4 fingerprint"
