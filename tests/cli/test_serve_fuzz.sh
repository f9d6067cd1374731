#!/bin/bash
# A seeded fuzz run of kvmem serve's HTTP and JSON inputs under ASan +
# UBSan (the -asan build beside $KVMEM; the plain one when there is none):
# a few thousand malformed requests (tests/serve/fuzz.mjs), no crash, no
# hang, no sanitizer report, and the server still answers; the workspaces
# it made still verify. KVMEM_SERVE_FUZZ=N changes the count.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../serve/lib.sh"
cli_setup serve_fuzz
serve_node
ASAN_KVMEM="$(dirname "$KVMEM")-asan/kvmem"
if [ -x "$ASAN_KVMEM" ]; then
	KVMEM=$ASAN_KVMEM
else
	echo "note: no ASan build beside $KVMEM; fuzzing the plain build"
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}
# Bounded work per request: the run is about inputs, not throughput.
serve_start --max-conversations 20 --max-body 256k --max-tokens 16 --max-request-tokens 512 || exit 1
timeout 900 node "$NODEDIR/fuzz.mjs" "$PORT" "$seed" "${KVMEM_SERVE_FUZZ:-3000}" || bad "fuzz run"
kill -0 "$SPID" 2>/dev/null || bad "the server died"
serve_stop
grep -E "ERROR: AddressSanitizer|runtime error|SUMMARY: UndefinedBehavior" "$tmp/serve.err" &&
	bad "sanitizer report (above)"
for ws in "$KVMEM_HOME"/serve/conversations/*/ws; do
	[ -d "$ws" ] || continue
	"$KVMEM" verify "$ws" >/dev/null 2>&1 || bad "workspace $ws does not verify: $("$KVMEM" verify "$ws" 2>&1 | tail -1)"
done
ls -d "$KVMEM_HOME"/serve/conversations/* 2>/dev/null | grep -v -E '/conversations/[A-Za-z0-9][A-Za-z0-9._-]*$' &&
	bad "a conversation directory with a name the ids do not allow"
cli_done serve_fuzz
