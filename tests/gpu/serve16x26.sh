#!/bin/bash
# On the GPU machine (issue #26): kvmem serve's 16 closed-loop clients
# against one client in the same bench serve run (its "vs 1"), with answers
# of 64 and 256 tokens, greedy and sampled at T 0.8, after a warm-up load of
# 16 (so that neither side pays the process's first sessions' buffers). The
# server on its own at the 8B geometry, fp8 views. First the draw kernel
# against its twin (kvmem_gpu_check --sample; a round of 16 rows and a lone
# row timed beside their argmax); after the loads the sanitizers over it
# and the batch invariance on cuda. Last, when the card has the memory for it (an H200)
# and time is left, the 64 x 8K batched decode against PyTorch's graphed
# decode over full caches (77 GB of KV: past an H100).
#
#   tests/gpu/serve16x26.sh OUTDIR [SECONDS]   (logs in OUTDIR/serve16x26)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/serve16x26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin serve16x26 560 "${2:-}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
gpu_check 90 sample.log --sample
port=8395
if gpu_serve device $port; then
	gpu_serve_load warm $port --clients 16 --requests 1 --tokens 16 --lines 8
	gpu_serve_load t64 $port --clients 1,16 --requests 4 --tokens 64 --lines 8
	gpu_serve_load t256 $port --clients 1,16 --requests 2 --tokens 256 --lines 8
	gpu_serve_load t256s $port --clients 1,16 --requests 2 --tokens 256 --lines 8 \
		--temperature 0.8
	kill -TERM $srv
	wait $srv
fi
rm -rf "$log"/data-*
gpu_sanitize --quick --sample
gpu_unit test_ws_batch 150
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -gt 120000 ] && [ "$(gpu_left 400)" -ge 400 ]; then
	gpu_batch b8k_64 240 --context 8k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,64 \
		--no-loop
	gpu_torch_peer 150 1,64:8192
else
	echo "skip the 64 x 8K peer (${mem:-?} MiB on the card, $(gpu_left 400) s left)"
fi
gpu_done
