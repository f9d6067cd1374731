#!/bin/sh
# In the VM (tests/vm/init.sh runs it with kvmem.ko loaded): kvmem bench
# pager over the userspace pager (--pager uring) and over the kernel module
# (--pager kmod) in one run, on ext2 (/mnt/ext: O_DIRECT), with its ceiling
# measured in the same run: dd iflag=direct reads of a file of the same size
# on the same file system, before and after the two benches (each bench
# also reads its own file O_DIRECT: its "seq read" column). The guest runs
# under TCG (emulated): only the ratios mean anything. Prints TAP lines:
#  - both benches succeed and print a page-in figure per page size;
#  - the kmod bench paged in through the module, every page filled by an
#    O_DIRECT read into its window: none read by the module (no copy), no
#    read or checksum error;
# and "# bench:" lines with the tables, the dd rates and, per page size,
# kmod's page-in over uring's.
set -u
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n bench: $1"; }
notok() { n=$((n + 1)); echo "not ok $n bench: $1"; fails=1; }
check() { if [ "$1" = 0 ]; then ok "$2"; else notok "$2"; fi; }
base=/mnt/ext
if ! [ -d $base ] || ! touch $base/.w 2>/dev/null; then
	echo "ok 1 bench: # SKIP no ext2 file system at /mnt/ext (O_DIRECT)"
	exit 0
fi
rm -f $base/.w
d=$base/bench
rm -rf $d && mkdir -p $d || exit 1
out=/tmp/bench
rm -rf $out && mkdir -p $out
size=16	# MiB: the bench's least; ext2 here is 64 MiB
pages=64k,256k
args="--dir $d --size ${size}M --pages $pages --rounds 3 --no-hit-rates"

dd_read() {	# MB/s (10^6 bytes) of dd iflag=direct reading $d/seq 8 times
	# (busybox's dd prints no rate here; /proc/uptime counts 10 ms)
	t0=$(cut -d' ' -f1 /proc/uptime)
	for i in 1 2 3 4 5 6 7 8; do
		dd if=$d/seq of=/dev/null bs=1M iflag=direct 2>/dev/null || return 1
	done
	t1=$(cut -d' ' -f1 /proc/uptime)
	awk "BEGIN { t = $t1 - $t0; if (t < 0.01) t = 0.01; printf \"%.1f\", 8 * $size * 1048576 / t / 1e6 }"
}
dd if=/dev/zero of=$d/seq bs=1M count=$size oflag=direct 2>/dev/null
dd0=$(dd_read)
kvmem bench pager $args --pager uring >$out/uring 2>&1
urc=$?
kvmem bench pager $args --pager kmod >$out/kmod 2>&1
krc=$?
dd1=$(dd_read)
rm -rf $d
for p in uring kmod; do
	sed "s/^/# bench: $p: /" $out/$p
done
echo "# bench: dd iflag=direct bs=1M, a ${size} MiB file on ext2 read 8 times: ${dd0:-?} MB/s before the benches, ${dd1:-?} MB/s after"

# A row: "  64 KiB  seq-write stage-out ratio [LOW] seq-read page-in ratio [LOW]".
pagein() { awk -v k="$2" '$2 == "KiB" && $1 == k { n = 0
	for (i = 3; i <= NF; i++) if ($i != "LOW") v[++n] = $i; print v[5] }' $1; }
rows=0
for k in 64 256; do
	u=$(pagein $out/uring $k) m=$(pagein $out/kmod $k)
	[ -n "$u" ] && [ -n "$m" ] && rows=$((rows + 1)) &&
		echo "# bench: $k KiB pages: page-in MB/s uring $u, kmod $m: kmod/uring" \
			"$(awk "BEGIN { printf \"%.2f\", $m / $u }"), kmod/dd" \
			"$(awk "BEGIN { printf \"%.2f\", $m / ${dd0:-0} }" 2>/dev/null)"
done
[ $urc = 0 ] && [ $krc = 0 ] && [ $rows = 2 ]
check $? "kvmem bench pager --pager uring and --pager kmod in one run (exit $urc and $krc, $rows of 2 page sizes)"
# "kernel module: F pages filled by O_DIRECT into its window, R read by the module ..."
line=$(grep '^kernel module:' $out/kmod)
filled=$(echo "$line" | sed -n 's/^kernel module: \([0-9]*\) pages filled.*/\1/p')
read_=$(echo "$line" | sed -n 's/.*window, \([0-9]*\) read by.*/\1/p')
errs=$(echo "$line" | sed -n 's/.*, \([0-9]*\) read errors, \([0-9]*\) checksum.*/\1 \2/p')
[ "${filled:-0}" -gt 0 ] && [ "${read_:-1}" = 0 ] && [ "$errs" = "0 0" ]
check $? "the kmod bench paged in by O_DIRECT into the module's window (${filled:-?} pages), the module read ${read_:-?} itself (copies), errors ${errs:-?}"
exit $fails
