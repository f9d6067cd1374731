#!/bin/bash
# kvmemsnoop: the event lines of a scripted session add up to the pager's
# counters exactly: "in" lines (one per page read) = pages_in, their bytes
# = bytes_in; "out" lines (one per block) = blocks_out, bytes = bytes_out;
# evict = evictions; prefetch = prefetch_pages; with -a, hit lines from
# the host = host_hits, from staging = staging_hits, miss = host_misses,
# step = steps; nothing lost. Then the text columns and -T.
. "$(dirname "$0")/../bpf/lib.sh"
bpf_setup

n() { grep -c "\"event\":\"$2\"" "$1"; }

for all in "" -a; do
	out=$tmp/snoop$all.json
	tool_start "$out" "$BPF/kvmemsnoop" $all -j -b "$KV" || continue
	session "$tmp/ws$all"
	tool_stop
	ws=$tmp/ws$all
	grep -q "lost" "$out.err" && bad "events lost: $(cat "$out.err")"
	same "in lines" "$(n "$out" in)" "$(stat "$ws" pages_in)"
	same "in bytes" "$(jsum "$out" bytes '"event":"in"')" "$(stat "$ws" bytes_in)"
	same "out lines" "$(n "$out" out)" "$(stat "$ws" blocks_out)"
	same "out bytes" "$(jsum "$out" bytes '"event":"out"')" "$(stat "$ws" bytes_out)"
	same "evict lines" "$(n "$out" evict)" "$(stat "$ws" evictions)"
	same "prefetch lines" "$(n "$out" prefetch)" "$(stat "$ws" prefetch_pages)"
	same "error lines" "$(n "$out" error)" 0
	if [ -n "$all" ]; then
		same "hit lines (host)" "$(grep '"event":"hit"' "$out" | grep -c '"move":"host"')" \
			"$(stat "$ws" host_hits)"
		same "hit lines (staging)" "$(grep '"event":"hit"' "$out" | grep -c '"move":"stage>host"')" \
			"$(stat "$ws" staging_hits)"
		same "miss lines" "$(n "$out" miss)" "$(stat "$ws" host_misses)"
		same "step lines" "$(n "$out" step)" "$(stat "$ws" steps)"
	else
		[ "$(n "$out" hit)" -eq 0 ] || bad "hit lines without -a"
	fi
	# page = block * layers + layer on every page line (4 layers)
	bad_geom=$(grep '"layer":[0-9]' "$out" | awk -F'[:,]' '{
		for (i = 1; i < NF; i++) { if ($i == "\"page\"") p = $(i+1); if ($i == "\"block\"") b = $(i+1);
		if ($i == "\"layer\"") l = $(i+1); if ($i == "\"layers\"") L = $(i+1) }
		if (p != b * L + l) print }' | head -2)
	[ -z "$bad_geom" ] || bad "page, block and layer disagree: $bad_geom"
done

if tool_start "$tmp/snoop.txt" "$BPF/kvmemsnoop" -T -b "$KV"; then
	session "$tmp/wst"
	tool_stop
	grep -q "^TIME *PID *WORKSPACE *EVENT *PAGE *BLOCK *LAYER *MOVE *BYTES *LAT(us)" "$tmp/snoop.txt" ||
		bad "text: no heading: $(head -3 "$tmp/snoop.txt")"
	grep -Eq "^[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6} +[0-9]+ +[^ ]*wst +in +[0-9]+ +[0-9]+ +[0-9]+ +nvme>host +16384 +[0-9.]+$" \
		"$tmp/snoop.txt" || bad "text: no in line: $(grep ' in ' "$tmp/snoop.txt" | head -2)"
	grep -Eq " out +[0-9]+ +[0-9]+ +\* +host>nvme " "$tmp/snoop.txt" || bad "text: no out line"
fi

[ $fail -eq 0 ] && echo "kvmemsnoop: event lines equal the pager's counters"
exit $fail
