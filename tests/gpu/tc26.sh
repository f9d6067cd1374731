#!/bin/bash
# On the GPU machine (issue 26): the tensor-core GEMM's forms at 16 and 64
# rows, then bench batch with each. From the repo root:
#
#   tests/gpu/tc26.sh OUTDIR [SECONDS]
#
#   1. kvmem_gpu_check --gemm-tc: every form's bits against the lone row
#      and the twin, then a layer's four GEMMs at 1, 16, 32 and 64 rows in
#      each form of gemm_tc_sweep (CUDA cores; one weight tile a warp; the
#      default; 8 blocks in flight for a lone row; x's loads early always,
#      then never: gemm_tc_xpre 1 and 2);
#   2. UNITS=1: test_ws_batch on cuda (batch invariance, the default form);
#   3. kvmem bench batch --preset 8b --context CONTEXT (default 512)
#      --sessions 1,16,64 (or BATCH_ARGS) with the default form, then with
#      each of FORMS (default "XPRE=1 XPRE=0"): KVMEM_CUDA_GEMM_TC_<F> set.
#
# SECONDS (default 400) bounds the whole; logs in OUTDIR/tc26.tar.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/tc26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin tc26 400 "${2:-}"

[ "${CHECK:-1}" = 1 ] && gpu_check "$(gpu_left 150)" gemm_tc.log --gemm-tc
[ "${UNITS:-0}" = 1 ] && gpu_unit test_ws_batch 150
CTX=${CONTEXT:-512}
ARGS=${BATCH_ARGS:---context $CTX --budget 4096 --chunk 2048 --tokens 8 --sessions 1,16,64 --no-loop}
# shellcheck disable=SC2086
gpu_batch batch_default "${BATCH_S:-120}" $ARGS
for f in ${FORMS-XPRE=1 XPRE=0}; do
	echo "-- KVMEM_CUDA_GEMM_TC_$f"
	export "KVMEM_CUDA_GEMM_TC_$f"
	# shellcheck disable=SC2086
	gpu_batch "batch_${f//=/}" "${BATCH_S:-120}" $ARGS
	unset "KVMEM_CUDA_GEMM_TC_${f%%=*}"
done
[ -n "${OUT:-}" ] && tar cf "$OUT/tc26.tar" -C "$OUT" tc26 && rm -rf "${OUT:?}/tc26"
gpu_done
