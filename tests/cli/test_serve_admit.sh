#!/bin/bash
# kvmem serve's admission and quotas (issue 26): a fair queue (FIFO in a
# conversation, round-robin across), 429 with Retry-After past
# --max-queue and --max-conversation-queue, rounds that batch the units of
# several conversations, a prompt's chunks taking the round's prefill budget
# (with the same answer as one chunk a round), idle conversations closed
# and reopened from their stored state with no re-prefill (equal to a twin
# that never closed), a turn short of memory waiting for a running one to
# end (--gpu-mem), a cap on the conversations' bytes (--max-disk) and a
# full disk (a small tmpfs), each an error (507) for the
# conversation that needed the space while the others go on.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../serve/lib.sh"
cli_setup serve_admit
serve_node
LINES='"$ ls\nexecutor.json executor.conf payments.props executor.props\npayments.props\n$ cat payments.props\npayments.props pool.workers = 18\npayments.props dns.cluster = host14\npayments.props pool.bucket = 0x2a97\npayments.props quota.cluster = host08\n"'
ASK='"$ cat api.conf\napi.conf db.port = 5432\n? api.conf db.port ="'
ASK2='"? api.conf db.port ="'
disk=""
trap '[ -z "$disk" ] || umount "$disk"; rm -rf "$tmp"' EXIT

js() {	# js EXPR: with b (the last body) in scope
	node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
		try { console.log(eval(process.argv[2])) } catch (e) { console.log(`(${e.message})`) }' \
		"$tmp/body" "$1"
}
metric() {
	curl -s "$BASE/metrics" | sed -n "s/^$1 //p"
}
# chat NAME CONV CONTENT...: a chat turn in the background; its body in
# $tmp/NAME.json; its pid joins $pids
pids=""
chat() {
	local name=$1 conv=$2 msgs="" c
	shift 2
	for c in "$@"; do msgs="$msgs${msgs:+,}{\"role\":\"user\",\"content\":$c}"; done
	(curl -s -o "$tmp/$name.json" "$BASE/v1/chat/completions" ${conv:+-H "X-Kvmem-Conversation: $conv"} \
		-d "{\"messages\":[$msgs]}") &
	pids="$pids $!"
}

# ---- the queue: one turn at a time, six requests at most ------------------------------
serve_start --max-inflight 1 --max-queue 6 --max-conversation-queue 2 || exit 1
# waiting N: until N requests wait for admission (10 s at most)
waiting() {
	local i
	for i in $(seq 1 100); do
		[ "$(metric kvmem_queue_waiting)" = "$1" ] && return 0
		sleep 0.1
	done
	bad "the queue never held $1 waiting ($(metric kvmem_queue_waiting))"
}
# L, a long request of no conversation, holds the one slot while the others queue.
curl -s -o "$tmp/L.json" "$BASE/v1/completions" -d "{\"prompt\":$LINES,\"max_tokens\":2500,\"ignore_eos\":true}" &
pids=$!
for i in $(seq 1 100); do
	[ "$(metric kvmem_requests_running)" = 1 ] && break
	sleep 0.1
done
chat A1 qa "$ASK"; waiting 1
chat A2 qa "$ASK"; waiting 2	# the same turn again: it waits behind A1 in qa's lane
chat B1 qb "$ASK"; waiting 3
# qa has two waiting: a third is refused, and says when to come back.
got=$(curl -s -o "$tmp/body" -D "$tmp/head" -w '%{http_code}' "$BASE/v1/chat/completions" -H 'X-Kvmem-Conversation: qa' \
	-d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}]}")
[ "$got" = 429 ] && grep -q '"code":"conversation_queue_full"' "$tmp/body" && grep -qi '^Retry-After: [1-9]' "$tmp/head" ||
	bad "a conversation's third waiting request: $got $(cat "$tmp/body") $(cat "$tmp/head")"
chat C1 "" "$ASK"; waiting 4
chat C2 "" "$ASK"; waiting 5
[ "$(metric kvmem_requests_running)" = 1 ] || bad "queue: $(metric kvmem_requests_running) running (want 1)"
got=$(curl -s -o "$tmp/body" -D "$tmp/head" -w '%{http_code}' "$BASE/v1/chat/completions" \
	-d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}]}")
