#!/bin/bash
# On the GPU machine: where a long prefill's time goes, kernel by kernel.
# Nsight Compute times every kernel of `kvmem bench engine --prefill P`
# (one chunk of warm-up, then P tokens in chunks) and
# tools/bench/census.py sums them per chunk: the GEMMs, attention and the
# rest, each against its FLOPs or bytes.
#
#   tests/gpu/prefill_census.sh [P] [CHUNK]     (default 32k 4096)
#
# ncu serialises the kernels and leaves the clocks free (--clock-control
# none): each kernel runs from a cool start at the burst clock, so the sum
# of the kernels is what the prefill would take with no gaps at the clock
# of a short burst; bench engine's own figure, printed beside it, runs at
# the power limit. Output: $OUT/census.csv and the table on stdout.
set -u
cd "$(dirname "$0")/../.."
[ -x build-gpu/kvmem ] || tar xJf build-gpu/bundle.tar.xz
export LD_LIBRARY_PATH=$PWD/build-gpu/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=${OUT:-/tmp}
P=${1:-32k} C=${2:-4096}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
args=(bench engine --backend cuda --prefill "$P" --chunk "$C" --decode 1k --decode-tokens 1)
build-gpu/kvmem "${args[@]}" | grep -E '^(ceilings|prefill|[0-9]+ +[0-9]+ )' | head -3
KVMEM_CEILINGS_HELD=0 timeout 500 "$NCU" --clock-control none --cache-control none --csv \
	--metrics gpu__time_duration.sum build-gpu/kvmem "${args[@]}" >"$out/census.csv" 2>"$out/census.err" ||
	{ echo "ncu failed:"; tail -5 "$out/census.err"; exit 1; }
tok=$(( $(echo "$P" | sed 's/k$/*1024/') ))
python3 tools/bench/census.py "$out/census.csv" --chunk "$C" --forwards $(( (tok + C - 1) / C ))
