#!/bin/bash
# kvmem bench batch, small: 1 and 3 sessions of the embedded model, a few
# greedy steps. Every row says the batch drew the loop's tokens (batch
# invariance; the command fails when it does not), the rates are positive,
# --json gives one object per session count with the batched step split
# into forward and host time and the step's roofline (its bytes counted
# here by hand), --no-loop leaves the loop out, --rounds repeats the
# back-to-back runs, bad options are refused.
set -u
KVMEM=${KVMEM:-build/kvmem}
[ -x "$KVMEM" ] || { echo "no $KVMEM"; exit 77; }
tmp=$(mktemp -d /tmp/kvmem-bbatch.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export KVMEM_HOME="$tmp/home"
fail() { echo "bench batch test: $*"; exit 1; }

out=$("$KVMEM" bench batch --backend cpu --sessions 1,3 --context 40 --tokens 3 --chunk 16 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "run failed (exit $rc): $out"
[ "$(echo "$out" | grep -cE '^[13] .* yes$')" -eq 2 ] || fail "rows not 1 and 3 with the same draws: $out"
# The ceilings measured in the run, and each row's roofline beside it.
echo "$out" | grep -qE '^ceilings measured now on .*: copy [0-9]+ GB/s' ||
	fail "no ceilings line: $out"
[ "$(echo "$out" | grep -cE '^ +roofline: one alone [0-9.]+ ms a step, [13] batched .* at most [0-9.]+x')" -eq 2 ] ||
	fail "not a roofline line for each row: $out"

out=$("$KVMEM" bench batch --backend cpu --sessions 2 --context 24 --tokens 2 --budget 64 \
	--json 2>"$tmp/err")
rc=$?
[ $rc -eq 0 ] || fail "--json run failed (exit $rc): $(cat "$tmp/err")"
echo "$out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
assert len(rows) == 1, rows
r = rows[0]
assert r["sessions"] == 2 and r["same_tokens"] is True, r
assert all(r[k] > 0 for k in r if k.endswith("_per_s")), r
# The step split: forward + host make the step; store and waits are in host.
ms = ("batch_step_ms", "batch_forward_ms", "batch_host_ms", "batch_store_ms",
      "batch_writer_wait_ms")
assert all(k in r and r[k] >= 0 for k in ms), r
assert r["batch_forward_ms"] > 0 and r["batch_forward_ms"] <= r["batch_step_ms"], r
assert abs(r["batch_forward_ms"] + r["batch_host_ms"] - r["batch_step_ms"]) < 0.01, r
assert r["batch_store_ms"] + r["batch_writer_wait_ms"] <= r["batch_host_ms"] + 0.01, r
# The roofline: a step of the two reads the weights once and each view.
# The embedded model: 6 layers of hidden 256, 8/2 heads of 64, MLP 768,
# vocabulary 768: L (H (Q + 2 K) + Q H + 3 I H) + V H + H = 5,701,888
# weights (the embedding a row) of 2 bytes (bf16 copies); the views hold
# 12 and 19 tokens at the first timed step and 14 and 21 at the last
# (histories of 0.5 and 0.8 x 24), 13 and 20 on average, at 6 layers x 2 KV
# heads x 64 x K and V x 4 bytes = 6144 bytes a token.
assert r["roofline_batch_bytes"] == 5701888 * 2 + 6144 * (13 + 20), r
assert 0 < r["roofline_alone_step_ms"] <= r["roofline_batch_step_ms"], r
assert abs(r["roofline_batch_over_alone"] -
           2 * r["roofline_alone_step_ms"] / r["roofline_batch_step_ms"]) < 0.01, r
assert 1 < r["roofline_batch_over_alone"] <= 2, r
' || fail "bad JSON: $out"

# --no-loop: the batch and the lone session only; the loop's figures are
# null, the batch's first session drew the lone session's tokens.
out=$("$KVMEM" bench batch --backend cpu --sessions 3 --context 40 --tokens 3 --chunk 16 \
	--budget 48 --no-loop --json 2>"$tmp/err")
rc=$?
[ $rc -eq 0 ] || fail "--no-loop run failed (exit $rc): $(cat "$tmp/err")"
echo "$out" | python3 -c '
import json, sys
r = json.loads(sys.stdin.readline())
assert r["sessions"] == 3 and r["same_tokens"] is True, r
assert r["loop_tokens_per_s"] is None and r["median_loop_tokens_per_s"] is None, r
assert r["prefill_loop_tokens_per_s"] is None, r
assert r["batch_tokens_per_s"] > 0 and r["median_alone_tokens_per_s"] > 0, r
' || fail "bad --no-loop JSON: $out"
out=$("$KVMEM" bench batch --backend cpu --sessions 2 --context 24 --tokens 2 --no-loop 2>&1) ||
	fail "--no-loop table run failed: $out"
echo "$out" | grep -qE '^2 +[0-9.]+ +- ' || fail "--no-loop table has a loop rate: $out"

# Progress on stderr while the histories go in (--progress S; every 10 s by
# default, so none in a run this short), none with --quiet.
"$KVMEM" bench batch --backend cpu --sessions 2 --context 64 --tokens 1 --chunk 16 --no-loop \
	--progress 0.000001 >/dev/null 2>"$tmp/err" || fail "--progress run failed: $(cat "$tmp/err")"
grep -qE '^kvmem bench batch: 2 sessions: prefilled [0-9]+ of 84 history tokens' "$tmp/err" ||
	fail "--progress: no progress line for the batch: $(cat "$tmp/err")"
grep -qE '^kvmem bench batch: 1 session: the lone session prefilled [0-9]+ of 32 ' "$tmp/err" ||
	fail "--progress: no progress line for the lone session: $(cat "$tmp/err")"
"$KVMEM" bench batch --backend cpu --sessions 2 --context 64 --tokens 1 --chunk 16 --no-loop \
	--progress 0.000001 --quiet >/dev/null 2>"$tmp/err" || fail "--quiet run failed"
[ -s "$tmp/err" ] && fail "--quiet printed: $(cat "$tmp/err")"
"$KVMEM" bench batch --backend cpu --sessions 2 --context 64 --tokens 1 --chunk 16 --no-loop \
	>/dev/null 2>"$tmp/err" || fail "default run failed"
[ -s "$tmp/err" ] && fail "a short run printed progress: $(cat "$tmp/err")"

# --kv-dtype fp8: the views hold fp8 KV; the batch still draws the loop's
# tokens (batch invariance over fp8 views) and the JSON names the dtype.
out=$("$KVMEM" bench batch --backend cpu --sessions 3 --context 40 --tokens 3 --chunk 16 \
	--budget 48 --kv-dtype fp8 --json 2>"$tmp/err")
rc=$?
[ $rc -eq 0 ] || fail "--kv-dtype fp8 run failed (exit $rc): $(cat "$tmp/err")"
echo "$out" | python3 -c '
import json, sys
r = json.loads(sys.stdin.readline())
assert r["kv_dtype"] == "fp8" and r["sessions"] == 3 and r["same_tokens"] is True, r
' || fail "--kv-dtype fp8 JSON: $out"

# --rounds N: the back-to-back pair of runs N times, each round's ratio; the
# batch's first session still draws the lone session's tokens in every round.
out=$("$KVMEM" bench batch --backend cpu --sessions 2 --context 24 --tokens 2 --no-loop \
	--rounds 3 --json 2>"$tmp/err")
rc=$?
[ $rc -eq 0 ] || fail "--rounds run failed (exit $rc): $(cat "$tmp/err")"
echo "$out" | python3 -c '
import json, sys
r = json.loads(sys.stdin.readline())
assert r["run_rounds"] == 3 and r["same_tokens"] is True, r
assert 0 < r["run_ratio_min"] <= r["run_ratio_median"] <= r["run_ratio_max"], r
assert r["run_alone_tokens_per_s"] > 0 and r["run_batch_tokens_per_s"] > 0, r
' || fail "bad --rounds JSON: $out"
out=$("$KVMEM" bench batch --backend cpu --sessions 2 --context 24 --tokens 2 --no-loop \
	--rounds 2 2>&1) || fail "--rounds table run failed: $out"
echo "$out" | grep -qE 'back to back: .*, 2 rounds: [0-9.]+x-[0-9.]+x, median [0-9.]+x' ||
	fail "--rounds 2: no rounds in the back-to-back line: $out"

for bad in "--sessions 0" "--sessions 1,x" "--tokens 0" "--preset nosuch" "--nope" "--progress -1" \
	"--kv-dtype fp9" "--rounds 0" "--rounds 101"; do
	# shellcheck disable=SC2086
	"$KVMEM" bench batch $bad >/dev/null 2>"$tmp/err"
	rc=$?
	[ $rc -eq 2 ] || fail "'$bad' exited $rc, not 2: $(cat "$tmp/err")"
	grep -q "kvmem bench batch" "$tmp/err" || fail "'$bad': no message naming the command"
done
# A preset has no weights: the cpu backend says so (cuda makes random ones).
"$KVMEM" bench batch --backend cpu --preset 8b >/dev/null 2>"$tmp/err" && fail "--preset 8b ran on cpu"
grep -q "kvmem bench batch: .*no weights" "$tmp/err" || fail "--preset 8b on cpu: $(cat "$tmp/err")"
echo "bench batch test: ok"
