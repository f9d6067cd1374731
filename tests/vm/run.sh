#!/bin/bash
# Boot Debian's 6.1 kernel in qemu (TCG) with the kvmem test initramfs and
# count the results on the serial console. Prints the boot time, the time
# the tests took, the failed cases, and one closing line that CI reads:
#   N passed, N failed, N skipped
# Exit status 0 only when nothing failed and the VM reached its end.
#   tests/vm/run.sh VM_DIR KVER [KERNEL_IMAGE]   (tests/vm/vm.mk builds what it needs)
# Without KERNEL_IMAGE: Debian's image for KVER, booted with preempt=full
# (more interleavings) and init_on_free=1 (memory read after it was freed
# reads zeros, which the tests can see). The debug kernel of make
# vmtest-debug is given as KERNEL_IMAGE, booted with kmemleak=on. Both
# panic on a soft lockup (a CPU stuck in the kernel for 20 s), printing
# every CPU's stack: the VM ends then, instead of at the time limit, and
# the report is repeated at the end of the output.
set -u
vm=$1 kver=$2
kernel=${3:-$vm/kernel/root/boot/vmlinuz-$kver}
log=$vm/console.log
extra=" preempt=full init_on_free=1 softlockup_panic=1 softlockup_all_cpu_backtrace=1"
[ $# -ge 3 ] && extra=" kmemleak=on softlockup_panic=1 softlockup_all_cpu_backtrace=1"
limit=${KVMEM_VM_TIMEOUT:-1500}

[ -f "$kernel" ] || { echo "kvmem vmtest: $kernel missing" >&2; exit 1; }
# The kernel hands unknown name=value parameters to /init as environment:
# KVMEM_TEST_SEED replays the selftests' random choices.
# So do KVMEM_VM_ONLY (only the selftests whose name holds it),
# KVMEM_FUZZ_SECONDS (kvmem-fuzz's time) and KVMEM_VM_STEP_TIMEOUT (seconds
# a selftest program may run before its stacks are printed and it is
# killed; 600 by default).
# Single-threaded TCG (both vCPUs on one host thread, interleaved): under
# multi-threaded TCG a kernel text patch (a trace event switched on or off,
# a BPF program attached to a tracepoint) while the other vCPU runs hangs
# the guest (text_poke_bp waits forever for its IPI's answer; the
# soft-lockup watchdog fires): kvmem-tpflip hangs there within a minute and
# passes here (testing.md). KVMEM_VM_TCG=multi puts the vCPUs on two host
# threads again, for more parallel interleavings at that risk.
tcg=${KVMEM_VM_TCG:-single}
seed=""
for v in KVMEM_TEST_SEED KVMEM_VM_ONLY KVMEM_FUZZ_SECONDS KVMEM_VM_STEP_TIMEOUT KVMEM_VM_SYSRQ; do
	eval "val=\${$v:-}"
	[ -n "$val" ] && seed="$seed $v=$val"
done
start=$(date +%s.%N)
echo "kvmem vmtest: booting $kver under qemu TCG, $tcg-threaded (log: $log)"
# Two NUMA nodes (one CPU and 512 MiB each), so placement can be checked.
timeout --foreground -k 10 "$limit" qemu-system-x86_64 -accel tcg,thread="$tcg" -cpu max -m 1024 -smp 2 \
	-object memory-backend-ram,id=m0,size=512M -object memory-backend-ram,id=m1,size=512M \
	-numa node,nodeid=0,cpus=0,memdev=m0 -numa node,nodeid=1,cpus=1,memdev=m1 \
	-nographic -no-reboot -kernel "$kernel" -initrd "$vm/initramfs.cpio" \
	-append "console=ttyS0 panic=-1 quiet loglevel=1$extra$seed" </dev/null 2>&1 |
	stdbuf -oL tr -d '\r' | tee "$log"
qrc=${PIPESTATUS[0]}
end=$(date +%s.%N)

pass=$(grep -c '^ok [0-9]' "$log" | tr -d ' ')
skip=$(grep -c '^ok [0-9].*# SKIP' "$log" | tr -d ' ')
fail=$(grep -c '^not ok [0-9]' "$log" | tr -d ' ')
# cmocka's TAP writes a skipped case as "not ok N # SKIP name".
cskip=$(grep -c '^not ok [0-9]* # SKIP' "$log" | tr -d ' ')
pass=$((pass - skip))
fail=$((fail - cskip))
skip=$((skip + cskip))
if ! grep -q '^KVMEM-VM-DONE' "$log"; then
	echo "kvmem vmtest: the VM did not reach the end of its tests (qemu exit $qrc;" \
		"timeout ${limit}s): counting one failure more"
	fail=$((fail + 1))
fi
boot=$(sed -n 's/.*KVMEM-VM-BOOTED \([0-9.]*\) s.*/\1/p' "$log")
done_at=$(sed -n 's/^KVMEM-VM-DONE .* at \([0-9.]*\) s.*/\1/p' "$log")
echo "kvmem vmtest: guest booted to /init at ${boot:-?} s (guest clock), tests ended at" \
	"${done_at:-?} s; wall time $(awk "BEGIN { printf \"%.1f\", $end - $start }") s"
grep '^not ok' "$log" | grep -v '^not ok [0-9]* # SKIP' | sed 's/^/failed: /'
# CI shows the end of the output: when something failed, the console's
# first kernel report (a panic, BUG:, a soft lockup, a hung selftest's
# stacks) is repeated here, before the closing line.
if [ "$fail" -gt 0 ]; then
	first=$(grep -n -m1 -E 'Kernel panic|BUG:|WARNING:|Oops|still running after|blocked for more than' \
		"$log" | cut -d: -f1)
	if [ -n "$first" ]; then
		echo "kvmem vmtest: the console from its first kernel report (line $first of $log):"
		sed -n "$((first > 3 ? first - 3 : 1)),$((first + 70))p" "$log" |
			grep -v '^\[ *[0-9.]*\]  *? ' | cut -c1-160 | sed 's/^/| /'
	fi
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
