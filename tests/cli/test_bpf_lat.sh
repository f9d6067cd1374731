#!/bin/bash
# kvmemlat: while a scripted session runs, each histogram's count and sum
# of nanoseconds equal the pager's counters exactly (page_in: read_requests
# and read_ns; stage_out: blocks_out and write_ns; commit: commits and
# commit_ns; step: steps; backpressure: backpressure_waits and _ns), and
# the slots add up to the count; the text output has bcc's histogram.
. "$(dirname "$0")/../bpf/lib.sh"
bpf_setup

if tool_start "$tmp/lat.json" "$BPF/kvmemlat" -j -b "$KV" 1; then
	session "$tmp/ws"
	tool_stop
	ws=$tmp/ws
	k() { grep "\"kind\":\"$1\"" "$tmp/lat.json"; }
	same "page_in count" "$(jsum "$tmp/lat.json" count '"kind":"page_in"')" "$(stat "$ws" read_requests)"
	same "page_in sum_ns" "$(jsum "$tmp/lat.json" sum_ns '"kind":"page_in"')" "$(stat "$ws" read_ns)"
	same "stage_out count" "$(jsum "$tmp/lat.json" count '"kind":"stage_out"')" "$(stat "$ws" blocks_out)"
	same "stage_out sum_ns" "$(jsum "$tmp/lat.json" sum_ns '"kind":"stage_out"')" "$(stat "$ws" write_ns)"
	same "commit count" "$(jsum "$tmp/lat.json" count '"kind":"commit"')" "$(stat "$ws" commits)"
	same "commit sum_ns" "$(jsum "$tmp/lat.json" sum_ns '"kind":"commit"')" "$(stat "$ws" commit_ns)"
	same "step count" "$(jsum "$tmp/lat.json" count '"kind":"step"')" "$(stat "$ws" steps)"
	same "backpressure count" "$(jsum "$tmp/lat.json" count '"kind":"backpressure"')" \
		"$(stat "$ws" backpressure_waits)"
	same "backpressure sum_ns" "$(jsum "$tmp/lat.json" sum_ns '"kind":"backpressure"')" \
		"$(stat "$ws" backpressure_ns)"
	[ "$(stat "$ws" read_requests)" -gt 0 ] || bad "the session read nothing back"
	# Each line's slots add up to its count.
	while read -r line; do
		c=$(echo "$line" | grep -o '"count":[0-9]*' | cut -d: -f2)
		s=$(echo "$line" | grep -o '"slots":\[[0-9,]*\]' | grep -o '[0-9]*' | awk '{ s += $1 } END { print s + 0 }')
		[ "$c" = "$s" ] || bad "slots add up to $s, count $c: $line"
	done <"$tmp/lat.json"
	grep -q '"kind":"fetch"' "$tmp/lat.json" || bad "no fetch histogram"
fi

# -x page_in: that histogram (and its per-request probe) is left out, the
# others still count exactly; an unknown name is refused.
if tool_start "$tmp/latx.json" "$BPF/kvmemlat" -j -x page_in,backpressure -b "$KV" 1; then
	session "$tmp/wsx"
	tool_stop
	! grep -Eq '"kind":"(page_in|backpressure)"' "$tmp/latx.json" ||
		bad "-x page_in,backpressure: still there: $(grep -E 'page_in|backpressure' "$tmp/latx.json" | head -1)"
	[ "$(stat "$tmp/wsx" read_requests)" -gt 0 ] || bad "-x: the session read nothing back"
	same "-x: stage_out count" "$(jsum "$tmp/latx.json" count '"kind":"stage_out"')" \
		"$(stat "$tmp/wsx" blocks_out)"
	same "-x: step count" "$(jsum "$tmp/latx.json" count '"kind":"step"')" "$(stat "$tmp/wsx" steps)"
fi
if "$BPF/kvmemlat" -x page_in,nope -b "$KV" >"$tmp/badx.out" 2>&1; then
	bad "-x nope: accepted"
else
	grep -q "no histogram named 'nope'" "$tmp/badx.out" || bad "-x nope: $(head -1 "$tmp/badx.out")"
fi

# Text: one summary at Ctrl-C, bcc's layout, microseconds; -M milliseconds.
if tool_start "$tmp/lat.txt" "$BPF/kvmemlat" -b "$KV"; then
	session "$tmp/ws2"
	tool_stop
	grep -q "^page_in: NVMe read requests.*count $(stat "$tmp/ws2" read_requests)," "$tmp/lat.txt" ||
		bad "text: no page_in heading with its count: $(head -5 "$tmp/lat.txt")"
	grep -q "^ *usecs *: count *distribution" "$tmp/lat.txt" || bad "text: no histogram heading"
	grep -Eq "^ +[0-9]+ -> [0-9]+ +: [0-9]+ +\|\**  *\|$" "$tmp/lat.txt" || bad "text: no histogram rows"
fi
if tool_start "$tmp/latm.txt" "$BPF/kvmemlat" -M -b "$KV"; then
	session "$tmp/ws3"
	tool_stop
	grep -q "^ *msecs *: count" "$tmp/latm.txt" || bad "-M: not in milliseconds: $(head -4 "$tmp/latm.txt")"
fi

[ $fail -eq 0 ] && echo "kvmemlat: counts and sums equal the pager's counters"
exit $fail
