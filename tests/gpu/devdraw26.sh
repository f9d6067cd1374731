#!/bin/bash
# On the GPU machine (issue #26): draws at a temperature made on the device
# beside the logits (kvmem_cuda_draw_rows; kernels/draw_fixed.h's integer
# weights, so the token is kvmem_sample's) against the host draws they
# replace, in the same call. The check program's draws against their twin
# (compute-sanitizer's memcheck and racecheck over them) and the batch
# invariance on cuda first; then kvmem serve at the 8B
# geometry (fp8 views) on its own, loaded by bench serve --url: one client
# and 16 closed-loop clients, greedy (the peer: a draw that costs nothing)
# and sampled at T 0.8; then the same sampled loads with
# KVMEM_SESSION_DEVICE_DRAW=0 (the host's draws, as before).
#
#   tests/gpu/devdraw26.sh OUTDIR [SECONDS]   (logs in OUTDIR/devdraw26)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/devdraw26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin devdraw26 560 "${2:-}"
gpu_check 90 sample.log --sample
gpu_sanitize --quick --sample
gpu_unit test_ws_batch 150
port=8393
serve() { # name, then env assignments
	local name=$1
	shift
	env "$@" "$K" serve --preset 8b --backend cuda --kv-dtype fp8 --port $port \
		--data-dir "$log/data-$name" >"$log/serve-$name.out" 2>"$log/serve-$name.err" &
	srv=$!
	for _ in $(seq 150); do
		curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
		sleep 1
	done
	bad "server $name did not start"
	return 1
}
load() { # name, then bench serve's arguments
	local name=$1
	shift
	echo "== $name: kvmem bench serve --url ... $*"
	timeout "$(gpu_left 90)" "$K" bench serve --url "http://127.0.0.1:$port" --mode closed "$@" \
		>"$log/$name.out" 2>"$log/$name.err" && ok "bench serve $name" || bad "bench serve $name"
	grep -E "^closed|^load" "$log/$name.out" | tail -3
	curl -sf "http://127.0.0.1:$port/metrics" >"$log/$name.metrics"
	grep -E '^kvmem_(batch_rounds_total|round_seconds_sum|round_predraws_total|round_predraw_seconds_total|session_lazy_draws_total) ' \
		"$log/$name.metrics" | tr '\n' ' '
	echo
}
lone=(--clients 1 --requests 3 --tokens 128 --lines 8)
many=(--clients 16 --requests 1 --tokens 256 --lines 8)
if serve device; then
	load warm --clients 16 --requests 1 --tokens 16 --lines 8
	load lone-greedy "${lone[@]}"
	load lone-sampled "${lone[@]}" --temperature 0.8
	load many-greedy "${many[@]}"
	load many-sampled "${many[@]}" --temperature 0.8
	kill -TERM $srv
	wait $srv
fi
if serve host KVMEM_SESSION_DEVICE_DRAW=0; then
	load warm-host --clients 16 --requests 1 --tokens 16 --lines 8
	load lone-sampled-host "${lone[@]}" --temperature 0.8
	load many-sampled-host "${many[@]}" --temperature 0.8
	kill -TERM $srv
	wait $srv
fi
rm -rf "$log"/data-*
gpu_done
