#!/bin/bash
# Issue 9 item 6: a FIFO (or a directory) in the place of config.json or
# model.safetensors must not hang `info` or `run` (the type check came after
# a blocking open) and is refused by name; a dangling model.safetensors
# link says it is one, not that the file is missing.
. "$(dirname "$0")/lib.sh"
cli_setup nonregular

expect() { # dir, message, command words after "kvmem"
	local d=$1 want=$2 out rc
	shift 2
	out=$(timeout 20 "$KVMEM" "$@" 2>&1)
	rc=$?
	[ $rc -eq 124 ] && { bad "$* on $d: hangs"; return; }
	[ $rc -ne 0 ] || bad "$* on $d: exit 0"
	grep -qF "$want" <<<"$out" || bad "$* on $d: want '$want', got: $out"
}
printf '{"append_random": 40}\n{"decode": 1}\n' >"$tmp/s"
for name in config.json model.safetensors; do
	for kind in fifo dir; do
		d="$tmp/$name-$kind"
		mkdir "$d"
		cp "$M"/*.json "$M/model.safetensors" "$d/"
		rm "$d/$name"
		if [ $kind = fifo ]; then mkfifo "$d/$name"; what="a FIFO"; else mkdir "$d/$name"; what="a directory"; fi
		expect "$d" "$name: $what, not a regular file" info "$d"
		expect "$d" "$name: $what, not a regular file" run --model "$d" --random 4
		expect "$d" "$name: $what, not a regular file" run --model "$d" --script "$tmp/s"
	done
done
d="$tmp/dangling"
mkdir "$d"
cp "$M"/*.json "$d/"
ln -s "$tmp/nowhere.safetensors" "$d/model.safetensors"
expect "$d" "model.safetensors: a dangling symbolic link to '$tmp/nowhere.safetensors'" info "$d"
expect "$d" "model.safetensors: a dangling symbolic link" run --model "$d" --random 4
cli_done "item 6 non-regular files"
