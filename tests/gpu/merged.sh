#!/bin/bash
# The checks a merge of several GPU branches needs, in one short call (the
# session's device time may be a few minutes): the backend-parametrised unit
# tests on cuda, the fp8 view kernels against their twins, --check-exact on
# cuda, then (while time is left) transformers as the oracle and memcheck.
#   tests/gpu/merged.sh OUTDIR [SECONDS]     # from the bundle (tools/gpu/bundle.sh)
# One "ok"/"FAIL" line a check, then "N passed, M failed"; logs in
# OUTDIR/merged. SECONDS (default 150) bounds the whole run.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/merged.sh OUTDIR [SECONDS]}
gpu_end=$(($(date +%s) + ${2:-150}))
. tests/gpu/lib.sh
gpu_setup merged
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

timeout "$(gpu_left 25)" "$G" --fp8 >"$log/fp8_check.log" 2>&1
rc=$?
grep '^FAIL' "$log/fp8_check.log"
if [ $rc -eq 0 ] && ! grep -q '^FAIL' "$log/fp8_check.log"; then
	ok "kvmem_gpu_check --fp8 ($(grep -c '^ok ' "$log/fp8_check.log") cases)"
else
	bad "kvmem_gpu_check --fp8 (exit $rc)"
fi
gpu_unit test_ws_session 45
gpu_unit test_ws_pool_fill 15
gpu_unit test_ws_append 20
gpu_unit test_fp8_session 20
gpu_unit test_serve_batch 15
gpu_unit test_ws_release 15

"$K" generate --preset tiny --out "$tmp/m" >/dev/null
printf '%s\n' '{"append_random": 700, "seed": 1}' '{"decode": 8}' \
	'{"append_random": 300, "seed": 2}' '{"decode": 8}' >"$tmp/s.jsonl"
if timeout "$(gpu_left 20)" "$K" run --backend cuda --model "$tmp/m" --script "$tmp/s.jsonl" \
	--check-exact >"$log/check_exact.log" 2>&1 && grep -q 'check-exact ok' "$log/check_exact.log"; then
	ok "kvmem run --backend cuda --check-exact (budget unlimited)"
else
	bad "check-exact on cuda"
	tail -5 "$log/check_exact.log"
fi

# step NAME SECONDS-WANTED SECONDS-AT-LEAST COMMAND...: one pass or
# failure, or a skip when fewer than SECONDS-AT-LEAST are left.
step() {
	local name=$1 t rc
	t=$(gpu_left "$2")
	shift 2
	if [ "$t" -lt "$1" ]; then
		echo "skip $name (no time left)"
		return 0
	fi
	shift
	timeout "$t" "$@" >"$log/$name.log" 2>&1
	rc=$?
	if [ $rc -eq 0 ]; then
		ok "$name"
	else
		bad "$name (exit $rc)"
	fi
}
step oracle 40 20 python3 tests/oracle/oracle.py --backend cuda --kvmem "$K"
grep -E '^(PASS|FAIL|oracle)' "$log/oracle.log" 2>/dev/null | head -8
step memcheck 40 15 compute-sanitizer --tool memcheck --error-exitcode 3 "$K" run \
	--backend cuda --model "$tmp/m" --script "$tmp/s.jsonl" --budget 256 --block 32
grep -o 'ERROR SUMMARY: [0-9]* errors' "$log/memcheck.log" 2>/dev/null | tail -1
gpu_done
