#!/bin/bash
# On the GPU machine (issue 27): the cuda backend's fp8 views checked, then
# the fp8 figures beside bf16's from the same run. From the repo root,
# after `tar xJf build-gpu/bundle.tar.xz`:
#
#   tests/gpu/fp827b.sh OUTDIR
#
#   1. kvmem_gpu_check --fp8 --bench: tests/gpu/fp8.sh's checks
#      (quantising and dequantising, the gather from fp8 pages, decode
#      attention over fp8 K/V, each against its CPU twin) and the fp8
#      views' (put, gather, a layer as bf16, v5 over fp8: bit for bit),
#      then their timings (decode attention of a layer at 32K and 128K
#      keys, v5 over an fp8 view and over a bf16 one; rematerialisation
#      from pinned pages into an fp8 view and into a bf16 one);
#   2. test_fp8_session on cuda: the restated invariant (a paged fp8
#      session equals full attention over the same fp8 KV, every logit,
#      and the two views hold the same bytes), every view slot against the
#      CPU twin of its K row (kvmem_fp8_view_k_row) and its page's V, the
#      pages' bytes, fp8's logit error against bf16 KV;
#   3. kvmem bench step --only fits --gpu-mem 24G, bf16 then fp8: the
#      largest view under the cap;
#   4. kvmem bench step --only step,decode --tiers warm at a 32K view over a
#      48K-token workspace (Qwen3-8B geometry, random weights), bf16 then
#      fp8: the warm step and decode in the session (each run's plain
#      decode and prefill are its peers);
#   5. the oracle (tests/oracle/oracle.py: transformers in fp32 on random
#      Qwen3 models) against --backend cuda with --kv-dtype bf16, then fp8,
#      the same seed, when time is left;
#   6. test_ws_session on cuda (bf16 views unchanged), when time is left.
#
# Everything within 95 s of wall time (each step's timeout is cut to what
# is left). Logs in OUTDIR; a short summary; "N passed, N failed"; exit 0
# only when every check passed.
set -u
cd "$(dirname "$0")/../.."
out=${1:?usage: tests/gpu/fp827b.sh OUTDIR}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/build-gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_WAIT_POLICY=passive
export KVMEM_CEILINGS_HELD=0	# bench step's ceilings without the held GEMM (1.5 s a run)
K=build-gpu/kvmem G=build-gpu/gpu/kvmem_gpu_check
F=build-gpu/tests/test_fp8_session T=build-gpu/tests/test_ws_session
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

# 1. the kernels against their twins
if [ -x "$G" ]; then
	timeout "$(left 30)" "$G" --fp8 --bench >"$out/fp8_check.log" 2>&1
	rc=$?
	n_ok=$(grep -c '^ok ' "$out/fp8_check.log")
	n_bad=$(grep -c '^FAIL' "$out/fp8_check.log")
	if [ "$rc" -eq 0 ] && [ "$n_bad" -eq 0 ] && [ "$n_ok" -gt 0 ]; then
		ok "kvmem_gpu_check --fp8 --bench ($n_ok cases)"
	else
		bad "kvmem_gpu_check --fp8 --bench (rc $rc, $n_ok ok, $n_bad FAIL)"
		grep -E '^FAIL|seed' "$out/fp8_check.log" | head -8
	fi
else
	bad "no $G"
fi

# 2. the cuda backend's fp8 views
unit() { # binary, log, seconds
	local what
	what="$(basename "$1") on cuda"
	if [ ! -x "$1" ]; then
		bad "no $1"
		return
	fi
	if env KVMEM_TEST_BACKEND=cuda timeout "$(left "$3")" "$1" >"$out/$2.log" 2>&1; then
		ok "$what: $(grep -c '^\[       OK' "$out/$2.log") cases"
	else
		bad "$what:"
		grep -E 'ERROR|FAILED|LINE|seed|differ|Assert|error' "$out/$2.log" | head -12
	fi
}
unit "$F" fp8_session 40

