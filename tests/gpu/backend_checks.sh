#!/bin/bash
# On the GPU machine: the cuda backend's checks, from the bundle that
# tools/gpu/bundle.sh built here (carried as build-gpu/).
#
#   1. exactness through the backend ops: tests/unit/test_ws_session with
#      KVMEM_TEST_BACKEND=cuda, with decode graphs (KVMEM_CUDA_GRAPH as set,
#      on by default) and without (a session whose budget holds the workspace
#      gives the full-context run's logits bit for bit, every policy, block
#      size and chunking; small budgets keep every invariant);
#   2. transformers as the oracle: tests/oracle/oracle.py --backend cuda
#      (bf16 compute against fp32 on the same rounded weights);
#   3. --check-exact of `kvmem run` on the GPU (budget over the workspace),
#      with the tiny model and with Qwen3-0.6B's geometry in long chunks
#      (prefill attention v6);
#   4. compute-sanitizer memcheck and racecheck on a short agent session.
#
# Ends with a plain "N passed, N failed" line. Logs go to $OUT when set.
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_WAIT_POLICY=passive
K=build-gpu/kvmem
out=${OUT:-/tmp}
pass=0 fail=0
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
tmp=$(mktemp -d)

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# A unit test program on the cuda backend: one pass (with its case count)
# or one failure (with its failing lines). Arguments: log name, seconds,
# program, then an environment setting for it or nothing.
cuda_unit() {
	local what="$3 on cuda${4:+, $4}"

	if env KVMEM_TEST_BACKEND=cuda ${4:-} timeout "$2" "build-gpu/tests/$3" >"$out/$1.log" 2>&1; then
		ok "$what ($(grep -c '^\[       OK' "$out/$1.log") cases)"
	else
		bad "$what:"
		grep -E 'ERROR|FAILED|LINE|seed' "$out/$1.log" | head -20
	fi
}
# 1. exactness through the ops, decode graphs as set (on by default) and off
for g in "${KVMEM_CUDA_GRAPH:-1}" 0; do
	cuda_unit "ws_session$g" 200 test_ws_session "KVMEM_CUDA_GRAPH=$g"
done
# forward outputs: only the last q_last tokens' queries, bit for bit the
# rows of a full download (the 2D copy and the graph path)
cuda_unit fwd_qlast 100 test_fwd_qlast
# 2. the oracle
if timeout 150 python3 tests/oracle/oracle.py --backend cuda --kvmem "$K" >"$out/oracle.log" 2>&1; then
	ok "oracle --backend cuda"
else
	bad "oracle --backend cuda"
fi
grep -E '^(PASS|FAIL|oracle)' "$out/oracle.log"
# 3 and 4: a short session of a generated model (head_dim 64)
"$K" generate --preset tiny --out "$tmp/m" >/dev/null
{
	echo '{"append_random": 700, "seed": 1}'
	echo '{"decode": 8}'
	echo '{"append_random": 300, "seed": 2}'
	echo '{"decode": 8}'
} >"$tmp/s.jsonl"
if "$K" run --backend cuda --model "$tmp/m" --script "$tmp/s.jsonl" --check-exact \
	>"$out/check_exact.log" 2>&1 && grep -q 'check-exact ok' "$out/check_exact.log"; then
	ok "kvmem run --backend cuda --check-exact (budget unlimited)"
else
	bad "check-exact on cuda"
	tail -5 "$out/check_exact.log"
fi
# 3b. the same at head_dim 128 with chunks of 2048 (Qwen3-0.6B's geometry:
# 16/8 heads): long chunks take prefill attention v6 on an H200, which the
# tiny model (head_dim 64) never reaches.
"$K" generate --preset 0.6b --out "$tmp/m06" >/dev/null
{
	echo '{"append_random": 6000, "seed": 3}'
	echo '{"decode": 8}'
	echo '{"append_random": 2500, "seed": 4}'
	echo '{"decode": 8}'
} >"$tmp/s06.jsonl"
if timeout 120 "$K" run --backend cuda --model "$tmp/m06" --script "$tmp/s06.jsonl" --chunk 2048 \
	--check-exact >"$out/check_exact_06.log" 2>&1 && grep -q 'check-exact ok' "$out/check_exact_06.log"; then
	ok "kvmem run --backend cuda --check-exact, 0.6B geometry, chunks of 2048"
else
	bad "check-exact on cuda, 0.6B geometry"
	tail -5 "$out/check_exact_06.log"
fi
for tool in memcheck racecheck; do
	if timeout 90 compute-sanitizer --tool $tool --error-exitcode 3 "$K" run --backend cuda \
		--model "$tmp/m" --script "$tmp/s.jsonl" --budget 256 --block 32 \
		>"$out/sanitizer_$tool.log" 2>&1; then
		ok "compute-sanitizer $tool: $(grep -o 'ERROR SUMMARY: [0-9]* errors' "$out/sanitizer_$tool.log" | tail -1)"
	else
		bad "compute-sanitizer $tool"
		grep -E 'ERROR|Invalid|Race|=========' "$out/sanitizer_$tool.log" | head -15
	fi
done
rm -rf "$tmp"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
