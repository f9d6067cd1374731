#!/bin/sh
# In the VM (tests/vm/init.sh runs it with kvmem.ko loaded): one agent
# session run twice, over the userspace pager (--pager uring) and over the
# kernel module (--pager kmod), on a tiny random model with a budget far
# below the history and a host cap of four pages, so selections read
# committed pages back at every step. The session runs in two parts with
# the workspace closed and reopened between them (the second part starts
# with committed pages in the module's window). Prints TAP lines:
#  - both runs succeed; every step's output (tokens, selection, and the
#    logits' largest difference from the --check-exact full-context twin)
#    is the same over both pagers; the workspaces' files are byte for byte
#    the same (writes are the pager's either way) and kvmem verify passes;
#  - the kmod run went through the module (its counters), the module's
#    tracepoints (kvmem:*, in tracefs) fired while it ran (fills, faults),
#    and on ext2 (/mnt/ext, O_DIRECT) the kmod source filled pages by
#    O_DIRECT reads into the window (kvmem_kmod_fill; how many pages each
#    way is printed: the module's buffered reads are page-cache copies).
# Needs kvmem on PATH. KVMEM_TEST_SEED picks the model and the script.
# An observer of the module's tracepoints (e.g. a bpf/ tool) can watch the
# kmod run: an executable kvmem-vm-observe on PATH (mkinitramfs.sh copies
# $VM/observe/* into /usr/bin) is started before it with the workspace as
# its argument, stopped with SIGTERM after (SIGINT: a background job of a
# script starts with it ignored), killed when it has not ended 10 s later,
# and its output printed as "# observe:" lines; its exit status is
# printed, not judged here.
set -u
n=0
ok() { n=$((n + 1)); echo "ok $n session: $1"; }
notok() { n=$((n + 1)); echo "not ok $n session: $1"; fails=1; }
check() { if [ "$1" = 0 ]; then ok "$2"; else notok "$2"; fi; }
fails=0
seed=${KVMEM_TEST_SEED:-$(od -An -tu4 -N4 /dev/urandom | tr -d ' ')}
echo "# session: seed $seed (replay with KVMEM_TEST_SEED=$seed)"
base=/mnt/ext
[ -d $base ] && touch $base/.w 2>/dev/null || base=/tmp
rm -f $base/.w
d=$base/session
rm -rf $d && mkdir -p $d || exit 1
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2

kvmem generate --preset tiny --seed "$seed" --out $d/model >/dev/null 2>$d/gen.err ||
	{ cat $d/gen.err; notok "kvmem generate --preset tiny"; exit 1; }
# Appends of random tokens (seeded from the run's seed), decodes between.
s1=$((seed % 1000)) s2=$((seed % 1000 + 1)) s3=$((seed % 1000 + 2)) s4=$((seed % 1000 + 3))
# Short: the guest computes some 25 tokens a second under TCG, and the
# --check-exact twin doubles that work.
cat >$d/part1 <<EOS
{"append_random": 16, "seed": $s1, "pin": true}
{"append_random": 64, "seed": $s2}
{"decode": 4}
{"append_random": 48, "seed": $s3}
{"decode": 4}
EOS
cat >$d/part2 <<EOS
{"append_random": 40, "seed": $s4}
{"decode": 4}
EOS

trace=/sys/kernel/tracing
run_pager() {	# pager: both parts into $d/ws-$1, outputs in $d/$1.*
	: >$d/$1.json
	: >$d/$1.err
	for part in part1 part2; do
		kvmem run --model $d/model --script $d/$part --workspace $d/ws-$1 --pager $1 \
			--budget 64 --chunk 48 --host-cap 128k --check-exact --json \
			>>$d/$1.json 2>>$d/$1.err || return 1
	done
}

t0=$(cut -d' ' -f1 /proc/uptime)
run_pager uring
check $? "a session over --pager uring (two parts, reopened)"
t1=$(cut -d' ' -f1 /proc/uptime)
if [ -d $trace/events/kvmem ]; then
	echo >$trace/trace
	echo 1 >$trace/events/kvmem/enable
fi
obs=""
if command -v kvmem-vm-observe >/dev/null 2>&1; then
	kvmem-vm-observe $d/ws-kmod >$d/observe.out 2>&1 &
	obs=$!
	sleep 2	# time to attach
