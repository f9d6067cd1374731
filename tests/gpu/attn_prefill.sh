#!/bin/bash
# Prefill attention (kernels/cuda/attention.cu v4, the mma.sync flash kernel,
# against kernels/cuda/attention_wgmma.cu v6, the wgmma kernel) on the GPU
# machine, checked and timed in one run.
#
#   tests/gpu/attn_prefill.sh [BUILD] [nosan]    BUILD: default build-gpu
#
# Run from the repository root with the bundle of tools/gpu/bundle.sh
# (carry build-gpu/bundle.tar.xz; it is unpacked here), or with a build
# folder that has gpu/kvmem_gpu_check[-static] and kvmem.
#
# 1. kvmem_gpu_check --attn-prefill (tests/gpu/check_attn_prefill.c): v4 and
#    v6 against the CPU twin on fresh random inputs (a chunk at the start of
#    the view, chunks at the end of longer views, counts that are not tile
#    multiples, GQA 32/8 and 64/8, MHA, a sharp softmax, shapes v6 hands to
#    v4) within Documentation/kernels.md's tolerance and a relative L2 error
#    under 1e-2, v6 bit for bit itself run again; then the bf16 GEMM rate
#    and v4 against v6 at 4096^2 and 16384^2 causal and 4096 / 512-token
#    chunks at the end of a 32768-key view: ms, TFLOP/s, fraction of the
#    GEMM rate, v6's output checked against v4's.
# 2. kvmem bench engine --backend cuda --prefill 4k,16k,32k --decode 4k
#    --decode-tokens 16 with KVMEM_CUDA_PREFILL=4, then =6 (each run is one
#    check: it must finish), and the prefill rates side by side.
# 3. compute-sanitizer memcheck and racecheck over --attn-prefill --quick;
#    "nosan" skips them.
# KVMEM_V6_FORMS=0,1,2 (indices of v6_forms in attention_wgmma.cu) checks
# and times each of v6's forms in step 1; steps 2 and 3 then run the
# fastest that passed (KVMEM_CUDA_V6).
#
# Ends with "N passed, N failed". Logs in $OUT/attn_prefill/ when OUT is set
# (the run tool's folder), else in a temporary folder.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/lib.sh
gpu_setup attn_prefill "$@"
OLD=4 NEW=6

gpu_check 200 check.log --attn-prefill
echo "($(($(date +%s) - t0)) s)"
if [ -n "${KVMEM_V6_FORMS:-}" ]; then
	# The fastest of the forms at the 4096-query chunk over 32768 keys
	# among those that failed no check: the engine and the sanitizers run it.
	best=$(awk '/^FAIL/ && match($0, /v6 f[0-9]+/) { bad[substr($0, RSTART + 4, RLENGTH - 4)] = 1 }
		/^chunk 4096 @ 32768 view v6 f[0-9]+ / { ms[substr($7, 2)] = $8 }
		END { for (f in ms) if (!(f in bad) && (b == "" || ms[f] < m)) { b = f; m = ms[f] }
		      print b }' "$log/check.log")
	if [ -n "$best" ]; then
		echo "== v6 form $best (the fastest that passed) for the engine and the sanitizers"
		export KVMEM_CUDA_V6=$best KVMEM_V6_FORMS=$best
	else
		bad "no v6 form passed its checks"
	fi
fi

# The prefill table of bench engine: "tokens tok/s of-GEMM".
prefill_rows() {
	awk '/^prefill/ { p = 1; next } /^decode at/ { p = 0 } p && $1 ~ /^[0-9]+$/ { print $1, $3, $5 }' "$1"
}
if gpu_engine_ab KVMEM_CUDA_PREFILL $OLD $NEW 200 prefill_rows \
	--prefill 4k,16k,32k --decode 4k --decode-tokens 16; then
	echo "== prefill tokens/s, v$OLD against v$NEW (the same build, the same run)"
	printf '%-10s %12s %12s %9s %10s %10s\n' tokens "v$OLD tok/s" "v$NEW tok/s" speedup \
		"v$OLD GEMM" "v$NEW GEMM"
	gpu_engine_join prefill_rows $OLD $NEW |
		awk '{ printf "%-10s %12s %12s %9.3f %10s %10s\n", $1, $2, $4, $4 / $2, $3, $5 }'
fi
echo "($(($(date +%s) - t0)) s)"

gpu_sanitize --attn-prefill --quick
gpu_done
