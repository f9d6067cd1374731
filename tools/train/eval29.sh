#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Issue 29's table for one model, through kvmem on this machine's CPU: the
# commands of Documentation/recall.md's Mean-K sections in one, the two
# seeds side by side (one thread each), then full context at 1x.
#
#   tools/train/eval29.sh MODEL_DIR OUT_DIR     (6-8 minutes on the 2-core build machine)
#
# Writes OUT_DIR/seed1005.csv, seed1010.csv and 1x.csv (kvmem bench recall
# --csv) with their logs, and prints the answers of meank, meank_neighbour,
# subblock, subblock_neighbour, neighbour and lexical over both seeds (48
# questions a cell: sizes 4x, 16x, 64x; depths 0.1, 0.5, 0.9; 8 look-alikes
# a needle), the needle line in view beside them, and full context at 1x
# over 150 questions (seed 1004000000, 50 a depth). KVMEM:
# the CLI (default build/kvmem); BLOCK: the sessions' block (--block; 32).
set -u
cd "$(dirname "$0")/../.."
MODEL=${1:?usage: tools/train/eval29.sh MODEL_DIR OUT_DIR}
OUT=${2:?usage: tools/train/eval29.sh MODEL_DIR OUT_DIR}
KVMEM=${KVMEM:-build/kvmem}
[ -f "$MODEL/model.safetensors" ] || { echo "eval29.sh: no model.safetensors in $MODEL" >&2; exit 1; }
[ -x "$KVMEM" ] || { echo "eval29.sh: no kvmem at $KVMEM (make, or set KVMEM)" >&2; exit 1; }
mkdir -p "$OUT" || exit 1

pids=()
for s in 1005 1010; do
	OMP_NUM_THREADS=1 "$KVMEM" bench recall --model "$MODEL" --sizes 4,16,64 \
		--depths 0.1,0.5,0.9 --questions 8 --lookalikes 8 --seed "${s}000000" --chunk 256 \
		--policies meank,meank_neighbour,subblock,subblock_neighbour,neighbour,lexical \
		--block "${BLOCK:-32}" --quiet --csv "$OUT/seed$s.csv" \
		>"$OUT/seed$s.log" 2>&1 &
	pids+=($!)
done
rc=0
for p in "${pids[@]}"; do
	wait "$p" || rc=1
done
[ $rc = 0 ] || { echo "eval29.sh: a workspace run failed (see $OUT/seed*.log)" >&2; exit 1; }
OMP_NUM_THREADS=2 "$KVMEM" bench recall --model "$MODEL" --sizes 1 --depths 0.1,0.5,0.9 \
	--questions 50 --lookalikes 8 --seed 1004000000 --chunk 256 --policies full \
	--block "${BLOCK:-32}" --quiet \
	--csv "$OUT/1x.csv" >"$OUT/1x.log" 2>&1 ||
	{ echo "eval29.sh: full context at 1x failed (see $OUT/1x.log)" >&2; exit 1; }

# Columns: tokens,size,depth,policy,accuracy,questions,needle_in_view,...
awk -F, -v model="$MODEL" '
FNR == 1 { next }
{
	k = $4 "," $2
	right[k] += $5 * $6; seen[k] += $7 * $6; n[k] += $6
	if (!(k in order)) { order[k] = ++cells; key[cells] = k }
}
END {
	printf "%s: answered (needle line in view), both seeds\n", model
	for (i = 1; i <= cells; i++) {
		split(key[i], p, ",")
		printf "  %-10s %3sx  %5.1f%% (%5.1f%%)  of %d\n", p[1], p[2],
		       100 * right[key[i]] / n[key[i]], 100 * seen[key[i]] / n[key[i]], n[key[i]]
	}
}' "$OUT/seed1005.csv" "$OUT/seed1010.csv"
awk -F, 'FNR > 1 { r += $5 * $6; n += $6 } END { printf "  full        1x  %5.1f%% of %d\n", 100 * r / n, n }' \
	"$OUT/1x.csv"
