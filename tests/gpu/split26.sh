#!/bin/bash
# On the GPU machine (issues #26 and #27, 2026-12-02): the checks of two
# kernel changes, before the benchmarks that measure them
# (tests/gpu/host26.sh, prof26.sh, fp8pool27.sh):
#
#   - decode attention v5 splits its keys into runs of at least
#     DEC_MIN_TILES stages (kernels/cuda/attention.cu): the lone decode
#     against its twin and itself (--attn-decode), the batched one bit for
#     bit each sequence alone (--attn-batch), and a batched decode's items
#     bit for bit their lone steps (test_ws_batch on cuda);
#   - the fp8 view gather computes a token's rotary angles once for all its
#     KV heads (kernels/cuda/fp8_view.cu): --fp8 and --gather (every fp8
#     placement bit for bit its twin), test_fp8_session on cuda.
#
#   tests/gpu/split26.sh OUTDIR [SECONDS]     (default 150; logs in OUTDIR/split26)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/split26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-150}))
gpu_setup split26 build-gpu
for opt in attn-decode attn-batch fp8 gather; do
	gpu_check "$(gpu_left 40)" "$opt.log" "--$opt"
done
gpu_unit test_ws_batch 30
gpu_unit test_fp8_session 20
gpu_unit test_ws_session 40
gpu_done
