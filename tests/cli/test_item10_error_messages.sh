#!/bin/bash
# Issue 9 item 10: errors say what is wrong. Each case below once printed
# something misleading (in brackets).
. "$(dirname "$0")/lib.sh"
cli_setup messages

says() { # what, wanted text, unwanted text ("" for none), command words after "kvmem"
	local what=$1 want=$2 unwanted=$3 out
	shift 3
	out=$("$KVMEM" "$@" 2>&1) && bad "$what: exit 0"
	grep -qF -- "$want" <<<"$out" || bad "$what: want '$want', got: $out"
	[ -z "$unwanted" ] || ! grep -qF -- "$unwanted" <<<"$out" || bad "$what: says '$unwanted': $out"
}
# ["pin" goes with an append]
printf '{"decode": 1, "seed": 1}\n' >"$tmp/ds"
says "decode with a seed" '"seed" goes with "append_random"' '"pin"' run --model "$M" --script "$tmp/ds"
# [the script holds no steps]
says "a directory as script" "$tmp: a directory, not a script" "no steps" run --model "$M" --script "$tmp"
# [wants a token count >= 1]
printf '{"append_random": 1e12}\n' >"$tmp/big"
says "append_random 1e12" '"append_random" wants a token count from 1 to 268435456, not 1000000000000' "" \
	run --model "$M" --script "$tmp/big"
printf '{"append_random": 300000000}\n' >"$tmp/big2"
says "append_random 3e8" 'wants a token count from 1 to 268435456, not 300000000' "" \
	run --model "$M" --script "$tmp/big2"
# [unknown option '--random']
says "--random with --json" "--json is an option of agent sessions" "unknown option" \
	run --model "$M" --random 4 --json
printf '{"append_random": 8}\n' >"$tmp/s"
says "--random with --script" "--random is an option of plain runs" "unknown option" \
	run --model "$M" --script "$tmp/s" --random 4
says "an unknown option" "kvmem run: unknown option '--nope' (kvmem run --help)" "" run --model "$M" --nope
says "a missing value" "kvmem run: --model needs a value" "" run --model
# [holds config.json but neither model.safetensors nor ...]
mkdir "$tmp/dl"
cp "$M/config.json" "$tmp/dl/"
ln -s "$tmp/gone" "$tmp/dl/model.safetensors"
says "a dangling model link" "model.safetensors: a dangling symbolic link to '$tmp/gone'" "neither" \
	info "$tmp/dl"
# [a commit failure printed twice]
printf '{"append_random": 40, "seed": 1}\n' >"$tmp/a"
"$KVMEM" run --model "$M" --script "$tmp/a" --workspace "$tmp/ws" >/dev/null 2>&1 || bad "first run"
for f in "$tmp"/ws/*; do [ -f "$f" ] && chmod a-w "$f"; done
chmod a-w "$tmp/ws"
printf '{"append_random": 40, "seed": 2}\n' >"$tmp/b"
out=$("$KVMEM" run --model "$M" --script "$tmp/b" --workspace "$tmp/ws" 2>&1 >/dev/null)
rc=$?
chmod -R u+w "$tmp/ws"
if [ "$(id -u)" -ne 0 ]; then
	[ $rc -ne 0 ] || bad "a commit into a read-only workspace succeeded"
	n=$(grep -c "kvmem run" <<<"$out")
	[ "$n" -eq 1 ] || bad "a commit failure printed $n times: $out"
fi
# (root writes anyway: a directory in the temporary manifest's place instead)
if [ "$(id -u)" -eq 0 ] && [ -z "$(ls -A "$tmp/ws" | grep '^manifest\.')" ]; then
	mkdir "$tmp/ws/manifest.tmp"
	out=$("$KVMEM" run --model "$M" --script "$tmp/b" --workspace "$tmp/ws" 2>&1 >/dev/null)
	if [ $? -ne 0 ]; then
		n=$(grep -c "manifest" <<<"$out")
		[ "$n" -eq 1 ] || bad "a commit failure printed $n times: $out"
	fi
fi
cli_done "item 10 error messages"
