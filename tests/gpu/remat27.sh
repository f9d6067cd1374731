#!/bin/bash
# On the GPU machine (issue #27): rematerialisation from pinned host pages,
# fp8 against bf16 in the same run, the way a session's step places the
# blocks that enter its view (each page's first time on the GPU; a block's
# layers in turn, 1,024 pages a call): with the device page pool as the
# backend keeps it (bf16: the gather reads the pages over PCIe and fills
# the pool; fp8: whole pages copied into the pool, then the gather from
# HBM) and with none (the gather alone over PCIe), beside the pinned copy
# peak measured first. 16K and 32K tokens of pages at the 8B geometry (two
# backends' weights, views and pools: 64K would pass an H100's 80 GB).
#
#   tests/gpu/remat27.sh OUTDIR [SECONDS]   (default 200; logs in OUTDIR/remat27)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/remat27.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin remat27 200 "${2:-}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in 16k 32k; do
	echo "== kvmem bench step --kv-dtype both --only ceilings,remat --remat $n"
	if timeout "$(gpu_left 90)" "$K" bench step --backend cuda --kv-dtype both \
		--only ceilings,remat --remat $n --dir "$tmp/b" >"$log/remat_$n.log" 2>&1; then
		ok "bench step --kv-dtype both --only remat --remat $n"
	else
		bad "bench step --kv-dtype both --only remat --remat $n (exit $?)"
	fi
	grep -E "^ceilings|^rematerialisation|^  (bf16|fp8 )|fp8 / bf16" "$log/remat_$n.log"
done
gpu_done
