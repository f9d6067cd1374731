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
gpu_batch b32k_16 420 --context 32k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,16 --no-loop
gpu_batch b8k_64 300 --context 8k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,64 --no-loop
gpu_done
