#!/bin/bash
# The GPU checks, on a machine with a CUDA GPU (never part of `make test`):
#
#   tests/gpu/run.sh [BUILD]     BUILD: the build folder (default: build)
#
# 1. kvmem_gpu_check: every CUDA op against its CPU twin at several shapes
#    (Qwen3-8B's among them), fresh random inputs, poisoned outputs;
# 2. compute-sanitizer memcheck and racecheck over a short run (--quick);
# 3. the timing table (--bench): attention, GEMMs, selection and sampling
#    against the GEMM rate and the HBM copy rate measured in the same run.
#
# It uses $BUILD/gpu/kvmem_gpu_check-static when present (built on a Debian
# machine with `make BUILD=... gpu-check-static` and carried over: the GPU
# machine has no Debian -dev packages), else $BUILD/gpu/kvmem_gpu_check,
# else tries to build that here. Closes with "N passed, N failed" where each
# check of step 1 is one and each sanitizer run is one. KVMEM_GPU_LOG=dir
# keeps each step's full output there.
set -u
cd "$(dirname "$0")/../.."
B=${1:-build}
log=${KVMEM_GPU_LOG:-$(mktemp -d /tmp/kvmem-gpu.XXXXXX)}
mkdir -p "$log"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:/usr/local/cuda/bin
pass=0 fail=0

bin=$B/gpu/kvmem_gpu_check-static
[ -x "$bin" ] || bin=$B/gpu/kvmem_gpu_check
if [ ! -x "$bin" ]; then
	echo "== building $bin"
	make BUILD="$B" gpu-check >"$log/build.log" 2>&1 || { tail -20 "$log/build.log"; }
fi
if [ ! -x "$bin" ]; then
	echo "no check program ($B/gpu/kvmem_gpu_check[-static]); build it with make gpu-check-static"
	echo "0 passed, 1 failed"
	exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null

# Each check line is "ok   ..." or "FAIL ..."; the program's own total is
# its last line.
count() { # log file, exit code
	local ok bad
	ok=$(grep -c '^ok ' "$1")
	bad=$(grep -c '^FAIL ' "$1")
	if [ "$2" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi	# crashed before its total
	pass=$((pass + ok)); fail=$((fail + bad))
}

echo "== checks"
"$bin" >"$log/check.log" 2>&1
rc=$?
cat "$log/check.log"
count "$log/check.log" $rc

if command -v compute-sanitizer >/dev/null; then
	for tool in memcheck racecheck; do
		echo "== compute-sanitizer --tool $tool (--quick)"
		timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 "$bin" --quick \
			>"$log/$tool.log" 2>&1
		rc=$?
		grep -E '^(FAIL|=========)|passed, ' "$log/$tool.log" | tail -15
		if [ $rc -eq 0 ]; then
			pass=$((pass + 1)); echo "ok   compute-sanitizer $tool: clean"
		else
			fail=$((fail + 1)); echo "FAIL compute-sanitizer $tool (exit $rc)"
		fi
	done
else
	echo "FAIL compute-sanitizer not found"
	fail=$((fail + 2))
fi

echo "== timing"
"$bin" --bench >"$log/bench.log" 2>&1
rc=$?
sed -n '/^== timing/,$p' "$log/bench.log"
[ $rc -eq 0 ] || echo "(the timing run exited $rc)"

echo "logs: $log"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
