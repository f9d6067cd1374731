#!/bin/bash
# On the GPU machine (issue #26): the batched rows against the lone
# conversation a user runs without a batching server. `kvmem serve` batches
# with KVMEM_CUDA_GEMM_TC=1 and, over fp8 views, KVMEM_CUDA_DEC_MIN_TILES=8,
# and bench batch times its lone session that way too, so that the lone and
# the batched step give the same bits; `kvmem run` and a server that does not
# batch take the GEMV and the default split (serve.md: about 5% of a lone
# stream). This times both lone paths beside the batch, in turn, in one call:
#
#   tests/gpu/lone26.sh OUTDIR [SECONDS] [16|64]   (logs in OUTDIR/lone26-PART.tar)
#   TILES="8 16 32" tests/gpu/lone26.sh ...         (serve's path at each split floor)
#
#   serve's path: bench batch --sessions 1,B as the row measured it (the
#   lone session and the batch on the tensor-core GEMM, 8 stages a split);
#   kvmem run's path: bench batch --sessions 1 with the GEMV and the
#   default split, the same first history; twice each, alternating. The
#   honest ratio is the batch's back-to-back tokens/s over the second lone.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/lone26.sh OUTDIR [SECONDS] [16|64]}
PART=${3:-16}
. tests/gpu/lib.sh
gpu_begin "lone26-$PART" 560 "${2:-}"
if [ "$PART" = 16 ]; then
	args=(--context 32k --budget 4096 --chunk 2048 --tokens 8 --no-loop --kv-dtype fp8)
else
	args=(--context 8k --budget 4096 --chunk 2048 --tokens 8 --no-loop --kv-dtype fp8)
fi
lone_run() { # name, seconds
	echo "== KVMEM_CUDA_GEMM_TC=0 kvmem bench batch --sessions 1 ${args[*]} (kvmem run's path)"
	if env -u KVMEM_CUDA_DEC_MIN_TILES KVMEM_CUDA_GEMM_TC=0 timeout "$(gpu_left "$2")" "$K" \
		bench batch --backend cuda --preset 8b --json --sessions 1 "${args[@]}" \
		>"$log/$1.json" 2>"$log/$1.err"; then
		ok "bench batch --sessions 1, the GEMV and the default split"
	else
		bad "bench batch --sessions 1, the GEMV and the default split (exit $?)"
	fi
}
# TILES: the decode split's least stages for serve's path, one batch each
# (serve sets 8; more stages a split make fewer, longer splits, which the
# batched fp8 attention over 4096-key views may want: it ran at 1669 GB/s
# there on an H100, latency more than bytes). "8" by default.
for i in 1 2; do
	for t in ${TILES:-8}; do
		KVMEM_CUDA_DEC_MIN_TILES=$t gpu_batch "serve_t${t}_$i" 120 --sessions "1,$PART" "${args[@]}"
	done
	lone_run "run_$i" 60
done
gpu_batch_summary
# The honest ratios: each batch over each lone of kvmem run's path, back to back.
python3 - "$log" "$PART" <<'EOF'
import json, glob, os, sys
log, part = sys.argv[1], int(sys.argv[2])
def rows(pat):
    out = []
    for f in sorted(glob.glob(os.path.join(log, pat))):
        for line in open(f):
            line = line.strip()
            if line.startswith("{"):
                out.append((os.path.basename(f), json.loads(line)))
    return out
batch = [(f, r) for f, r in rows("serve_*.json") if r.get("sessions") == part]
lone = [(f, r) for f, r in rows("run_*.json") if r.get("sessions") == 1]
for f, r in batch:
    print(f"{f}: batch {r['run_batch_tokens_per_s']:.1f} tok/s back to back, its lone on serve's "
          f"path {r['run_alone_tokens_per_s']:.1f} ({r['run_batch_tokens_per_s'] / r['run_alone_tokens_per_s']:.2f}x)")
for f, r in lone:
    a = r["run_alone_tokens_per_s"]
    print(f"{f}: lone on kvmem run's path {a:.1f} tok/s back to back; the batches over it: " +
          ", ".join(f"{b['run_batch_tokens_per_s'] / a:.2f}x" for _, b in batch))
EOF
[ -n "${OUT:-}" ] && tar cf "$OUT/lone26-$PART.tar" -C "$OUT" "lone26-$PART" &&
	rm -rf "${OUT:?}/lone26-$PART"
gpu_done
