#!/bin/bash
# kvmem serve as a new user meets it (issue 26): the defects they saw, each
# checked here, and the API clients expect.
#
#   1 a request of no conversation whose client hangs up stops (whole
#     answers too, not only streams)
#   2 with a temperature and no seed, calls differ; a seed is honoured,
#     inside a conversation too
#   3 a completion conversation whose answer was lost: the same prompt
#     replays it, GET /v1/conversations/ID returns the text
#   4 a NUL byte in X-Kvmem-Conversation is refused, not cut
#   5 a stream cut by --request-timeout ends with an error event and [DONE]
#   6 414, 431, a bad, too large or two differing Content-Lengths: OpenAI errors (JSON)
#   7 "bearer" in lower case is taken; a replay reports the turn's usage (and its
#     logprobs, null where it kept none); a
#     user's content null is refused
#   and "hello" to the embedded model: a 400 that says what it speaks, with
#   a prompt that works.
# Then the fields SDKs send (stop, top_k, min_p, n, logprobs, top_logprobs,
# response_format, store, metadata, service_tier, reasoning_effort,
# ignore_eos), tokenize/detokenize, conversations listed and deleted, CORS
# and the new /metrics lines.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../serve/lib.sh"
cli_setup serve_api
serve_node
# A fixed workspace text (kvmem synth sample --seed 3): the model goes on
# writing lines after it.
LINES='"$ ls\nexecutor.json executor.conf payments.props executor.props\npayments.props\n$ cat payments.props\npayments.props pool.workers = 18\npayments.props dns.cluster = host14\npayments.props pool.bucket = 0x2a97\npayments.props quota.cluster = host08\n"'
ASK='"$ cat api.conf\napi.conf db.port = 5432\n? api.conf db.port ="'

# expect STATUS CODE [curl args...]: the status and the error's code.
expect() {
	local want=$1 code=$2 got
	shift 2
	got=$(curl -s -o "$tmp/body" -D "$tmp/head" -w '%{http_code}' "$@")
	[ "$got" = "$want" ] || { bad "$* -> HTTP $got, want $want: $(head -c 300 "$tmp/body")"; return 1; }
	[ -z "$code" ] || grep -q "\"code\":\"$code\"" "$tmp/body" ||
		{ bad "$* -> $(head -c 300 "$tmp/body"), want code $code"; return 1; }
	grep -q '"error":{"message":' "$tmp/body" || [ "$want" = 200 ] ||
		{ bad "$* -> not an OpenAI error body"; return 1; }
	return 0
}
# js EXPR: evaluate with b (the last body, parsed) in scope.
js() {
	node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
		try { console.log(eval(process.argv[2])) } catch (e) { console.log(`(${e.message})`) }' \
		"$tmp/body" "$1"
}
metric() {
	curl -s "$BASE/metrics" | sed -n "s/^$1 //p"
}
raw() {	# raw REQUEST: status line, headers, body of one raw exchange
	node "$NODEDIR/raw.mjs" "$PORT" "$1"
}

serve_start --request-timeout 3 --max-tokens 64 || exit 1
CH="$BASE/v1/chat/completions"
CO="$BASE/v1/completions"

# ---- 1: a whole answer's client hangs up ---------------------------------------------
curl -s -m 0.5 "$CO" -d "{\"prompt\":$LINES,\"max_tokens\":1500,\"ignore_eos\":true}" >/dev/null
sleep 1.5
t1=$(metric kvmem_completion_tokens_total)
sleep 1
t2=$(metric kvmem_completion_tokens_total)
[ "$(metric kvmem_requests_running)" = 0 ] && [ "$t1" = "$t2" ] && [ "${t1:-9999}" -lt 1500 ] ||
	bad "1: the request went on after its client left (tokens $t1 then $t2, running $(metric kvmem_requests_running))"
[ "$(metric kvmem_requests_cancelled_total)" -ge 1 ] 2>/dev/null || bad "1: no request counted as cancelled"

