#!/bin/bash
# Issue #26 on the GPU: many conversations in one forward pass on the cuda
# backend, checked, then measured beside its peers in the same run.
#
#   tests/gpu/batch26g.sh OUTDIR
#
# Run from the repository root after the bundle of tools/gpu/bundle.sh is
# unpacked (it is unpacked again here if present). Logs in OUTDIR/batch26g.
#
# 1. kvmem_gpu_check --attn-batch: the batched attention against its CPU
#    twin on fresh random batches (1-12 sequences, 0-4 queries, 0-3000 keys,
#    shuffled positions, GQA 1/4/8, head_dim 64/128), bit for bit alone /
#    in the batch / reversed; the rows GEMM bit for bit each row alone; then
#    the timing: the batched attention against one decode call per sequence
#    (1/8/16/64 sequences of 4K, 1-8K and 32K keys, 8B geometry) and a
#    layer's GEMMs at 1/16/64 rows against one GEMV per row.
# 2. test_ws_batch with KVMEM_TEST_BACKEND=cuda: sessions decoding in
#    batches get their twins' (alone) logits, tokens and views bit for bit;
#    72 sessions in one step; batched forwards really ran.
# 3. kvmem bench batch --backend cuda --preset 8b at 1/16/64 sessions:
#    aggregate decode tokens/s batched, in a loop and one session alone,
#    and that the batch drew the loop's tokens (batch invariance at 8B).
# 4. tools/bench/torch_batch_decode.py: PyTorch batched decode of the same
#    geometry and batch sizes (eager and CUDA graph), the peer.
# Ends with the figures side by side and "N passed, N failed" (1: each
# check line; 2, 3: one each; 4 is a figure, not a check). About 60-90 s.
set -u
OUTDIR=${1:?usage: tests/gpu/batch26g.sh OUTDIR}
mkdir -p "$OUTDIR"
OUT=$(cd "$OUTDIR" && pwd)
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/lib.sh
gpu_setup batch26g build-gpu nosan
gpu_need "$K" "$B/tests/test_ws_batch"
CTX=512	# history tokens per session (0.5..1.4 x): what fits the 100 s
# Each step's time limit: its own, or what is left of 96 s.
cap() { local left=$((96 - ($(date +%s) - t0))); [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"; }

# 1.
gpu_check "$(cap 40)" attn_batch.log --attn-batch
sed -n '/^batched decode attention/,$p' "$log/attn_batch.log" | grep -v '^ok \|^FAIL ' \
	>"$log/timing.txt"

# 2.
echo "== KVMEM_TEST_BACKEND=cuda test_ws_batch"
if KVMEM_TEST_BACKEND=cuda timeout "$(cap 40)" "$B/tests/test_ws_batch" >"$log/ws_batch.log" 2>&1; then
	grep -E 'batched forwards|PASSED|seed' "$log/ws_batch.log" | head -8
	ok "test_ws_batch on cuda: batched sessions equal their twins alone"
else
	grep -E 'FAIL|differ|Error|error|seed' "$log/ws_batch.log" | head -12
	bad "test_ws_batch on cuda (see $log/ws_batch.log)"
fi

# 3.
echo "== kvmem bench batch --backend cuda --preset 8b --sessions 1,16,64 --context $CTX --tokens 8 --chunk 256"
timeout "$(cap 45)" "$K" bench batch --backend cuda --preset 8b --sessions 1,16,64 \
	--context $CTX --tokens 8 --chunk 256 --json >"$log/bench_batch.json" \
	2>"$log/bench_batch.err"
rc=$?
if [ $rc -eq 0 ]; then
	ok "bench batch at 8B: the batch drew the loop's tokens at 1, 16, 64 sessions"
else
	tail -5 "$log/bench_batch.err"
	bad "bench batch at 8B (exit $rc; see $log/bench_batch.err)"
fi

# 4. The peer (a figure: its failure is reported, not counted).
echo "== python3 tools/bench/torch_batch_decode.py --batch 1,16,64 --context $CTX"
timeout "$(cap 60)" python3 tools/bench/torch_batch_decode.py --batch 1,16,64 --context $CTX \
	>"$log/torch.json" 2>"$log/torch.err" || { echo "(the PyTorch peer failed:"; tail -3 "$log/torch.err"; echo ")"; }

echo
echo "== figures (same run; the kernel timings are in the check's lines above)"
python3 - "$log/bench_batch.json" "$log/torch.json" <<'EOF'
import json, sys
def rows(p):
    try:
        return [json.loads(l) for l in open(p) if l.startswith("{")]
    except OSError:
        return []
kv, th = rows(sys.argv[1]), {r["batch"]: r for r in rows(sys.argv[2])}
print("\n8B geometry, random weights, decode tokens/s in all (kvmem: median step; histories "
      "256-716 tokens; torch: every sequence 512 keys)")
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
EOF
gpu_done
