#!/bin/bash
# kvmem serve's crash rule at its one narrow moment: a turn's record
# (conversation.json) written, its workspace not yet committed. The server
# is made to end there (KVMEM_SERVE_FAULT=record:3, a fault for tests) in a
# chat conversation, then again in a completion conversation; the record on
# disk then holds three turns and the workspace two. Started again, each
# conversation must reopen with the two committed turns, run turn 3 as new
# and go on equal to an uninterrupted twin (tests/serve/crash.mjs).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../serve/lib.sh"
cli_setup serve_crash
serve_node
MODEL=agentlang
serve_corpus "$tmp/corpus.txt" "$seed" 3000
CONVS="$KVMEM_HOME/serve/conversations"

# turns_on_disk KIND: the turns conversation.json holds; committed KIND:
# the tokens its workspace committed (kvmem stat).
turns_on_disk() {
	node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).turns.length)' \
		"$CONVS/cr-$1-$seed/conversation.json"
}
last_turn_tokens() {
	node -e 'const t = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).turns;
		console.log(t[t.length - 1].tokens)' "$CONVS/cr-$1-$seed/conversation.json"
}
committed() {
	"$KVMEM" stat "$CONVS/cr-$1-$seed/ws" | sed -n 's/^ *committed: *\([0-9][0-9]*\) tokens.*/\1/p' | head -1
}

for kind in chat text; do
	KVMEM_SERVE_FAULT=record:3 serve_start || exit 1
	node "$NODEDIR/crash.mjs" "$kind" "$BASE" "$MODEL" "$tmp/corpus.txt" "$tmp/state.json" "$seed" ||
		bad "$kind: the turns before the fault"
	wait "$SPID"
	rc=$?
	[ "$rc" = 75 ] || bad "$kind: the server ended with $rc, not the fault's 75"
	grep -q "KVMEM_SERVE_FAULT: exiting between conversation cr-$kind-$seed's record" "$tmp/serve.err" ||
		bad "$kind: no word of the fault on stderr"
	# The fault fell between the two writes: three turns recorded, the
	# workspace committed at the end of the second.
	[ "$(turns_on_disk "$kind")" = 3 ] || bad "$kind: the record holds $(turns_on_disk "$kind") turns, not 3"
	ws=$(committed "$kind")
	[ -n "$ws" ] && [ "$ws" -lt "$(last_turn_tokens "$kind")" ] ||
		bad "$kind: the workspace committed '$ws' tokens, the record's last turn ends at" \
		    "$(last_turn_tokens "$kind"): the commit came before the record"
	"$KVMEM" verify -q "$CONVS/cr-$kind-$seed/ws" >"$tmp/verify.out" 2>&1 ||
		bad "$kind: the workspace does not verify: $(cat "$tmp/verify.out")"
done

serve_start || exit 1
node "$NODEDIR/crash.mjs" after "$BASE" "$MODEL" "$tmp/corpus.txt" "$tmp/state.json" "$seed" ||
	bad "the conversations after the crash"
for kind in chat text; do
	[ "$(turns_on_disk "$kind")" = 4 ] || bad "$kind: the record holds $(turns_on_disk "$kind") turns, not 4"
done
serve_stop
# A malformed fault is refused, not ignored.
KVMEM_SERVE_FAULT=record:x "$KVMEM" serve --port 0 >/dev/null 2>"$tmp/fault.err" &&
	bad "KVMEM_SERVE_FAULT=record:x was taken"
grep -q "KVMEM_SERVE_FAULT" "$tmp/fault.err" || bad "no word about KVMEM_SERVE_FAULT: $(cat "$tmp/fault.err")"
grep -E "ERROR: AddressSanitizer|runtime error" "$tmp/serve.err" && bad "sanitizer report"
cli_done serve_crash
