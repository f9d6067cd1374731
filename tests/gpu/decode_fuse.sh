#!/bin/bash
# Decode's fused ops (kernels/cuda/gemv.cu: RMSNorm fused into the qkv and
# gate|up GEMVs, SwiGLU into gate|up's output; kernels/cuda/qkv.cu: the view
# scatter of the new token inside the q/k norm + RoPE kernel) on the GPU
# machine: checked, then the engine's decode speed with fusion off and on,
# then exactness.
#
#   tests/gpu/decode_fuse.sh [BUILD] [nosan]    BUILD: default build-gpu
#
# Run from the repository root with the bundle of tools/gpu/bundle.sh
# (carry build-gpu/bundle.tar.xz; it is unpacked here).
#
# 1. kvmem_gpu_check --fuse (tests/gpu/check_fuse.c): each fused op against
#    its twin at Qwen3-8B's decode shapes and odd ones, bit for bit against
#    the unfused CUDA ops at every split (and that the fused kernel ran);
#    the q/k norm + RoPE + scatter kernel bit for bit against the two
#    unfused ops; then the two GEMV ops' times, unfused and fused.
# 2. kvmem bench engine --backend cuda --prefill 4k --decode 4k,32k
#    --decode-tokens 64 with KVMEM_CUDA_FUSE=0, then =1: the A/B.
# 3. test_ws_session on cuda with KVMEM_CUDA_FUSE=1 (a session's logits
#    bit for bit the full-context run's; graphs on).
# 4. A generated tiny model: `kvmem run --backend cuda` greedy tokens with
#    fusion off and on (the same), and --check-exact with fusion on.
# 5. compute-sanitizer memcheck and racecheck over --fuse --quick (the
#    fused kernels' shared memory); "nosan" skips them.
#
# Ends with "N passed, N failed": each check line of step 1 is one, each
# other step one. Logs in $OUT/decode_fuse/ when OUT is set, else in a
# temporary folder. About 90-150 s (the sanitizers about 40 of them).
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/lib.sh
gpu_setup decode_fuse "$@"
gpu_need "$K" "$B/tests/test_ws_session"

# 1. Each check line is "ok   ..." or "FAIL ..."; a program that exits
# non-zero without a FAIL line crashed: one failure.
gpu_check 120 fuse.log --fuse

# 2. The A/B, in one run of this script: the same binary, the same seed.
for f in 0 1; do
	echo "== KVMEM_CUDA_FUSE=$f kvmem bench engine --backend cuda --prefill 4k --decode 4k,32k --decode-tokens 64"
	if KVMEM_CUDA_FUSE=$f timeout 180 "$K" bench engine --backend cuda --prefill 4k \
		--decode 4k,32k --decode-tokens 64 >"$log/bench$f.log" 2>&1; then
		cat "$log/bench$f.log"
		ok "bench engine, KVMEM_CUDA_FUSE=$f"
	else
		tail -20 "$log/bench$f.log"
		bad "bench engine, KVMEM_CUDA_FUSE=$f"
	fi
done
# decode rows: "context tokens tok/s roofline of-it%"
awk 'FNR == 1 { f++; d = 0 } /^decode at/ { d = 1; next } d && NF == 5 && $1 ~ /^[0-9]+$/ {
	t[f, $1] = $3; c[$1] = 1 }
     END { for (k in c) if (t[1, k] && t[2, k])
	printf "decode at %s: %.1f -> %.1f tok/s with fusion (%.3fx)\n", k, t[1, k], t[2, k],
	       t[2, k] / t[1, k] }' "$log/bench0.log" "$log/bench1.log"

# 3. Session exactness with the fused decode.
echo "== KVMEM_CUDA_FUSE=1 KVMEM_TEST_BACKEND=cuda test_ws_session"
if KVMEM_CUDA_FUSE=1 KVMEM_TEST_BACKEND=cuda timeout 240 "$B/tests/test_ws_session" \
	>"$log/ws_session.log" 2>&1; then
	ok "test_ws_session on cuda, fusion on ($(grep -c '^\[       OK' "$log/ws_session.log") cases)"
else
	bad "test_ws_session on cuda, fusion on:"
	grep -E 'ERROR|FAILED|LINE|seed' "$log/ws_session.log" | head -20
fi

# 4. A whole model, fusion off and on: the same greedy tokens (the bits are
# the same); the session against its full-context twin with fusion on.
tmp=$(mktemp -d)
"$K" generate --preset tiny --out "$tmp/m" >/dev/null
{
	echo '{"append_random": 700, "seed": 1}'
	echo '{"decode": 24}'
	echo '{"append_random": 300, "seed": 2}'
	echo '{"decode": 24}'
} >"$tmp/s.jsonl"
for f in 0 1; do
	KVMEM_CUDA_FUSE=$f timeout 60 "$K" run --backend cuda --model "$tmp/m" --script "$tmp/s.jsonl" \
		>"$log/run$f.log" 2>&1
	echo "exit $?" >>"$log/run$f.log"
done
if grep -q '^exit 0' "$log/run1.log" &&
	cmp -s <(grep 'tokens:' "$log/run0.log") <(grep 'tokens:' "$log/run1.log") &&
	grep -q 'tokens:' "$log/run1.log"; then
	ok "kvmem run --backend cuda: the same greedy tokens with fusion off and on"
else
	bad "kvmem run --backend cuda, fusion off / on:"
	diff <(grep 'tokens:\|exit' "$log/run0.log") <(grep 'tokens:\|exit' "$log/run1.log") | head
fi
if KVMEM_CUDA_FUSE=1 timeout 60 "$K" run --backend cuda --model "$tmp/m" --script "$tmp/s.jsonl" \
	--check-exact >"$log/check_exact.log" 2>&1 && grep -q 'check-exact ok' "$log/check_exact.log"; then
	ok "kvmem run --backend cuda --check-exact, fusion on"
else
	bad "kvmem run --backend cuda --check-exact, fusion on"
	tail -5 "$log/check_exact.log"
fi
rm -rf "$tmp"

# 5. The sanitizers on the small shapes.
gpu_sanitize --fuse --quick
gpu_done