# ---- 2: sampling without a seed differs; a seed is honoured ------------------------------
for i in 1 2 3 4; do
	curl -s "$CO" -d "{\"prompt\":$LINES,\"max_tokens\":24,\"temperature\":1.5}" -o "$tmp/body"
	js 'JSON.stringify(b.choices[0].text)' >>"$tmp/unseeded"
done
[ "$(sort -u "$tmp/unseeded" | wc -l)" -gt 1 ] || bad "2: four unseeded calls at temperature 1.5 gave the same text"
for i in 1 2; do
	curl -s "$CO" -d "{\"prompt\":$LINES,\"max_tokens\":24,\"temperature\":1.5,\"seed\":42}" -o "$tmp/body"
	js 'JSON.stringify(b.choices[0].text)' >>"$tmp/seeded"
done
[ "$(sort -u "$tmp/seeded" | wc -l)" = 1 ] || bad "2: the same seed gave different texts"
# In conversations: the same history, another seed, another text (in one of
# four pairs at least; before, a conversation's own sampler ignored it).
differ=0
more=$(node -e 'console.log(JSON.stringify(JSON.parse(process.argv[1]) + "$ cat payments.props\n"))' "$LINES")
for k in 1 2 3 4; do
	for c in a b; do
		curl -s -o /dev/null "$CO" -H "X-Kvmem-Conversation: sd$k$c" -d "{\"prompt\":$LINES,\"max_tokens\":0}"
	done
	curl -s -o "$tmp/body" "$CO" -H "X-Kvmem-Conversation: sd${k}a" -d "{\"prompt\":$more,\"max_tokens\":16,\"temperature\":1.5,\"seed\":$k}"
	a=$(js 'b.choices[0].text')
	curl -s -o "$tmp/body" "$CO" -H "X-Kvmem-Conversation: sd${k}b" -d "{\"prompt\":$more,\"max_tokens\":16,\"temperature\":1.5,\"seed\":$((k + 100))}"
	[ "$a" = "$(js 'b.choices[0].text')" ] || differ=$((differ + 1))
done
[ "$differ" -gt 0 ] || bad "2: inside conversations the seed changed nothing (4 pairs)"
# Seeded streams at once draw their tokens ahead of their units, beside each
# other (turn_predraw): each gives the text it gives alone, logprobs too.
pids=""
for k in 1 2 3 4; do
	lp=""; [ $((k % 2)) = 0 ] && lp=',"logprobs":2'
	body="{\"prompt\":$LINES,\"max_tokens\":32,\"temperature\":1.2,\"seed\":$((k + 7))$lp}"
	curl -s "$CO" -d "$body" -o "$tmp/alone$k"
	curl -s "$CO" -d "$body" -o "$tmp/together$k" &
	pids="$pids $!"
done
wait $pids
for k in 1 2 3 4; do
	a=$(node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); console.log(JSON.stringify([b.choices[0].text, b.choices[0].logprobs]))' "$tmp/alone$k")
	t=$(node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); console.log(JSON.stringify([b.choices[0].text, b.choices[0].logprobs]))' "$tmp/together$k")
	[ -n "$a" ] && [ "$a" = "$t" ] || bad "2: seeded stream $k beside three others: $t, alone: $a"
done

# ---- 3: a completion conversation whose answer was lost ---------------------------------
expect 200 "" "$CO" -H 'X-Kvmem-Conversation: lost' -d "{\"prompt\":$ASK,\"max_tokens\":8}"
first=$(js 'JSON.stringify([b.choices[0].text, b.usage])')
# The client lost that answer and sends the same prompt again.
expect 200 "" "$CO" -H 'X-Kvmem-Conversation: lost' -d "{\"prompt\":$ASK,\"max_tokens\":8}"
[ "$(js 'b.kvmem.replayed')" = true ] && [ "$(js 'JSON.stringify([b.choices[0].text, b.usage])')" = "$first" ] ||
	bad "3: the same prompt did not replay the answer ($first): $(head -c 300 "$tmp/body")"
