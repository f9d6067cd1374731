#!/bin/bash
# SPDX-License-Identifier: MIT
#
# How far a KV format alone moves the logits (issue #27): the cpu backend
# computes in fp32 and KVMEM_CPU_KV_ROUND rounds each new token's raw K
# (before RoPE) and V as a format would (cli.md), so the logits of every
# prompt position against the same run with fp32 KV measure the format's
# own error, with no compute rounding beside it (on the GPU, bf16 compute
# is in both dtypes' error against the fp32 oracle). Prints the relative
# L2 error of the logits (all positions) and the argmax agreement for each
# format, and each error over bf16's.
#
#   tools/bench/kv_round_logits.sh MODEL_DIR [PROMPT]
#
# PROMPT: "text:FILE" (the model's tokenizer; default: an agentlang workspace
# of 2048 tokens from `kvmem synth sample --seed 3`, for the embedded model)
# or "random:N" (N random ids: a random-weight preset's model). KVMEM (build/kvmem)
# and FORMATS ("bf16 fp8 fp8-g16 int8") may be set.
set -eu
MODEL=${1:?usage: tools/bench/kv_round_logits.sh MODEL_DIR [text:FILE|random:N]}
PROMPT=${2:-}
KVMEM=${KVMEM:-build/kvmem}
FORMATS=${FORMATS:-bf16 fp8 fp8-g16 int8}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "$PROMPT" ]; then
	# a workspace as text, its header and the questions' notes left out
	"$KVMEM" synth sample --seed 3 --tokens 2048 --questions 4 |
		grep -v -- '^----' | sed 's/^<bos> //; s/ *\[needle.*$//' >"$tmp/p.txt"
	PROMPT=text:$tmp/p.txt
fi
case $PROMPT in
text:*) args=(--prompt-text "$(cat "${PROMPT#text:}")") ;;
random:*) args=(--random "${PROMPT#random:}") ;;
*) echo "kv_round_logits.sh: PROMPT is text:FILE or random:N, not '$PROMPT'" >&2; exit 2 ;;
esac
run() { # out.f32, then KVMEM_CPU_KV_ROUND's value ("" for fp32)
	KVMEM_CPU_KV_ROUND=$2 "$KVMEM" run --backend cpu --model "$MODEL" "${args[@]}" \
		--decode 1 --logits "$1" >"$1.log" 2>&1 || { cat "$1.log" >&2; exit 1; }
}
run "$tmp/fp32.f32" ""
echo "kv_round_logits: model $MODEL, prompt $PROMPT ($(grep -o 'prefill: [0-9]* tokens' \
	"$tmp/fp32.f32.log")), cpu backend, fp32 compute; each format against fp32 KV"
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$MODEL/config.json")
for f in $FORMATS; do
	run "$tmp/$f.f32" "$f"
done
python3 - "$tmp" "$vocab" $FORMATS <<'PY'
import array, math, sys
d, vocab, fmts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(n):
    a = array.array('f'); a.frombytes(open(f"{d}/{n}.f32", 'rb').read()); return a
ref = load('fp32'); pos = len(ref) // vocab
def argmax(a, p):
    row = a[p * vocab:(p + 1) * vocab]; return max(range(vocab), key=row.__getitem__)
ref_arg = [argmax(ref, p) for p in range(pos)]
den = math.sqrt(sum(x * x for x in ref))
err = {}
for f in fmts:
    a = load(f)
    err[f] = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, ref))) / den
    agree = sum(argmax(a, p) == ref_arg[p] for p in range(pos)) / pos
    print(f"  {f:8s} relative L2 of the logits {err[f]:.3e}, argmax as fp32 KV {agree * 100:.1f}% "
          f"of {pos} positions" + (f", {err[f] / err['bf16']:.1f}x bf16's" if 'bf16' in err and f != 'bf16' else ""))
PY
