#!/bin/bash
# On the GPU machine (issue #26): where kvmem serve's time goes at the 8B
# geometry under 16 closed-loop clients, where `bench serve` gave 2.0x one
# client's decode rate and `bench batch` 10x. The server runs on its own
# (fp8 views, KVMEM_SESSION_BATCH_PROFILE=1, printed at its exit), `bench
# serve --url` loads it, and its /metrics are kept after each load: the
# rounds, the units' time (prefill, decode, selections), the commits, the
# turns' session time by part.
# Loads: one-off requests of 64 and 256 tokens, conversations, then 256
# tokens sampled at a temperature (the draws the engine makes ahead).
#
#   tests/gpu/servesplit26.sh OUTDIR [SECONDS]   (logs in OUTDIR/servesplit26.tar)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/servesplit26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin servesplit26 300 "${2:-}"
port=8391
gpu_serve_metrics='kvmem_(turns_total|prompt_tokens_total|completion_tokens_total|prefill_seconds_total|decode_seconds_total|selection_seconds_total|selections_total|commit_seconds_total|batch_rounds_total|batch_units_total|batch_size_max|round_seconds_sum|round_seconds_max|batch_decode_units_total|batch_prefill_units_total|batch_select_units_total|round_predraws_total|round_predraw_seconds_total)'
gpu_serve split $port KVMEM_SESSION_BATCH_PROFILE=1 || { gpu_done; exit; }
head -12 "$log/serve-split.err"
load() { # name, then bench serve's arguments
	gpu_serve_load "$1" $port "${@:2}"
	grep -E '^kvmem_session_(seconds_total|forwards_total|lazy_logits_total)' "$log/$1.metrics" |
		sed 's/kvmem_session_seconds_total//' | tr '\n' ' '
	echo
}
load t64 --clients 1,16 --requests 2 --tokens 64 --lines 8
load t256 --clients 16 --requests 1 --tokens 256 --lines 8
load conv --clients 16 --requests 3 --tokens 64 --lines 8 --conversations
load t256s --clients 16 --requests 1 --tokens 256 --lines 8 --temperature 0.8
kill -TERM $srv
wait $srv
grep -A6 KVMEM_SESSION_BATCH_PROFILE "$log/serve-split.err"
[ -n "${OUT:-}" ] && tar cf "$OUT/servesplit26.tar" -C "$OUT" --exclude="data*" servesplit26 &&
	rm -rf "${OUT:?}/servesplit26"
gpu_done
