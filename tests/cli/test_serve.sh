#!/bin/bash
# kvmem serve with the official openai npm client and with curl: chat,
# streaming, completions, a conversation that goes on after a restart
# (answers equal to an uninterrupted twin's), and every refusal with its
# HTTP status and OpenAI-shaped error: malformed JSON, wrong types, unknown
# fields, bad conversation ids (no path escape), body and token limits, the
# conversation limit, the bearer token, a client gone mid-stream.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../serve/lib.sh"
cli_setup serve
serve_node
MODEL=agentlang
serve_corpus "$tmp/corpus.txt" "$seed" 3000

serve_start --max-body 64k --max-request-tokens 2k --max-conversations 6 || exit 1
# The embedded model runs with no --model.
curl -sf "$BASE/health" | grep -q '"status":"ok"' || bad "/health"
# kvmem run takes text and chats where the model has a tokenizer.
AL="$KVMEM_HOME/models/agentlang"
"$KVMEM" run --model "$AL" --prompt-text $'$ cat api.conf\napi.conf db.host = node12\n? api.conf db.host =' \
	--decode 4 >"$tmp/run.out" 2>&1 || bad "run --prompt-text: $(cat "$tmp/run.out")"
grep -q '^text: node12 \[stop\]$' "$tmp/run.out" || bad "run --prompt-text: $(cat "$tmp/run.out")"
echo '{"messages": [{"role": "user", "content": "$ cat api.conf\napi.conf db.port = 5432\n? api.conf db.port ="}]}' >"$tmp/chat.json"
"$KVMEM" run --model "$AL" --chat "$tmp/chat.json" --decode 4 >"$tmp/run.out" 2>&1 &&
	grep -q '^text: 5432 \[stop\]$' "$tmp/run.out" || bad "run --chat: $(cat "$tmp/run.out")"
"$KVMEM" run --model "$M" --prompt-text hello --decode 1 >"$tmp/run.out" 2>&1 &&
	bad "run --prompt-text on a model with no tokenizer"
grep -q "no tokenizer.json" "$tmp/run.out" || bad "run --prompt-text without a tokenizer: $(cat "$tmp/run.out")"
node "$NODEDIR/client.mjs" basic "$BASE" "$MODEL" "$tmp/corpus.txt" "$tmp/state.json" "$seed" ||
	bad "openai client: chat, streaming, conversation"

# ---- curl and the refusals ------------------------------------------------------
# expect STATUS CODE [curl args...]: the status and the error's code.
expect() {
	local want=$1 code=$2 got
	shift 2
	got=$(curl -s -o "$tmp/body" -w '%{http_code}' "$@")
	[ "$got" = "$want" ] || { bad "$* -> HTTP $got, want $want: $(head -c 300 "$tmp/body")"; return; }
	[ -z "$code" ] || grep -q "\"code\":\"$code\"" "$tmp/body" ||
		bad "$* -> $(head -c 300 "$tmp/body"), want code $code"
	grep -q '"error":{"message":' "$tmp/body" || [ "$want" = 200 ] || bad "$* -> not an OpenAI error body"
}
CH="$BASE/v1/chat/completions"
Q=$(node -e 'const c=require("fs").readFileSync(process.argv[1],"utf8").split("\n").filter(l=>/ = /.test(l)&&!l.startsWith("$"))[3]; console.log(JSON.stringify("? "+c.slice(0,c.indexOf(" = "))+" ="))' "$tmp/corpus.txt")
ok_body="{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":$Q}],\"max_tokens\":4}"
expect 200 "" "$CH" -d "$ok_body"
grep -q '"object":"chat.completion"' "$tmp/body" || bad "curl chat: $(cat "$tmp/body")"
expect 400 invalid_json "$CH" -d '{"model": "agentlang", "messages": [}'
expect 400 invalid_json "$CH" -d '[1, 2]'
expect 400 invalid_json "$CH" -d '{"a": 1, "a": 2}'
expect 400 invalid_json "$CH" -d '{"messages": [{"role": "user", "content": "a\u0000b"}]}'
expect 400 invalid_request "$CH" -d '{"messages": "hi"}'
expect 400 invalid_request "$CH" -d "{\"messages\":[{\"role\":\"user\",\"content\":$Q}],\"max_tokens\":4.5}"
expect 400 invalid_request "$CH" -d "{\"messages\":[{\"role\":\"user\",\"content\":$Q}],\"temperature\":\"hot\"}"
expect 400 invalid_request "$CH" -d "{\"messages\":[{\"role\":\"wizard\",\"content\":$Q}]}"
expect 400 invalid_request "$CH" -d "{\"messages\":[{\"role\":\"user\",\"content\":$Q}],\"n\":17}"
expect 400 unknown_field "$CH" -d "{\"messages\":[{\"role\":\"user\",\"content\":$Q}],\"frobnicate\":1}"
expect 400 unknown_field "$CH" -d "{\"messages\":[{\"role\":\"user\",\"content\":$Q,\"extra\":1}]}"
expect 404 model_not_found "$CH" -d "{\"model\":\"gpt-9\",\"messages\":[{\"role\":\"user\",\"content\":$Q}]}"
expect 400 invalid_prompt "$CH" -d '{"messages":[{"role":"user","content":"zzqx unknownword"}]}'
for id in '../../etc' 'a/b' '.hidden' 'x..y' "$(printf 'a%.0s' $(seq 1 200))" 'sp ace'; do
	expect 400 invalid_conversation_id "$CH" -H "X-Kvmem-Conversation: $id" -d "$ok_body"
