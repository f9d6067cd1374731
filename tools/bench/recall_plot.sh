#!/bin/sh
# Plot `kvmem bench recall --csv` results: accuracy per policy against the
# workspace size, averaged over depths (weighted by questions).
#   tools/bench/recall_plot.sh OUT.png FILE.csv [FILE.csv ...]
# Needs gnuplot (Debian: gnuplot-nox).
set -eu
[ $# -ge 2 ] || { echo "usage: $0 OUT.png FILE.csv..." >&2; exit 2; }
out=$1; shift
dat=$(mktemp /tmp/recall-plot.XXXXXX)
trap 'rm -f "$dat"' EXIT
# tokens,size,depth,policy,accuracy,questions,needle_in_view,ms,mb
awk -F, 'FNR > 1 {
	k = $2 SUBSEP $4; ok[k] += $5 * $6; n[k] += $6; size[$2] = 1
	if (!($4 in seen)) { seen[$4] = 1; pol[++np] = $4 }
} END {
	printf "size"; for (i = 1; i <= np; i++) printf " %s", pol[i]; printf "\n"
	m = 0; for (s in size) sizes[++m] = s + 0
	for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++)
		if (sizes[j] < sizes[i]) { t = sizes[i]; sizes[i] = sizes[j]; sizes[j] = t }
	for (i = 1; i <= m; i++) {
		printf "%g", sizes[i]
		for (j = 1; j <= np; j++) {
			k = sizes[i] SUBSEP pol[j]
			if (n[k]) printf " %.1f", 100 * ok[k] / n[k]; else printf " NaN"
		}
		printf "\n"
	}
}' "$@" >"$dat"
cols=$(head -1 "$dat" | wc -w)
gnuplot <<GP
set terminal pngcairo size 900,540 font "DejaVu Sans,11"
set output '$out'
set title "kvmem bench recall: exact-match accuracy per selection policy"
set xlabel "workspace size (multiples of the native window)"
set ylabel "accuracy (%), averaged over needle depths"
set logscale x 2
set yrange [0:105]
set key outside right
set grid
plot for [i=2:$cols] '$dat' using 1:i with linespoints lw 2 pt 7 title columnhead(i)
GP
echo "wrote $out"