fi
run_pager kmod
check $? "the same session over --pager kmod"
t2=$(cut -d' ' -f1 /proc/uptime)
if [ -n "$obs" ]; then
	kill -TERM $obs 2>/dev/null
	i=0
	while kill -0 $obs 2>/dev/null && [ $i -lt 10 ]; do sleep 1; i=$((i + 1)); done
	kill -KILL $obs 2>/dev/null
	wait $obs
	echo "# observe: kvmem-vm-observe exit $?"
	sed 's/^/# observe: /' $d/observe.out | head -n 200
fi
if [ -d $trace/events/kvmem ]; then
	echo 0 >$trace/events/kvmem/enable
	cat $trace/trace >$d/kmod.trace
fi
echo "# session: uring $t0 .. $t1 s, kmod $t1 .. $t2 s (guest clock)"
grep -v '^{' $d/uring.err $d/kmod.err | sed 's/^/# /'

# Every step's output but its time.
for p in uring kmod; do
	sed 's/,"ms":[0-9.]*//' $d/$p.json >$d/$p.steps
done
steps=$(grep -c '"tokens":\[[0-9]' $d/kmod.steps)
if [ -s $d/uring.steps ] && [ "$steps" -ge 3 ] && cmp -s $d/uring.steps $d/kmod.steps; then
	ok "every step the same over both pagers ($steps decode steps: tokens, selections, logit differences)"
else
	diff $d/uring.steps $d/kmod.steps | head -n 20 | sed 's/^/# /'
	notok "every step the same over both pagers"
fi
same=0
for f in manifest tokens pages sums index tail; do
	cmp -s $d/ws-uring/$f $d/ws-kmod/$f || { echo "# $f differs"; same=1; }
done
check $same "the two workspaces hold the same bytes (writes and commits are the pager's)"
kvmem verify $d/ws-kmod >$d/verify.out 2>&1
check $? "kvmem verify of the kmod run's workspace"

# "kernel module /dev/kvmem: F faults, H hits, R pages read (B bytes), P
# prefetched, E evictions, U filled by O_DIRECT, ..." per part: R counts the
# module's own (buffered) reads, copies out of the page cache; U the
# source's O_DIRECT fills.
read_pages=$(sed -n 's/^kernel module .* \([0-9]*\) pages read.*/\1/p' $d/kmod.err $d/kmod.json |
	awk '{ s += $1 } END { print s + 0 }')
user_fills=$(sed -n 's/^kernel module .* \([0-9]*\) filled by O_DIRECT.*/\1/p' $d/kmod.err $d/kmod.json |
	awk '{ s += $1 } END { print s + 0 }')
grep -q '^kernel module' $d/kmod.err $d/kmod.json && ! grep -q '^kernel module' $d/uring.err $d/uring.json
check $? "the kmod run went through the module ($read_pages pages read by it), the uring run did not"
if [ -s $d/kmod.trace ]; then
	fills=$(grep -c 'kvmem_fill_done' $d/kmod.trace)
	pref=$(grep -c 'kvmem_prefetch:' $d/kmod.trace)
	faults=$(grep -c 'kvmem_fault' $d/kmod.trace)
	hints=$(grep -c 'kvmem_hint:' $d/kmod.trace)
	# A fill by userspace (CLAIM, O_DIRECT, FILLED) reports no time of
	# the module's: ns=0. The others are the module's buffered reads.
	direct=$(grep 'kvmem_fill_done' $d/kmod.trace | grep -c ' ns=0 err=0')
	echo "# session: tracepoints during the kmod run: $fills fill_done ($direct by O_DIRECT into the window, $((fills - direct)) by the module), $pref prefetch, $faults fault, $hints hint"
	[ "$fills" -gt 0 ]
	check $? "the module's tracepoints fired during the kmod session"
	# The selection's committed pages reach the module with the step.
	[ "$hints" -gt 0 ]
	check $? "the session's selections reached the module as hints ($hints KVMEM_IOC_HINT)"
	if [ "$base" = /mnt/ext ]; then
		# On a file system with O_DIRECT the kmod source reads pages
		# into the window without a copy (kvmem_kmod_fill).
		# The module's own reads (page-cache copies) would be a get
		# that could not claim, a failed read, or a page reclaimed
		# between its get and its use: none in a session.
		[ "$direct" -gt 0 ] && [ "$fills" -eq "$direct" ] && [ "$read_pages" -eq 0 ] &&
			[ "$user_fills" -eq "$direct" ]
		check $? "the kmod source filled $direct pages by O_DIRECT into the window, the module $((fills - direct)) by buffered reads (copies; kvmem run's counters: $user_fills and $read_pages)"
	fi
else
	notok "the module's tracepoints fired during the kmod session (no trace)"
fi
rm -rf $d
exit $fails