expect 200 "" "$BASE/v1/conversations/lost"
[ "$(js 'JSON.stringify(b.text)')" = "$(node -e 'console.log(JSON.stringify(JSON.parse(process.argv[2]) + JSON.parse(process.argv[1])[0]))' "$first" "$ASK")" ] ||
	bad "3: GET /v1/conversations/lost does not hold the prompt and its answer: $(head -c 300 "$tmp/body")"
held=$(js 'JSON.stringify(b.text + "\n? api.conf db.port =")')
expect 200 "" "$CO" -H 'X-Kvmem-Conversation: lost' -d "{\"prompt\":$held,\"max_tokens\":8}" &&
	[ "$(js 'b.kvmem.replayed')" = false ] || bad "3: the conversation did not go on with the text GET gave"

# ---- 4: NUL in the conversation header ---------------------------------------------------
body='{"messages":[{"role":"user","content":"? a ="}]}'
raw "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Kvmem-Conversation: victim\x00evil\r\nContent-Length: ${#body}\r\n\r\n$body" >"$tmp/raw"
head -1 "$tmp/raw" | grep -q ' 400 ' && grep -q '"code":"invalid_conversation_id"' "$tmp/raw" ||
	bad "4: a NUL in X-Kvmem-Conversation: $(cat "$tmp/raw")"
[ ! -e "$KVMEM_HOME/serve/conversations/victim" ] || bad "4: the request landed in conversation 'victim'"

# ---- 5: a stream cut by --request-timeout (3 s) --------------------------------------------
curl -s -N "$CO" -d "{\"prompt\":$LINES,\"max_tokens\":9000,\"ignore_eos\":true,\"stream\":true}" \
	--max-time 30 >"$tmp/sse"
tail -4 "$tmp/sse" | grep -q '^data: {"error":{.*"code":"timeout"' && [ "$(tail -2 "$tmp/sse" | head -1)" = "data: [DONE]" ] ||
	bad "5: the stream cut by --request-timeout: $(tail -c 400 "$tmp/sse")"
serve_stop

# ---- 6: what libmicrohttpd would answer in HTML ----------------------------------------------
serve_start --api-key "k$seed" --cors '*' || exit 1
CH="$BASE/v1/chat/completions"
CO="$BASE/v1/completions"
long=$(head -c 20000 /dev/zero | tr '\0' a)
check_raw() {	# check_raw STATUS CODE WHAT REQUEST
	raw "$4" >"$tmp/raw"
	head -1 "$tmp/raw" | grep -q " $1 " && grep -qi '^header Content-Type: application/json' "$tmp/raw" &&
		grep -q "\"error\":{\"message\":.*\"code\":\"$2\"" "$tmp/raw" || bad "6: $3: $(head -c 400 "$tmp/raw")"
}
check_raw 414 uri_too_long "a 20 KB request line" "GET /v1/models?q=$long HTTP/1.1\r\nHost: x\r\n\r\n"
check_raw 431 headers_too_large "70 KB of headers" "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ${long}${long}${long}${long}\r\n\r\n"
check_raw 400 invalid_content_length "Content-Length: abc" "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}"
check_raw 400 invalid_content_length "two Content-Lengths that differ" "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\n{}xyz"
grep -qi '^header Access-Control-Allow-Origin: \*' "$tmp/raw" || bad "6: the screen's answer has no CORS header"
# Past 64 bits libmicrohttpd sent HTML 413, its head twice; past --max-body
# the screen refuses before a byte of the body is read.
check_raw 413 body_too_large "Content-Length of 20 digits" "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n{}"
check_raw 413 body_too_large "Content-Length over --max-body" "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1048577\r\n\r\n{}"
# Two equal ones are one length (RFC 9112): the request goes on (to 401 here).
check_raw 401 invalid_api_key "two equal Content-Lengths" "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}"

