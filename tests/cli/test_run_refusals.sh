#!/bin/bash
# Issue 23: a kvmem run that refuses its --workspace modifies no file of it
# (Documentation/pager.md, "What the store promises"). Each refusal runs on
# a copy of a workspace kvmem run wrote (390 tokens on the tiny model) and
# then made to show any change: bytes past the last commit, a dead writer's
# temporary files, its counters file and a lock naming a process that is
# gone (or no lock file). Every entry is compared before and after by name,
# type, inode, size, mtime, ctime and bytes. Refused: another model,
# another block size, a torn manifest, corrupt tokens, corrupt sums, a
# truncated pages file, another writer; and a history whose adoption fails
# (a bad page), which leaves every file but lock as it was (the open had
# succeeded and named its process there).
# Needs $KVMEM; skipped (77) when it is missing.
. "$(dirname "$0")/lib.sh"
cli_setup run_refusals

run() { timeout 120 "$KVMEM" run --model "$1" --script "$tmp/b.jsonl" --workspace "$2" "${@:3}"; }
mf_u32() { od -An -tu4 -j"$2" -N4 "$1/manifest" | tr -d ' '; }
# Every entry of DIR, and DIR itself, one line each.
snap() {
	local f
	(cd "$1" && for f in $(ls -A | sort); do
		echo "$(stat -c '%n %F %i %s %.9Y %.9Z' "$f") $(sha256sum <"$f" | cut -c1-16)"
	done; stat -c '. %.9Y %.9Z' .)
	sleep 0.05	# a change after this gets a later time stamp
}
# A copy of the workspace as a killed writer leaves it; LOCK=0: no lock.
prepare() {
	rm -rf "$2"
	cp -a "$tmp/ws" "$2"
	head -c 4096 /dev/urandom >>"$2/pages"
	head -c 36 /dev/urandom >>"$2/tokens"
	head -c 40 /dev/urandom >>"$2/sums"
	echo junk >"$2/manifest.tmp.99999.7"
	echo junk >"$2/stats.tmp.99999"
	if [ "$1" = 1 ]; then echo 99999 >"$2/lock"; else rm -f "$2/lock"; fi
}

"$KVMEM" generate --preset tiny --seed $((seed + 1)) --out "$tmp/other" >/dev/null ||
	{ echo "FAIL: kvmem generate"; exit 1; }
echo '{"append_random": 390, "seed": 1}' >"$tmp/a.jsonl"
printf '{"append_random": 10, "seed": 2}\n{"decode": 4}\n' >"$tmp/b.jsonl"
timeout 120 "$KVMEM" run --model "$M" --script "$tmp/a.jsonl" --workspace "$tmp/ws" \
	>/dev/null 2>"$tmp/err" || { echo "FAIL: kvmem run: $(cat "$tmp/err")"; exit 1; }
L=$(mf_u32 "$tmp/ws" 24)
stride=$(mf_u32 "$tmp/ws" 56)

for lock in 1 0; do
	for k in model block manifest tokens sums truncated; do
		w="$tmp/w-$k-$lock"
		prepare $lock "$w"
		model=$M
		extra=()
		case $k in
		model) model=$tmp/other; want="refusing to open it" ;;
		block) extra=(--block 64); want="geometry" ;;
		manifest) flip_byte "$w/manifest" 40; want="manifest: checksum mismatch" ;;
		tokens) flip_byte "$w/tokens" 30; want="tokens: checksum of the committed part differs" ;;
		sums) flip_byte "$w/sums" 13; want="sums: checksum of the committed part differs" ;;
		truncated) truncate -s $((L * stride)) "$w/pages"; want="pages: .* truncated" ;;
		esac
		before=$(snap "$w")
		out=$(run "$model" "$w" "${extra[@]}" 2>&1) && bad "$k (lock $lock): not refused: $out"
		echo "$out" | grep -q "$want" || bad "$k (lock $lock): unclear message: $out"
		after=$(snap "$w")
		[ "$after" = "$before" ] ||
			bad "$k (lock $lock): the refused run changed the workspace: $(diff <(echo "$before") <(echo "$after"))"
	done
done

# Another writer: the first run holds the workspace while its script stays
# quiet (nothing written yet); the second is refused and changes nothing.
w="$tmp/w-busy"
prepare 1 "$w"
(sleep 8; cat "$tmp/b.jsonl") | "$KVMEM" run --model "$M" --script /dev/stdin --workspace "$w" \
	>"$tmp/first.out" 2>&1 &
holder=$!
for _ in $(seq 100); do
	grep -qx "$holder" "$w/lock" 2>/dev/null && break
	sleep 0.1
done
grep -qx "$holder" "$w/lock" || bad "the first run never named itself in lock"
before=$(snap "$w")
out=$(run "$M" "$w" 2>&1) && bad "a second writer was let in: $out"
echo "$out" | grep -q "in use by another writer (process $holder," ||
	bad "second writer: the message does not name $holder: $out"
after=$(snap "$w")
[ "$after" = "$before" ] ||
	bad "the second writer changed the workspace: $(diff <(echo "$before") <(echo "$after"))"
wait "$holder" || bad "the first run failed: $(tail -3 "$tmp/first.out")"
"$KVMEM" verify -q "$w" || bad "after the first run: verify"
ls "$w" | grep -q '\.tmp' && bad "the first run's writes left the dead writer's temporary files"

# A bad page in block 3: the open succeeds, the adoption reads it and
# refuses. Nothing but lock changes.
w="$tmp/w-adopt"
prepare 1 "$w"
flip_byte "$w/pages" $((3 * L * stride + 100))
before=$(snap "$w")
out=$(run "$M" "$w" 2>&1) && bad "a history with a bad page was adopted: $out"
echo "$out" | grep -q "adopting block 3.*pages: page $((3 * L)) (block 3, layer 0).*checksum mismatch" ||
	bad "refused adoption: unclear message: $out"
after=$(snap "$w")
[ "$(grep -v '^lock ' <<<"$after")" = "$(grep -v '^lock ' <<<"$before")" ] ||
	bad "the refused adoption changed the workspace: $(diff <(echo "$before") <(echo "$after"))"

cli_done run_refusals
