#!/bin/bash
# On the GPU machine (issue 24, round three): a prefill chunk's K/V written
# by the GPU straight into the pinned host pool slots, checked, then the
# figures. From the repo root, after `tar xJf build-gpu/bundle.tar.xz`:
#
#   tests/gpu/gpu24c.sh OUTDIR
#
#   1. kvmem_gpu_check --pages: kernels/cuda/pages.cu against its CPU twin
#      (kernels/cpu/pages.c), bit for bit, fresh random rows and pages;
#   2. test_ws_session's pages_equal_rows on cuda: a session over bf16
#      workspaces with pages written by the GPU and made from rows on the
#      host (KVMEM_PAGE_ROWS=0): every logit, every page, verify;
#   2b. test_ws_session's shared_pool_owners on cuda: two sessions over one
#      shared host pool, interleaved, each exact against itself alone, and
#      the device page pool serves them (keyed by each session's owner);
#   3. kvmem bench step --only ceilings,stageout --prefill 16384 (the
#      plain forward pass, the pinned copy rate and the rows path are its
#      peers in the same run);
#   4. kvmem bench step --only step,decode ... --tiers warm;
#   5. the whole test_ws_session on cuda (the exactness invariant), when
#      time is left.
#
# Everything within 95 s of wall time (each step's timeout is cut to what
# is left). Logs in OUTDIR; a short summary; "N passed, N failed"; exit 0
# only when every check passed.
set -u
cd "$(dirname "$0")/../.."
out=${1:?usage: tests/gpu/gpu24c.sh OUTDIR}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/build-gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_WAIT_POLICY=passive
K=build-gpu/kvmem G=build-gpu/gpu/kvmem_gpu_check T=build-gpu/tests/test_ws_session
pass=0 fail=0
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
end=$((SECONDS + 95))
# The timeout for a step: at most $1 seconds, and what is left.
left() { local l=$((end - SECONDS)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
git log -1 --format='commit %H %s' 2>/dev/null | tee -a "$out/gpu.txt"

# 1. the copy against its twin
if [ -x "$G" ]; then
	timeout "$(left 20)" "$G" --pages >"$out/pages_check.log" 2>&1
	rc=$?
	n_ok=$(grep -c '^ok ' "$out/pages_check.log")
	n_bad=$(grep -c '^FAIL' "$out/pages_check.log")
	if [ "$rc" -eq 0 ] && [ "$n_bad" -eq 0 ] && [ "$n_ok" -gt 0 ]; then
		ok "kvmem_gpu_check --pages ($n_ok cases)"
	else
		bad "kvmem_gpu_check --pages (rc $rc, $n_ok ok, $n_bad FAIL)"
		grep -E '^FAIL|seed' "$out/pages_check.log" | head -8
	fi
else
	bad "no $G"
fi

# 2. the session: pages from the GPU = pages from rows
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
ws_case ws_pages 25 test_pages_equal_rows
# the device page pool over a host pool two sessions share (part b)
ws_case ws_shared 25 test_shared_pool_owners
grep -h 'shared pool,' "$out/ws_shared.log"

# 3. prefill: the figure and its peers
mkdir -p "$tmp/b"
if timeout "$(left 35)" "$K" bench step --backend cuda --only ceilings,stageout --prefill 16384 \
	--dir "$tmp/b" >"$out/bench_stageout.log" 2>&1; then
	ok "bench step stageout"
else
	bad "bench step stageout (rc $?)"
	tail -5 "$out/bench_stageout.log"
fi
rm -rf "$tmp/b"

# 4. the agent step (warm pool)
mkdir -p "$tmp/b"
if timeout "$(left 55)" "$K" bench step --backend cuda --only step,decode --tokens 262144 \
	--view 65536 --steps 4 --decode 128 --tiers warm --dir "$tmp/b" \
	>"$out/bench_step.log" 2>&1; then
	ok "bench step step,decode"
else
	bad "bench step step,decode (rc $?)"
	tail -5 "$out/bench_step.log"
fi
rm -rf "$tmp/b"

# 5. the exactness invariant, every case, if time is left
if [ $((end - SECONDS)) -ge 20 ]; then
	ws_case ws_all 60 ""
else
	echo "NOT RUN: the whole test_ws_session on cuda ($((end - SECONDS)) s left)"
fi

echo
echo "== figures (H200; peers from the same run) =="
grep -h 'rows to pages, one layer' "$out/pages_check.log"
grep -hE 'pinned|copy|GEMM' "$out/bench_stageout.log" | head -4
grep -hE 'plain forward|pool used before|plain / session|the commit|peer:|the pool \(|writer thread' \
	"$out/bench_stageout.log"
grep -hE 'median|step [0-9] \(|prefilling|decode in|per token|bytes' "$out/bench_step.log" | head -16
echo
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
