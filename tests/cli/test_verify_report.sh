#!/bin/bash
# Issue 23: what kvmem verify says and how it exits, on a workspace written
# by kvmem run on the tiny model (390 tokens: 12 full blocks of 32 and a
# partial block of 6).
#  - verify -q prints only what is bad: bytes past the last commit (an
#    interrupted append) are a note for the plain report, not an error;
#  - verify --salvage exits 1 whenever anything was dropped, the partial
#    block alone included (DEST then holds less than DIR: that must not
#    look like a clean verify), and 0 only when nothing was.
# Needs $KVMEM; skipped (77) when it is missing.
. "$(dirname "$0")/lib.sh"
cli_setup verify_report

run() { timeout 120 "$KVMEM" run --model "$M" "$@"; }
# The manifest's u32 at byte OFFSET (struct mf_head, user/pager/pager_int.h).
mf_u32() { od -An -tu4 -j"$2" -N4 "$1/manifest" | tr -d ' '; }

echo '{"append_random": 390, "seed": 1}' >"$tmp/a.jsonl"
run --script "$tmp/a.jsonl" --workspace "$tmp/ws" >/dev/null 2>"$tmp/err" ||
	{ echo "FAIL: kvmem run: $(cat "$tmp/err")"; exit 1; }
L=$(mf_u32 "$tmp/ws" 24)
ib=$(mf_u32 "$tmp/ws" 48)
stride=$(mf_u32 "$tmp/ws" 56)
slot=$(mf_u32 "$tmp/ws" 104)
slot_bytes=$((L * stride + (ib + 4095) / 4096 * 4096))

# -q on an intact workspace with bytes past the last commit: silent, 0.
cp -a "$tmp/ws" "$tmp/past"
head -c 5000 /dev/urandom >>"$tmp/past/pages"
"$KVMEM" verify "$tmp/past" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] || bad "verify: bytes past the commit made it fail (exit $rc): $(cat "$tmp/out")"
grep -q "5000 bytes past the last commit (ignored)" "$tmp/out" ||
	bad "verify: the plain report does not note the bytes past the commit: $(cat "$tmp/out")"
grep -q "all good, 0 bad" "$tmp/out" || bad "verify: no summary: $(cat "$tmp/out")"
"$KVMEM" verify -q "$tmp/past" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] || bad "verify -q: exit $rc on an intact workspace: $(cat "$tmp/out")"
[ -s "$tmp/out" ] && bad "verify -q printed what is not an error: $(cat "$tmp/out")"

# -q with a bad page as well: the page and the summary, nothing else.
flip_byte "$tmp/past/pages" $((2 * L * stride + 7))
"$KVMEM" verify -q "$tmp/past" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 1 ] || bad "verify -q: exit $rc with a bad page (want 1): $(cat "$tmp/out")"
grep -q "pages: page $((2 * L)) (block 2, layer 0) at offset $((2 * L * stride)): checksum mismatch" \
	"$tmp/out" || bad "verify -q: the bad page is not named: $(cat "$tmp/out")"
grep -q ": 1 bad$" "$tmp/out" || bad "verify -q: no summary of the bad item: $(cat "$tmp/out")"
[ "$(wc -l <"$tmp/out")" -eq 2 ] || bad "verify -q: more than the error and its summary: $(cat "$tmp/out")"

# Only the partial block bad: salvage keeps every full block and exits 1.
cp -a "$tmp/ws" "$tmp/tail"
at=$((slot * slot_bytes + 3 * stride + 11))
flip_byte "$tmp/tail/tail" $at
"$KVMEM" verify --salvage "$tmp/tail.saved" "$tmp/tail" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 1 ] || bad "salvage that dropped the partial block: exit $rc (want 1): $(cat "$tmp/out")"
grep -q "kept: *384 of 390 tokens (12 of 12 full blocks; the partial block of 6 tokens dropped)" \
	"$tmp/out" || bad "salvage: not every full block kept: $(cat "$tmp/out")"
grep -q "dropped: 6 tokens (the partial block)" "$tmp/out" ||
	bad "salvage: the loss is not said plainly: $(cat "$tmp/out")"
grep -q "first bad: .*/tail: slot $slot, layer 3 at offset $((slot * slot_bytes + 3 * stride)) " \
	"$tmp/out" || bad "salvage: the first bad place is not named: $(cat "$tmp/out")"
"$KVMEM" verify -q "$tmp/tail.saved" >"$tmp/v.out" 2>&1 || bad "the copy: $(cat "$tmp/v.out")"
"$KVMEM" verify "$tmp/tail.saved" | grep -q "384 tokens, 12 blocks" ||
	bad "the copy does not hold the 12 full blocks"

# Nothing dropped: 0.
"$KVMEM" verify --salvage "$tmp/ws.saved" "$tmp/ws" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] || bad "salvage of an intact workspace: exit $rc: $(cat "$tmp/out")"
grep -q "nothing was lost" "$tmp/out" || bad "intact salvage: $(cat "$tmp/out")"

cli_done verify_report
