#!/bin/sh
# kvmem-vm-observe WS: the BPF tools on the kernel module's tracepoints, in
# the VM of `make vmtest` (tests/vm/session.sh starts it before the session
# over --pager kmod and stops it with SIGINT after; its output shows up as
# "# observe:" lines of the VM log, not judged there; this script compares
# the tools' totals with the module's own counters and says "same" or
# "DIFFERENT" per figure, exit 1 on a difference). The tools come from
# $(BUILD)/bpf, built with this machine's vmlinux.h: their raw_tp programs
# use no kernel type, so they load on the VM's 6.1 kernel as they are.
# Prints each tool's totals, and the policy's answers on kvmem_reclaim.
ws=${1:-?}
out=/tmp/kvmem-vm-observe
mkdir -p $out
echo "observing the module's tracepoints for $ws"
kvmemtop -m -j 3600 >$out/top 2>&1 &
top=$!
kvmemlat -m -j >$out/lat 2>&1 &
lat=$!
kvmemsnoop -m -a -j >$out/snoop 2>&1 &
snoop=$!
kvmempolicy -P /usr/bin/protect_recent.bpf.o -m -j 1 >$out/policy 2>&1 &
policy=$!
stop() {
	kill -INT $top $lat $snoop $policy 2>/dev/null
	for p in $top $lat $snoop $policy; do
		wait $p
		echo "exit $?"
	done
	echo "kvmemtop -m:"
	cat $out/top
	echo "kvmemlat -m (kind count sum_ns):"
	if ! grep -o '"kind":"[a-z_]*","unit":"[a-z]*","count":[0-9]*,"sum_ns":[0-9]*' $out/lat; then
		cat $out/lat
		# the verifier's log of the refused program, for this kernel
		kvmemlat -m -v 1 1 2>&1 | grep -v '^libbpf: \(elf\|sec\|map\|prog\|CO-RE\|loaded\|usdt\)' |
			tail -n 40
	fi
	echo "kvmemsnoop -m -a (events by kind):"
	grep -o '"event":"[a-z_]*"' $out/snoop | sort | uniq -c
	grep -v '^{' $out/snoop
	echo "kvmempolicy protect_recent on kvmem_reclaim (last intervals):"
	tail -n 5 $out/policy
	compare
}

# sum FILE KEY: the sum of "KEY":N over the JSON lines of FILE.
sum() { grep -o "\"$2\":[0-9]*" "$1" | cut -d: -f2 | awk '{ s += $1 } END { print s + 0 }'; }

# The module's own counters, as the session's kvmem run printed them
# ("kernel module /dev/kvmem: F faults, H hits, R pages read (B bytes),
# P prefetched, E evictions, U filled by O_DIRECT, ..." per part, beside the
# workspace), against kvmemtop's and kvmemsnoop's totals. Pages come in two
# ways: the module's reads (R) and userspace's O_DIRECT fills (U); the
# tools see both as fills (kvmem_fill_done). Exit 1 on a difference.
compare() {
	err=$(dirname "$ws")/kmod.err
	if [ ! -f "$err" ]; then
		echo "no module counters to compare with ($err)"
		exit 0
	fi
	grep -h '^kernel module /dev/kvmem:' "$err" | sed 's/[^0-9]\{1,\}/ /g' | awk '
		{ f += $1; h += $2; r += $3; b += $4; p += $5; e += $6; u += $7 }
		END { print f, h, r, b, p, e, r + u }' >$out/module
	read -r faults hits own bytes pref evict reads <$out/module
	bad=0
	check() { # what tool module
		if [ "$2" = "$3" ]; then echo "same: $1 $2"; else echo "DIFFERENT: $1: tool $2, module $3"; bad=1; fi
	}
	check "kvmemtop hits" "$(sum $out/top hits)" "$hits"
	# The module counts a fault per window fault (a hit or a miss) and a
	# hit also when a prefetch finds the page resident (in its kworker).
	echo "module faults $faults: kvmemtop misses $(sum $out/top misses), hits $(sum $out/top hits)" \
		"(prefetch-path hits among them come from kernel threads)"
	check "kvmemtop nvme>host pages" "$(sum $out/top nvme_host_pages)" "$reads"
	# Bytes: the module counts its own reads' only (B for R pages).
	echo "kvmemtop nvme>host bytes $(sum $out/top nvme_host_bytes): the module's own reads $bytes" \
		"for $own pages, the rest by O_DIRECT"
	check "kvmemtop prefetches" "$(sum $out/top prefetches)" "$pref"
	check "kvmemtop evictions" "$(sum $out/top evictions)" "$evict"
	check "kvmemsnoop in lines" "$(grep -c '"event":"in"' $out/snoop)" "$reads"
	check "kvmemsnoop evict lines" "$(grep -c '"event":"evict"' $out/snoop)" "$evict"
	check "kvmemlat fault count" "$(grep -o '"kind":"fault"[^}]*' $out/lat | grep -o '"count":[0-9]*' |
		cut -d: -f2 | awk '{ s += $1 } END { print s + 0 }')" "$reads"
	exit $bad
}
trap stop INT TERM
while :; do
	sleep 1
done