[ "$got" = 429 ] && grep -q '"code":"server_busy"' "$tmp/body" && grep -q '"type":"rate_limit_error"' "$tmp/body" &&
	grep -qi '^Retry-After: [1-9]' "$tmp/head" || bad "past --max-queue: $got $(cat "$tmp/body") $(cat "$tmp/head")"
wait $pids
for r in L A1 A2 B1 C1 C2; do
	grep -q '"finish_reason"' "$tmp/$r.json" || bad "request $r: $(cat "$tmp/$r.json")"
done
grep -q '"replayed":true' "$tmp/A2.json" || bad "A2 did not replay A1: $(cat "$tmp/A2.json")"
# Round-robin: after A1, the next lanes (qb, then the two of no
# conversation) come before qa's second request, which came before them.
# The answers' ids count up in the order their turns were admitted (their
# last 6 hex digits; numbered at admission, not when the HTTP thread wrote
# the answer: a replayed A2 answered before C2's thread woke once here).
ends=$(for r in A1 B1 C1 C2 A2; do echo "$(sed -n 's/.*"id":"chatcmpl-[0-9a-f]*\([0-9a-f]\{6\}\)".*/\1/p' "$tmp/$r.json") $r"; done |
	sort | cut -d' ' -f2 | tr '\n' ' ')
[ "$ends" = "A1 B1 C1 C2 A2 " ] || bad "the order turns ended in: $ends(want A1 B1 C1 C2 A2: round-robin across lanes)"
serve_stop

# ---- rounds batch the units of several conversations --------------------------------------
serve_start --idle-close 1 || exit 1
pids=""
for i in 1 2 3 4; do
	curl -s -N -o "$tmp/s$i" "$BASE/v1/completions" -d "{\"prompt\":$LINES,\"max_tokens\":200,\"ignore_eos\":true,\"stream\":true}" &
	pids="$pids $!"
done
wait $pids
for i in 1 2 3 4; do
	[ "$(tail -2 "$tmp/s$i" | head -1)" = "data: [DONE]" ] || bad "stream $i did not end with [DONE]"
done
[ "$(metric kvmem_batch_size_max)" -ge 4 ] || bad "four streams at once never shared a round (largest $(metric kvmem_batch_size_max) units)"
rounds=$(metric kvmem_batch_rounds_total)
units=$(metric kvmem_batch_decode_units_total)
[ "$rounds" -lt "$units" ] || bad "rounds $rounds, decode units $units: no round ran two decodes"

