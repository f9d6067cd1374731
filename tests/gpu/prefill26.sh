#!/bin/bash
# On the GPU machine (issue #26): prefill chunks of several conversations in
# one forward pass (cuda_fwd_prefill.c, kvmem_backend_opts.batch_prefill).
#  1. The GEMMs' batch invariance with cuBLASLt's algorithm pinned
#     (kvmem_gpu_check --gemm-pin: a row's bits alone and among others, and
#     what pinning costs at 32, 206 and 1024 rows).
#  2. test_ws_batch on cuda (every backend there opened with batch_prefill:
#     batched sessions against lone twins, bit for bit, the prefill passes
#     counted: KVMEM_CUDA_BATCH_PROFILE=1), test_ws_session and
#     test_fp8_session (the lone forward's layer, split in three for it).
#  3. kvmem bench serve at the 8B geometry over fp8 views, ~206-token
#     prompts (8 workspace lines), 1 and 16 clients, closed loop then
#     Poisson: with --batch-prefill and without (each prompt's chunk alone,
#     the GEMMs unpinned: kvmem serve's default), in the same run.
#
#   tests/gpu/prefill26.sh OUTDIR [SECONDS]   (logs in OUTDIR/prefill26)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/prefill26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin prefill26 420 "${2:-}"
export OMP_WAIT_POLICY=passive
gpu_check "$(gpu_left 60)" gemm_pin.log --gemm-pin
gpu_unit test_ws_batch 120 KVMEM_CUDA_BATCH_PROFILE=1
grep -h "cuda batched prefill:" "$log/test_ws_batch.log" | sort | uniq -c | sort -rn | head -5
gpu_unit test_ws_session 120
gpu_unit test_fp8_session 120
for pin in on off; do
	args=(--preset 8b --backend cuda --kv-dtype fp8 --clients 1,16 --mode both --requests 2
		--tokens 32 --lines 8)
	[ $pin = on ] && args+=(--batch-prefill)
	echo "== batched prefill $pin: kvmem bench serve ${args[*]}"
	if ( export KVMEM_CUDA_BATCH_PROFILE=1
	     timeout "$(gpu_left 100)" "$K" bench serve "${args[@]}" \
		>"$log/serve_$pin.txt" 2>"$log/serve_$pin.err" ); then
		ok "bench serve, batched prefill $pin"
	else
		bad "bench serve, batched prefill $pin"
		tail -5 "$log/serve_$pin.err"
	fi
	cat "$log/serve_$pin.txt"
	grep "cuda batched prefill:" "$log/serve_$pin.err"
done
gpu_done