# 3. the largest view under a 24 GiB cap
for dt in bf16 fp8; do
	if timeout "$(left 12)" "$K" bench step --backend cuda --kv-dtype $dt --only fits \
		--gpu-mem 24G --dir "$tmp/fits" >"$out/fits_$dt.log" 2>&1; then
		ok "bench step fits, $dt"
	else
		bad "bench step fits, $dt (rc $?)"
		tail -3 "$out/fits_$dt.log"
	fi
done

# 4. the warm step and decode in the session, bf16 then fp8
for dt in bf16 fp8; do
	mkdir -p "$tmp/b"
	if timeout "$(left 28)" "$K" bench step --backend cuda --kv-dtype $dt --only step,decode \
		--tokens 49152 --view 32768 --steps 2 --decode 32 --tiers warm --dir "$tmp/b" \
		>"$out/step_$dt.log" 2>&1; then
		ok "bench step step,decode, $dt"
	else
		bad "bench step step,decode, $dt (rc $?)"
		tail -5 "$out/step_$dt.log"
	fi
	rm -rf "$tmp/b"
done

# 5. the oracle, bf16 then fp8 KV, if time is left
if [ $((end - SECONDS)) -ge 30 ] && python3 -c 'import torch, transformers' 2>/dev/null; then
	seed=$((RANDOM * 32768 + RANDOM))
	for dt in bf16 fp8; do
		if timeout "$(left 20)" python3 tests/oracle/oracle.py --kvmem "$K" --backend cuda \
			--kv-dtype $dt --seed $seed --decode 4 >"$out/oracle_$dt.log" 2>&1; then
			ok "oracle, cuda $dt KV"
		else
			bad "oracle, cuda $dt KV"
			tail -4 "$out/oracle_$dt.log"
		fi
	done
else
	echo "NOT RUN: the oracle ($((end - SECONDS)) s left, or no torch)"
fi

# 6. bf16 views unchanged, if time is left
if [ $((end - SECONDS)) -ge 15 ]; then
	unit "$T" ws_session $((end - SECONDS))
else
	echo "NOT RUN: test_ws_session on cuda ($((end - SECONDS)) s left)"
fi

echo
echo "== figures (H200; fp8 beside bf16, same run) =="
grep -hE '^(rematerial|decode attention)' "$out/fp8_check.log"
grep -h 'relative L2 logit error' "$out/fp8_session.log"
for dt in bf16 fp8; do
	echo "-- $dt"
	grep -h 'a view of up to' "$out/fits_$dt.log" | sed 's/; the device page pool.*//'
	grep -hE 'median step|decode in a|per token:|prefilling' "$out/step_$dt.log" | head -6
done
grep -hE '^(PASS|FAIL) cuda' "$out"/oracle_*.log 2>/dev/null | sed 's/; vs torch.*//'
awk '/decode in a/ { for (i = 1; i <= NF; i++) if ($i == "tokens/s;") { v[FILENAME] = $(i - 1); break } }
     END { b = v[ARGV[1]]; f = v[ARGV[2]]; if (b && f) printf "decode in the session, fp8 / bf16: %.2f (target >= 1.08 at 32K)\n", f / b }' \
	"$out/step_bf16.log" "$out/step_fp8.log" 2>/dev/null
awk '/a view of up to/ { for (i = 1; i <= NF; i++) if ($i == "up" && $(i + 1) == "to") { v[FILENAME] = $(i + 2); break } }
     END { b = v[ARGV[1]]; f = v[ARGV[2]]; if (b && f) printf "largest view under 24G, fp8 / bf16: %.2f (target 2)\n", f / b }' \
	"$out/fits_bf16.log" "$out/fits_fp8.log" 2>/dev/null
awk '/median step/ { for (i = 1; i <= NF; i++) if ($i == "step") { v[FILENAME] = $(i + 1); break } }
     END { b = v[ARGV[1]]; f = v[ARGV[2]]; if (b && f) printf "warm step, bf16 / fp8 time: %.2f (target >= 1.6)\n", b / f }' \
	"$out/step_bf16.log" "$out/step_fp8.log" 2>/dev/null
echo
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