# ---- a prompt takes what the round's prefill budget leaves ----------------------------------
# Chunks of 16, 64 prefill tokens a round: a lone prompt's chunks run four a
# round (serve_engine.c, more_prefill), and the answer is the one a server
# giving it one chunk a round gives (the same chunks, so the same bits).
LONG=$(node -e 'const l = JSON.parse(process.argv[1]);
	console.log(JSON.stringify(l.repeat(4) + "? payments.props pool.workers ="))' "$LINES")
serve_stop
for pb in 64 16; do
	serve_start --chunk 16 --prefill-budget $pb || exit 1
	grep -q "prefill in chunks of 16 tokens, $pb tokens a round" "$tmp/serve.out" ||
		bad "--chunk 16 --prefill-budget $pb: $(grep prefill "$tmp/serve.out" | tail -1)"
	curl -s -o "$tmp/long$pb.json" "$BASE/v1/completions" \
		-d "{\"prompt\":$LONG,\"max_tokens\":6,\"temperature\":0}"
	pre=$(metric kvmem_batch_prefill_units_total)
	rounds=$(metric kvmem_batch_rounds_total)
	echo "prefill budget $pb: $pre prefill units in $rounds rounds"
	if [ "$pb" = 64 ]; then
		[ "$pre" -ge 8 ] || bad "the long prompt took $pre prefill units (want 8 or more chunks of 16)"
		# the prefill's rounds, then the selection, 6 decode steps, the close
		[ "$rounds" -le $(((pre + 3) / 4 + 9)) ] ||
			bad "$pre prefill chunks in $rounds rounds: not four a round"
	else
		[ "$rounds" -ge "$pre" ] || bad "one chunk a round: $pre chunks in $rounds rounds"
	fi
	serve_stop
done
a=$(sed 's/"id":"[^"]*"//; s/"created":[0-9]*//; s/"prefill_rounds":[0-9]*//' "$tmp/long64.json")
b=$(sed 's/"id":"[^"]*"//; s/"created":[0-9]*//; s/"prefill_rounds":[0-9]*//' "$tmp/long16.json")
grep -q '"text"' "$tmp/long64.json" ||
	bad "the long prompt's answer: $(head -c 300 "$tmp/long64.json")"
[ "$a" = "$b" ] || bad "four chunks a round answered otherwise: $(head -c 300 "$tmp/long64.json")" \
	"vs $(head -c 300 "$tmp/long16.json")"

# ---- the oldest prompt takes the round's prefill budget first (--prefill-order) -------------
# Two prompts of about 2K tokens, B sent 50 ms after A, chunks of 16 and 32
# prefill tokens a round. fcfs (the default): A takes both chunks of every
# round until its prompt is in, then B does: each prompt's prefill spans
# ceil(P / 32) rounds (kvmem.prefill_rounds), as if it were alone. shared:
# they take a chunk each in turn, and both span about twice as many. The
# answers are the same either way.
BIG=$(node -e 'const l = JSON.parse(process.argv[1]);
	console.log(JSON.stringify(l.repeat(40) + "? payments.props pool.workers ="))' "$LINES")
for order in fcfs shared; do
	serve_start --chunk 16 --prefill-budget 32 $([ "$order" = shared ] && echo --prefill-order shared) || exit 1
	pids=""
	(curl -s -o "$tmp/A.$order" "$BASE/v1/completions" \
		-d "{\"prompt\":$BIG,\"max_tokens\":4,\"temperature\":0}") &
	pids=$!
	sleep 0.05
	curl -s -o "$tmp/B.$order" "$BASE/v1/completions" \
		-d "{\"prompt\":$BIG,\"max_tokens\":4,\"temperature\":0}"
	wait $pids
	serve_stop
	for r in A B; do
		node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
			console.log(b.usage ? [b.usage.prompt_tokens, b.kvmem.prefill_rounds,
				JSON.stringify(b.choices[0].text)].join(" ") : JSON.stringify(b))' \
			"$tmp/$r.$order" >"$tmp/$r.$order.got"
	done
	echo "$order: A $(cat "$tmp/A.$order.got"), B $(cat "$tmp/B.$order.got") (prompt tokens, prefill rounds, answer)"
done
read -r pa ra ta <"$tmp/A.fcfs.got"
read -r pb rb tb <"$tmp/B.fcfs.got"
want=$(((pa + 31) / 32))
[ "$ra" = "$want" ] && [ "$rb" = "$want" ] ||
	bad "fcfs: prefill rounds A $ra, B $rb for $pa prompt tokens (want $want each: 32 tokens a round, one prompt at a time)"
read -r _ sa sta <"$tmp/A.shared.got"
read -r _ sb stb <"$tmp/B.shared.got"
[ "$sa" -gt "$want" ] && [ "$sb" -gt "$want" ] ||
	bad "shared: prefill rounds A $sa, B $sb (want more than $want each: the prompts took chunks in turn)"
[ "$ta" = "$tb" ] && [ "$ta" = "$sta" ] && [ "$ta" = "$stb" ] ||
	bad "the answers differ between the orders: $ta $tb $sta $stb"
grep -q "tokens a round, the oldest prompt first (fcfs)$" "$tmp/serve.out" &&
	grep -q "tokens a round, a chunk to each prompt in turn (shared)$" "$tmp/serve.out" ||
	bad "serve did not say its prefill order: $(grep prefill "$tmp/serve.out" | tail -2)"
"$KVMEM" serve --prefill-order lifo >/dev/null 2>"$tmp/err" && bad "--prefill-order lifo was taken"
grep -q -- "--prefill-order lifo: not fcfs" "$tmp/err" || bad "--prefill-order lifo: $(cat "$tmp/err")"
# One slice a round (--view-slice 0): the counts below are the slices'.
serve_start --idle-close 1 --view-slice 0 || exit 1

# ---- idle conversations close, and come back from their stored state ------------------------
curl -s -o "$tmp/body" "$BASE/v1/chat/completions" -H 'X-Kvmem-Conversation: idle' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}]}"
first=$(js 'b.choices[0].message.content')
sleep 2.5
[ "$(metric kvmem_conversations_open)" = 0 ] && [ "$(metric kvmem_conversation_idle_closes_total)" -ge 1 ] ||
	bad "an idle conversation was not closed ($(metric kvmem_conversations_open) open)"
