#!/bin/bash
# On the GPU machine (issue #26): the issue's 32K-token conversations, the
# measurement the ninth session could not fit in its calls. kvmem bench
# batch --no-loop (the batch and the lone session only: the loop's second
# set of sessions doubled the memory and was killed) with histories of
# 16K-36K tokens (--context 32k, 406K tokens for 16) and a 4096-token view
# budget, 16 conversations beside one; then, while time is left, 64 beside
# one at --context 8k (75 GB of bf16 KV; 64 x 32K tokens, 302 GB, fits
# neither the GPU nor the GPU and the host together).
#
# The histories live in the sessions' own memory source, in bf16 pages on
# this backend since 2026-12-03 (fp32 before: 295 KB a token at the 8B
# geometry, and the 16 were killed by the host's OOM killer at 390K of
# their 406K tokens, 128 GiB). First the cuda session tests that run the
# bf16 memory source (test_ws_session: paged = full attention, bit for
# bit; test_ws_batch: batch invariance); each bench line says the host's
# peak resident memory (host_peak_rss_gb). Last, the peer a user would
# otherwise run, in the same call: PyTorch's batched decode of the same
# geometry over full caches (tools/bench/torch_batch_decode.py, graphed:
# 16 x 32768 keys, 64 x 8192 keys, 77 GB of KV each). UNITS=0 leaves the
# unit tests out, PEER=0 the peer.
#
#   tests/gpu/b32k26.sh OUTDIR [SECONDS]    (default 560; logs in OUTDIR/b32k)
#
# Needs build-gpu (tools/gpu/bundle.sh). Expect about 5 minutes for the 16:
# the 16 prefills first, then 8 steps each way.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/b32k26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-560}))
gpu_setup b32k build-gpu
gpu_need "$K"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
if [ "${UNITS:-1}" != 0 ]; then
	gpu_unit test_ws_session 120
	gpu_unit test_ws_batch 120
fi
gpu_batch b32k_16 420 --context 32k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,16 --no-loop
gpu_batch b8k_64 300 --context 8k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,64 --no-loop
if [ "${PEER:-1}" != 0 ]; then
	gpu_torch_peer 150 1,16:32768 1,64:8192
fi
gpu_done
