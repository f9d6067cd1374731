#!/bin/bash
# On the GPU machine (issue 24, the session's prefill): the checks first,
# then the figure beside its peers. From the repo root, after
# `tar xJf build-gpu/bundle.tar.xz`:
#
#   tests/gpu/prefill24.sh OUTDIR
#
#   1. test_ws_append on cuda: the index's summaries made on the GPU
#      (kernels/cuda/index.cu through user/backend/cuda_fwd_index.c) give
#      the index, plans, logits and tokens of the host summing the same
#      rows, bit for bit; the cuda backend's pinned rows are kept for the
#      next session (user/backend/cuda_host.c), and that case FAILS with
#      KVMEM_CUDA_HOST_KEEP=0 (it can fail);
#   2. the whole test_ws_session on cuda (the exactness invariant; an
#      append's inner chunks compute no logits);
#   3. kvmem bench step --only ceilings,stageout --prefill 16384: session
#      prefill over the workspace against the plain forward pass in the same
#      run, and where the rest of its time went (the split);
#      The bench runs its own peers: the index summed on the host
#      (KVMEM_DEVICE_INDEX=0) and the rows copied on the host
#      (KVMEM_PAGE_ROWS=0), each in the same process;
#   4. when time is left, the same again (the spread between runs: the
#      writer thread's pace varied by a third between two runs of call 1).
#
# Everything within 95 s of wall time (each step's timeout is cut to what
# is left). Logs in OUTDIR; a short summary; "N passed, N failed"; exit 0
# only when every check passed.
set -u
cd "$(dirname "$0")/../.."
out=${1:?usage: tests/gpu/prefill24.sh OUTDIR}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/build-gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_WAIT_POLICY=passive
K=build-gpu/kvmem T=build-gpu/tests/test_ws_session
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

# 1. test_ws_append on cuda: the index made on the GPU against the host's
# (device_index_backend) and the pinned rows kept (rows_kept), then
# rows_kept again with KVMEM_CUDA_HOST_KEEP=0, where it must fail
A=build-gpu/tests/test_ws_append
if KVMEM_TEST_BACKEND=cuda timeout "$(left 25)" "$A" >"$out/ws_append.log" 2>&1 &&
	grep -q '^\[       OK \] test_device_index_backend' "$out/ws_append.log" &&
	grep -q '^\[       OK \] test_rows_kept' "$out/ws_append.log"; then
	ok "test_ws_append on cuda: $(grep -c '^\[       OK' "$out/ws_append.log") cases (device index, rows kept among them)"
else
	bad "test_ws_append on cuda:"
	grep -E 'ERROR|FAILED|SKIPPED|LINE|seed|differ' "$out/ws_append.log" | head -12
fi
KVMEM_CUDA_HOST_KEEP=0 KVMEM_TEST_FILTER=test_rows_kept KVMEM_TEST_BACKEND=cuda \
	timeout "$(left 15)" "$A" >"$out/ws_append_nokeep.log" 2>&1
if grep -q '^\[  FAILED  \] test_rows_kept' "$out/ws_append_nokeep.log"; then
	ok "test_rows_kept fails with KVMEM_CUDA_HOST_KEEP=0 (it can fail)"
else
	bad "test_rows_kept did not fail with KVMEM_CUDA_HOST_KEEP=0"
fi

# 2. the exactness invariant on cuda, every case
if KVMEM_TEST_BACKEND=cuda timeout "$(left 40)" "$T" >"$out/ws_session.log" 2>&1; then
	ok "test_ws_session on cuda: $(grep -c '^\[       OK' "$out/ws_session.log") cases"
else
	bad "test_ws_session on cuda:"
	grep -E 'ERROR|FAILED|LINE|seed|differ' "$out/ws_session.log" | head -12
fi

# 3. prefill: the figure, its peers, the split
stage() { # log, env...
	local log=$1

	shift
	mkdir -p "$tmp/b"
	if env "$@" timeout "$(left 35)" "$K" bench step --backend cuda --only ceilings,stageout \
		--prefill 16384 --dir "$tmp/b" >"$out/$log" 2>&1; then
		ok "bench step stageout${*:+ ($*)}"
	else
		bad "bench step stageout${*:+ ($*)} (rc $?)"
		tail -5 "$out/$log"
	fi
	rm -rf "$tmp/b"
}
stage bench_stageout.log
# 4. the same again, when time is left
if [ $((end - SECONDS)) -ge 25 ]; then
	stage bench_stageout_again.log
else
	echo "NOT RUN: the stage-out again ($((end - SECONDS)) s left)"
fi

echo
echo "== figures (H200; peers from the same run) =="
grep -h 'rows kept:' "$out/ws_append.log"
for f in bench_stageout.log bench_stageout_again.log; do
	[ -f "$out/$f" ] || continue
	echo "-- $f"
	grep -hE 'pinned|copy|GEMM' "$out/$f" | head -3
	grep -hE 'plain forward|pool used before|plain / session|the commit|peer:|the pool \(|writer thread|split of' \
		"$out/$f"
done
echo
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
