#!/bin/busybox sh
# /init of the kvmem VM test initramfs (tests/vm/mkinitramfs.sh packs it).
# Runs every step with a timeout and prints TAP-style lines: the selftests'
# own "ok N name" / "not ok N name", and "ok N vm: step" for the steps here
# (module load and unload, a selftest that crashed or timed out, new BUG:,
# WARNING:, Oops or hung-task lines in the kernel log after a step). tests/vm/run.sh
# counts those lines on the serial console and prints "N passed, N failed".
/bin/busybox mkdir -p /proc /sys /dev /tmp /usr/bin /usr/sbin /sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tracefs tracefs /sys/kernel/tracing
echo "KVMEM-VM-BOOTED $(cut -d' ' -f1 /proc/uptime) s"
# KVMEM_TEST_SEED, when run.sh got one, comes from the kernel command line.
[ -n "${KVMEM_TEST_SEED:-}" ] && export KVMEM_TEST_SEED && echo "# KVMEM_TEST_SEED=$KVMEM_TEST_SEED"
[ -n "${KVMEM_FUZZ_SECONDS:-}" ] && export KVMEM_FUZZ_SECONDS

n=0
fails=0
result() {	# ok|fail description
	n=$((n + 1))
	if [ "$1" = ok ]; then
		echo "ok $n vm: $2"
	else
		echo "not ok $n vm: $2"
		fails=$((fails + 1))
	fi
}

# Fail the step when the kernel logged a bug since the last check.
dmesg -c >/dev/null
kernel_log_clean() {
	dmesg -c >/tmp/dmesg.step
	if grep -E 'BUG:|WARNING:|Oops|general protection|Call Trace|blocked for more than' \
		/tmp/dmesg.step >/dev/null; then
		cat /tmp/dmesg.step
		result fail "kernel log after $1 has BUG:/WARNING:/Oops"
	fi
}

step() {	# name command...: a shell step, ok when it exits 0
	name=$1
	shift
	if "$@"; then result ok "$name"; else result fail "$name (exit $?)"; fi
	kernel_log_clean "$name"
}

# The debug kernel (kmemleak=on) runs the suite 2-3 times slower than the
# stock one, more on a loaded machine: its programs get three times the time
# (the selftests, and the suite, session, policy and bench steps below: the
# bench, 16 MiB paged in through both pagers with the module's XXH3 under
# KASAN, ran past a fixed 600 s there, 2026-12-02).
slow=1
grep -q 'kmemleak=on' /proc/cmdline && slow=3
# A program past its time: the kernel stacks of every thread of its session
# (a kselftest runs each case in a child of its own process group), of
# every task blocked in the kernel (sysrq w; KVMEM_VM_SYSRQ=t for all) and
# of the CPUs (sysrq l: where a running task spins) go to the console, then
# every process of the session is killed (killing the parent alone would
# leave a hung case behind to stall the programs after it).
in_session() {	# sid: the pids of the processes of session sid
	for p in /proc/[0-9]*; do
		[ "$(cut -d' ' -f6 "$p"/stat 2>/dev/null)" = "$1" ] && echo "${p#/proc/}"
	done
}
watchdog() {	# seconds sid name
	sleep "$1"
	kill -0 "$2" 2>/dev/null || return
	echo "# ---- $3 still running after $1 s: kernel stacks of its threads"
	for p in $(in_session "$2"); do
		for task in /proc/"$p"/task/[0-9]*; do
			echo "# task ${task##*/} ($(cut -d' ' -f2,3 "$task"/stat), $(cat "$task"/wchan)):"
			sed 's/^/#   /' "$task"/stack 2>/dev/null
		done
	done
	echo "${KVMEM_VM_SYSRQ:-w}" >/proc/sysrq-trigger
	echo l >/proc/sysrq-trigger
	sleep 1
	dmesg -c | grep -v '^\[.*\]  *? ' | sed 's/^/# /'
	kill -KILL $(in_session "$2")
}
selftest() {	# seconds program args...: a kselftest program
	t=$((${KVMEM_VM_STEP_TIMEOUT:-$1} * slow))
	shift
	echo "# ---- $*"
	start=$(cut -d' ' -f1 /proc/uptime)
	setsid "$@" &
	pid=$!
	watchdog "$t" "$pid" "$1" &
	wd=$!
	wait "$pid"
	rc=$?
	kill "$wd" 2>/dev/null
	echo "# ---- $1 exit $rc after $start .. $(cut -d' ' -f1 /proc/uptime) s"
	# 0 all passed, 1 some failed (each reported): anything else (a signal,
	# the timeout) means cases may be missing from the count.
	[ $rc -le 1 ] || result fail "$1 ended abnormally (exit $rc, timeout ${t}s)"
	kernel_log_clean "$1"
}

