#!/bin/bash
# On the GPU machine (issue 24, follow-up steps): the compact and the
# stable view layouts in one run, each beside the same peers. From the repo
# root, after `tar xJf build-gpu/bundle.tar.xz` (gpu_setup unpacks it):
#
#   tests/gpu/layout24.sh OUTDIR [SECONDS]
#
#   1. test_ws_session on cuda with KVMEM_CUDA_MOVE_GAP=0: every run of a
#      move's sources copied aside on its own (the many-run path of
#      cuda_move, which small test views never take with the default gap),
#      moves bit for bit the pages' placements, stable's cases included;
#   2. kvmem bench step --backend cuda --only step,decode --tokens 262144
#      --view 65536 --steps 4 --decode 32 --tiers warm, KVMEM_LAYOUT=compact
#      then KVMEM_LAYOUT=stable (each run's ceilings, the view's prefill and
#      plain decode are its peers);
#   3. the two runs' steps side by side.
#
# SECONDS (default 280) bounds the whole; LAYOUTS="stable" runs one layout
# (default "compact stable"). Logs in OUTDIR/layout24.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/layout24.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-280}))
gpu_setup layout24 build-gpu
gpu_need "$K" "$B/tests/test_ws_session"
export KVMEM_CEILINGS_HELD=0	# the held GEMM ceiling: 1.5 s a run, not a peer here
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

gpu_unit test_ws_session 45 KVMEM_CUDA_MOVE_GAP=0

for lay in ${LAYOUTS:-compact stable}; do
	t=$(gpu_left 110)
	echo "== KVMEM_LAYOUT=$lay kvmem bench step (at most $t s)"
	mkdir -p "$tmp/ws"
	if KVMEM_LAYOUT=$lay timeout "$t" "$K" bench step --backend cuda --only step,decode \
		--tokens 262144 --view 65536 --steps 4 --decode 32 --tiers warm --dir "$tmp/ws" \
		>"$log/step_$lay.log" 2>&1; then
		ok "bench step, $lay layout"
	else
		bad "bench step, $lay layout (exit $?)"
		tail -5 "$log/step_$lay.log"
	fi
	rm -rf "$tmp/ws"
	grep -E 'median|step [0-9] \(|bytes:|decode in a|prefilling' "$log/step_$lay.log" |
		cut -c1-400
done
gpu_done
