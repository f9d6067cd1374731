#!/bin/bash
# On the GPU machine, from the bundle tools/gpu/bundle.sh built (carried as
# build-gpu/bundle.tar.xz): the engine's checks first, then its timings, in
# one call.
#
#   tests/gpu/perf.sh [quick]
#
# 1. kvmem_gpu_check: every op against its twin, the fast paths against the
#    plain ones (tests/gpu/check_perf.c), and compute-sanitizer memcheck
#    over --quick;
# 2. tests/gpu/backend_checks.sh with KVMEM_CUDA_GRAPH=2 (a decode graph that
#    fails to capture is an error): exactness, the oracle, check-exact,
#    memcheck and racecheck of a session; with attention v4 for prefill
#    (KVMEM_CUDA_PREFILL=4) when v4 passed step 1;
# 3. kvmem_gpu_check --bench (the ops' timing table);
# 4. kvmem bench engine (decode graphs, then without graphs, then prefill
#    with the other attention version), bench select --backend cuda, the
#    demo and a small recall run on the GPU.
# Logs go to $OUT/logs.tgz; a summary is printed last.
set -u
cd "$(dirname "$0")/../.."
tar xJf build-gpu/bundle.tar.xz
export LD_LIBRARY_PATH=$PWD/build-gpu/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/cuda/lib64
export PATH=$PATH:/usr/local/cuda/bin
export OMP_WAIT_POLICY=passive
L=/tmp/kvmem-perf
mkdir -p "$L"
K=build-gpu/kvmem
G=build-gpu/gpu/kvmem_gpu_check
[ -x build-gpu/gpu/kvmem_gpu_check-static ] && G=build-gpu/gpu/kvmem_gpu_check-static
quick=${1:-}
t00=$(date +%s)
el() { echo "$(($(date +%s) - t00))s"; }
sum() { echo "$*" >>"$L/summary"; echo "$*"; tar czf "${OUT:-/tmp}/logs.tgz" -C "$L" . 2>/dev/null; }
: >"$L/summary"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader |
	tee -a "$L/summary"

# 1. the ops
timeout 150 "$G" >"$L/check.log" 2>&1
sum "checks (rc $?, $(el)): $(tail -1 "$L/check.log")"
grep -E '^FAIL' "$L/check.log" | head -20 | tee -a "$L/summary"
grep -E '^(ok|FAIL) .*(decode|v4|qk norm|gemv|index append|16-byte|plan blocks)' "$L/check.log" |
	cut -c1-150 >"$L/check_perf.txt"
v4ok=0
grep -q '^ok   attention v4' "$L/check.log" && ! grep -q '^FAIL .*v4' "$L/check.log" && v4ok=1

# 2. the backend
pre=""
[ $v4ok = 1 ] && pre=4
KVMEM_CUDA_GRAPH=2 KVMEM_CUDA_PREFILL=$pre OUT=$L timeout 330 tests/gpu/backend_checks.sh \
	>"$L/backend.log" 2>&1
sum "backend checks, graph strict, prefill v${pre:-2} (rc $?, $(el)):"
grep -E '^(PASS|FAIL)|passed, ' "$L/backend.log" | tee -a "$L/summary"
grep -E 'rel|argmax|greedy' "$L/oracle.log" | head -6 >>"$L/summary"

# 4. the engine, selection, demo, recall
e() { timeout 120 "$K" bench engine --backend cuda "$@"; }
KVMEM_CUDA_PREFILL=$pre e >"$L/engine.log" 2>&1
sum "engine, graphs (on by default), prefill v${pre:-2} (rc $?, $(el))"
KVMEM_CUDA_GRAPH=0 KVMEM_CUDA_PREFILL=$pre e --prefill 4k --decode 4k,32k \
	>"$L/engine_nograph.log" 2>&1
sum "engine, no graphs (rc $?, $(el))"
KVMEM_CUDA_GRAPH=0 KVMEM_CUDA_GEMV=0 KVMEM_CUDA_PREFILL=2 e --prefill 4k,32k --decode 4k \
	>"$L/engine_v2.log" 2>&1
sum "engine, prefill v2, no graph, cuBLASLt decode GEMMs (rc $?, $(el))"
KVMEM_CUDA_DECODE=3 e --prefill 4k --decode 4k,32k >"$L/engine_dec3.log" 2>&1
sum "engine, decode v3 (rc $?, $(el))"
timeout 90 "$K" bench select --backend cuda --blocks 1024,31250,312500 >"$L/select.log" 2>&1
sum "select meank (rc $?, $(el))"
timeout 60 "$K" bench select --backend cuda --policy subblock --blocks 31250,312500 \
	>"$L/select_sub.log" 2>&1
sum "select subblock (rc $?, $(el))"
# 3. the ops' timings
timeout 150 "$G" --bench >"$L/bench.log" 2>&1
sum "ops timing (rc $?, $(el))"

home=$(mktemp -d)
KVMEM_HOME=$home timeout 60 "$K" demo --backend cuda >"$L/demo.log" 2>&1
sum "demo on cuda (rc $?, $(el)): $(grep '^Summary' "$L/demo.log")"
timeout 90 "$K" bench recall --backend cuda --model models/agentlang --sizes 1,4 --depths 0.5 \
	--questions 20 --policies full,meank,subblock,recency --quiet >"$L/recall.log" 2>&1
sum "recall on cuda (rc $?, $(el))"

if [ "$quick" != quick ]; then
	timeout 100 compute-sanitizer --tool memcheck --error-exitcode 99 "$G" --quick \
		>"$L/memcheck_ops.log" 2>&1
	sum "memcheck of the ops --quick (rc $?, $(el)): $(grep -o 'ERROR SUMMARY: [0-9]* errors' \
		"$L/memcheck_ops.log" | tail -1)"
fi
tar czf "${OUT:-/tmp}/logs.tgz" -C "$L" .
echo
echo "==== summary"
cat "$L/summary"
echo "==== fast-path checks"
cat "$L/check_perf.txt"
echo "==== timings"
sed -n '/^== timing/,$p' "$L/bench.log" | grep -E 'copy|GEMM bf16|decode|prefill|chunk|gemv|cuBLASLt|meank|norm|index|top-k' | cut -c1-100
for f in engine engine_nograph engine_v2 engine_dec3; do
	echo "-- $f"
	grep -E '^(ceilings|decode:|[0-9])' "$L/$f.log"
done
echo "-- select"
grep -E '^ +[0-9]|plan check|floor:' "$L/select.log" "$L/select_sub.log" | cut -c1-130
echo "-- recall"
grep -E '%' "$L/recall.log"
echo "total $(el)"