# An ext2 file system on a loop device at /mnt/ext, for the tests that
# need O_DIRECT (tmpfs has none in 6.1); they skip when it is missing.
# (A kernel with them built in, such as the debug kernel, has no .ko files.)
ext_fs() {
	for m in crc16 crc32c_generic mbcache jbd2 ext4 loop; do
		[ -f /lib/extra/$m.ko ] || continue
		insmod /lib/extra/$m.ko || return 1
	done
	truncate -s 64M /tmp/ext.img || return 1
	dev=$(losetup -f) && losetup "$dev" /tmp/ext.img && mke2fs -q -b 4096 "$dev" >/dev/null &&
		mkdir -p /mnt/ext && mount -t ext4 "$dev" /mnt/ext || { dmesg | tail -n 5; return 1; }
}
step "ext2 on a loop device (for O_DIRECT)" ext_fs
# Device mapper, for a read that waits in a suspended target (optional).
[ -f /lib/extra/dm-mod.ko ] && step "insmod dm-mod" insmod /lib/extra/dm-mod.ko
step "insmod kvmem.ko" insmod /lib/kvmem.ko
if [ -c /dev/kvmem ] && [ "$(stat -c %a /dev/kvmem)" = 600 ]; then
	result ok "/dev/kvmem is a 0600 character device"
else
	result fail "/dev/kvmem is a 0600 character device ($(ls -l /dev/kvmem 2>&1))"
fi
# KVMEM_VM_ONLY (kernel command line, from run.sh): only the selftest
# programs whose name contains it (and the page-source suite, the session,
# the policy check and the bench when their names, kvmem-vm-source,
# kvmem-vm-session, kvmem-vm-policy and kvmem-vm-bench, do), none of the
# other steps after them.
for t in /tests/kvmem-*; do
	case $t in
	*.o) ;;
	*${KVMEM_VM_ONLY:-}*) selftest 600 "$t" ;;
	esac
done
policy() {	# a live BPF policy (kvmempolicy) against the module's clock
	echo "# ---- kvmem-vm-policy"
	timeout -s KILL $((300 * slow)) kvmem-vm-policy
	[ $? -lt 128 ] || result fail "kvmem-vm-policy ended abnormally"
	kernel_log_clean kvmem-vm-policy
}
# The page-source suite over the kmod variant (the module is loaded; the
# other variants run on the build machine), in TAP; its scratch directories
# (under /tmp) on ext2, where the pager uses O_DIRECT.
page_source() {
	echo "# ---- test_page_source"
	bound=0
	mkdir -p /mnt/ext/tmp 2>/dev/null && mount -o bind /mnt/ext/tmp /tmp && bound=1
	KVMEM_TEST_SOURCE=kmod CMOCKA_MESSAGE_OUTPUT=TAP timeout -s KILL $((600 * slow)) test_page_source
	rc=$?
	[ $bound = 1 ] && umount /tmp
	# cmocka: 0 all passed, else the number failed (each reported).
	[ $rc -lt 128 ] || result fail "test_page_source ended abnormally (exit $rc)"
	kernel_log_clean test_page_source
}
# A session over --pager kmod against the same over --pager uring.
session() {
	echo "# ---- kvmem-vm-session"
	timeout -s KILL $((600 * slow)) kvmem-vm-session
	[ $? -lt 128 ] || result fail "kvmem-vm-session ended abnormally"
	kernel_log_clean kvmem-vm-session
}
# kvmem bench pager over --pager uring and --pager kmod, same run (TCG:
# relative figures only).
bench() {
	echo "# ---- kvmem-vm-bench"
	start=$(cut -d' ' -f1 /proc/uptime)
	timeout -s KILL $((600 * slow)) kvmem-vm-bench
	rc=$?
	echo "# ---- kvmem-vm-bench exit $rc after $start .. $(cut -d' ' -f1 /proc/uptime) s"
	[ $rc -lt 128 ] || result fail "kvmem-vm-bench ended abnormally (timeout $((600 * slow)) s)"
	kernel_log_clean kvmem-vm-bench
}
if [ -n "${KVMEM_VM_ONLY:-}" ]; then
	case kvmem-vm-source in *$KVMEM_VM_ONLY*) page_source ;; esac
	case kvmem-vm-session in *$KVMEM_VM_ONLY*) session ;; esac
	case kvmem-vm-policy in *$KVMEM_VM_ONLY*) policy ;; esac
	case kvmem-vm-bench in *$KVMEM_VM_ONLY*) bench ;; esac
	echo "KVMEM-VM-DONE $n steps, $fails failed, at $(cut -d' ' -f1 /proc/uptime) s (only $KVMEM_VM_ONLY)"
	poweroff -f
fi
page_source
session
policy
bench
# The debug kernel's kmemleak (booted with kmemleak=on; the stock kernel
# has none): objects allocated by kvmem.ko and never freed. Checked while
# the module is loaded, so its frames have names in the backtraces.
kmemleak() {
	mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
	[ -w /sys/kernel/debug/kmemleak ] || return 0
	echo scan >/sys/kernel/debug/kmemleak
	sleep 2
	echo scan >/sys/kernel/debug/kmemleak
	if grep -q 'kvmem' /sys/kernel/debug/kmemleak; then
		cat /sys/kernel/debug/kmemleak
		result fail "kmemleak: objects allocated by kvmem.ko were never freed"
	else
		result ok "kmemleak: nothing allocated by kvmem.ko leaked"
	fi
}
kmemleak
step "rmmod kvmem (nothing holds it after the tests)" rmmod kvmem
step "insmod kvmem.ko group=4242" insmod /lib/kvmem.ko group=4242
[ -x /tests/kvmem-perm ] && selftest 120 /tests/kvmem-perm
step "rmmod kvmem again" rmmod kvmem
echo "KVMEM-VM-DONE $n steps, $fails failed, at $(cut -d' ' -f1 /proc/uptime) s"
poweroff -f
