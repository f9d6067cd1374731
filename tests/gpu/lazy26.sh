#!/bin/bash
# On the GPU machine (issue #26): a batched greedy decode step's logits
# left on the device (kvmem_fwd_item.argmax: only each item's argmax comes
# down), against the step that brings every item's 0.6 MB of logits to the
# host (KVMEM_SESSION_LAZY_LOGITS=0), in the same call, as `kvmem serve`
# batches (KVMEM_CUDA_GEMM_TC=1, KVMEM_CUDA_DEC_MIN_TILES=8, fp8 views).
#
#   tests/gpu/lazy26.sh OUTDIR [SECONDS] [PART]   (logs in OUTDIR/lazy26-PART.tar)
#   PART 16: the draws' checks (kvmem_gpu_check --sample), test_ws_batch on
#            cuda, the host split at 16 conversations of short histories,
#            then 16 conversations of 16K-45K tokens, both ways
#   PART 64: the host split at 64, then 64 conversations of 4K-11K, both ways
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/lazy26.sh OUTDIR [SECONDS] [16|64]}
PART=${3:-16}
. tests/gpu/lib.sh
gpu_begin "lazy26-$PART" 560 "${2:-}"
export KVMEM_CUDA_DEC_MIN_TILES=8
both() { # name, seconds, then bench batch's arguments
	local name=$1 secs=$2
	shift 2
	KVMEM_SESSION_LAZY_LOGITS=0 gpu_batch "${name}_host" "$secs" "$@"
	gpu_batch "${name}_lazy" "$secs" "$@"
}
prof() { # sessions
	local b=$1 mode
	for mode in 0 1; do
		echo "== KVMEM_SESSION_LAZY_LOGITS=$mode KVMEM_SESSION_BATCH_PROFILE=1 kvmem bench batch --context 2k --sessions $b"
		KVMEM_SESSION_LAZY_LOGITS=$mode KVMEM_SESSION_BATCH_PROFILE=1 KVMEM_CUDA_GEMM_TC=1 \
			timeout "$(gpu_left 60)" "$K" bench batch --backend cuda --preset 8b --json \
			--context 2k --budget 4096 --chunk 2048 --tokens 32 --sessions "$b" --no-loop \
			--kv-dtype fp8 >"$log/prof${b}_lazy$mode.json" 2>"$log/prof${b}_lazy$mode.err"
		grep -A6 "KVMEM_SESSION_BATCH_PROFILE" "$log/prof${b}_lazy$mode.err"
	done
}
if [ "$PART" = 16 ]; then
	gpu_check 60 check_sample.log --sample
	unset KVMEM_CUDA_DEC_MIN_TILES
	gpu_unit test_ws_batch 120
	export KVMEM_CUDA_DEC_MIN_TILES=8
	prof 16
	both b32k_16 100 --context 32k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,16 \
		--no-loop --kv-dtype fp8
else
	prof 64
	both b8k_64 110 --context 8k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,64 \
		--no-loop --kv-dtype fp8
fi
gpu_batch_summary
[ -n "${OUT:-}" ] && tar cf "$OUT/lazy26-$PART.tar" -C "$OUT" "lazy26-$PART" &&
	rm -rf "${OUT:?}/lazy26-$PART"
gpu_done
