#!/bin/bash
# kvmempolicy, the offline side (the module's victim hook is not there yet):
#  - on the built-in access sequence (a hot set every third step, scans
#    between) each example policy raises the host hit rate well above LRU
#    order's, and protect_recent with a window too short to see the reuse
#    (-o 2) does not: the verdicts, not an accident, make the difference;
#  - the same sequence written out and replayed from the file gives the
#    same figures;
#  - a session recorded with kvmemsnoop -a -j replays with exactly the
#    session's fetched pages (host_hits + host_misses) as accesses;
#  - both entry points of each policy, the module's reclaim hook included,
#    pass the verifier (--check);
#  - live mode without the module: one line, non-zero.
. "$(dirname "$0")/../bpf/lib.sh"
bpf_setup
P=$BPF/kvmempolicy

val() { grep -o "\"$2\":[0-9.]*" <<<"$1" | cut -d: -f2; }
above() { awk -v a="$1" -v b="$2" -v m="$3" 'BEGIN { exit !(a >= b + m) }'; }

for pol in protect_recent score_aware; do
	out=$("$P" -P "$pol" --synthetic -j 2>&1) || { bad "$pol: $out"; continue; }
	lru=$(val "$out" lru_hit_rate)
	mine=$(val "$out" policy_hit_rate)
	above "$mine" "$lru" 0.2 || bad "$pol: hit rate $mine, LRU $lru: expected at least +0.2"
	[ "$(val "$out" keep)" -gt 0 ] || bad "$pol: no page kept: $out"
done
out=$("$P" -P protect_recent -o 2 --synthetic -j 2>&1) || bad "-o 2: $out"
above "$(val "$out" policy_hit_rate)" "$(val "$out" lru_hit_rate)" 0.05 &&
	bad "protect_recent over 2 steps cannot see a reuse every 3 steps, yet: $out"

"$P" --synthetic-trace >"$tmp/syn.jsonl" || bad "--synthetic-trace failed"
a=$("$P" -P protect_recent --synthetic -j | sed 's/"trace":"[^"]*",//')
b=$("$P" -P protect_recent --replay "$tmp/syn.jsonl" --cap 200 -j | sed 's/"trace":"[^"]*",//')
[ "$a" = "$b" ] || bad "the written sequence replays otherwise: $a / $b"

if tool_start "$tmp/rec.jsonl" "$BPF/kvmemsnoop" -a -j -b "$KV"; then
	session "$tmp/ws"
	tool_stop
	out=$("$P" -P protect_recent --replay "$tmp/rec.jsonl" -j 2>&1) || bad "replay of a recording: $out"
	same "accesses replayed" "$(val "$out" accesses)" \
		"$(($(stat "$tmp/ws" host_hits) + $(stat "$tmp/ws" host_misses)))"
	same "steps replayed" "$(val "$out" steps)" "$(stat "$tmp/ws" steps)"
fi

for pol in protect_recent score_aware; do
	out=$("$P" -P "$pol" --check 2>&1) || bad "$pol --check: $out"
	[ "$out" = "$pol: choose and tp_reclaim passed the verifier" ] || bad "$pol --check: $out"
done

if [ -d /sys/module/kvmem ]; then
	echo "the kvmem module is loaded: live mode is not checked for its refusal"
else
	"$P" -P protect_recent 1 1 >"$tmp/live.out" 2>"$tmp/live.err" && bad "live mode without the module succeeded"
	[ "$(wc -l <"$tmp/live.err")" -eq 1 ] && grep -q "module is not loaded" "$tmp/live.err" ||
		bad "live mode without the module: $(cat "$tmp/live.err")"
fi

[ $fail -eq 0 ] && echo "kvmempolicy: policies beat LRU where they should, replays agree"
exit $fail
