#!/bin/bash
# What an idle open conversation of kvmem serve holds (issue 24): its pages
# live in the host pool the server's conversations share (--host-cap), not
# in a pool and stage-out buffer of its own. The server's resident memory
# (VmRSS) is read before and after opening conversations that then sit idle:
#   - 16 small ones (a few lines each): at most 2 MB each;
#   - 8 of about 1.2K tokens each under --host-cap 4M, views kept
#     (--idle-release 0): at most 20 MB each. Such a conversation's view
#     (K and V as fp32, and raw K, for its tokens) is about 12 MB of that
#     with the embedded model; its pages (3.7 MB) stay within the shared
#     4 MB. Before, each held its own pool and stage-out buffer: 52 MB each
#     (1.1 MB each for the small ones).
#   - the same idle past --idle-release 0.5: each gives its view up
#     (/metrics counts them): at most 2 MB each (issue #24's target).
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

serve_start --max-tokens 4 --host-cap 4M --idle-release 0 || exit 1
grow 8 1 5000
big=$each
echo "conversations of about 1.2K tokens, views kept: $big kB each ($(node -e \
	'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).usage.prompt_tokens)' \
	"$tmp/answer.json") tokens in the last)"
[ "$big" -le 20480 ] || bad "an idle 1.2K-token conversation holds $big kB (at most 20480)"
serve_stop

# The same conversations idle past --idle-release: each gives its view up
# (its pages stay in the shared pool and on disk), and /metrics says so.
metric() { curl -s "$BASE/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
released() {	# wait (at most 20 s) until N views were given up
	local i
	for i in $(seq 1 100); do
		[ "$(metric kvmem_views_released_total)" -ge "$1" ] 2>/dev/null && return 0
		sleep 0.2
	done
	return 1
}
serve_start --max-tokens 4 --host-cap 4M --idle-release 0.5 || exit 1
ask w2-1 0 5000; ask w2-2 1000 5000
released 2 || bad "the first two conversations' views were not given up"
r0=$(rss)
for i in $(seq 1 8); do ask "c2-$i" $((2000 + i * 997)) 5000; done
released 10 || bad "views given up: $(metric kvmem_views_released_total), want 10"
sleep 0.5
r1=$(rss)
away=$(((r1 - r0) / 8))
echo "conversations of about 1.2K tokens, views given up: $away kB each," \
	"$(metric kvmem_conversations_without_view) of $(metric kvmem_conversations_open) open without a view"
[ "$away" -le 2048 ] || bad "an idle 1.2K-token conversation whose view was given up holds $away kB (at most 2048)"
[ "$(metric kvmem_conversations_without_view)" = 10 ] ||
	bad "kvmem_conversations_without_view $(metric kvmem_conversations_without_view), want 10"
serve_stop
cli_done serve_memory
