#!/bin/bash
# Idle conversations give their views up and lay them out again from their
# pages (issue #24, #26: "come back by a step, never a re-prefill").
# Two servers run the same completion conversation, five turns of
# agentlang lines with sampled answers (a temperature, a seed each turn)
# and their log probabilities, under a small budget so selections move
# the view: one keeps every view (--idle-release 0), the other gives the
# conversation's view up between turns (--idle-release 0.3, waited for on
# /metrics). Every turn's text, log probabilities (jansson writes each
# float's double exactly: the logits' bits show through), usage and
# workspace tokens are equal; the conversation never reopened from disk
# (restored false) and prefilled only each turn's new tokens; /metrics
# counts the views given up and laid out again, and their tokens. Then
# --max-views 1 with two conversations: the idle one gives its view up as
# soon as the other's turn needs room, and still answers as its twin. Last,
# the load test's conversations (tests/serve/load.mjs: 8 at once, 8 turns,
# SIGKILL after 40 requests) with --max-views 2 --idle-release 0.05, so
# views go and come back between most turns: every conversation equals an
# uninterrupted twin; and again with --max-open 2 --budget 256, so most
# turns reopen their conversation from disk and every selection places
# blocks, both in slices of rounds.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../serve/lib.sh"
command -v node >/dev/null || { echo "skip: node is not installed"; exit 77; }
cli_setup serve_release
serve_corpus "$tmp/corpus.txt" "$seed" 40000