# ---- 7: the bearer's case, a replay's usage, a user's content null ------------------------------
expect 200 "" "$CH" -H "authorization: bearer k$seed" -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}]}" ||
	bad "7: 'bearer' in lower case was refused"
A="Authorization: Bearer k$seed"
expect 200 "" "$CH" -H "$A" -H 'X-Kvmem-Conversation: rp' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}]}"
u1=$(js 'JSON.stringify(b.usage)')
expect 200 "" "$CH" -H "$A" -H 'X-Kvmem-Conversation: rp' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}]}"
[ "$(js 'b.kvmem.replayed')" = true ] && [ "$(js 'JSON.stringify(b.usage)')" = "$u1" ] && [ "$(js 'b.usage.completion_tokens > 0')" = true ] ||
	bad "7: a replay reports usage $(js 'JSON.stringify(b.usage)'), the turn had $u1"
# A replay asked for log probabilities: the turn's own (recorded with it),
# never an empty list beside tokens; null where the turn kept none ('rp').
expect 200 "" "$CH" -H "$A" -H 'X-Kvmem-Conversation: rp' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"logprobs\":true}"
[ "$(js 'b.kvmem.replayed')" = true ] && [ "$(js 'b.choices[0].logprobs')" = null ] ||
	bad "7: a replay of a turn kept without logprobs: $(js 'JSON.stringify(b.choices[0].logprobs)')"
expect 200 "" "$CH" -H "$A" -H 'X-Kvmem-Conversation: rl' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"logprobs\":true,\"top_logprobs\":3}"
l1=$(js 'JSON.stringify(b.choices[0].logprobs)')
[ "$(js 'b.choices[0].logprobs.content.length > 0')" = true ] || bad "7: no logprobs in the turn: $l1"
expect 200 "" "$CH" -H "$A" -H 'X-Kvmem-Conversation: rl' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"logprobs\":true,\"top_logprobs\":3}"
[ "$(js 'b.kvmem.replayed')" = true ] && [ "$(js 'JSON.stringify(b.choices[0].logprobs)')" = "$l1" ] ||
	bad "7: a replay's logprobs $(js 'JSON.stringify(b.choices[0].logprobs)'), the turn had $l1"
expect 200 "" -X DELETE "$BASE/v1/conversations/rl" -H "$A"	# the list below is of the others
for role in user system tool; do
	expect 400 invalid_request "$CH" -H "$A" -d "{\"messages\":[{\"role\":\"$role\",\"content\":null}]}"
done
expect 400 invalid_request "$CH" -H "$A" -d '{"messages":[{"role":"user"}]}'

# ---- hello ------------------------------------------------------------------------------------------
expect 400 invalid_prompt "$CH" -H "$A" -d '{"messages":[{"role":"user","content":"hello"}]}'
grep -q "'hello' is not agentlang" "$tmp/body" || bad "hello: $(cat "$tmp/body")"
example=$(js 'JSON.stringify(b.error.message.match(/A prompt it answers: "([^"]*)"/)[1])')
expect 200 "" "$CH" -H "$A" -d "{\"messages\":[{\"role\":\"user\",\"content\":$example}]}" &&
	[ "$(js 'b.choices[0].message.content')" = 5432 ] || bad "hello: the example in the message does not answer 5432: $(cat "$tmp/body")"

# ---- the fields SDKs send ------------------------------------------------------------------------------
# stop: the text ends before it, finish_reason stop.
expect 200 "" "$CO" -H "$A" -d "{\"prompt\":$LINES,\"max_tokens\":64,\"stop\":[\"\\n\"]}"
[ "$(js 'b.choices[0].text.includes("\n") || b.choices[0].finish_reason')" = stop ] ||
	bad "stop: $(head -c 300 "$tmp/body")"
