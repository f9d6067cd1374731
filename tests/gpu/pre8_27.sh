#!/bin/bash
# On the GPU machine (issue 27): prefill attention over fp8 (v4's flash
# kernel reading e4m3 tiles: a warm step's question no longer dequantises
# the view into a bf16 scratch) and the warm step with its floor. From the
# repo root (gpu_setup unpacks the bundle):
#
#   tests/gpu/pre8_27.sh OUTDIR [SECONDS]
#
#   1. kvmem_gpu_check --fp8 --bench: the fp8 kernels against their twins
#      (prefill over fp8 bit for bit v4 over the rows dequantised), one
#      layer's question at 32K / 128K keys beside bf16 and the old way;
#   2. test_fp8_session on cuda (the exactness invariant on fp8 views);
#   3. kvmem bench step --kv-dtype both --only step,decode at a 32K view
#      over 48K tokens: the warm step's bf16 / fp8 time and its floor;
#   4. --kv-dtype both --only fits --gpu-mem 24G (the scratch no longer
#      reserved with the view);
#   5. the issue's warm step shape, a 64K view over 256K tokens, both
#      dtypes, while time is left.
#
# SECONDS (default 400) bounds the whole; logs in OUTDIR/pre8_27.tar.
# STEPS=N: warm steps a bench step run (2); FITS=0 leaves out 4, BIG=0 5;
# POLICY=random: both dtypes enter the same blocks (like for like);
# CVT=1: 5 once more in fp8 with the gather's conversions by the field
# decode (KVMEM_CUDA_FP8_GATHER_CVT=0); SYNC=1: 5 once more with every
# place() waiting for its gather (KVMEM_CUDA_PLACE_SYNC=1); HASH=1: 5 once
# more with the device pool's old hash (KVMEM_CUDA_POOL_HASH=spread); BATCH=N:
# 5 once more with place() batches of N pool pages (KVMEM_PLACE_BATCH_CACHED; 8,192
# by default, 1,024 before); UNITS="t1 t2":
# those unit tests on cuda too (test_ws_session, test_ws_pool_fill: the
# gather left running under the session's own checks).
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/pre8_27.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-400}))
gpu_setup pre8_27 build-gpu
gpu_need "$K"
export KVMEM_CEILINGS_HELD=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

gpu_fp8_bench 60
grep -E "^prefill|tokens over|over fp8" "$log/fp8_check.log" | grep -v "^ok" | head -20
gpu_unit test_fp8_session 60
export STEPS=${STEPS:-2}	# warm steps a run (lib.sh gpu_step): the medians over more of them
gpu_step step32k_both both 49152 32768 step,decode 90
grep -E "^fp8 against|^what bounds|^peers|^the warm" "$log/step32k_both.log"
if [ "${FITS:-1}" = 1 ]; then
	echo "== kvmem bench step --kv-dtype both --only fits --gpu-mem 24G"
	if timeout "$(gpu_left 40)" "$K" bench step --backend cuda --kv-dtype both --only fits \
		--gpu-mem 24G --dir "$tmp/fits" >"$log/fits_both.log" 2>&1; then
		ok "bench step fits, both"
	else
		bad "bench step fits, both (rc $?)"
		tail -3 "$log/fits_both.log"
	fi
	grep -E "largest view" "$log/fits_both.log"
fi
if [ "${BIG:-1}" = 1 ]; then
	gpu_step step256k_both both 262144 65536 step 240
	grep -E "^fp8 against|^what bounds|^peers|^the warm" "$log/step256k_both.log"
	if [ "${CVT:-0}" = 1 ]; then
		gpu_step step256k_fp8field fp8 262144 65536 step 150 KVMEM_CUDA_FP8_GATHER_CVT=0
		grep -E "^the warm|place" "$log/step256k_fp8field.log" | head -5
	fi
	if [ "${SYNC:-0}" = 1 ]; then
		gpu_step step256k_sync both 262144 65536 step 240 KVMEM_CUDA_PLACE_SYNC=1
		grep -E "^fp8 against|^the warm" "$log/step256k_sync.log"
	fi
	if [ "${BATCH:-0}" != 0 ]; then
		gpu_step "step256k_batch$BATCH" both 262144 65536 step 240 \
			KVMEM_PLACE_BATCH_CACHED="$BATCH"
		grep -E "^fp8 against|^the warm" "$log/step256k_batch$BATCH.log"
	fi
	if [ "${HASH:-0}" = 1 ]; then
		gpu_step step256k_spread both 262144 65536 step 240 KVMEM_CUDA_POOL_HASH=spread
		grep -E "^fp8 against|^the warm" "$log/step256k_spread.log"
	fi
fi
for t in ${UNITS:-}; do
	gpu_unit "$t" 120
done
# The run tool brings back eight files a call: the logs as one tar.
[ -n "${OUT:-}" ] && tar cf "$OUT/pre8_27.tar" -C "$OUT" pre8_27 && rm -rf "${OUT:?}/pre8_27"
gpu_done