metric() { curl -s "$BASE/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
# until_metric NAME N: wait (at most 20 s) until metric NAME >= N
until_metric() {
	local i
	for i in $(seq 1 100); do
		[ "$(metric "$1")" -ge "$2" ] 2>/dev/null && return 0
		sleep 0.2
	done
	bad "$1 is $(metric "$1"), never $2"
	return 1
}
# turn CONV I: turn I of completion conversation CONV on $BASE: the text it
# holds ($tmp/CONV.held) and about 600 new characters of the corpus, a
# sampled answer with log probabilities; the answer's comparable part in
# $tmp/CONV.I.out, the held text grown by prompt and answer.
turn() {
	node -e 'const fs = require("fs");
		const [corpus, held, i] = process.argv.slice(1);
		const t = fs.readFileSync(corpus, "utf8");
		const a = t.indexOf("\n", 1000 + 3000 * +i) + 1, b = t.lastIndexOf("\n", a + 600) + 1;
		const h = fs.existsSync(held) ? fs.readFileSync(held, "utf8") : "";
		process.stdout.write(JSON.stringify({ prompt: h + t.slice(a, b), max_tokens: 24,
			temperature: 0.8, seed: 100 + +i, logprobs: 5, ignore_eos: true }))' \
		"$tmp/corpus.txt" "$tmp/$1.held" "$2" >"$tmp/req.json"
	curl -s "$BASE/v1/completions" -H "X-Kvmem-Conversation: $1" -d @"$tmp/req.json" \
		-o "$tmp/$1.$2.json" -w '%{http_code}' | grep -q '^200$' ||
		{ bad "conversation $1, turn $2: $(head -c 300 "$tmp/$1.$2.json")"; return 1; }
	node -e 'const fs = require("fs");
		const [req, ans, held, out] = process.argv.slice(1);
		const q = JSON.parse(fs.readFileSync(req)), b = JSON.parse(fs.readFileSync(ans));
		fs.writeFileSync(held, q.prompt + b.choices[0].text);
		fs.writeFileSync(out, JSON.stringify([b.choices[0].text, b.choices[0].logprobs,
			b.choices[0].finish_reason, b.usage, b.kvmem.workspace_tokens, b.kvmem.restored]))' \
		"$tmp/req.json" "$tmp/$1.$2.json" "$tmp/$1.held" "$tmp/$1.$2.out"
}

# ---- the twin: every view kept -----------------------------------------------------------
opts="--max-tokens 24 --budget 256 --block 32 --idle-close 0"
KVMEM_HOME="$tmp/twin" serve_start $opts --idle-release 0 || exit 1
for i in 1 2 3 4 5; do turn twin "$i"; done
[ "$(metric kvmem_views_released_total)" = 0 ] || bad "--idle-release 0 gave views up"
serve_stop

# ---- the same conversation, its view given up between turns --------------------------------
KVMEM_HOME="$tmp/idle" serve_start $opts --idle-release 0.3 --view-slice 0 || exit 1
for i in 1 2 3 4 5; do
	turn idle "$i"
	until_metric kvmem_views_released_total "$i"
	[ "$(metric kvmem_conversations_without_view)" = 1 ] ||
		bad "after turn $i: $(metric kvmem_conversations_without_view) conversations without a view (want 1)"
	cmp -s "$tmp/twin.$i.out" "$tmp/idle.$i.out" ||
		bad "turn $i after the view was given up: $(head -c 400 "$tmp/idle.$i.out"); its twin: $(head -c 400 "$tmp/twin.$i.out")"
done
grep -q ',false\]$' "$tmp/idle.5.out" || bad "the conversation was reopened from disk: $(tail -c 100 "$tmp/idle.5.out")"
[ "$(metric kvmem_views_restored_total)" = 4 ] || bad "views laid out again: $(metric kvmem_views_restored_total), want 4"
[ "$(metric kvmem_view_restore_tokens_total)" -gt 4 ] 2>/dev/null ||
	bad "tokens laid out again: $(metric kvmem_view_restore_tokens_total)"
# A layer a round (--view-slice 0; the model's 6 layers in eighths, at least one each).
[ "$(metric kvmem_view_restore_steps_total)" = 24 ] ||
	bad "rounds that laid views out: $(metric kvmem_view_restore_steps_total), want 4 x 6"
[ "$(metric kvmem_conversation_restores_total)" = 0 ] || bad "a conversation was reopened from its workspace"
echo "5 turns, the view given up $(metric kvmem_views_released_total) times and laid out again" \
	"$(metric kvmem_views_restored_total) times ($(metric kvmem_view_restore_tokens_total) tokens," \
	"$(metric kvmem_view_restore_seconds_total) s): every answer equal to the twin's"
serve_stop

# ---- --max-views 1: the idle one gives its view up for the other's turn ------------------------
KVMEM_HOME="$tmp/quota" serve_start $opts --idle-release 0 --max-views 1 || exit 1
turn qa 1
turn qb 1
[ "$(metric kvmem_views_released_total)" = 1 ] && [ "$(metric kvmem_conversations_without_view)" = 1 ] ||
	bad "--max-views 1, two conversations: $(metric kvmem_views_released_total) given up, $(metric kvmem_conversations_without_view) without a view"
turn qa 2
[ "$(metric kvmem_views_restored_total)" = 1 ] || bad "qa's view was not laid out again"
for i in 1 2; do cmp -s "$tmp/twin.$i.out" "$tmp/qa.$i.out" || bad "--max-views 1: qa's turn $i differs from its twin's"; done
serve_stop

# ---- under load: views given up and laid out again between turns -------------------------------
serve_node
export KVMEM_HOME="$tmp/load"
timeout 300 node "$NODEDIR/load.mjs" "$KVMEM" "$tmp/corpus.txt" "$seed" 8 8 40 "$tmp/load.json" \
	--max-open 64 --max-views 2 --idle-release 0.05 >"$tmp/load.out" 2>&1 ||
	bad "load with --max-views 2: $(tail -3 "$tmp/load.out")"
grep '^load:' "$tmp/load.out"

# ---- under load: conversations closed and reopened, selections over a small budget ------------
# --max-open 2 for 8 conversations: most turns reopen theirs from disk (the
# index and the view taken in a slice a round), and a 256-token budget
# makes each turn's selection place blocks, a layer a round (--view-slice
# 0: the most slice boundaries). The twins run
# on the same server: every answer equal says a reopen or a selection in
# slices changes no bit, whenever it falls.
export KVMEM_HOME="$tmp/reopen"
timeout 300 node "$NODEDIR/load.mjs" "$KVMEM" "$tmp/corpus.txt" "$seed" 8 6 30 "$tmp/reopen.json" \
	--max-open 2 --budget 256 --view-slice 0 >"$tmp/reopen.out" 2>&1 ||
	bad "load with --max-open 2 --budget 256: $(tail -3 "$tmp/reopen.out")"
grep '^load:' "$tmp/reopen.out"
node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
	console.log(`conversations reopened ${r.restores}`); process.exit(r.restores >= 8 ? 0 : 1)' \
	"$tmp/reopen.json" || bad "--max-open 2: fewer than 8 reopens"
cli_done serve_release
