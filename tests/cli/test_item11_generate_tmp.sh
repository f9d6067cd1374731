#!/bin/bash
# Issue 9 item 11: a killed `kvmem generate` left its temporary file (532 MB
# for 0.6b) and --force did not clean it. Now SIGTERM/SIGINT remove it on
# the way out; what a SIGKILL leaves (its pid gone) is removed by the next
# run, with or without --force; a live writer's file is left alone.
. "$(dirname "$0")/lib.sh"
cli_setup generate-tmp

tmpfiles() { find "$1" -maxdepth 1 -name '.*.kvmem-tmp-*' | wc -l; }
# Start a large preset and stop it while it writes.
start_big() { # dir
	"$KVMEM" generate --preset 0.6b --out "$1" >/dev/null 2>&1 &
	pid=$!
	for i in $(seq 300); do
		[ "$(tmpfiles "$1")" -gt 0 ] && [ -n "$(find "$1" -name '.*safetensors.kvmem-tmp-*' -size +1M)" ] &&
			return 0
		kill -0 $pid 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}
for sig in TERM INT; do
	d="$tmp/$sig"
	if ! start_big "$d"; then
		kill -9 $pid 2>/dev/null
		bad "SIG$sig: no temporary file appeared"
		continue
	fi
	kill -$sig $pid
	wait $pid
	rc=$?
	[ $rc -gt 128 ] || bad "SIG$sig: generate exited $rc, not by the signal"
	[ "$(tmpfiles "$d")" -eq 0 ] || bad "SIG$sig left: $(ls -a "$d")"
done

d="$tmp/KILL"
if start_big "$d"; then
	kill -9 $pid
	wait $pid 2>/dev/null
	[ "$(tmpfiles "$d")" -eq 1 ] || bad "SIGKILL: expected one leftover: $(ls -a "$d")"
	# The next run (no --force: the leftover does not count as content).
	out=$("$KVMEM" generate --preset tiny --out "$d" 2>&1) || bad "next run after SIGKILL: $out"
	[ "$(tmpfiles "$d")" -eq 0 ] || bad "the next run kept the leftover: $(ls -a "$d")"
	"$KVMEM" info "$d" >/dev/null || bad "the next run's model does not load"
else
	kill -9 $pid 2>/dev/null
	bad "SIGKILL: no temporary file appeared"
fi

# --force over a model with a dead writer's leftover; a live pid's file stays.
sleep 100 &
live=$!
dead=$(sh -c 'echo $$')
: >"$M/.model.safetensors.kvmem-tmp-$dead"
: >"$M/.config.json.kvmem-tmp-$live"
out=$("$KVMEM" generate --preset tiny --out "$M" --force 2>&1) || bad "--force: $out"
[ -e "$M/.model.safetensors.kvmem-tmp-$dead" ] && bad "--force kept a dead writer's file"
[ -e "$M/.config.json.kvmem-tmp-$live" ] || bad "--force removed a live writer's file"
kill $live
cli_done "item 11 generate temporary files"
