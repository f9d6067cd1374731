#!/bin/bash
# Issue 9 item 10: errors say what is wrong. Each case below once printed
# something misleading (in brackets).
. "$(dirname "$0")/lib.sh"
cli_setup messages

says() { # what, wanted text, unwanted text ("" for none), command words after "kvmem"
	local what=$1 want=$2 unwanted=$3 out
	shift 3
	out=$("$KVMEM" "$@" 2>&1) && bad "$what: exit 0"
	grep -qF -- "$want" <<<"$out" || bad "$what: want '$want', got: $out"
	[ -z "$unwanted" ] || ! grep -qF -- "$unwanted" <<<"$out" || bad "$what: says '$unwanted': $out"
}
# ["pin" goes with an append]
printf '{"decode": 1, "seed": 1}\n' >"$tmp/ds"
says "decode with a seed" '"seed" goes with "append_random"' '"pin"' run --model "$M" --script "$tmp/ds"
# [the script holds no steps]
says "a directory as script" "$tmp: a directory, not a script" "no steps" run --model "$M" --script "$tmp"
# [wants a token count >= 1]
printf '{"append_random": 1e12}\n' >"$tmp/big"
says "append_random 1e12" '"append_random" wants a token count from 1 to 268435456, not 1000000000000' "" \
	run --model "$M" --script "$tmp/big"
printf '{"append_random": 300000000}\n' >"$tmp/big2"
says "append_random 3e8" 'wants a token count from 1 to 268435456, not 300000000' "" \
	run --model "$M" --script "$tmp/big2"
# [unknown option '--random']
says "--random with --json" "--json is an option of agent sessions" "unknown option" \
	run --model "$M" --random 4 --json
printf '{"append_random": 8}\n' >"$tmp/s"
says "--random with --script" "--random is an option of plain runs" "unknown option" \
	run --model "$M" --script "$tmp/s" --random 4
says "an unknown option" "kvmem run: unknown option '--nope' (kvmem run --help)" "" run --model "$M" --nope
says "a missing value" "kvmem run: --model needs a value" "" run --model
# [holds config.json but neither model.safetensors nor ...]
mkdir "$tmp/dl"
cp "$M/config.json" "$tmp/dl/"
ln -s "$tmp/gone" "$tmp/dl/model.safetensors"
says "a dangling model link" "model.safetensors: a dangling symbolic link to '$tmp/gone'" "neither" \
	info "$tmp/dl"
# [a commit failure printed twice] A file size limit makes the pages file
# refuse to grow (SIGXFSZ ignored: the write fails with EFBIG instead).
printf '{"append_random": 40, "seed": 1}\n' >"$tmp/a"
printf '{"append_random": 400, "seed": 2}\n{"decode": 2}\n' >"$tmp/b"
"$KVMEM" run --model "$M" --script "$tmp/a" --workspace "$tmp/ws" >/dev/null 2>&1 || bad "first run"
out=$(trap '' XFSZ; ulimit -f 200; "$KVMEM" run --model "$M" --script "$tmp/b" --workspace "$tmp/ws" 2>&1 >/dev/null)
[ $? -eq 1 ] || bad "a commit past the file size limit did not fail: $out"
n=$(grep -c "File too large" <<<"$out")
[ "$n" -eq 1 ] || bad "a commit failure printed $n times: $out"
grep -q "b:1: .*the workspace stays at its last commit (40 tokens)" <<<"$out" ||
	bad "the commit failure does not name the line and what is kept: $out"
# [KVMEM_MATMUL set to anything hung the first matmul: a pthread_once
# entered again from inside itself; an unknown or missing instruction set
# went unsaid] The names it takes run; the rest refuse the cpu backend.
export KVMEM_MATMUL=c
timeout 60 "$KVMEM" run --model "$M" --backend cpu --random 8 --decode 2 >/dev/null 2>&1 ||
	bad "KVMEM_MATMUL=c: rc $? (124: hung)"
KVMEM_MATMUL=sse9 says "an unknown KVMEM_MATMUL" \
	"KVMEM_MATMUL=sse9: not an instruction set of the cpu matmul (c, avx2 or avx512)" "" \
	run --model "$M" --backend cpu --random 8 --decode 2
