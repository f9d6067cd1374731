#!/bin/bash
# On the GPU machine (issue #26): kvmem serve's decode under 1, 16 and 64
# closed-loop clients at the 8B geometry over fp8 views, its plain greedy
# draws made beside the logits on the device (kvmem_session_draw) against
# every step's logits brought to the host (KVMEM_SESSION_LAZY_LOGITS=0), in
# one call; then the batched step's host split at 64 with the draws at hand
# on the caller's thread.
#
#   tests/gpu/lazyserve26.sh OUTDIR [SECONDS]   (logs in OUTDIR/lazyserve26.tar)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/lazyserve26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin lazyserve26 400 "${2:-}"
for mode in 0 1; do
	echo "== KVMEM_SESSION_LAZY_LOGITS=$mode KVMEM_CUDA_GEMM_TC=1 kvmem bench serve --preset 8b --kv-dtype fp8 --clients 1,16,64"
	if KVMEM_SESSION_LAZY_LOGITS=$mode KVMEM_CUDA_GEMM_TC=1 timeout "$(gpu_left 150)" "$K" bench serve \
		--preset 8b --backend cuda --kv-dtype fp8 --clients 1,16,64 --mode closed --requests 2 \
		--tokens 64 --lines 8 >"$log/serve_lazy$mode.out" 2>"$log/serve_lazy$mode.err"; then
		ok "bench serve, KVMEM_SESSION_LAZY_LOGITS=$mode"
	else
		bad "bench serve, KVMEM_SESSION_LAZY_LOGITS=$mode (exit $?)"
		tail -3 "$log/serve_lazy$mode.err"
	fi
	cat "$log/serve_lazy$mode.out"
done
echo "== KVMEM_SESSION_BATCH_PROFILE=1 kvmem bench batch --context 2k --sessions 64"
KVMEM_CUDA_DEC_MIN_TILES=8 KVMEM_SESSION_BATCH_PROFILE=1 KVMEM_CUDA_GEMM_TC=1 \
	timeout "$(gpu_left 60)" "$K" bench batch --backend cuda --preset 8b --json --context 2k \
	--budget 4096 --chunk 2048 --tokens 32 --sessions 64 --no-loop --kv-dtype fp8 \
	>"$log/prof64.json" 2>"$log/prof64.err"
grep -A6 "KVMEM_SESSION_BATCH_PROFILE" "$log/prof64.err"
gpu_batch_summary
[ -n "${OUT:-}" ] && tar cf "$OUT/lazyserve26.tar" -C "$OUT" lazyserve26 && rm -rf "${OUT:?}/lazyserve26"
gpu_done
