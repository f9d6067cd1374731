#!/bin/bash
# What an idle open conversation of kvmem serve holds (issue 24): its pages
# live in the host pool the server's conversations share (--host-cap), not
# in a pool and stage-out buffer of its own. The server's resident memory
# (VmRSS) is read before and after opening conversations that then sit idle:
#   - 16 small ones (a few lines each): at most 2 MB each;
#   - 8 of about 1.2K tokens each under --host-cap 4M: at most 20 MB each.
#     Such a conversation's view (K and V as fp32, and raw K, for its
#     tokens) is about 12 MB of that with the embedded model; its pages
#     (3.7 MB) stay within the shared 4 MB. Before, each held its own pool
#     and stage-out buffer: 52 MB each (1.1 MB each for the small ones).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../serve/lib.sh"
command -v node >/dev/null || { echo "skip: node is not installed"; exit 77; }
cli_setup serve_memory
serve_corpus "$tmp/corpus.txt" "$seed" 40000

rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$SPID/status"; }
# ask ID FROM CHARS: a completion in conversation ID whose prompt is the
# corpus's whole lines from character FROM for about CHARS characters.
ask() {
	node -e 'const t = require("fs").readFileSync(process.argv[1], "utf8");
		const a = t.indexOf("\n", +process.argv[2]) + 1;
		const b = t.lastIndexOf("\n", a + +process.argv[3]) + 1;
		process.stdout.write(JSON.stringify({ prompt: t.slice(a, b), max_tokens: 2 }))' \
		"$tmp/corpus.txt" "$2" "$3" >"$tmp/req.json"
	curl -s "$BASE/v1/completions" -H "X-Kvmem-Conversation: $1" -d @"$tmp/req.json" \
		-o "$tmp/answer.json" -w '%{http_code}' | grep -q '^200$' ||
		bad "conversation $1: $(head -c 300 "$tmp/answer.json")"
}
# grow N FROM CHARS: kB of resident memory each of N new conversations adds,
# in $each.
grow() {
	local r0 r1 i
	# Two first: the engine's own buffers and the pool's first pages.
	ask "w$2-1" 0 "$3"; ask "w$2-2" 1000 "$3"
	r0=$(rss)
	for i in $(seq 1 "$1"); do ask "c$2-$i" $((2000 + i * 997)) "$3"; done
	sleep 0.5
	r1=$(rss)
	each=$(((r1 - r0) / $1))
}

serve_start --max-tokens 4 || exit 1
grow 16 0 60
small=$each
serve_stop
echo "small conversations: $small kB each"
[ "$small" -le 2048 ] || bad "an idle small conversation holds $small kB (at most 2048)"

serve_start --max-tokens 4 --host-cap 4M || exit 1
grow 8 1 5000
big=$each
echo "conversations of about 1.2K tokens: $big kB each ($(node -e \
	'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).usage.prompt_tokens)' \
	"$tmp/answer.json") tokens in the last)"
[ "$big" -le 20480 ] || bad "an idle 1.2K-token conversation holds $big kB (at most 20480)"
serve_stop
cli_done serve_memory