done
expect 400 invalid_conversation_id "$CH" -H 'X-Kvmem-Conversation;' -d "$ok_body"
expect 400 invalid_conversation_id "$CH" -d "{\"conversation\":\"../x\",\"messages\":[{\"role\":\"user\",\"content\":$Q}]}"
[ -z "$(ls "$KVMEM_HOME/serve" | grep -v '^conversations$')" ] || bad "something escaped the data directory"
[ ! -e "$tmp/etc" ] && [ ! -e "$KVMEM_HOME/etc" ] || bad "a conversation id escaped"
head -c 70000 /dev/zero | tr '\0' 'a' >"$tmp/big"
expect 413 body_too_large "$CH" --data-binary @"$tmp/big"
expect 400 too_many_tokens "$CH" -d "{\"messages\":[{\"role\":\"user\",\"content\":$Q}],\"max_tokens\":1999}"
expect 409 conversation_mismatch "$CH" -H 'X-Kvmem-Conversation: mt-'"$seed" -d "$ok_body"
expect 404 not_found "$BASE/v1/embeddings" -d '{}'
expect 405 method_not_allowed "$BASE/v1/chat/completions"
curl -s "$BASE/metrics" | grep -q '^kvmem_pager_commits_total [1-9]' || bad "/metrics: no pager commits counted"
curl -s "$BASE/metrics" | grep -q '^kvmem_selection_seconds_total ' || bad "/metrics: no selection time"

# A client that goes away mid-stream: the server and the conversation go on.
long="{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":$Q}],\"max_tokens\":200,\"stream\":true}"
curl -s -N --max-time 0.3 "$CH" -H 'X-Kvmem-Conversation: gone' -d "$long" >/dev/null
curl -s -N --max-time 0.3 "$CH" -d "$long" >/dev/null
sleep 1
curl -sf "$BASE/health" >/dev/null || bad "the server died after a client left mid-stream"
for i in $(seq 1 50); do	# the turn runs to its end without its client
	curl -s -o "$tmp/body" "$CH" -H 'X-Kvmem-Conversation: gone' \
		-d "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":$Q}],\"max_tokens\":4}"
	grep -q conversation_busy "$tmp/body" || break
	sleep 0.2
done
grep -q '"replayed":true' "$tmp/body" || bad "the turn whose client left was not kept: $(cat "$tmp/body")"

# The conversation limit: 6 directories (mt-SEED and gone are two).
for i in 1 2 3 4; do
	curl -s -o /dev/null "$CH" -H "X-Kvmem-Conversation: lim$i" -d "$ok_body"
done
expect 429 too_many_conversations "$CH" -H 'X-Kvmem-Conversation: lim99' -d "$ok_body"

# ---- restart: the conversation goes on with no re-prefill ----------------------------
serve_stop
serve_start --max-body 64k --max-request-tokens 2k --max-conversations 100 || exit 1
CH="$BASE/v1/chat/completions"
node "$NODEDIR/client.mjs" resume "$BASE" "$MODEL" "$tmp/corpus.txt" "$tmp/state.json" "$seed" ||
	bad "openai client: the conversation after a restart"
serve_stop

# ---- the bearer token ------------------------------------------------------------------
serve_start --api-key "k$seed" || exit 1
CH="$BASE/v1/chat/completions"
expect 401 invalid_api_key "$CH" -d "$ok_body"
expect 401 invalid_api_key "$CH" -H "Authorization: Bearer wrong" -d "$ok_body"
# Only the whole key: not the key and one more character, not a prefix of it,
# not an empty token (a comparison without the lengths let the first two in).
expect 401 invalid_api_key "$CH" -H "Authorization: Bearer k${seed}x" -d "$ok_body"
expect 401 invalid_api_key "$CH" -H "Authorization: Bearer k${seed%?}" -d "$ok_body"
expect 401 invalid_api_key "$CH" -H "Authorization: Bearer k" -d "$ok_body"
expect 401 invalid_api_key "$CH" -H "Authorization: Bearer " -d "$ok_body"
expect 401 invalid_api_key "$BASE/metrics" -H "Authorization: Bearer k${seed}0"
expect 200 "" "$CH" -H "Authorization: Bearer k$seed" -d "$ok_body"
curl -sf "$BASE/health" >/dev/null || bad "/health needs no token"
serve_stop
"$KVMEM" serve --host 0.0.0.0 --port 0 >/dev/null 2>"$tmp/nokey.err" &&
	bad "listening beyond loopback without --api-key was allowed"
grep -q "api-key" "$tmp/nokey.err" || bad "no word about --api-key: $(cat "$tmp/nokey.err")"
grep -E "ERROR: AddressSanitizer|runtime error" "$tmp/serve.err" && bad "sanitizer report"
cli_done serve
