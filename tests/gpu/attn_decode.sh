#!/bin/bash
# Decode attention (kernels/cuda/attention.cu) on the GPU machine: the old
# kernel (v2: the flash kernel, split-K, a second kernel to combine) against
# the new one (v5: one launch, four warps per split over a three-stage
# cp.async ring, the combine done by the last block of each KV head), checked
# and timed in one run.
#
#   tests/gpu/attn_decode.sh [BUILD] [nosan]    BUILD: default build-gpu
#
# Run from the repository root with the bundle of tools/gpu/bundle.sh
# (carry build-gpu/bundle.tar.xz; it is unpacked here), or with a build
# folder that has gpu/kvmem_gpu_check[-static] and kvmem.
#
# 1. kvmem_gpu_check --attn-decode (tests/gpu/check_attn_decode.c): decode
#    v2, v3 and v5 against the CPU twin on fresh random inputs (1, 7, 100,
#    4096, 4097, 32768, 32771 keys at odd capacities; GQA 4, 8 and 1;
#    head_dim 64 and 128; 1 to 4 queries; shuffled key positions) within
#    Documentation/kernels.md's tolerance and a relative L2 error under
#    1e-2; each bit for bit itself run again and with the key count on the
#    device over a view of another capacity; v5 in a graph of 4 layers'
#    launches replayed at 8 key counts bit for bit the plain calls; v5 20
#    times at 32768 keys, the same bits. Then each version's time per layer
#    in a graph of 36 launches over 36 layers' K/V (Qwen3-8B: 32/8 heads,
#    head_dim 128, a view of 131072 slots) at 4096, 32768 and 131072 keys,
#    and as single launches, in microseconds and as a fraction of the byte
#    floor (K + V bytes at the copy rate measured in the same run); the
#    graphs' outputs checked bit for bit against plain calls and, at 131072
#    keys, against the twin.
# 2. kvmem bench engine --backend cuda --prefill 4k --decode 4k,32k
#    --decode-tokens 64 with KVMEM_CUDA_DECODE=2, then =5 (each run is one
#    check: it must finish), and the decode rates side by side.
# 3. compute-sanitizer memcheck and racecheck over --attn-decode --quick
#    (small shapes, every version, the graph); "nosan" skips them.
#
# Ends with "N passed, N failed": each check line of step 1 is one, each
# engine run and each sanitizer run is one. Logs in $OUT/attn_decode/ when
# OUT is set (the run tool's folder), else in a temporary folder. About
# 100 s.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/lib.sh
gpu_setup attn_decode "$@"
OLD=2 NEW=5

gpu_check 150 check.log --attn-decode
echo "($(($(date +%s) - t0)) s)"

# The decode table of bench engine: "context tokens tok/s roofline of-it".
decode_rows() {
	awk '/^decode at/ { d = 1; next } d && $1 ~ /^[0-9]+$/ { print $1, $3, $4, $5 }' "$1"
}
if gpu_engine_ab KVMEM_CUDA_DECODE $OLD $NEW 120 decode_rows \
	--prefill 4k --decode 4k,32k --decode-tokens 64; then
	echo "== decode tokens/s, v$OLD against v$NEW (the same build, the same run)"
	printf '%-10s %12s %12s %9s %10s %12s\n' context "v$OLD tok/s" "v$NEW tok/s" speedup roofline \
		"v$NEW of it"
	gpu_engine_join decode_rows $OLD $NEW |
		awk '{ printf "%-10s %12s %12s %9.3f %10s %12s\n", $1, $2, $5, $5 / $2, $6, $7 }'
fi
echo "($(($(date +%s) - t0)) s)"

gpu_sanitize --attn-decode --quick
gpu_done
