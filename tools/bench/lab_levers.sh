#!/bin/sh
# The recall levers of Documentation/recall.md, replayed with kvmem lab over
# recorded recall workspaces (kvmem bench recall --lab DIR): one row per
# lever, the needle line in view, the needle's median rank, the oracle's
# mass held (where computed) and MB read per question.
#   tools/bench/lab_levers.sh OUT.csv WS TRACE [WS TRACE ...]
# KVMEM (default build/kvmem) is the binary; ORACLE=1 computes the oracle
# columns too (slower: it scores every key of every step).
set -eu
[ $# -ge 3 ] || { echo "usage: $0 OUT.csv WS TRACE [WS TRACE ...]" >&2; exit 2; }
KVMEM=${KVMEM:-build/kvmem}
out=$1
shift
pairs=""
while [ $# -ge 2 ]; do
	pairs="$pairs --workspace $1 --trace $2"
	shift 2
done
oracle="--no-oracle"
[ "${ORACLE:-0}" = 1 ] && oracle=""
tmp=$(mktemp -d /tmp/kvmem-levers.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# lever label | kvmem lab compare arguments
cat >"$tmp/levers" <<'EOF'
baseline: the answer marker's query and blocks of 32|--policies meank,subblock,refine --blocks 32
neighbour expansion|--policies neighbour --blocks 32
16-token blocks|--policies meank,subblock,refine,neighbour --blocks 16
shortlist: the whole history (oracle)|--policies oracle --blocks 32,16
several query tokens (the question's last N)|--policies subblock,refine --blocks 32 --query-tokens 2,4,8
the question's key tokens as queries|--policies subblock,refine --blocks 32 --query-span
representative tokens (infllm)|--policies infllm --blocks 32,16
per-layer selection|--policies refine_layer --blocks 32,16
EOF
first=1
while IFS='|' read -r label args; do
	# shellcheck disable=SC2086
	"$KVMEM" lab compare $pairs $args $oracle --bw 2,10,10 --csv "$tmp/c.csv" --md /dev/null \
		2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
	if [ $first = 1 ]; then
		printf 'lever,%s\n' "$(head -1 "$tmp/c.csv")" >"$out"
		first=0
	fi
	tail -n +2 "$tmp/c.csv" | sed "s|^|$label,|" >>"$out"
done <"$tmp/levers"
# The summary: lever, policy, block, queries, in view, rank, MB per question.
awk -F, 'NR > 1 {
	printf "| %s | %s | %s | %s | %.1f%% | %s | %.1f |\n", $1, $2, $3, $5, 100 * $10, $11,
		$16 + $17
}' "$out"