expect 200 "" "$CO" -H "$A" -d "{\"prompt\":$LINES,\"max_tokens\":64,\"stop\":\"pool\",\"stream\":true}"
grep -q '"text":"[^"]*pool' "$tmp/body" && bad "stop: a stream sent the stop string"
# top_k 1 and min_p 1 leave one candidate: any seed draws the greedy text.
expect 200 "" "$CO" -H "$A" -d "{\"prompt\":$LINES,\"max_tokens\":12}"
greedy=$(js 'b.choices[0].text')
for f in '"top_k":1' '"min_p":1'; do
	expect 200 "" "$CO" -H "$A" -d "{\"prompt\":$LINES,\"max_tokens\":12,\"temperature\":1.5,$f}"
	[ "$(js 'b.choices[0].text')" = "$greedy" ] || bad "$f at temperature 1.5 is not greedy"
done
expect 400 invalid_request "$CO" -H "$A" -d "{\"prompt\":$LINES,\"min_p\":1.5}"
# n: that many choices, usage summed; streamed, each index and one [DONE].
expect 200 "" "$CO" -H "$A" -d "{\"prompt\":$LINES,\"max_tokens\":6,\"n\":3,\"temperature\":1}"
[ "$(js 'b.choices.map((c) => c.index).join()')" = 0,1,2 ] || bad "n 3: $(head -c 300 "$tmp/body")"
expect 200 "" "$CH" -H "$A" -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"n\":2,\"stream\":true}"
[ "$(grep -c '"index":1' "$tmp/body")" -ge 2 ] && [ "$(grep -c '^data: \[DONE\]' "$tmp/body")" = 1 ] ||
	bad "n 2 streamed: $(head -c 600 "$tmp/body")"
expect 400 invalid_request "$CH" -H "$A" -H 'X-Kvmem-Conversation: nn' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"n\":2}"
# logprobs: one entry per token of the answer, log probabilities, the
# greedy token first among its alternatives.
expect 200 "" "$CH" -H "$A" -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"logprobs\":true,\"top_logprobs\":2}"
[ "$(js 'const l = b.choices[0].logprobs.content; l.length > 0 && l.map((e) => e.token).join("") === b.choices[0].message.content && l.every((e) => e.logprob <= 0 && e.top_logprobs.length === 2 && e.top_logprobs[0].token === e.token && e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob)')" = true ] ||
	bad "logprobs (chat): $(head -c 600 "$tmp/body")"
expect 200 "" "$CO" -H "$A" -d "{\"prompt\":$ASK,\"logprobs\":1}"
[ "$(js 'const l = b.choices[0].logprobs; l.tokens.length === l.token_logprobs.length && l.tokens.length === l.top_logprobs.length && l.tokens.length > 0')" = true ] ||
	bad "logprobs (completions): $(head -c 600 "$tmp/body")"
expect 400 invalid_request "$CH" -H "$A" -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"top_logprobs\":2}"
# ignore_eos: an answer that stops runs on to max_tokens; the greedy draw the
# session makes (kvmem_session_draw: the best token, unless it is a stop) and
# the one over the masked logits (which logprobs take) are the same tokens.
expect 200 "" "$CO" -H "$A" -d "{\"prompt\":$ASK,\"max_tokens\":40}"
[ "$(js 'b.choices[0].finish_reason')" = stop ] || bad "ignore_eos: without it the answer did not stop: $(head -c 300 "$tmp/body")"
expect 200 "" "$CO" -H "$A" -d "{\"prompt\":$ASK,\"max_tokens\":40,\"ignore_eos\":true}"
drawn=$(js 'JSON.stringify([b.choices[0].text, b.choices[0].finish_reason, b.usage.completion_tokens])')
expect 200 "" "$CO" -H "$A" -d "{\"prompt\":$ASK,\"max_tokens\":40,\"ignore_eos\":true,\"logprobs\":1}"
masked=$(js 'JSON.stringify([b.choices[0].text, b.choices[0].finish_reason, b.usage.completion_tokens])')
[ "$drawn" = "$masked" ] && [ "$(js 'b.usage.completion_tokens')" = 40 ] ||
	bad "ignore_eos: drawn by the session $drawn, over the masked logits $masked"
