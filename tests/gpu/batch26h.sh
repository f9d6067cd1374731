#!/bin/bash
# Issue #26 on the GPU, the tensor-core GEMM for decode's rows (gemm_tc.cu):
# checked, then the batched decode measured with it beside its peers.
#
#   tests/gpu/batch26h.sh OUTDIR
#
# Run from the repository root after the bundle of tools/gpu/bundle.sh is
# unpacked (it is unpacked again here if present). Logs in OUTDIR/batch26h.
#
# 1. kvmem_gpu_check --gemm-tc: kvmem_cuda_gemm_tc_bf16 against its CPU
#    twin (1e-4 of sum |x w|) at the 8B layer shapes and odd ones; each row
#    bit for bit the same for n = 1, 7, 16, 64, 72 and reversed; with
#    "gemm_tc" on, the rows GEMM bit for bit each lone row; then a layer's
#    four GEMMs at 1/16/64 rows with "gemm_tc" off and on.
# 2. compute-sanitizer memcheck over 1 (--quick: the checks, not the
#    timings).
# 3. KVMEM_CUDA_GEMM_TC=1: test_ws_batch on cuda (batched sessions get
#    their twins' bits alone, 72 sessions in one step) and kvmem run
#    --check-exact (the lone decode on the new GEMM stays exact).
# 4. kvmem bench batch --backend cuda --preset 8b at 1/16/64 sessions with
#    KVMEM_CUDA_GEMM_TC=1 (call 1 ran it with it off beside: 738 / 788
#    tok/s at 16 / 64 against 876 / 2051 on).
# 5. tools/bench/torch_batch_decode.py, the PyTorch peer (a figure).
# 6. Time allowing (figures): the bench at 64 sessions with the
#    per-item host work on one thread (OMP_NUM_THREADS=1); then histories
#    of 2K tokens at 1 and 16 sessions beside the peer at 2048 keys.
# Ends with the figures side by side and "N passed, N failed".
set -u
OUTDIR=${1:?usage: tests/gpu/batch26h.sh OUTDIR}
mkdir -p "$OUTDIR"
OUT=$(cd "$OUTDIR" && pwd)
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/lib.sh
gpu_setup batch26h build-gpu
gpu_need "$K" "$B/tests/test_ws_batch"
CTX=512	# history tokens per session (0.5..1.4 x): what fits the 100 s
# Each step's time limit: its own, or what is left of 96 s.
cap() { local left=$((96 - ($(date +%s) - t0))); [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"; }

# 1.
gpu_check "$(cap 35)" gemm_tc.log --gemm-tc

# 2.
if command -v compute-sanitizer >/dev/null; then
	echo "== compute-sanitizer --tool memcheck kvmem_gpu_check --gemm-tc --quick"
	timeout "$(cap 20)" compute-sanitizer --tool memcheck --error-exitcode 99 "$G" --gemm-tc \
		--quick >"$log/memcheck.log" 2>&1
	rc=$?
	grep -E '^FAIL|^========= (ERROR|Invalid)|SUMMARY' "$log/memcheck.log" | head -8
	[ $rc -eq 0 ] && ok "compute-sanitizer memcheck: gemm tc clean" ||
		bad "compute-sanitizer memcheck (exit $rc)"
fi

# 3.
export KVMEM_CUDA_GEMM_TC=1
echo "== KVMEM_CUDA_GEMM_TC=1 KVMEM_TEST_BACKEND=cuda test_ws_batch"
if KVMEM_TEST_BACKEND=cuda timeout "$(cap 30)" "$B/tests/test_ws_batch" >"$log/ws_batch.log" 2>&1; then
	grep -E 'batched forwards|PASSED|seed' "$log/ws_batch.log" | head -8
	ok "test_ws_batch on cuda, gemm_tc: batched sessions equal their twins alone"
else
	grep -E 'FAIL|differ|Error|error|seed' "$log/ws_batch.log" | head -12
	bad "test_ws_batch on cuda, gemm_tc (see $log/ws_batch.log)"
fi
tmp=$(mktemp -d)
"$K" generate --preset tiny --out "$tmp/m" >/dev/null
printf '%s\n' '{"append_random": 700, "seed": 1}' '{"decode": 8}' \
	'{"append_random": 300, "seed": 2}' '{"decode": 8}' >"$tmp/s.jsonl"
if timeout "$(cap 20)" "$K" run --backend cuda --model "$tmp/m" --script "$tmp/s.jsonl" \
	--check-exact >"$log/check_exact.log" 2>&1 && grep -q 'check-exact ok' "$log/check_exact.log"; then
	ok "kvmem run --backend cuda --check-exact, gemm_tc"
else
	tail -5 "$log/check_exact.log"
	bad "kvmem run --backend cuda --check-exact, gemm_tc"
fi
rm -rf "$tmp"

# 4.
echo "== KVMEM_CUDA_GEMM_TC=1 kvmem bench batch --backend cuda --preset 8b --sessions 1,16,64 --context $CTX --tokens 8 --chunk 256"
timeout "$(cap 40)" "$K" bench batch --backend cuda --preset 8b --sessions 1,16,64 \
	--context $CTX --tokens 8 --chunk 256 --json >"$log/bench_batch.json" \
	2>"$log/bench_batch.err"
rc=$?
if [ $rc -eq 0 ]; then
	ok "bench batch at 8B, gemm_tc: the batch drew the loop's tokens at 1, 16, 64 sessions"
else
	tail -5 "$log/bench_batch.err"
	bad "bench batch at 8B, gemm_tc (exit $rc; see $log/bench_batch.err)"
fi
unset KVMEM_CUDA_GEMM_TC

# 5. The peer (a figure: its failure is reported, not counted).
echo "== python3 tools/bench/torch_batch_decode.py --batch 1,16,64 --context $CTX"
timeout "$(cap 60)" python3 tools/bench/torch_batch_decode.py --batch 1,16,64 --context $CTX \
	>"$log/torch.json" 2>"$log/torch.err" || { echo "(the PyTorch peer failed:"; tail -3 "$log/torch.err"; echo ")"; }

# 6. The per-item host work on one thread (OMP_NUM_THREADS=1: the draws
# and the items' copies of batch.c / cuda_fwd_batch.c serial again), time
# allowing (a figure; the bench with gemm_tc off was run in call 1).
left=$((96 - ($(date +%s) - t0)))
if [ "$left" -ge 16 ]; then
	echo "== OMP_NUM_THREADS=1 KVMEM_CUDA_GEMM_TC=1 kvmem bench batch --sessions 64 --tokens 4"
	OMP_NUM_THREADS=1 KVMEM_CUDA_GEMM_TC=1 timeout $((left - 2)) "$K" bench batch --backend cuda \
		--preset 8b --sessions 64 --context $CTX --tokens 4 --chunk 256 --json \
		>"$log/bench_omp1.json" 2>"$log/bench_omp1.err" || tail -3 "$log/bench_omp1.err"
fi

# 7. Longer histories (2K tokens a session, 1 and 16 sessions) with the
# peer at 2048 keys, time allowing (figures).
left=$((96 - ($(date +%s) - t0)))
if [ "$left" -ge 20 ]; then
	echo "== KVMEM_CUDA_GEMM_TC=1 kvmem bench batch --sessions 1,16 --context 2048 --tokens 4; torch --context 2048"
	KVMEM_CUDA_GEMM_TC=1 timeout $((left * 2 / 3)) "$K" bench batch --backend cuda --preset 8b \
		--sessions 1,16 --context 2048 --tokens 4 --chunk 512 --json >"$log/bench_2k.json" \
		2>"$log/bench_2k.err" || tail -3 "$log/bench_2k.err"
	left=$((96 - ($(date +%s) - t0)))
	[ "$left" -ge 5 ] && timeout $((left - 2)) python3 tools/bench/torch_batch_decode.py \
		--batch 1,16 --context 2048 >"$log/torch_2k.json" 2>"$log/torch_2k.err"
fi

echo
echo "== figures (same run; the GEMM timings are in the check's lines above)"
python3 - "$log/bench_batch.json" "$log/torch.json" "$log/bench_omp1.json" "$log/bench_2k.json" \
	"$log/torch_2k.json" <<'PY'
import json, sys
def rows(p):
    try:
        return [json.loads(l) for l in open(p) if l.startswith("{")]
    except OSError:
        return []
kv, th, off = rows(sys.argv[1]), {r["batch"]: r for r in rows(sys.argv[2])}, rows(sys.argv[3])
print("\n8B geometry, random weights, decode tokens/s in all, gemm_tc on (kvmem: median step; "
      "histories 256-716 tokens; torch: every sequence 512 keys)")
print("%-9s %10s %10s %10s %9s %9s | %11s %11s %9s" % ("sessions", "batch", "loop",
      "alone", "batch/1", "loop/1", "torch eager", "torch graph", "kvmem/tg"))
for r in kv:
    b, t = r["sessions"], th.get(r["sessions"], {})
    one = r["median_alone_tokens_per_s"]
    tg = t.get("graph_tokens_per_s", 0)
    print("%-9d %10.1f %10.1f %10.1f %8.2fx %8.2fx | %11.1f %11.1f %8.2fx" % (
        b, r["median_batch_tokens_per_s"], r["median_loop_tokens_per_s"], one,
        r["median_batch_tokens_per_s"] / one, r["median_loop_tokens_per_s"] / one,
        t.get("eager_tokens_per_s", 0), tg, r["median_batch_tokens_per_s"] / tg if tg else 0))
print("\nwhere a batched step goes (ms, means over the steps): the forward's wall, the host "
      "work around it (per item), of it the rows stored on the step's thread and the writer waits")
print("%-9s %9s %9s %9s %9s %9s %9s" % ("sessions", "step", "forward", "host", "host/item",
      "store", "wr wait"))
for r in kv:
    if "batch_step_ms" in r:
        print("%-9d %9.2f %9.2f %9.2f %9.3f %9.2f %9.2f" % (r["sessions"], r["batch_step_ms"],
              r["batch_forward_ms"], r["batch_host_ms"], r["batch_host_ms"] / r["sessions"],
              r["batch_store_ms"], r["batch_writer_wait_ms"]))
omp1 = {r["sessions"]: r for r in off}
if omp1:
    print("\nthe per-item host work on one thread (OMP_NUM_THREADS=1), same run, 4 steps:")
    for r in kv:
        o = omp1.get(r["sessions"])
        if o:
            print("%-9d batch %8.1f tok/s threaded, %8.1f on one thread; step %7.2f / %7.2f ms, "
                  "forward %7.2f / %7.2f, host %7.2f / %7.2f" % (
                  r["sessions"], r["median_batch_tokens_per_s"], o["median_batch_tokens_per_s"],
                  r["batch_step_ms"], o["batch_step_ms"], r["batch_forward_ms"],
                  o["batch_forward_ms"], r["batch_host_ms"], o["batch_host_ms"]))
k2, t2 = rows(sys.argv[4]), {r["batch"]: r for r in rows(sys.argv[5])}
if k2:
    print("\nhistories of 1-2.9K tokens (--context 2048), 4 steps; torch every sequence 2048 keys:")
    for r in k2:
        t = t2.get(r["sessions"], {})
        tg = t.get("graph_tokens_per_s", 0)
        print("%-9d batch %8.1f alone %7.1f (%.2fx) step %7.2f ms (forward %7.2f, host %6.2f) | "
              "torch graph %8.1f (kvmem/tg %.2fx)" % (
              r["sessions"], r["median_batch_tokens_per_s"], r["median_alone_tokens_per_s"],
              r["median_batch_tokens_per_s"] / r["median_alone_tokens_per_s"],
              r["batch_step_ms"], r["batch_forward_ms"], r["batch_host_ms"], tg,
              r["median_batch_tokens_per_s"] / tg if tg else 0))
PY
gpu_done
