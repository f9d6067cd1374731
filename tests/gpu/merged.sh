#!/bin/bash
# The checks a merge of several GPU branches needs, in one short call (the
# session's device time may be a few minutes): the backend-parametrised unit
# tests on cuda, the fp8 view kernels against their twins, --check-exact on
# cuda, then (while time is left) transformers as the oracle and memcheck.
#   tests/gpu/merged.sh OUTDIR [SECONDS]     # from the bundle (tools/gpu/bundle.sh)
# Prints PASS/FAIL a line, then "N passed, M failed"; logs in OUTDIR.
set -u
cd "$(dirname "$0")/../.."
out=${1:?usage: tests/gpu/merged.sh OUTDIR [SECONDS]}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/build-gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_WAIT_POLICY=passive
K=build-gpu/kvmem G=build-gpu/gpu/kvmem_gpu_check
pass=0 fail=0 skipped=0
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
end=$((SECONDS + ${2:-150}))
# left N: the seconds a step may take, N or what is left; 0 once none is.
left() { local l=$((end - SECONDS)); [ "$l" -lt "$1" ] && echo $((l > 0 ? l : 0)) || echo "$1"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

# unit NAME SECONDS [VAR=VALUE]: a unit test with the cuda backend.
unit() {
	local t
	t=$(left "$2")
	if [ "$t" -lt 5 ]; then
		echo "SKIP: $1 (no time left)"
		skipped=$((skipped + 1))
		return
	fi
	if env KVMEM_TEST_BACKEND=cuda ${3:-} timeout "$t" "build-gpu/tests/$1" >"$out/$1.log" 2>&1; then
		ok "$1 on cuda${3:+, $3} ($(grep -c '^\[       OK' "$out/$1.log") cases)"
	else
		bad "$1 on cuda${3:+, $3} (rc $?):"
		grep -E 'ERROR|FAILED|LINE|seed|differ|error' "$out/$1.log" | head -10
	fi
}

if timeout "$(left 25)" "$G" --fp8 >"$out/fp8_check.log" 2>&1 &&
	! grep -q '^FAIL' "$out/fp8_check.log"; then
	ok "kvmem_gpu_check --fp8 ($(grep -c '^ok ' "$out/fp8_check.log") cases)"
else
	bad "kvmem_gpu_check --fp8"
	grep -E '^FAIL|seed' "$out/fp8_check.log" | head -8
fi
unit test_ws_session 45
unit test_ws_pool_fill 15
unit test_ws_append 20
unit test_fp8_session 20
unit test_serve_batch 15
unit test_ws_release 15

"$K" generate --preset tiny --out "$tmp/m" >/dev/null
{
	echo '{"append_random": 700, "seed": 1}'
	echo '{"decode": 8}'
	echo '{"append_random": 300, "seed": 2}'
	echo '{"decode": 8}'
} >"$tmp/s.jsonl"
if timeout "$(left 20)" "$K" run --backend cuda --model "$tmp/m" --script "$tmp/s.jsonl" \
	--check-exact >"$out/check_exact.log" 2>&1 && grep -q 'check-exact ok' "$out/check_exact.log"; then
	ok "kvmem run --backend cuda --check-exact (budget unlimited)"
else
	bad "check-exact on cuda"
	tail -5 "$out/check_exact.log"
fi
t=$(left 40)
if [ "$t" -ge 20 ] && command -v python3 >/dev/null; then
	if timeout "$t" python3 tests/oracle/oracle.py --backend cuda --kvmem "$K" >"$out/oracle.log" 2>&1; then
		ok "oracle --backend cuda"
	else
		bad "oracle --backend cuda (rc $?)"
	fi
	grep -E '^(PASS|FAIL|oracle)' "$out/oracle.log" | head -8
else
	echo "SKIP: oracle (no time left)"
	skipped=$((skipped + 1))
fi
t=$(left 40)
if [ "$t" -ge 15 ]; then
	if timeout "$t" compute-sanitizer --tool memcheck --error-exitcode 3 "$K" run --backend cuda \
		--model "$tmp/m" --script "$tmp/s.jsonl" --budget 256 --block 32 \
		>"$out/memcheck.log" 2>&1; then
		ok "compute-sanitizer memcheck: $(grep -o 'ERROR SUMMARY: [0-9]* errors' "$out/memcheck.log" | tail -1)"
	else
		bad "compute-sanitizer memcheck"
		grep -E 'ERROR|Invalid|=========' "$out/memcheck.log" | head -10
	fi
else
	echo "SKIP: memcheck (no time left)"
	skipped=$((skipped + 1))
fi
echo "$pass passed, $fail failed, $skipped skipped"
[ "$fail" = 0 ]
