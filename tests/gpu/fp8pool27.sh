#!/bin/bash
# On the GPU machine (issue 27): the device page pool for fp8 pages
# (KVMEM_CUDA_FP8_POOL=1, the default since this ran on 2026-12-02; 0 is the peer). From the
# repo root (gpu_setup unpacks the bundle):
#
#   tests/gpu/fp8pool27.sh OUTDIR [SECONDS]
#
#   1. kvmem_gpu_check --fp8: the fp8 kernels against their twins;
#   2. test_fp8_session on cuda with KVMEM_CUDA_FP8_POOL=0, then =1: the
#      restated invariant (a paged fp8 session equals full attention over
#      the same fp8 KV, bit for bit) and every view slot checked against
#      its page, now with pages read from the pool's slots;
#   3. kvmem bench step --only step,decode --tokens 49152 --view 32768
#      --steps 2 --decode 32 --tiers warm (as fp8step27.sh runs it), in one
#      run: bf16, fp8 with the knob 0, fp8 with it 1. Passes when each
#      exits 0 and, with the knob 1, the steps read pages from the pool
#      ("N from the device page pool", N above 0); the steps' times are
#      printed for bf16 time / fp8 time;
#   4. test_ws_session on cuda with the knob 0, then 1 (a bf16 backend:
#      the knob must change nothing there).
#
# SECONDS (default 180) bounds the whole. Logs in OUTDIR/fp8pool27.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/fp8pool27.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-180}))
gpu_setup fp8pool27 build-gpu
gpu_need "$K"
export KVMEM_CEILINGS_HELD=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

gpu_check "$(gpu_left 25)" fp8_check.log --fp8

# A unit test with the knob 0 then 1, each into its own log.
unit_both() { # test name, seconds each
	local k
	for k in 0 1; do
		gpu_unit "$1" "$2" KVMEM_CUDA_FP8_POOL=$k
		[ -f "$log/$1.log" ] && mv "$log/$1.log" "$log/$1.pool$k.log"
	done
}
unit_both test_fp8_session 20

# The warm step and decode at a 32K view: log name, dtype, the knob.
step32k() {
	local name=$1 dt=$2 knob=$3 rc
	mkdir -p "$tmp/b"
	echo "== KVMEM_CUDA_FP8_POOL=$knob kvmem bench step --kv-dtype $dt (32K view)"
	KVMEM_CUDA_FP8_POOL=$knob timeout "$(gpu_left 35)" "$K" bench step --backend cuda \
		--kv-dtype "$dt" --only step,decode --tokens 49152 --view 32768 --steps 2 \
		--decode 32 --tiers warm --dir "$tmp/b" >"$log/$name.log" 2>&1
	rc=$?
	rm -rf "$tmp/b"
	if [ $rc -eq 0 ]; then
		ok "bench step, $dt, KVMEM_CUDA_FP8_POOL=$knob"
	else
		bad "bench step, $dt, KVMEM_CUDA_FP8_POOL=$knob (exit $rc)"
		tail -5 "$log/$name.log"
	fi
	grep -E 'median step|device page pool: |^    step [0-9]|decode in a|prefilling' \
		"$log/$name.log" | cut -c1-400
	return $rc
}
step32k step_bf16 bf16 0
step32k step_fp8_pool0 fp8 0
if step32k step_fp8_pool1 fp8 1; then
	# each step's line says "N from the device page pool"
	hits=$(grep -oE '[0-9]+ from the device page pool' "$log/step_fp8_pool1.log" |
		awk '{ s += $1 } END { print s + 0 }')
	if [ "${hits:-0}" -gt 0 ]; then
		ok "fp8 steps read $hits pages from the device page pool"
	else
		bad "fp8 steps with KVMEM_CUDA_FP8_POOL=1 read no page from the pool"
	fi
fi

unit_both test_ws_session 40
gpu_done
