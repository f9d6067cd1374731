#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Issue 29: a longer Mean-K run, as two calls on the GPU machine. Continues
# a model (INIT, default the thirteenth session's hard0 model carried along)
# with the hard0 recipe (MEANK_WHOLE_HARD=0: no block's key gets the
# whole-workspace loss's gradient) and the weight01 run's paged batches
# (PAGED_BATCH=16: reading from pages more). The first call of 5 minutes
# plus this one make a 12-minute run from the shipped model.
#
#   INIT=DIR OUT=DIR tools/train/continue29.sh   (build/static/kvmem carried)
#
# TEACHER=DIR (e.g. models/agentlang) adds train.py's --teacher with
# --teacher-weight TEACHER_WEIGHT (0.5): the reading of the model the runs
# started from kept (tools/train/README.md, "Keeping the starting model's
# reading"; run once, c31: Documentation/recall.md, "Mean-K with a teacher").
#
# MEANK_WHOLE (0.5: the share of paged sequences that are whole
# workspaces) and MEANK_WHOLE_WEIGHT (0.5: that loss's weight), then
# MEANK_WHOLE_HARD (0), LOOKALIKES (drawn), MEANK_BLOCK (32), WHOLE_QUERY
# (view) and WHOLE_TARGET (equals) pass through to run_gpu.sh: the keys' side
# of the whole-workspace loss, the bench's 8 look-alikes, Mean-K's blocks of
# 16 tokens (kvmem's --block 16), that loss's queries blind to the needles
# (blind), and every block of the needle's line its target (line)
# (c32-c34, 2026-12-07: recall.md, "Mean-K trained against the bench's
# look-alikes"; their last model, c34, was kept on a branch that did not land).
#
# Leaves OUT/model.tar (model, record, log) and the run's output in
# OUT/run.txt. 2026-12-03 (fourteenth session): recall.md ("a longer run").
set -u
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT}"
INIT=${INIT:-build/init-hard0}
[ -f "$INIT/model.safetensors" ] || { echo "continue29.sh: no model in $INIT" >&2; exit 1; }
mkdir -p "$OUT"
TEACHER_ARGS=${TEACHER:+ --teacher $TEACHER --teacher-weight ${TEACHER_WEIGHT:-0.5}}
env TRAIN_ARGS="--init $INIT --lr 3e-4 --warmup 30 --curriculum 0$TEACHER_ARGS" \
	PAGED=0.5 PAGED_FROM=0 MINUTES=${MINUTES:-7} TOKENS=80M VIEWS=0.6 \
	VIEW_POLICY=lexical MAX_RATIO=64 STALE=0.6 DROP=0.1 MEANK_WEIGHT=0.2 \
	MEANK_WHOLE=${MEANK_WHOLE:-0.5} MEANK_WHOLE_BATCH=2 MEANK_WHOLE_WEIGHT=${MEANK_WHOLE_WEIGHT:-0.5} \
	MEANK_WHOLE_HARD=${MEANK_WHOLE_HARD:-0} \
	PAGED_BATCH=16 SEED=${SEED:-2} OUT="$OUT/model" WORK=/tmp/kt-c29 \
	tools/train/run_gpu.sh full >"$OUT/run.txt" 2>&1
rc=$?
# The run tool brings back eight files a call: the model as one tar.
[ -d "$OUT/model" ] && tar cf "$OUT/model.tar" -C "$OUT" model && rm -rf "${OUT:?}/model"
tail -n 6 "$OUT/run.txt"
echo "continue29 exit $rc"
exit $rc
