#!/bin/sh
# Concatenate `kvmem bench recall --csv` files into one CSV on stdout (one
# header), e.g. the per-process files of recall_parallel.sh.
#   tools/bench/recall_merge.sh FILE.csv [FILE.csv ...] > all.csv
set -eu
[ $# -ge 1 ] || { echo "usage: $0 FILE.csv..." >&2; exit 2; }
awk -F, 'FNR == 1 { if (NR == 1) print; next } { print }' "$@"
