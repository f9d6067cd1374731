#!/bin/bash
# Issue 9 item 9: parsing never changes input silently. Token files: a NUL
# byte is an error (it read "1\0 2" as other ids), a 71-digit number is one
# bad token (it was split in two ids). Sizes: one parser, k/M/G/T binary,
# anything else refused ("1T" meant 1 byte, "5X" 5 bytes, nan/inf/1e30
# fell back or asked for 128 TiB). Sampling: a negative temperature and
# top-p 0 are refused, not read as greedy / no filtering.
. "$(dirname "$0")/lib.sh"
cli_setup parsing

refused() { # what, wanted text, command words after "kvmem"
	local what=$1 want=$2 out rc
	shift 2
	out=$("$KVMEM" "$@" 2>&1)
	rc=$?
	[ $rc -eq 2 ] || bad "$what: exit $rc, want 2 (bad usage): $out"
	grep -qF -- "$want" <<<"$out" || bad "$what: want '$want', got: $out"
}
failed() { # the same for bad input (exit 1)
	local what=$1 want=$2 out rc
	shift 2
	out=$("$KVMEM" "$@" 2>&1)
	rc=$?
	[ $rc -eq 1 ] || bad "$what: exit $rc, want 1: $out"
	grep -qF -- "$want" <<<"$out" || bad "$what: want '$want', got: $out"
}

printf '1\0 2' >"$tmp/nul"
failed "NUL in --prompt" "a NUL byte at offset 1" run --model "$M" --prompt "$tmp/nul" --decode 1
printf '5 %s 7\n' "$(printf '9%.0s' $(seq 71))" >"$tmp/long"
failed "71-digit id" "the token at index 1 (offset 2) is a number of 71 digits" \
	run --model "$M" --prompt "$tmp/long" --decode 1
printf '3 -4\n' >"$tmp/neg"
failed "negative id" "the token at index 1 (offset 2) is not a decimal id" \
	run --model "$M" --prompt "$tmp/neg" --decode 1
printf '3 1024\n' >"$tmp/big"
failed "id past the vocabulary" "is 1024, outside the vocabulary 0..1023" \
	run --model "$M" --tokens "$tmp/big" --decode 1
# the old spelling --tokens still reads a prompt, ids as written
printf ' 5\t6\n\n7 ' >"$tmp/ok"
out=$("$KVMEM" run --model "$M" --tokens "$tmp/ok" --decode 1 2>&1) || bad "a good prompt: $out"
grep -q "^prefill: 3 tokens" <<<"$out" || bad "a good prompt is not 3 tokens: $out"

printf '{"append_random": 40}\n{"decode": 1}\n' >"$tmp/s"
for v in 5X nan inf 1e30 -1 1.5G 1TB 0x10 "" 16EiB 99999999999999999999; do
	refused "--host-cap '$v'" "--host-cap wants a size in bytes" \
		run --model "$M" --script "$tmp/s" --workspace "$tmp/ws" --host-cap "$v"
done
refused "--shard-size 1.5G" "--shard-size wants a size in bytes" \
	generate --preset tiny --out "$tmp/g" --shard-size 1.5G
refused "--size nan" "--size wants a size in bytes" bench pager --size nan
refused "--mem 1e30" "--mem wants a size in bytes" bench select --mem 1e30
# k/M/G/T are powers of 1024: shards take at least 1 MiB, so 1024k passes
# (1048576) and 1023k does not; as powers of 1000 neither would.
"$KVMEM" generate --preset tiny --out "$tmp/g" --shard-size 1024k >/dev/null ||
	bad "--shard-size 1024k (1 MiB) refused"
refused "--shard-size 1023k" "--shard-size wants a size in bytes from 1048576" \
	generate --preset tiny --out "$tmp/g2" --shard-size 1023k
out=$("$KVMEM" run --model "$M" --script "$tmp/s" --workspace "$tmp/ws2" --host-cap 2M 2>&1) ||
	bad "--host-cap 2M refused: $out"

refused "--temperature -1" "--temperature wants a number from 0" run --model "$M" --random 4 --temperature -1
refused "--temperature nan" "--temperature wants a number" run --model "$M" --random 4 --temperature nan
refused "--top-p 0" "--top-p wants a share of the probability mass with 0 < P <= 1" \
	run --model "$M" --random 4 --top-p 0
refused "--top-p 1.5" "--top-p wants" run --model "$M" --random 4 --top-p 1.5
refused "--top-k -1" "--top-k wants an integer" run --model "$M" --random 4 --top-k -1
refused "--decode 1e3" "--decode wants a count" run --model "$M" --random 4 --decode 1e3
refused "--seed -5" "--seed wants an unsigned" run --model "$M" --random 4 --seed -5
refused "--budget 12abc" "--budget wants a count" run --model "$M" --script "$tmp/s" --budget 12abc
refused "demo --tokens 4.5k" "--tokens wants a count" demo --tokens 4.5k
refused "synth --views nan" "--views wants a number from 0 to 1" synth corpus --tokens 1k \
	--out "$tmp/c" --views nan
refused "synth --lookalikes 17" "--lookalikes wants an integer in 1..16, not '17'" synth corpus \
	--tokens 1k --out "$tmp/c" --lookalikes 17
out=$("$KVMEM" synth corpus --tokens 2k --seq-len 512 --seed 1000000001 --views 1 \
	--lookalikes 8 --out "$tmp/c" --quiet 2>&1) || bad "synth --lookalikes 8: $out"
grep -q "look-alikes 8)" <<<"$out" || bad "synth --lookalikes 8 not said: $out"
# counts take k/M/G as powers of 1000
out=$("$KVMEM" run --model "$M" --random 1k --decode 1 2>&1) || bad "--random 1k: $out"
grep -q "^prefill: 1000 tokens" <<<"$out" || bad "--random 1k is not 1000 tokens: $out"
cli_done "item 9 strict parsing"
