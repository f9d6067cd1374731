#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Issue 29's two Mean-K follow-ups in one call on the GPU machine, side by
# side (each its own corpus folder and output; the GPU and the 16 cores
# shared, so each loop gets fewer steps than alone: record.json says how
# many). Both start from the shipped model with the eleventh session's
# whole-workspace recipe (recall.md, "Mean-K over a whole workspace"):
#   weight01   MEANK_WHOLE_WEIGHT=0.1 PAGED_BATCH=16: finding trained less
#              hard, reading from pages more
#   hard0      MEANK_WHOLE_HARD=0: no block's key gets the whole-workspace
#              loss's gradient (only the question's query side)
#
#   OUT=DIR tools/train/meank29.sh      (build/static/kvmem carried along)
#
# Leaves OUT/weight01.tar and OUT/hard0.tar (model, record, log) and the
# two runs' output in OUT/logs. 2026-12-03: 400 s wall; recall.md ("Mean-K
# over a whole workspace, the two follow-ups").
set -u
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT}"
common() {
	env TRAIN_ARGS="--init models/agentlang --lr 3e-4 --warmup 30 --curriculum 0" \
		PAGED=0.5 PAGED_FROM=0 MINUTES=${MINUTES:-5} TOKENS=80M VIEWS=0.6 \
		VIEW_POLICY=lexical MAX_RATIO=64 STALE=0.6 DROP=0.1 MEANK_WEIGHT=0.2 \
		MEANK_WHOLE=0.5 MEANK_WHOLE_BATCH=2 "$@" tools/train/run_gpu.sh full
}
common OUT="$OUT/weight01" WORK=/tmp/kt-w01 MEANK_WHOLE_WEIGHT=0.1 PAGED_BATCH=16 \
	>"$OUT.w01.txt" 2>&1 &
a=$!
common OUT="$OUT/hard0" WORK=/tmp/kt-h0 MEANK_WHOLE_WEIGHT=0.5 MEANK_WHOLE_HARD=0 \
	>"$OUT.h0.txt" 2>&1 &
b=$!
wait $a; ra=$?
wait $b; rb=$?
mkdir -p "$OUT/logs"
mv "$OUT.w01.txt" "$OUT.h0.txt" "$OUT/logs/"
# The run tool brings back eight files a call: each model as one tar.
for m in weight01 hard0; do
	[ -d "$OUT/$m" ] && tar cf "$OUT/$m.tar" -C "$OUT" "$m" && rm -rf "${OUT:?}/$m"
done
tail -n 4 "$OUT"/logs/*.txt
echo "weight01 exit $ra, hard0 exit $rb"
[ $ra = 0 ] && [ $rb = 0 ]
