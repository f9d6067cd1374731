#!/bin/sh
# A Markdown table from `kvmem bench recall --csv` files: per workspace size
# (rows) and policy (columns), exact-match accuracy over all depths
# (weighted by questions), the needle-in-view share in brackets, and the
# questions behind each figure.
#   tools/bench/recall_table.sh FILE.csv [FILE.csv ...]
set -eu
[ $# -ge 1 ] || { echo "usage: $0 FILE.csv..." >&2; exit 2; }
# tokens,size,depth,policy,accuracy,questions,needle_in_view,ms,mb,rank
awk -F, 'FNR > 1 {
	k = $2 SUBSEP $4; ok[k] += $5 * $6; iv[k] += $7 * $6; n[k] += $6
	if (!($2 in tok)) { tok[$2] = $1; sizes[++ns] = $2 + 0 }
	if (!($4 in seen)) { seen[$4] = 1; pol[++np] = $4 }
} END {
	for (i = 1; i <= ns; i++) for (j = i + 1; j <= ns; j++)
		if (sizes[j] < sizes[i]) { t = sizes[i]; sizes[i] = sizes[j]; sizes[j] = t }
	printf "| workspace |"; for (j = 1; j <= np; j++) printf " %s |", pol[j]; printf "\n"
	printf "| --- |"; for (j = 1; j <= np; j++) printf " --- |"; printf "\n"
	for (i = 1; i <= ns; i++) {
		s = sizes[i]; t = tok[s]
		name = t >= 1048576 ? sprintf("%gM", t / 1048576) : \
			t >= 10240 ? sprintf("%dK", (t + 512) / 1024) : t
		printf "| %s (%gx) |", name, s
		for (j = 1; j <= np; j++) {
			k = s SUBSEP pol[j]
			if (n[k]) printf " %.1f%% (%.0f%%) |", 100 * ok[k] / n[k], 100 * iv[k] / n[k]
			else printf " — |"
		}
		printf "\n"
	}
}' "$@"