second="[{\"role\":\"user\",\"content\":$ASK},{\"role\":\"assistant\",\"content\":\"$first\"},{\"role\":\"user\",\"content\":$ASK2}]"
steps0=$(metric kvmem_view_restore_steps_total)
laid0=$(metric kvmem_views_restored_total)
curl -s -o "$tmp/body" "$BASE/v1/chat/completions" -H 'X-Kvmem-Conversation: idle' -d "{\"messages\":$second}"
idle=$(js 'JSON.stringify([b.choices[0].message.content, b.usage, b.kvmem.workspace_tokens])')
[ "$(js 'b.kvmem.restored')" = true ] || bad "the idle conversation did not come back from its workspace: $(cat "$tmp/body")"
# The reopened view is laid out by the turn, an eighth of the layers a
# round (the embedded model's 6 layers: one a round), not in one go.
steps=$(( $(metric kvmem_view_restore_steps_total) - steps0 ))
laid=$(( $(metric kvmem_views_restored_total) - laid0 ))
[ "$laid" = 1 ] && [ "$steps" -ge 2 ] ||
	bad "the reopened conversation's view: $laid layouts in $steps rounds (want 1 in 2 or more)"
[ "$(metric kvmem_conversations_without_view)" = 0 ] ||
	bad "after the reopened turn $(metric kvmem_conversations_without_view) conversations are counted without a view"
# Its twin runs both turns back to back, never closed.
curl -s -o "$tmp/body" "$BASE/v1/chat/completions" -H 'X-Kvmem-Conversation: twin' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}]}"
curl -s -o "$tmp/body" "$BASE/v1/chat/completions" -H 'X-Kvmem-Conversation: twin' -d "{\"messages\":$second}"
[ "$(js 'b.kvmem.restored')" = false ] && [ "$(js 'JSON.stringify([b.choices[0].message.content, b.usage, b.kvmem.workspace_tokens])')" = "$idle" ] ||
	bad "closed and reopened: $idle; its twin: $(js 'JSON.stringify([b.choices[0].message.content, b.usage, b.kvmem.workspace_tokens])') (the usage's prompt tokens are the new turn's alone: no re-prefill)"
# Each turn's selection is laid out a layer a round (the embedded model's 6
# layers: 6 units a selection), and the answers above are the same.
sel=$(metric kvmem_selections_total)
units=$(metric kvmem_batch_select_units_total)
[ "$sel" -ge 4 ] && [ "$units" -eq $((6 * sel)) ] ||
	bad "$sel selections in $units units (want 6 units each: a layer a round)"
serve_stop
# A round's time for them that no selection here needs (--view-slice 60
# s): each selection in one unit, and the same answer.
serve_start --view-slice 60000 || exit 1
curl -s -o "$tmp/body" "$BASE/v1/chat/completions" -H 'X-Kvmem-Conversation: twin2' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}]}"
curl -s -o "$tmp/body" "$BASE/v1/chat/completions" -H 'X-Kvmem-Conversation: twin2' -d "{\"messages\":$second}"
[ "$(js 'JSON.stringify([b.choices[0].message.content, b.usage, b.kvmem.workspace_tokens])')" = "$idle" ] ||
	bad "--view-slice 60000: $(js 'JSON.stringify([b.choices[0].message.content, b.usage])'), want $idle"