# response_format: json_object is a constraint; a vocabulary with no '{'
# cannot meet it (agentlang): 400. Others are refused.
expect 400 invalid_request "$CH" -H "$A" -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"response_format\":{\"type\":\"json_object\"}}"
expect 400 invalid_request "$CH" -H "$A" -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}}"
expect 200 "" "$CH" -H "$A" -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"response_format\":{\"type\":\"text\"}}"
# Accepted as OpenAI accepts them.
expect 200 "" "$CH" -H "$A" -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"store\":true,\"metadata\":{\"team\":\"ops\"},\"service_tier\":\"auto\",\"reasoning_effort\":\"low\",\"user\":\"u1\"}"
expect 400 invalid_request "$CH" -H "$A" -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"service_tier\":\"gold\"}"
expect 400 invalid_request "$CH" -H "$A" -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"metadata\":{\"a\":1}}"
expect 400 invalid_request "$CH" -H "$A" -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"reasoning_effort\":\"max\"}"

# ---- tokenize, detokenize -------------------------------------------------------------------------------
expect 200 "" "$BASE/tokenize" -H "$A" -d "{\"prompt\":$ASK}"
ids=$(js 'JSON.stringify(b.tokens)')
[ "$(js 'b.count === b.tokens.length && b.max_model_len === 2048')" = true ] || bad "tokenize: $(cat "$tmp/body")"
expect 200 "" "$BASE/v1/detokenize" -H "$A" -d "{\"tokens\":$ids}"
[ "$(js 'JSON.stringify(b.prompt)')" = "$ASK" ] || bad "detokenize: $(cat "$tmp/body") for $ASK"
expect 200 "" "$BASE/tokenize" -H "$A" -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}]}"
[ "$(js 'b.count')" = 20 ] || bad "tokenize messages: $(cat "$tmp/body") (the chat of 20 prompt tokens)"
expect 400 invalid_request "$BASE/detokenize" -H "$A" -d '{"tokens":[999999]}'

# ---- conversations listed, read, deleted -------------------------------------------------------------------
expect 200 "" "$BASE/v1/conversations" -H "$A"
[ "$(js 'b.data.map((c) => c.id).join()')" = "lost,rp,sd1a,sd1b,sd2a,sd2b,sd3a,sd3b,sd4a,sd4b" ] &&
	[ "$(js 'b.data[1].open && !b.has_more')" = true ] || bad "list: $(cat "$tmp/body")"
expect 200 "" "$BASE/v1/conversations?limit=2" -H "$A"
[ "$(js 'b.data.map((c) => c.id).join() + " " + b.has_more')" = "lost,rp true" ] || bad "list, limit 2: $(cat "$tmp/body")"
expect 200 "" "$BASE/v1/conversations?after=sd4a" -H "$A"
[ "$(js 'b.data.map((c) => c.id).join() + " " + b.has_more')" = "sd4b false" ] || bad "list, after sd4a: $(cat "$tmp/body")"
expect 200 "" "$BASE/v1/conversations/rp" -H "$A"
[ "$(js 'b.turns === 1 && b.messages.length === 2 && b.messages[1].role')" = assistant ] || bad "get: $(cat "$tmp/body")"
expect 200 "" -X DELETE "$BASE/v1/conversations/rp" -H "$A"
[ "$(js 'b.deleted')" = true ] && [ ! -e "$KVMEM_HOME/serve/conversations/rp" ] || bad "delete: $(cat "$tmp/body")"
expect 404 conversation_not_found "$BASE/v1/conversations/rp" -H "$A"
expect 404 conversation_not_found -X DELETE "$BASE/v1/conversations/rp" -H "$A"
expect 401 invalid_api_key "$BASE/v1/conversations"
# Deleted, the id begins again.
expect 200 "" "$CH" -H "$A" -H 'X-Kvmem-Conversation: rp' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}]}" &&
	[ "$(js 'b.kvmem.workspace_tokens')" = 24 ] || bad "a deleted id did not begin again: $(cat "$tmp/body")"

