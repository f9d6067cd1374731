#!/bin/bash
# Issue 29, the fourth run's recipe: tools/train/train.py --self-test on a
# paged corpus made by this kvmem (the records give back each view; the
# re-rotation, the cache assembly, masks and positions; with transformers,
# a tiny Qwen3's logits from pages against a plain forward), with whole
# paged sequences (--paged-whole: windows that tile the workspace, each
# block's Mean-K summary from the window that owns it, the needles, the
# workspace Mean-K loss's gradients), and --kv-fp8's fake quantisation (the
# e4m3 rounding against tools/train/e4m3_fixture.txt, kernels/cpu/fp8.c's
# bits, which test_fp8 checks; the straight-through gradient; the hooks on
# k_norm and v_proj), and --teacher's KL (0 against the teacher itself, pad
# targets left out, the gradient to the model only). Skipped (77)
# where no python3 has torch and numpy (apt-get install python3-torch
# python3-numpy gives them).
. "$(dirname "$0")/lib.sh"
[ -x "$KVMEM" ] || { echo "no kvmem binary at $KVMEM"; exit 77; }
PY=
for p in python3 /usr/bin/python3; do
	if command -v "$p" >/dev/null && "$p" -c 'import numpy, torch' 2>/dev/null; then
		PY=$p
		break
	fi
done
[ -n "$PY" ] || { echo "train_paged: no python3 with torch and numpy: skipped"; exit 77; }
tmp=$(mktemp -d /tmp/kvmem-train-paged.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
seed=${KVMEM_TEST_SEED:-$(od -An -tu4 -N4 /dev/urandom | tr -d ' ')}
seed=$((seed % 1000000))
echo "train_paged: seed $seed (replay with KVMEM_TEST_SEED=$seed)"
"$KVMEM" synth corpus --tokens 200k --seq-len 512 --seed "$seed" --views 0.7 \
	--view-policy lexical --max-ratio 16 --paged 0.5 --page-window 256 --paged-whole 1 \
	--whole-min-ratio 16 --out "$tmp/c.bin" --quiet || bad "kvmem synth corpus --paged failed"
OMP_NUM_THREADS=1 "$PY" tools/train/train.py --self-test --data "$tmp/c.bin" >"$tmp/log" 2>&1 ||
	bad "train.py --self-test failed: $(grep -v 'self-test: ok' "$tmp/log")"
grep -q "self-test: ok   paged records give back each view" "$tmp/log" ||
	bad "the corpus check did not run: $(cat "$tmp/log")"
for want in "has whole paged sequences" "whole records: the windows tile the workspace" \
	"each question's needle is a '='" "block means from the windows = one long forward" \
	"gradients reach the selected blocks' tokens and nothing else"; do
	grep -q "self-test: ok   .*$want" "$tmp/log" || bad "no whole check '$want': $(cat "$tmp/log")"
done
for want in "fp8: e4m3 rounding = kvmem_f32_to_e4m3 bit for bit" \
	"fp8: the fixture tells ties-away from ties-to-even" \
	"fp8: row scales = kvmem_fp8_row_scale" "fp8: row round trips = kvmem_fp8_roundtrip_rows" \
	"fp8: the gradient passes through unchanged" \
	"fp8 hooks: on, each layer's K and V rows are read back as fp8"; do
	grep -q "self-test: ok   $want" "$tmp/log" || bad "no fp8 check '$want': $(cat "$tmp/log")"
done
# --kv-fp8 is a share of the steps
"$PY" tools/train/train.py --data "$tmp/c.bin" --out "$tmp/m" --kv-fp8 1.5 2>"$tmp/err" &&
	bad "--kv-fp8 1.5 was taken"
grep -q "kv-fp8 1.5: a share of the steps" "$tmp/err" || bad "--kv-fp8 1.5: $(cat "$tmp/err")"
# --paged-whole needs --paged, and page windows of whole blocks in each half
"$KVMEM" synth corpus --tokens 10k --seq-len 512 --view-policy lexical --paged-whole 0.5 \
	--out "$tmp/x.bin" --quiet 2>/dev/null && bad "--paged-whole without --paged was taken"
"$KVMEM" synth corpus --tokens 10k --seq-len 512 --view-policy lexical --paged 0.5 \
	--page-window 288 --paged-whole 0.5 --out "$tmp/x.bin" --quiet 2>/dev/null &&
	bad "--paged-whole with a page window of 288 was taken"
cli_done train_paged
