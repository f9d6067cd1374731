#!/bin/bash
# The BPF tools on bad input: a pid that does not exist, no privileges (run
# as nobody), the module asked for (-m) when it is not loaded, a binary
# without kvmem's probes, a missing file, a missing policy: each says so in
# one line on stderr and exits non-zero.
. "$(dirname "$0")/../bpf/lib.sh"
bpf_setup

# refuse WHAT PATTERN COMMAND...: non-zero, one line on stderr matching.
refuse() {
	local what=$1 pat=$2 rc
	shift 2
	"$@" >"$tmp/r.out" 2>"$tmp/r.err"
	rc=$?
	[ $rc -ne 0 ] || { bad "$what: exit 0"; return; }
	[ "$(wc -l <"$tmp/r.err")" -eq 1 ] || bad "$what: not one line: $(cat "$tmp/r.err")"
	grep -q -- "$pat" "$tmp/r.err" || bad "$what: says $(cat "$tmp/r.err")"
}

pid=$(($(cat /proc/sys/kernel/pid_max) - 1))
while [ -e /proc/$pid ]; do pid=$((pid - 1)); done
cp "$BPF"/kvmem* "$tmp/"
nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all)
command -v setpriv >/dev/null || nobody=(runuser -u nobody --)

for t in kvmemtop kvmemsnoop kvmemlat; do
	refuse "$t -p $pid" "pid $pid: no such process" "$BPF/$t" -p $pid -b "$KV"
	refuse "$t as nobody" "cannot load BPF programs: Operation not permitted (run as root" \
		"${nobody[@]}" "$tmp/$t" -b "$KV"
	refuse "$t -b /bin/true" "/bin/true: no USDT probe kvmem:" "$BPF/$t" -b /bin/true
	refuse "$t -b missing" "$tmp/missing: No such file or directory" "$BPF/$t" -b "$tmp/missing"
	if [ -d /sys/module/kvmem ]; then
		echo "the kvmem module is loaded: -m is not checked for its refusal"
	else
		refuse "$t -m" "the kvmem kernel module is not loaded" "$BPF/$t" -m
	fi
done
refuse "kvmempolicy: no such policy" "policy nosuch: no such policy" \
	"$BPF/kvmempolicy" -P nosuch --synthetic
refuse "kvmempolicy as nobody" "cannot load BPF programs: Operation not permitted" \
	"${nobody[@]}" "$tmp/kvmempolicy" -P "$BPF/policies/protect_recent.bpf.o" --synthetic
refuse "kvmempolicy: replay of a missing file" "$tmp/missing: No such file or directory" \
	"$BPF/kvmempolicy" -P protect_recent --replay "$tmp/missing"
echo '{"event":"step","step":0}' >"$tmp/empty.jsonl"
refuse "kvmempolicy: replay without accesses" "no page accesses" \
	"$BPF/kvmempolicy" -P protect_recent --replay "$tmp/empty.jsonl"

[ $fail -eq 0 ] && echo "BPF tools: bad input refused in one line"
exit $fail
