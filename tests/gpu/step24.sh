#!/bin/bash
# On the GPU machine (issue 24, the warm agent step): the device page pool
# filled ahead at adopt, checked, then the step figures. From the repo
# root, after `tar xJf build-gpu/bundle.tar.xz`:
#
#   tests/gpu/step24.sh OUTDIR
#
#   1. test_ws_pool_fill on cuda: a reopened workspace adopted and stepped
#      with the fill and without (KVMEM_POOL_FILL=0): every logit the same
#      bits; with it the pool took pages at adopt and the steps read pages
#      from it that the run without it read from host memory;
#   2. the same with KVMEM_POOL_FILL=0 from outside: it must FAIL (the
#      check bites);
#   3. kvmem_gpu_check --gather with KVMEM_GATHER_THREADS 512, 768, 1024:
#      the gather kernel's other block sizes bit for bit against its twin;
#   4. kvmem bench step --backend cuda --only remat,step,decode --remat
#      16384 --tokens 262144 --view 65536 --steps 4 --decode 32 --tiers
#      warm: the gather kernel from the device page pool at each block
#      size (the fastest kept), then the steps (decode cut from 128 to 32
#      tokens and the held GEMM ceiling skipped to stay within 100 s; the
#      ceilings, the view's prefill and plain decode are its peers in the
#      same run);
#   5. test_ws_session on cuda (whole, or moves_equal_pages: the exactness
#      of tokens moved inside the view) with the time left.
#
# Everything within 99 s of wall time (each step's timeout is cut to what
# is left). Logs in OUTDIR; a short summary; "N passed, N failed"; exit 0
# only when every check passed.
set -u
cd "$(dirname "$0")/../.."
out=${1:?usage: tests/gpu/step24.sh OUTDIR}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/build-gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_WAIT_POLICY=passive
K=build-gpu/kvmem T=build-gpu/tests/test_ws_session F=build-gpu/tests/test_ws_pool_fill
pass=0 fail=0
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
end=$((SECONDS + 99))
# The timeout for a step: at most $1 seconds, and what is left.
left() { local l=$((end - SECONDS)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee "$out/gpu.txt"

# 1. the fill: same bits, pages from the pool
if env KVMEM_TEST_BACKEND=cuda timeout "$(left 12)" "$F" >"$out/pool_fill.log" 2>&1; then
	ok "test_ws_pool_fill on cuda"
else
	bad "test_ws_pool_fill on cuda:"
	grep -E 'ERROR|FAILED|LINE|seed|Failure|false' "$out/pool_fill.log" | head -8
fi
grep -h 'adopt filled' "$out/pool_fill.log"
# 2. the check bites: with the fill off it must fail
env KVMEM_TEST_BACKEND=cuda KVMEM_POOL_FILL=0 timeout "$(left 12)" "$F" \
	>"$out/pool_fill_off.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q 'FAILED' "$out/pool_fill_off.log"; then
	ok "test_ws_pool_fill fails with KVMEM_POOL_FILL=0 (as it must)"
else
	bad "test_ws_pool_fill with KVMEM_POOL_FILL=0: rc $rc, not a failed check: it does not bite"
fi

# 2b. the gather kernel at its other block sizes, bit for bit against its
# twin (the bench below keeps the fastest of 256..1024 for its steps)
for t in 512 768 1024; do
	[ $((end - SECONDS)) -lt 84 ] && { echo "NOT RUN: --gather at $t threads"; continue; }
	if env KVMEM_GATHER_THREADS=$t timeout "$(left 8)" build-gpu/gpu/kvmem_gpu_check --gather \
		>"$out/gather_$t.log" 2>&1 && ! grep -q '^FAIL' "$out/gather_$t.log"; then
		ok "kvmem_gpu_check --gather, $t threads ($(grep -c '^ok ' "$out/gather_$t.log") cases)"
	else
		bad "kvmem_gpu_check --gather, $t threads:"
		grep -E '^FAIL|seed|rror' "$out/gather_$t.log" | head -6
	fi
done

# 3. the session's exactness with moves, and what a step reads
ws_case() { # log, seconds, filter or empty
	local what="test_ws_session on cuda${3:+ ($3)}"

	if env KVMEM_TEST_BACKEND=cuda ${3:+KVMEM_TEST_FILTER=$3} timeout "$(left "$2")" "$T" \
		>"$out/$1.log" 2>&1; then
		ok "$what: $(grep -c '^\[       OK' "$out/$1.log") cases"
	else
		bad "$what:"
		grep -E 'ERROR|FAILED|LINE|seed|differ' "$out/$1.log" | head -12
	fi
}
# 4. the step figures (remat first: the gather kernel from the device page
# pool at each block size, the fastest kept for the steps)
if KVMEM_CEILINGS_HELD=0 timeout "$(left 90)" stdbuf -oL "$K" bench step --backend cuda \
	--only remat,step,decode --remat 16384 --tokens 262144 --view 65536 --steps 4 --decode 32 \
	--tiers warm >"$out/bench_step.log" 2>&1; then
	ok "bench step step,decode"
else
	bad "bench step step,decode (rc $?)"
	tail -5 "$out/bench_step.log"
fi

# 5. the session suite's moves (then the whole suite) when time is left
if [ $((end - SECONDS)) -ge 30 ]; then
	ws_case ws_full 40 ""
elif [ $((end - SECONDS)) -ge 6 ]; then
	ws_case ws_moves 10 test_moves_equal_pages
else
	echo "NOT RUN: test_ws_session on cuda ($((end - SECONDS)) s left)"
fi

echo
echo "== figures (H200; peers from the same run) =="
grep -E '^ceilings|^rematerial|^  (gather|batch|pack|staged|pool|kept)|^peers|^agent step|first view|device page pool|step [0-9]|bytes:|median|^decode|per token|device memory held' \
	"$out/bench_step.log"
echo
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