# ---- CORS ------------------------------------------------------------------------------------------------------
got=$(curl -s -o /dev/null -D "$tmp/head" -w '%{http_code}' -X OPTIONS "$CH" -H 'Origin: https://app.example' \
	-H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization, content-type')
[ "$got" = 204 ] && grep -qi '^Access-Control-Allow-Headers:.*Authorization' "$tmp/head" &&
	grep -qi '^Access-Control-Allow-Origin: \*' "$tmp/head" || bad "CORS preflight: $got $(cat "$tmp/head")"
curl -s -D "$tmp/head" -o /dev/null "$BASE/health"
grep -qi '^Access-Control-Allow-Origin: \*' "$tmp/head" || bad "CORS: no header on an answer"

# ---- /metrics --------------------------------------------------------------------------------------------------
for m in kvmem_batch_size kvmem_batch_size_max kvmem_queue_waiting kvmem_requests_running \
	kvmem_tier_device_bytes kvmem_tier_host_bytes kvmem_tier_disk_bytes kvmem_batch_decode_units_total; do
	curl -s -H "$A" "$BASE/metrics" | grep -q "^$m [0-9]" || bad "/metrics has no $m"
done
[ "$(curl -s -H "$A" "$BASE/metrics" | sed -n 's/^kvmem_tier_host_bytes //p')" -gt 0 ] || bad "/metrics: no host bytes with a conversation open"
# What the pool holds, not its size: some, and less than all of it.
used=$(curl -s -H "$A" "$BASE/metrics" | sed -n 's/^kvmem_tier_host_used_bytes //p')
size=$(curl -s -H "$A" "$BASE/metrics" | sed -n 's/^kvmem_tier_host_bytes //p')
[ -n "$used" ] && [ "$used" -gt 0 ] && [ "$used" -lt "$size" ] ||
	bad "/metrics: host pool in use '$used' of $size with a conversation open"
# The rounds' wall times, a Prometheus histogram: cumulative buckets up to
# +Inf, which is the count and the rounds that ran units; a sum and the
# longest round, the longest no more than the sum.
curl -s -H "$A" "$BASE/metrics" >"$tmp/metrics"
node -e '
	const t = require("fs").readFileSync(process.argv[1], "utf8");
	const v = (re) => { const m = re.exec(t); return m ? +m[1] : NaN; };
	const b = [...t.matchAll(/^kvmem_round_seconds_bucket\{le="([^"]+)"\} (\d+)$/gm)].map((m) => [m[1], +m[2]]);
	const inf = b.length ? b[b.length - 1] : ["", NaN];
	const count = v(/^kvmem_round_seconds_count (\d+)$/m), rounds = v(/^kvmem_batch_rounds_total (\d+)$/m);
	const sum = v(/^kvmem_round_seconds_sum (\S+)$/m), max = v(/^kvmem_round_seconds_max (\S+)$/m);
	const ok = /# TYPE kvmem_round_seconds histogram/.test(t) && b.length === 12 && inf[0] === "+Inf" &&
		b.every((x, i) => !i || x[1] >= b[i - 1][1]) && inf[1] === count && count === rounds &&
		count > 0 && sum > 0 && max > 0 && max <= sum;
	if (!ok) { console.error(JSON.stringify({ b, count, rounds, sum, max })); process.exit(1); }' "$tmp/metrics" ||
	bad "/metrics: kvmem_round_seconds is not a histogram of the rounds"
# The draws made ahead of the rounds' units: the sampled requests above
# (n 3 at temperature 1) had theirs drawn so, in part of the rounds' time.
node -e '
	const t = require("fs").readFileSync(process.argv[1], "utf8");
	const v = (re) => { const m = re.exec(t); return m ? +m[1] : NaN; };
	const n = v(/^kvmem_round_predraws_total (\d+)$/m), s = v(/^kvmem_round_predraw_seconds_total (\S+)$/m);
	const rounds = v(/^kvmem_round_seconds_sum (\S+)$/m);
	if (!(n > 0 && s > 0 && s <= rounds)) { console.error(JSON.stringify({ n, s, rounds })); process.exit(1); }' "$tmp/metrics" ||
	bad "/metrics: kvmem_round_predraws_total / kvmem_round_predraw_seconds_total not the draws made ahead"
# The turns' session time by part: forwards ran, their time counted, and
# no part more than the rounds' wall time.
node -e '
	const t = require("fs").readFileSync(process.argv[1], "utf8");
	const parts = Object.fromEntries([...t.matchAll(/^kvmem_session_seconds_total\{part="(\w+)"\} (\S+)$/gm)].map((m) => [m[1], +m[2]]));
	const v = (re) => { const m = re.exec(t); return m ? +m[1] : NaN; };
	const rounds = v(/^kvmem_round_seconds_sum (\S+)$/m), fwds = v(/^kvmem_session_forwards_total (\d+)$/m);
	const ok = Object.keys(parts).length === 10 && parts.forward > 0 && fwds > 0 &&
		Object.values(parts).every((x) => x >= 0 && x <= rounds);
	if (!ok) { console.error(JSON.stringify({ parts, rounds, fwds })); process.exit(1); }' "$tmp/metrics" ||
	bad "/metrics: kvmem_session_seconds_total is not the turns' session time"
serve_stop

# ---- the limits a request meets: --max-n, --max-conversation-tokens, --max-batch ---------------
serve_start --max-n 2 --max-conversation-tokens 60 --max-batch 2 || exit 1
CH="$BASE/v1/chat/completions"
CO="$BASE/v1/completions"
expect 400 "" "$CO" -d '{"prompt":"? api.conf db.port =","max_tokens":2,"n":3}' &&
	grep -q '"param":"n"' "$tmp/body" && grep -q '1\.\.2' "$tmp/body" || bad "n 3 under --max-n 2: $(head -c 300 "$tmp/body")"
expect 200 "" "$CO" -d '{"prompt":"? api.conf db.port =","max_tokens":2,"n":2}' &&
	[ "$(js 'b.choices.length')" = 2 ] || bad "n 2 under --max-n 2: $(head -c 300 "$tmp/body")"
# A chat turn whose prompt is one chunk took one prefill round (its closing
# tokens, prefilled after the answer, are not its prompt's).
expect 200 "" "$CH" -H 'X-Kvmem-Conversation: cap' -d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK}],\"max_tokens\":8}" &&
	[ "$(js 'b.kvmem.prefill_rounds')" = 1 ] || bad "a one-chunk chat turn's prefill_rounds: $(js 'b.kvmem')"
expect 400 conversation_full "$CH" -H 'X-Kvmem-Conversation: cap' \
	-d "{\"messages\":[{\"role\":\"user\",\"content\":$ASK},{\"role\":\"assistant\",\"content\":\"5432\"},{\"role\":\"user\",\"content\":$LINES}],\"max_tokens\":8}"
# Four streams at once under --max-batch 2: no round ran more than two units.
pids=""
for i in 1 2 3 4; do
	curl -s -o /dev/null "$CO" -d "{\"prompt\":$LINES,\"max_tokens\":300,\"ignore_eos\":true,\"stream\":true}" &
	pids="$pids $!"
done
wait $pids
max=$(curl -s "$BASE/metrics" | sed -n 's/^kvmem_batch_size_max //p')
[ -n "$max" ] && [ "$max" -ge 2 ] && [ "$max" -le 2 ] || bad "--max-batch 2: the largest round ran '$max' units"
serve_stop
grep -E "ERROR: AddressSanitizer|runtime error" "$tmp/serve.err" && bad "sanitizer report"
cli_done serve_api
