#!/bin/bash
# kvmem serve on a model with a tokenizer.json (the Qwen3 chat template) and
# tool calls whose arguments come as a JSON object, which transformers takes
# and renders with its tojson (Python's json.dumps, ensure_ascii=False): the
# server must hold and render exactly that text (0.1 stays 0.1, 1e16 is
# 1e+16, a control character is \u001f), in the tools too, and a string
# argument as it is. The tokenizer is written here: the 256 bytes, three
# special tokens and no merges, so prompt_tokens is the rendered text's length
# (a special token counting one) and tells whether the server rendered what
# transformers renders, written down below (jinja2 3.1.6 with transformers'
# settings and Qwen3's template).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../serve/lib.sh"
cli_setup serve_tools
command -v node >/dev/null || { echo "skip: node is not installed"; exit 77; }
node -e '
	const bs = [];
	for (let b = 0; b < 256; b++)
		if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) bs.push(b);
	const vocab = {};
	let n = 0;
	for (let b = 0; b < 256; b++)
		vocab[String.fromCodePoint(bs.includes(b) ? b : 256 + n++)] = b;
	// Pieces no merge makes, so that any id the random model answers with
	// (up to its vocabulary of 1024) decodes.
	for (let id = 259; id < 1024; id++)
		vocab["x" + id] = id;
	const added = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
		.map((content, i) => ({ id: 256 + i, content, special: true }));
	require("fs").writeFileSync(process.argv[1], JSON.stringify({ version: "1.0", added_tokens: added,
		normalizer: null, pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, use_regex: true },
		model: { type: "BPE", vocab, merges: [] } }));' "$M/tokenizer.json"

cat >"$tmp/req.json" <<'EOF'
{"model": "model", "max_tokens": 1,
 "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "number", "minimum": 0.1, "maximum": 1e16}}}}}],
 "messages": [{"role": "user", "content": "Weather in Oslo?"},
 {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather",
   "arguments": {"city": "Oslo", "days": [1, 2.5, 1e16, 0.1], "unit": null, "ok": true, "note": "ß\u001f\"\\\n/"}}}]},
 {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": -3}"}]}
EOF
# What transformers' apply_chat_template renders for it (add_generation_prompt).
cat >"$tmp/want.json" <<'EOF'
{"args": "{\"city\": \"Oslo\", \"days\": [1, 2.5, 1e+16, 0.1], \"unit\": null, \"ok\": true, \"note\": \"ß\\u001f\\\"\\\\\\n/\"}",
 "text": "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather of a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"number\", \"minimum\": 0.1, \"maximum\": 1e+16}}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": [1, 2.5, 1e+16, 0.1], \"unit\": null, \"ok\": true, \"note\": \"ß\\u001f\\\"\\\\\\n/\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": -3}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"}
EOF
# js EXPR: evaluate with raw (the request's text: JSON.stringify would write
# its 1e16 as an integer), req (parsed), want, body (the last answer) and rec
# (conversation tc's record) in scope; print the result.
js() {
	node -e 'const fs = require("fs"), rd = (f) => fs.existsSync(f) ? JSON.parse(fs.readFileSync(f, "utf8")) : null;
		const raw = fs.readFileSync(process.argv[1], "utf8"), req = JSON.parse(raw), want = rd(process.argv[2]);
		const body = rd(process.argv[3]), rec = rd(process.argv[4]);
		try { console.log(eval(process.argv[5])) } catch (e) { console.log(`(${e.message})`) }' "$tmp/req.json" "$tmp/want.json" "$tmp/body" \
		"$KVMEM_HOME/serve/conversations/tc/conversation.json" "$1"
}
# post BODY-FILE [CONVERSATION]: the answer in $tmp/body, its HTTP status printed.
post() {
	curl -s -o "$tmp/body" -w '%{http_code}' "$BASE/v1/chat/completions" ${2:+-H "X-Kvmem-Conversation: $2"} \
		--data-binary @"$1"
}