sel=$(metric kvmem_selections_total)
units=$(metric kvmem_batch_select_units_total)
[ "$sel" -ge 2 ] && [ "$units" -eq "$sel" ] || bad "--view-slice 60000: $sel selections in $units units"
"$KVMEM" serve --view-slice -1 >/dev/null 2>"$tmp/err" && bad "--view-slice -1 was taken"
grep -q -- "--view-slice" "$tmp/err" || bad "--view-slice -1: $(cat "$tmp/err")"
serve_stop

# ---- a turn short of memory waits for one to end ---------------------------------------------
# Under --gpu-mem (on the cpu backend the views' memory) six ~1.2K-token
# prompts at once do not all fit: the turns whose view cannot grow before
# their first token are undone and run again as others end (parked), and
# every answer is the one an uncapped server gives. One of them is a
# conversation's turn, which reopens at its last commit and goes on. A turn
# that cannot fit alone gets 503 insufficient_memory, naming the cap.
MID=$(node -e 'const l = JSON.parse(process.argv[1]);
	console.log(JSON.stringify(l.repeat(20) + "? payments.props pool.workers ="))' "$LINES")
complete() {	# complete NAME [CONV]: a completion of MID in the background
	(curl -s -o "$tmp/$1.json" "$BASE/v1/completions" ${2:+-H "X-Kvmem-Conversation: $2"} \
		-d "{\"prompt\":$MID,\"max_tokens\":6,\"temperature\":0}") &
	pids="$pids $!"
}
answer() {	# answer NAME: the completion's text and usage
	node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
		console.log(b.choices ? JSON.stringify([b.choices[0].text, b.usage]) : JSON.stringify(b))' "$tmp/$1.json"
}
serve_start || exit 1
pids=""; complete alone; wait $pids
want=$(answer alone)
serve_stop
serve_start --gpu-mem 40M || exit 1
pids=""
for i in 1 2 3 4 5; do complete mem$i; done
complete mem6 memconv
wait $pids
for i in 1 2 3 4 5 6; do
	[ "$(answer mem$i)" = "$want" ] || bad "under --gpu-mem 40M, request $i: $(answer mem$i) (alone: $want)"
done
parked=$(metric kvmem_turns_parked_total)
[ "${parked:-0}" -ge 1 ] || bad "six 1.2K-token prompts under --gpu-mem 40M: none waited for memory"
echo "six prompts under --gpu-mem 40M: $parked turns waited for memory, every answer the same"
[ "$(metric kvmem_memory_short)" = 0 ] || bad "memory still short with nothing running"
grep -q "waits for memory (session: cpu view: .* cap (--gpu-mem" "$tmp/serve.err" ||
	bad "no log line for a turn that waited: $(tail -3 "$tmp/serve.err")"
# The conversation's next turn: its text so far, then a new question.
next=$(node -e 'const a = JSON.parse(process.argv[1]);
	const b = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8"));
	console.log(JSON.stringify(a + b.choices[0].text + "\n? payments.props dns.cluster ="))' \
	"$MID" "$tmp/mem6.json")
rm -f "$tmp/body"
curl -s -o "$tmp/body" "$BASE/v1/completions" -H 'X-Kvmem-Conversation: memconv' \
	-d "{\"prompt\":$next,\"max_tokens\":6,\"temperature\":0}"
grep -q '"finish_reason"' "$tmp/body" && [ "$(js 'b.usage.prompt_tokens < 40')" = true ] ||
	bad "the conversation that waited did not go on from its commit: $(head -c 400 "$tmp/body")"
serve_stop
# bench serve counts the parked turns of each load (its server's, in
# process), and none of its requests fails.
"$KVMEM" bench serve --clients 6 --requests 1 --tokens 2 --lines 160 --gpu-mem 40M --mode closed \
	--view-slice 2.5 --json >"$tmp/bench.json" 2>"$tmp/bench.err" || bad "bench serve --gpu-mem 40M: $(tail -3 "$tmp/bench.err")"
grep -q '"failed":0,.*"parked":[1-9]' "$tmp/bench.json" ||
	bad "bench serve, six clients under --gpu-mem 40M: $(cat "$tmp/bench.json")"
grep -q '"view_slice_ms":2.5[,}]' "$tmp/bench.json" || bad "bench serve --view-slice 2.5: $(cat "$tmp/bench.json")"
serve_start --gpu-mem 4M || exit 1
got=$(curl -s -o "$tmp/body" -w '%{http_code}' "$BASE/v1/completions" -d "{\"prompt\":$MID,\"max_tokens\":6}")
[ "$got" = 503 ] && grep -q '"code":"insufficient_memory"' "$tmp/body" && grep -q 'gpu-mem' "$tmp/body" ||
	bad "a turn too large alone for --gpu-mem 4M: $got $(head -c 400 "$tmp/body")"
serve_stop

# ---- a full disk --------------------------------------------------------------------------------
# disk_rule WHAT WANT ARGS...: a server started with ARGS answers 'small'; a
# prompt whose pages would pass the room ('big') gets 507 with a message
# matching WANT; then 'small' goes on, and so does 'big' with a turn that fits.
disk_rule() {
	local what=$1 want=$2 big got
	shift 2
	serve_start "$@" || exit 1
	rm -f "$tmp/body"
	curl -s -o "$tmp/body" "$BASE/v1/chat/completions" -H 'X-Kvmem-Conversation: small' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}]}"
	grep -q '"finish_reason":"stop"' "$tmp/body" || bad "$what: the first turn of 'small': $(cat "$tmp/body")"
	big=$(node -e 'const l = JSON.parse(process.argv[1]); console.log(JSON.stringify(l.repeat(40) + "? payments.props pool.workers ="))' "$LINES")
	got=$(curl -s -o "$tmp/body" -w '%{http_code}' "$BASE/v1/chat/completions" -H 'X-Kvmem-Conversation: big' \
		-d "{\"messages\":[{\"role\":\"user\",\"content\":$big}]}")
	[ "$got" = 507 ] && grep -q '"error":{"message":"conversation .big.*"type":"server_error".*"code":"insufficient_storage"' "$tmp/body" &&
		grep -q -- "$want" "$tmp/body" || bad "$what: the turn that needed the space got $got: $(head -c 400 "$tmp/body")"
	rm -f "$tmp/body"
	curl -s -o "$tmp/body" "$BASE/v1/chat/completions" -H 'X-Kvmem-Conversation: small' \
		-d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK},{\"role\":\"assistant\",\"content\":\"5432\"},{\"role\":\"user\",\"content\":$ASK2}]}"
	grep -q '"finish_reason":"stop"' "$tmp/body" || bad "$what: 'small' did not go on: $(cat "$tmp/body")"
	rm -f "$tmp/body"
	curl -s -o "$tmp/body" "$BASE/v1/chat/completions" -H 'X-Kvmem-Conversation: big' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}]}"
	grep -q '"finish_reason":"stop"' "$tmp/body" || bad "$what: 'big' with a turn that fits: $(cat "$tmp/body")"
	serve_stop
}

