#!/bin/bash
# On the GPU machine (issue #26): draws at a temperature made on the device
# beside the logits (kvmem_cuda_draw_rows; kernels/draw_fixed.h's integer
# weights, so the token is kvmem_sample's) against the host draws they
# replace, in the same call. The check program's draws against their twin
# (compute-sanitizer's memcheck and racecheck over them) and the batch
# invariance on cuda first; then kvmem serve at the 8B
# geometry (fp8 views) on its own, loaded by bench serve --url: one client
# and 16 closed-loop clients, greedy (the peer: a draw that costs nothing)
# and sampled at T 0.8; then the same sampled loads with
# KVMEM_SESSION_DEVICE_DRAW=0 (the host's draws, as before).
#
#   tests/gpu/devdraw26.sh OUTDIR [SECONDS]   (logs in OUTDIR/devdraw26)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/devdraw26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin devdraw26 560 "${2:-}"
gpu_check 90 sample.log --sample
gpu_sanitize --quick --sample
gpu_unit test_ws_batch 150
port=8393
lone=(--clients 1 --requests 3 --tokens 128 --lines 8)
many=(--clients 16 --requests 1 --tokens 256 --lines 8)
if gpu_serve device $port; then
	gpu_serve_load warm $port --clients 16 --requests 1 --tokens 16 --lines 8
	gpu_serve_load lone-greedy $port "${lone[@]}"
	gpu_serve_load lone-sampled $port "${lone[@]}" --temperature 0.8
	gpu_serve_load many-greedy $port "${many[@]}"
	gpu_serve_load many-sampled $port "${many[@]}" --temperature 0.8
	kill -TERM $srv
	wait $srv
fi
if gpu_serve host $port KVMEM_SESSION_DEVICE_DRAW=0; then
	gpu_serve_load warm-host $port --clients 16 --requests 1 --tokens 16 --lines 8
	gpu_serve_load lone-sampled-host $port "${lone[@]}" --temperature 0.8
	gpu_serve_load many-sampled-host $port "${many[@]}" --temperature 0.8
	kill -TERM $srv
	wait $srv
fi
rm -rf "$log"/data-*
gpu_done
