#!/bin/bash
# The one-row GEMM (kernels/cuda/gemv.cu) on the GPU machine: the first
# kernel against the split-K one, checked and timed in one run.
#
#   tests/gpu/gemv_sweep.sh [BUILD] [nosan]    BUILD: default build-gpu
#
# Run from the repository root with the bundle of tools/gpu/bundle.sh
# (carry build-gpu/bundle.tar.xz; it is unpacked here), or with a build
# folder that has gpu/kvmem_gpu_check[-static].
#
# 1. kvmem_gpu_check --gemv (tests/gpu/check_gemv.c): odd shapes in every
#    mode, then Qwen3-8B's decode shapes (qkv 4096->6144, o_proj 4096->4096
#    +=, gate|up 4096->24576, down 12288->4096 +=, lm_head 4096->151936) on
#    fresh random inputs: cuBLASLt, the first kernel, the split kernel (its
#    own split and each forced one) against the CPU twin within
#    Documentation/kernels.md's tolerance; split ks1 bit for bit the first
#    kernel; the split it picks bit for bit one of the forced ones; a graph
#    replay of it bit for bit the plain call. Then each shape's time per
#    launch in a graph of 36 launches over different weights (cold in the
#    L2, as in decode) and as single launches, in microseconds and as a
#    fraction of the copy rate measured in the same run, and one decode
#    token's GEMVs (36 layers + lm_head) with each kernel.
# 2. compute-sanitizer memcheck and racecheck over --gemv --quick (the odd
#    shapes: rows past the end, splits past the input, the shared-memory
#    sum of the split kernel); "nosan" skips them.
#
# Ends with "N passed, N failed": each check line of step 1 is one, each
# sanitizer run is one. Logs in $OUT/gemv_sweep/ when OUT is set (the run
# tool's folder), else in a temporary folder. About 30-60 s.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=${1:-build-gpu}
san=${2:-}
[ "$B" = nosan ] && { B=build-gpu; san=nosan; }
log=${OUT:+$OUT/gemv_sweep}
log=${log:-$(mktemp -d /tmp/kvmem-gemv.XXXXXX)}
mkdir -p "$log"
export LD_LIBRARY_PATH=$PWD/$B/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:/usr/local/cuda/bin
pass=0 fail=0
t0=$(date +%s)

# The bundle is unpacked every time (a warm machine may hold an older one).
[ -f "$B/bundle.tar.xz" ] && tar xJf "$B/bundle.tar.xz"
G=$B/gpu/kvmem_gpu_check-static
[ -x "$G" ] || G=$B/gpu/kvmem_gpu_check
if [ ! -x "$G" ]; then
	echo "no check program in $B/gpu (build it with tools/gpu/bundle.sh and carry" \
		"build-gpu/bundle.tar.xz, or make BUILD=$B gpu-check-static)"
	echo "0 passed, 1 failed"
	exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null

# Each check line is "ok   ..." or "FAIL ..."; a program that exits
# non-zero without a FAIL line crashed: one failure.
count() { # log file, exit code
	local ok bad
	ok=$(grep -c '^ok ' "$1")
	bad=$(grep -c '^FAIL ' "$1")
	if [ "$2" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
	pass=$((pass + ok)); fail=$((fail + bad))
}

echo "== kvmem_gpu_check --gemv"
timeout 150 "$G" --gemv >"$log/gemv.log" 2>&1
rc=$?
grep -v 'passed, .* failed$' "$log/gemv.log"
[ $rc -eq 0 ] || echo "(kvmem_gpu_check --gemv exited $rc)"
count "$log/gemv.log" $rc

if [ "$san" != nosan ]; then
	if command -v compute-sanitizer >/dev/null; then
		for tool in memcheck racecheck; do
			echo "== compute-sanitizer --tool $tool, --gemv --quick"
			timeout 90 compute-sanitizer --tool $tool --error-exitcode 99 "$G" --gemv --quick \
				>"$log/$tool.log" 2>&1
			rc=$?
			grep -E '^FAIL|^========= (ERROR|RACECHECK|Invalid|Race)|SUMMARY' "$log/$tool.log" | head -10
			if [ $rc -eq 0 ]; then
				pass=$((pass + 1)); echo "ok   compute-sanitizer $tool: clean"
			else
				fail=$((fail + 1)); echo "FAIL compute-sanitizer $tool (exit $rc)"
			fi
		done
	else
		echo "FAIL compute-sanitizer not found"
		fail=$((fail + 1))
	fi
fi

echo "logs: $log; $(($(date +%s) - t0)) s"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
