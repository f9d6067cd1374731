#!/bin/bash
# On the GPU machine (issue #27): fp8 decode attention in registers with
# fewer, longer splits. v5's and the register form's least stages a split
# (KVMEM_CUDA_DEC_MIN_TILES, 4 by default) decide how many blocks share a
# view's keys; at 32K and 128K keys fp8 / bf16 decode stood at 1.04-1.06
# and 1.21-1.23 (targets 1.08 and 1.3), with the split's combine and its
# launch a larger share of fp8's shorter reads. Each setting in the same run:
#
#   1. kvmem_gpu_check --fp8 --bench with KVMEM_CUDA_DEC_MIN_TILES=N, N in
#      4 (the default), 8, 16, 32: the fp8 kernels against their twins,
#      then one layer's decode attention at 32K / 128K keys, fp8 beside
#      bf16 (the bf16 form reads the same knob);
#   2. kvmem bench step --only decode, a 32K view over 48K tokens: bf16,
#      then fp8 at each N;
#   3. the same in a 128K view over 144K tokens: bf16, fp8 at 4 and the
#      best N of 2 (by its decode tokens/s).
#
#   tests/gpu/tiles27.sh OUTDIR [SECONDS]      (default 500; logs in OUTDIR/tiles27.tar)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/tiles27.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin tiles27 500 "${2:-}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1.
for n in 4 8 16 32; do
	echo "== KVMEM_CUDA_DEC_MIN_TILES=$n kvmem_gpu_check --fp8 --bench"
	KVMEM_CUDA_DEC_MIN_TILES=$n timeout "$(gpu_left 40)" "$G" --fp8 --bench \
		>"$log/fp8_check_t$n.log" 2>&1
	rc=$?
	grep -E '^(decode attention|FAIL)|passed' "$log/fp8_check_t$n.log"
	count "$log/fp8_check_t$n.log" $rc
done
# 2.
gpu_step step32k_bf16 bf16 49152 32768 decode 40
for n in 4 8 16 32; do
	gpu_step step32k_fp8_t$n fp8 49152 32768 decode 40 KVMEM_CUDA_DEC_MIN_TILES=$n
done
# 3. The best N at 32K by decode tokens/s (the bench's "decode" line).
rate() { # "decode in a 32768-token view over 49152 tokens: 411.8 tokens/s; ..."
	sed -n 's/^decode in a [0-9]*-token view over [0-9]* tokens: \([0-9.]*\) tokens\/s.*/\1/p' \
		"$log/$1.log" | head -1; }
best=4 best_rate=$(rate step32k_fp8_t4)
for n in 8 16 32; do
	r=$(rate step32k_fp8_t$n)
	[ -n "$r" ] && [ -n "$best_rate" ] && awk "BEGIN { exit !($r > $best_rate) }" && best=$n best_rate=$r
done
echo "best KVMEM_CUDA_DEC_MIN_TILES at 32K: $best (${best_rate:-?} tok/s)"
gpu_step step128k_bf16 bf16 147456 131072 decode 60
gpu_step step128k_fp8_t4 fp8 147456 131072 decode 60 KVMEM_CUDA_DEC_MIN_TILES=4
[ "$best" != 4 ] &&
	gpu_step step128k_fp8_t$best fp8 147456 131072 decode 60 KVMEM_CUDA_DEC_MIN_TILES=$best
for f in "$log"/step*.log; do
	echo "-- $(basename "$f" .log)"
	grep -E '^decode in' "$f" | head -2
done
# The run tool brings back few files a call: the logs as one tar.
[ -n "${OUT:-}" ] && tar cf "$OUT/tiles27.tar" -C "$OUT" tiles27 && rm -rf "${OUT:?}/tiles27"
gpu_done