if ! grep -qw avx512f /proc/cpuinfo || ! grep -qw avx512bw /proc/cpuinfo; then
	KVMEM_MATMUL=avx512 says "KVMEM_MATMUL past the CPU" "KVMEM_MATMUL=avx512: this CPU lacks it" "" \
		run --model "$M" --backend cpu --random 8 --decode 2
fi
# [new, 2026-12-07] The matmul's and the attention's bits are the same at
# every instruction set: the same prompt (60 tokens: runs of eight visible
# keys and tails) gives the same tokens and logits, bit for bit, at each
# one this CPU has; one it lacks is refused, saying so.
same_at_every_isa() { # KVMEM_MATMUL or KVMEM_ATTENTION
	local var=$1 isa out g ids="" first=""

	for isa in c avx2 avx512; do
		out=$(env "$var=$isa" timeout 120 "$KVMEM" run --model "$M" --backend cpu --random 60 \
			--decode 16 --logits "$tmp/logits.$var.$isa" 2>&1) || {
			grep -q "this CPU lacks it" <<<"$out" || bad "$var=$isa: $out"
			continue
		}
		g=$(grep '^generated:' <<<"$out")
		[ -n "$g" ] && [ -s "$tmp/logits.$var.$isa" ] || bad "$var=$isa generated nothing: $out"
		[ -z "$ids" ] || [ "$g" = "$ids" ] || bad "$var=$isa generated other tokens: '$g' / '$ids'"
		[ -z "$first" ] || cmp -s "$tmp/logits.$var.$first" "$tmp/logits.$var.$isa" ||
			bad "$var=$isa gave other logits than $first"
		ids=$g first=${first:-$isa}
	done
	[ "$first" = c ] || bad "$var=c did not run"
}
unset KVMEM_MATMUL
same_at_every_isa KVMEM_MATMUL
# [KVMEM_ATTENTION: new, 2026-12-07] An unknown name refuses the cpu backend.
KVMEM_ATTENTION=sse9 says "an unknown KVMEM_ATTENTION" \
	"KVMEM_ATTENTION=sse9: not an instruction set of the cpu attention (c, avx2 or avx512)" "" \
	run --model "$M" --backend cpu --random 8 --decode 2
same_at_every_isa KVMEM_ATTENTION
# [KVMEM_CPU_WEIGHTS: new] The cpu engine reads a bf16 model's weights as bf16 copies (2 bytes
# a weight in bench engine's roofline) or, at fp32, as before (4): the same tokens either way
# (the bits: test_generate's test_bf16_weights); another value refuses the cpu backend.
gen=()
for w in bf16 fp32; do
	out=$(KVMEM_CPU_WEIGHTS=$w timeout 120 "$KVMEM" run --model "$M" --backend cpu --random 40 \
		--decode 12 2>&1) || bad "KVMEM_CPU_WEIGHTS=$w: rc $?"
	gen[${#gen[@]}]=$(grep '^generated:' <<<"$out")
	out=$(KVMEM_CPU_WEIGHTS=$w timeout 120 "$KVMEM" bench engine --backend cpu --model "$M" \
		--prefill 64 --decode 64 --chunk 64 --decode-tokens 4 --json 2>&1) ||
		bad "bench engine at KVMEM_CPU_WEIGHTS=$w: rc $?"
	want=$([ $w = bf16 ] && echo 2 || echo 4)
	grep -q "\"weight_bytes\": $want}" <<<"$out" ||
		bad "bench engine at KVMEM_CPU_WEIGHTS=$w does not count $want bytes a weight: $out"
done
[ -n "${gen[0]}" ] && [ "${gen[0]}" = "${gen[1]}" ] ||
	bad "bf16 and fp32 weights generated other tokens: '${gen[0]}' / '${gen[1]}'"
KVMEM_CPU_WEIGHTS=half says "an unknown KVMEM_CPU_WEIGHTS" "KVMEM_CPU_WEIGHTS=half: not fp32 or bf16" \
	"" run --model "$M" --backend cpu --random 8 --decode 2
cli_done "item 10 error messages"
