#!/bin/bash
# On the GPU machine (issue #26, 2026-12-03, fourteenth session): the
# tensor-core GEMM with a batched step's rows in shared memory
# (kernels/cuda/gemm_tcc.cu, "gemm_tcc", off by default until these figures
# say otherwise), checked and timed beside gemm_tc.cu in the same call:
#
#   1. kvmem_gpu_check --gemm-tc: gemm_tc.cu against the twin and its batch
#      invariance as before, gemm_tcc.cu byte for byte gemm_tc.cu (n 2, 9,
#      16, 64, 72 at every split), the rows GEMM against the lone row with
#      both on; then a layer's four GEMMs timed at 1, 16, 64 rows, each form;
#   2. test_ws_batch on cuda with gemm_tc and gemm_tcc on: batched items bit
#      for bit their lone steps;
#   3. kvmem bench batch --preset 8b --context 512 --sessions 1,16,64, with
#      gemm_tcc off then on (both with gemm_tc on, as the batch's figures
#      in benchmarks.md are taken);
#   4. time allowing, the eleventh session's 64 x 8K row (--context 8k
#      --budget 4096 --chunk 2048 --sessions 1,64 --no-loop) with gemm_tcc on.
#
#   tests/gpu/tcc26.sh OUTDIR [SECONDS]      (default 330; logs in OUTDIR/tcc26)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/tcc26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-330}))
gpu_setup tcc26 build-gpu
gpu_need "$K" "$B/tests/test_ws_batch"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader

# 1., 2.
gpu_check "$(gpu_left 100)" gemm_tc.log --gemm-tc
gpu_unit test_ws_batch 40 "KVMEM_CUDA_GEMM_TC=1 KVMEM_CUDA_GEMM_TCC=1"

# 3., 4.: figures (a run that fails is counted; one cut by the time is said)
batch() { # name, tcc, seconds, bench args...
	local name=$1 tcc=$2 s=$3 rc
	shift 3
	if [ "$(gpu_left "$s")" -lt 20 ]; then
		echo "(no time left for $name)"
		return 0
	fi
	echo "== KVMEM_CUDA_GEMM_TC=1 KVMEM_CUDA_GEMM_TCC=$tcc kvmem bench batch $*"
	KVMEM_CUDA_GEMM_TC=1 KVMEM_CUDA_GEMM_TCC=$tcc timeout "$(gpu_left "$s")" "$K" bench batch \
		--backend cuda --preset 8b --json "$@" >"$log/$name.json" 2>"$log/$name.err"
	rc=$?
	if [ $rc -eq 0 ]; then
		ok "bench batch $name: the batch drew the loop's tokens"
	elif [ $rc -eq 124 ]; then
		echo "($name cut by the time limit)"
	else
		bad "bench batch $name (exit $rc)"
		tail -5 "$log/$name.err"
	fi
	grep '^{' "$log/$name.json" | cut -c1-400
}
short=(--context 512 --tokens 8 --chunk 256 --sessions 1,16,64)
batch b512_tc 0 50 "${short[@]}"
batch b512_tcc 1 50 "${short[@]}"
batch b8k64_tcc 1 120 --context 8k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,64 --no-loop

python3 - "$log" <<'PY'
import json, os, sys
d = sys.argv[1]
def rows(n):
    try:
        return {r["sessions"]: r for r in (json.loads(l) for l in open(os.path.join(d, n + ".json"))
                                           if l.startswith("{"))}
    except (OSError, ValueError):
        return {}
print("aggregate decode tok/s (and / the 1-session row), gemm_tc on; tcc off | on")
for name in ("b512", "b8k64"):
    a, b = rows(name + "_tc"), rows(name + "_tcc")
    for s in sorted(set(a) | set(b)):
        def f(r):
            if s not in r:
                return "-"
            t = r[s].get("median_batch_tokens_per_s")
            one = r.get(1, {}).get("median_batch_tokens_per_s")
            return "%.1f (%.2fx)" % (t, t / one) if t and one else str(t)
        print("%-6s %4d  %-22s | %s" % (name, s, f(a), f(b)))
PY
gpu_done