# ---- --max-disk: the rule under a cap of the conversations' bytes (no tmpfs needed)
disk_rule "--max-disk" "--max-disk allows" --data-dir "$tmp/capped" --max-disk 10M
used=$(du -sk "$tmp/capped/conversations" | cut -f1)
[ "$used" -le 10240 ] || bad "--max-disk 10M: the conversations take $used KiB"

if [ "$(id -u)" != 0 ] || ! mkdir -p "$tmp/disk" || ! mount -t tmpfs -o size=6M kvmem-serve-test "$tmp/disk" 2>"$tmp/mount.err"; then
	echo "note: no 6 MiB tmpfs to fill (not root, or: $(cat "$tmp/mount.err" 2>/dev/null)): the full-disk part is skipped"
else
	disk="$tmp/disk"
	disk_rule "full disk" "free" --data-dir "$disk"
	for ws in "$disk"/conversations/*/ws; do
		"$KVMEM" verify -q "$ws" >/dev/null 2>&1 || bad "full disk: $ws does not verify"
	done
	umount "$disk" && disk=""
fi
grep -E "ERROR: AddressSanitizer|runtime error" "$tmp/serve.err" && bad "sanitizer report"
[ $fail = 0 ] || tail -5 "$tmp/serve.err"
cli_done serve_admit