serve_start --model "$M" --name model || exit 1
want_tokens=$(js 'Buffer.byteLength(want.text.split(/<\|im_start\|>|<\|im_end\|>/).join("\x01"))')
[ "$(post "$tmp/req.json" tc)" = 200 ] || bad "object arguments: $(head -c 300 "$tmp/body")"
got=$(js 'body.usage.prompt_tokens')
[ "$got" = "$want_tokens" ] ||
	bad "object arguments: $got prompt tokens, transformers' rendering is $want_tokens"
[ "$(js 'rec.messages[1].tool_calls[0].arguments === want.args')" = true ] ||
	bad "object arguments held as $(js 'JSON.stringify(rec.messages[1].tool_calls[0].arguments)'), want $(js 'JSON.stringify(want.args)')"

# The same arguments as the string transformers would write: the same tokens.
js 'raw.replace(/"arguments": \{[^}]*\}/, () => "\"arguments\": " + JSON.stringify(want.args))' >"$tmp/req_str.json"
[ "$(post "$tmp/req_str.json")" = 200 ] && [ "$(js 'body.usage.prompt_tokens')" = "$want_tokens" ] ||
	bad "string arguments: $(head -c 300 "$tmp/body"), want $want_tokens prompt tokens"
# The conversation goes on with the object sent again: it is what it holds.
js 'raw.replace(/\]\}\s*$/, () => ", " + JSON.stringify(body.choices[0].message) +
	", {\"role\": \"user\", \"content\": \"thanks\"}]}")' >"$tmp/req2.json"
[ "$(post "$tmp/req2.json" tc)" = 200 ] || bad "the conversation's next turn: $(head -c 300 "$tmp/body")"
# Arguments neither a string nor an object are refused.
js 'req.messages[1].tool_calls[0].function.arguments = [1], JSON.stringify(req)' >"$tmp/req_bad.json"
[ "$(post "$tmp/req_bad.json")" = 400 ] && grep -q 'tool_calls\[0\].function must hold' "$tmp/body" ||
	bad "arguments as an array: $(head -c 300 "$tmp/body")"

# response_format json_object constrains a model of random weights: every
# answer begins an object, and one that stops is one object. The same
# model unconstrained does not (a '{' is one token of 1024).
cat >"$tmp/json.json" <<'EOF2'
{"model": "model", "max_tokens": 48, "temperature": 1, "n": 8, "seed": 5,
 "response_format": {"type": "json_object"}, "messages": [{"role": "user", "content": "An object, please."}]}
EOF2
[ "$(post "$tmp/json.json")" = 200 ] || bad "json_object: $(head -c 300 "$tmp/body")"
ok=$(node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
	let ok = b.choices.length === 8;
	for (const c of b.choices) {
		const t = c.message.content;
		ok &&= t.trimStart().startsWith("{");
		if (c.finish_reason === "stop") {
			try { const v = JSON.parse(t); ok &&= typeof v === "object" && !Array.isArray(v) && v !== null; }
			catch (e) { ok = false; }
		}
	}
	console.log(ok)' "$tmp/body")
[ "$ok" = true ] || bad "json_object: an answer that is not (a prefix of) one object: $(head -c 600 "$tmp/body")"
node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); delete r.response_format;
	require("fs").writeFileSync(process.argv[1], JSON.stringify(r))' "$tmp/json.json"
[ "$(post "$tmp/json.json")" = 200 ] && [ "$(node -e 'const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
	console.log(b.choices.filter((c) => c.message.content.trimStart().startsWith("{")).length)' "$tmp/body")" -lt 8 ] ||
	bad "json_object: the same model unconstrained began all its answers with '{' too"
serve_stop
grep -E "ERROR: AddressSanitizer|runtime error" "$tmp/serve.err" && bad "sanitizer report"
cli_done serve_tools
