#!/bin/bash
# kvmem serve --kv-dtype fp8: the views hold fp8 KV and new conversations
# keep fp8 pages (kvmem stat says so); a conversation goes on in a later
# turn and after a restart; the KV dtype is fixed when a conversation is
# made, so a server of the other kind answers 409 conversation_incompatible
# naming both dtypes, and still serves its own kind; a bad value is a usage
# error. The cuda backend's batched forward over fp8 views:
# tests/gpu/fp8batch27.sh.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../serve/lib.sh"
cli_setup serve_kv_dtype
command -v python3 >/dev/null || { echo "skip: python3 is not installed"; exit 77; }
command -v curl >/dev/null || { echo "skip: curl is not installed"; exit 77; }

if timeout 60 "$KVMEM" serve --model "$M" --tokenizer bytes --kv-dtype fp9 --port 0 \
	--data-dir "$tmp/d0" >"$tmp/out" 2>&1; then
	bad "--kv-dtype fp9 was taken"
else
	[ $? -eq 2 ] || bad "--kv-dtype fp9: not a usage error: $(cat "$tmp/out")"
	grep -qF -- "--kv-dtype wants bf16 or fp8, not 'fp9'" "$tmp/out" ||
		bad "--kv-dtype fp9: $(cat "$tmp/out")"
fi

# turn CONV PROMPT: a 6-token greedy completion; the status in $code, the
# body in $tmp/body.
turn() {
	local body
	body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[2], "max_tokens": 6,
		"temperature": 0, "conversation": sys.argv[1]}))' "$1" "$2")
	code=$(curl -s -o "$tmp/body" -w '%{http_code}' "$BASE/v1/completions" -d "$body")
}
field() { python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' \
	"$tmp/body" "$1"; }
p1='$ cat api.conf
api.conf db.port = 5432
? api.conf db.port ='

serve_start --model "$M" --tokenizer bytes --data-dir "$tmp/data" --kv-dtype fp8 || exit 1
grep -q "kvmem serve: model .*, fp8 KV)" "$tmp/serve.out" ||
	bad "banner does not say fp8 KV: $(head -1 "$tmp/serve.out")"
turn c1 "$p1"
[ "$code" = 200 ] || bad "fp8 server, c1: $code $(cat "$tmp/body")"
a1=$(field 'b["choices"][0]["text"]')
turn c1 "$p1$a1
? x ="
[ "$code" = 200 ] || bad "fp8 server, c1's second turn: $code $(cat "$tmp/body")"
[ "$(field 'b["usage"]["prompt_tokens"]')" -lt 10 ] ||
	bad "c1's second turn prefilled its history again: $(cat "$tmp/body")"
a2=$(field 'b["choices"][0]["text"]')
serve_stop
out=$("$KVMEM" stat "$tmp/data/conversations/c1/ws" 2>&1) || bad "stat c1: $out"
echo "$out" | grep -qw fp8 || bad "c1's pages are not fp8: $out"

# A server of the backend's own KV: c1 refused, naming both; c2 is its own.
serve_start --model "$M" --tokenizer bytes --data-dir "$tmp/data" || exit 1
turn c1 "$p1"
[ "$code" = 409 ] || bad "c1 on a server without --kv-dtype fp8: $code $(cat "$tmp/body")"
grep -q "conversation_incompatible" "$tmp/body" && grep -q "fp8" "$tmp/body" &&
	grep -q "f32" "$tmp/body" || bad "c1's refusal does not name both dtypes: $(cat "$tmp/body")"
turn c2 "$p1"
[ "$code" = 200 ] || bad "c2 on the f32 server: $code $(cat "$tmp/body")"
serve_stop

# fp8 again: c1 goes on from its pages (a short prompt), c2 is refused.
serve_start --model "$M" --tokenizer bytes --data-dir "$tmp/data" --kv-dtype fp8 || exit 1
turn c1 "$p1$a1
? x =$a2
? y ="
[ "$code" = 200 ] || bad "c1 after the restart: $code $(cat "$tmp/body")"
[ "$(field 'b["usage"]["prompt_tokens"]')" -lt 10 ] ||
	bad "c1 after the restart prefilled its history again: $(cat "$tmp/body")"
turn c2 "$p1"
[ "$code" = 409 ] || bad "c2 on the fp8 server: $code $(cat "$tmp/body")"
serve_stop
cli_done serve_kv_dtype
