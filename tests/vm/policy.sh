#!/bin/sh
# In the VM (tests/vm/init.sh runs it with kvmem.ko loaded): a live BPF
# policy against the module's own clock, in the same run. The workload
# kvmem-vm-scan (a hot set of 4 pages beside a scan of 12 new pages a
# step, 40 steps, a window of 8 pages; tests/vm/kvmem_scan.c) runs twice:
# under the module's clock alone, then with kvmempolicy attached live with
# the shipped policy protect_recent (bpf/policies/). Prints TAP lines:
#  - both runs end, and the tool attached to the module's tracepoints;
#  - the policy's hit rate beats the clock's;
#  - the module took verdicts (its counter) and the tool answered "keep"
#    (its own counters, summed over its intervals).
# Skips when the initramfs has no kvmempolicy (bpf/bpf.mk puts the tools
# there only where they build).
set -u
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n policy: $1"; }
notok() { n=$((n + 1)); echo "not ok $n policy: $1"; fails=1; }
obj=/usr/bin/protect_recent.bpf.o
if ! command -v kvmempolicy >/dev/null 2>&1 || [ ! -f $obj ] ||
	! command -v kvmem-vm-scan >/dev/null 2>&1; then
	echo "ok 1 policy: # SKIP no kvmempolicy or protect_recent.bpf.o in this initramfs"
	exit 0
fi
args="/data/ws-small 40 4 12 8"
out=/tmp/policy
mkdir -p $out
field() { sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" "$1"; }

if kvmem-vm-scan $args >$out/clock 2>&1; then
	ok "the workload under the module's clock: $(cat $out/clock)"
else
	cat $out/clock
	notok "the workload under the module's clock"
fi

kvmempolicy -P $obj -m -j 1 >$out/tool 2>$out/tool.err &
tool=$!
i=0
while ! grep -q '^Tracing' $out/tool.err 2>/dev/null && kill -0 $tool 2>/dev/null &&
	[ $i -lt 60 ]; do
	sleep 1
	i=$((i + 1))
done
if grep -q '^Tracing' $out/tool.err; then
	ok "kvmempolicy -P protect_recent attached to the module ($i s)"
else
	cat $out/tool.err
	notok "kvmempolicy -P protect_recent attached to the module"
fi
if kvmem-vm-scan $args >$out/policy 2>&1; then
	ok "the workload with protect_recent: $(cat $out/policy)"
else
	cat $out/policy
	notok "the workload with protect_recent"
fi
sleep 2	# the tool's last interval
kill -INT $tool 2>/dev/null
wait $tool
echo "# policy: kvmempolicy exit $?; its intervals:"
sed 's/^/# policy: /' $out/tool | tail -n 5

clock=$(field $out/clock hit_rate)
pol=$(field $out/policy hit_rate)
if [ -n "$clock" ] && [ -n "$pol" ] && awk "BEGIN { exit !($pol > $clock) }"; then
	ok "protect_recent's live hit rate $pol beats the clock's $clock (hot pages found resident: $(field $out/policy hot_hits) vs $(field $out/clock hot_hits) of $(field $out/clock hot_touches))"
else
	notok "protect_recent's live hit rate (${pol:-?}) beats the clock's (${clock:-?})"
fi
verdicts=$(field $out/policy verdicts)
keep=$(grep -o '"keep":[0-9]*' $out/tool | cut -d: -f2 | awk '{ s += $1 } END { print s + 0 }')
evict=$(grep -o '"evict":[0-9]*' $out/tool | cut -d: -f2 | awk '{ s += $1 } END { print s + 0 }')
dflt=$(grep -o '"default":[0-9]*' $out/tool | cut -d: -f2 | awk '{ s += $1 } END { print s + 0 }')
if [ "${verdicts:-0}" -gt 0 ] && [ "$keep" -gt 0 ]; then
	ok "the module took $verdicts verdicts; the tool answered keep $keep, evict $evict, default $dflt"
else
	notok "verdicts taken (module: ${verdicts:-?}; tool: keep $keep, evict $evict, default $dflt)"
fi
rm -rf $out
exit $fails
