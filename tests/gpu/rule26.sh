#!/bin/bash
# On the GPU machine (issue #26, 2026-12-02): the checks of the tensor-core
# GEMM's new split and tile rule (kernels/cuda/gemm_tc.cu: ks 8 at every 8B
# shape, two weight tiles a warp only for wide outputs at 9-32 rows), then
# the PyTorch peer of bench batch in the same call (tests/gpu/host26.sh and
# prof26.sh measure kvmem):
#
#   kvmem_gpu_check --gemm-tc: against the twin, each row bit for bit for
#     n = 1, 7, 16, 64, 72 and reversed, the rows GEMM bit for bit the lone
#     call, fused bit for bit unfused at every split; then its timings;
#   KVMEM_CUDA_GEMM_TC=1 test_ws_batch on cuda: batched items bit for bit
#     their lone steps;
#   python3 tools/bench/torch_batch_decode.py --batch 1,16,64 --context 512.
#
#   tests/gpu/rule26.sh OUTDIR [SECONDS]      (default 150; logs in OUTDIR/rule26)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/rule26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-150}))
gpu_setup rule26 build-gpu
gpu_check "$(gpu_left 60)" gemm_tc.log --gemm-tc
gpu_unit test_ws_batch 30 KVMEM_CUDA_GEMM_TC=1
echo "== python3 tools/bench/torch_batch_decode.py --batch 1,16,64 --context 512"
if timeout "$(gpu_left 60)" python3 tools/bench/torch_batch_decode.py --batch 1,16,64 \
	--context 512 >"$log/torch.json" 2>"$log/torch.err"; then
	ok "the PyTorch peer"
	cat "$log/torch.json"
else
	bad "the PyTorch peer"
	tail -3 "$log/torch.err"
fi
gpu_done
