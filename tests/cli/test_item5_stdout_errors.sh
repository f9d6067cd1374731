#!/bin/bash
# Issue 9 item 5: a write error on stdout is an error. Output to /dev/full
# or to a closed stdout must end with a non-zero status and a message on
# stderr, for every kind of output (text, JSON, a long session, help).
. "$(dirname "$0")/lib.sh"
cli_setup stdout-errors

printf '{"append_random": 40, "seed": 1}\n{"decode": 3}\n' >"$tmp/s"
check() { # what, where stdout goes (full or closed), then the command
	local what=$1 to=$2 rc
	shift 2
	if [ "$to" = full ]; then "$@" >/dev/full 2>"$tmp/err"; else "$@" >&- 2>"$tmp/err"; fi
	rc=$?
	[ $rc -ne 0 ] || bad "$what: exit 0 with its output lost"
	grep -q "write error on standard output" "$tmp/err" ||
		bad "$what: no message on stderr: $(cat "$tmp/err")"
}
check "info >/dev/full" full "$KVMEM" info "$M"
check "info --json >/dev/full" full "$KVMEM" info --json "$M"
check "run >/dev/full" full "$KVMEM" run --model "$M" --random 8 --decode 2
check "run --script >/dev/full" full "$KVMEM" run --model "$M" --script "$tmp/s"
check "run --json >&-" closed "$KVMEM" run --model "$M" --script "$tmp/s" --json
check "run >&-" closed "$KVMEM" run --model "$M" --random 8 --decode 2
check "generate --dry-run >/dev/full" full "$KVMEM" generate --preset 8b --dry-run
check "run --help >/dev/full" full "$KVMEM" run --help
# A closed stdout must never become a file kvmem opens: the logits file and
# the workspace get only their own bytes.
"$KVMEM" run --model "$M" --random 8 --decode 2 --logits "$tmp/l.bin" >&- 2>/dev/null
[ "$(stat -c %s "$tmp/l.bin" 2>/dev/null)" = $((8 * 1024 * 4)) ] ||
	bad "the logits file is not 8 x 1024 floats with stdout closed: $(stat -c %s "$tmp/l.bin")"
# And good output still exits 0.
"$KVMEM" info "$M" >/dev/null || bad "info to /dev/null failed"
cli_done "item 5 stdout errors"
