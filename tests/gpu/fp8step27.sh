#!/bin/bash
# On the GPU machine (issue 27): fp8 beside bf16 in a session, each run
# with its peers. From the repo root (gpu_setup unpacks the bundle):
#
#   tests/gpu/fp8step27.sh OUTDIR [SECONDS]
#
#   1. kvmem_gpu_check --fp8 --bench: the fp8 kernels against their twins,
#      then decode attention of one layer at 32K / 128K keys over an fp8
#      view and a bf16 one (v5), and rematerialisation into each;
#   2. kvmem bench step --only step,decode --tokens 49152 --view 32768
#      --steps 2 --decode 32 --tiers warm, --kv-dtype bf16 then fp8: the
#      warm step and decode in the session, with the per-token split
#      (forward, rows put away, own) that says where an fp8 token goes;
#   3. kvmem bench step --only ceilings,coldin --coldin 2G --kv-dtype both:
#      cold page-in from the disk, fp8 beside bf16 over the same tokens,
#      against the disk's sequential read in the same run.
#
#   4. KVMEM_CUDA_GRAPH=2 (a decode graph that cannot be captured is an
#      error, not a quiet fall back to plain launches): fp8 decode again.
#
# SECONDS (default 250) bounds the whole; COLDIN=0 leaves out 3. Logs in
# OUTDIR/fp8step27.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/fp8step27.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-250}))
gpu_setup fp8step27 build-gpu
gpu_need "$K"
export KVMEM_CEILINGS_HELD=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

gpu_fp8_bench 35

gpu_step32k step_bf16 bf16
gpu_step32k step_fp8 fp8
# a decode graph that cannot be captured is then an error, not plain launches
gpu_step32k graph_fp8 fp8 KVMEM_CUDA_GRAPH=2
[ "${COLDIN:-1}" = 0 ] && { gpu_done; exit; }

mkdir -p "$tmp/c"
echo "== kvmem bench step --only ceilings,coldin --coldin 2G --kv-dtype both"
if timeout "$(gpu_left 150)" "$K" bench step --backend cuda --only ceilings,coldin \
	--coldin 2G --kv-dtype both --dir "$tmp/c" >"$log/coldin.log" 2>&1; then
	ok "bench step coldin, bf16 and fp8"
else
	bad "bench step coldin, bf16 and fp8 (exit $?)"
fi
rm -rf "$tmp/c"
grep -vE '^\s*$' "$log/coldin.log" | tail -30 | cut -c1-300
gpu_done
