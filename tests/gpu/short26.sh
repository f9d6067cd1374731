#!/bin/bash
# On the GPU machine (issue #26): where a short prompt's prefill goes, the
# chat-sized chunk kvmem serve's first token waits for (~206 tokens at the
# 8B geometry: 13-15 ms unloaded, its GEMMs ~7.4 ms). Three views:
#  1. bench step's stage-out phase with chunks of 256 (the session's
#     prefill against the plain forward in the same run, split by part);
#  2. the plain forward's kernels, chunk by chunk, under Nsight Compute
#     (tests/gpu/prefill_census.sh 1024 256: GEMMs, attention, the rest);
#  3. the same with fp8 views (kvmem serve's --kv-dtype fp8).
#
#   tests/gpu/short26.sh OUTDIR [SECONDS]   (logs in OUTDIR/short26)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/short26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin short26 240 "${2:-}"
for kv in bf16 fp8; do
	echo "== kvmem bench step --only ceilings,stageout --prefill 2048 --chunk 256 --kv-dtype $kv"
	timeout "$(gpu_left 90)" "$K" bench step --backend cuda --only ceilings,stageout --prefill 2048 \
		--chunk 256 --kv-dtype $kv >"$log/step_$kv.txt" 2>&1 && ok "bench step $kv" ||
		bad "bench step $kv"
	cat "$log/step_$kv.txt"
done
echo "== tests/gpu/prefill_census.sh 1024 256"
OUT=$log timeout "$(gpu_left 120)" tests/gpu/prefill_census.sh 1024 256 && ok "census" || bad "census"
gpu_done
