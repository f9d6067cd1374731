#!/bin/bash
# kvmem serve on the GPU (issues #24 and #26): idle views leave the device
# and come back from their pages, the host pool pinned once at start, the
# batch runner's invariance on cuda.
#
#   tests/gpu/serve24.sh OUTDIR
#
# Run from the repository root after the bundle of tools/gpu/bundle.sh is
# unpacked (it is unpacked again here if present). Logs in OUTDIR/serve24.
#
# 1. test_serve_batch with KVMEM_TEST_BACKEND=cuda: the server's batch
#    runner against the loop of per-session calls, bit for bit, rounds in
#    one batched forward (declined rounds counted).
# 2. test_ws_release with KVMEM_TEST_BACKEND=cuda: sessions whose view is
#    given up and laid out again from their pages equal their twins that
#    kept it (every forward's logits, every token), memory source and pager.
# 3. tests/serve/release_py.py with --backend cuda: two servers, the same
#    5-turn conversation (sampled, logprobs), one keeping its view, one
#    giving it up between turns: equal answers, no reopen; the figures:
#    start-up and pinning (256 MiB and 2.7 GB pools), turn times, views
#    laid out again, device bytes with the view held and given up; a third
#    server with KVMEM_SERVE_PIN=0 (the pool pinned inside the first turn,
#    as before) beside it.
# 4. kvmem bench serve --backend cuda, closed loop then Poisson arrivals
#    (0.8 of the closed loop's rate) at 1 and 16 clients (a figure: p99
#    first token at 16 / at 1; its failure is reported, not counted).
# 5. tools/bench/serve_stall.py with BACKEND=cuda, MODE restore, reopen and
#    select (8K history, 1.5K budget): how long another stream waits for a
#    token while one conversation's view is laid out again, reopened or
#    selected in slices (a figure; issue #26).
# Ends with "N passed, N failed"; every log in one file, OUTDIR/serve24.tgz.
# About 80-110 s; at most 132.
set -u
OUTDIR=${1:?usage: tests/gpu/serve24.sh OUTDIR}
mkdir -p "$OUTDIR"
OUT=$(cd "$OUTDIR" && pwd)
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/lib.sh
gpu_setup serve24 build-gpu nosan
gpu_need "$K" "$B/tests/test_serve_batch" "$B/tests/test_ws_release"
# Each step's time limit: its own, or what is left of 130 s.
cap() { local left=$((130 - ($(date +%s) - t0))); [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"; }

# 1, 2.
for t in test_serve_batch test_ws_release; do
	echo "== KVMEM_TEST_BACKEND=cuda $t"
	if KVMEM_TEST_BACKEND=cuda timeout "$(cap 25)" "$B/tests/$t" >"$log/$t.log" 2>&1; then
		grep -E 'backend|seed|PASSED' "$log/$t.log" | head -6
		ok "$t on cuda"
	else
		grep -E 'FAIL|differ|rror|seed|backend' "$log/$t.log" | head -12
		bad "$t on cuda (see $log/$t.log)"
	fi
done

# 3.
echo "== tests/serve/release_py.py (--backend cuda)"
"$K" synth sample --seed 5 --tokens 40000 --questions 0 >"$log/corpus.txt" 2>/dev/null
mkdir -p "$log/release"
timeout "$(cap 40)" python3 tests/serve/release_py.py "$K" "$log/corpus.txt" "$log/release" \
	--backend cuda >"$log/release.log" 2>&1
rc=$?
grep -v '^ok ' "$log/release.log" | grep -v '^{' | head -20
count "$log/release.log" $rc
summary="release_py: $(grep -c '^ok ' "$log/release.log") ok, $(grep -c '^FAIL ' "$log/release.log") FAIL, exit $rc"

# 4. A figure. (Poisson alone would arrive at its default 0.8/s: 64
# requests at 16 clients take 80 s. After the closed loop its rate is 0.8
# of what the closed loop sustained.)
echo "== $K bench serve --backend cuda --clients 1,16 --mode both --requests 4 --tokens 32"
timeout "$(cap 30)" "$K" bench serve --backend cuda --clients 1,16 --mode both --requests 4 \
	--tokens 32 >"$log/bench_serve.txt" 2>&1 || echo "(bench serve failed or ran out of time)"

# 5. Figures.
for m in restore reopen select; do
	echo "== MODE=$m BACKEND=cuda tools/bench/serve_stall.py 2"
	extra=""
	[ "$m" = select ] && extra="HISTORY=4 BUDGET=1536"
	env $extra MODE=$m BACKEND=cuda KVMEM="$K" timeout "$(cap 15)" python3 tools/bench/serve_stall.py 2 \
		>"$log/stall_$m.txt" 2>&1 || echo "(serve_stall $m failed or ran out of time)"
done
echo
echo "== summary (the call brings back the console's last lines)"
for t in test_serve_batch test_ws_release; do
	echo "$t on cuda: $(grep -E 'backend.*(rounds|views)' "$log/$t.log" | tr '\n' ' ')$(grep -E 'PASSED|FAILED' "$log/$t.log" | tail -1)"
done
echo "$summary"
grep '^{' "$log/release.log"
cat "$log/bench_serve.txt"
cat "$log"/stall_*.txt
# Every log in one file (the call brings few files back); not the
# conversations' workspaces.
(cd "$OUT" && find serve24 -type f \( -name '*.log' -o -name '*.json' -o -name '*.err' -o \
	-name '*.txt' \) ! -name corpus.txt ! -path '*/serve/*' ! -path '*/models/*' -print0 | tar czf serve24.tgz --null -T - && rm -rf serve24)
gpu_done
