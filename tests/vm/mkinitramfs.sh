#!/bin/sh
# Pack the VM test initramfs: busybox, /init (tests/vm/init.sh), kvmem.ko,
# the selftests and BPF object ($VM/bin), the page-source suite, the CLI and
# the policy workload ($VM/usr, into /usr/bin, with tests/vm/session.sh and
# tests/vm/policy.sh), their shared
# libraries (ldd), and the workspaces the generator wrote ($VM/data).
# Writes $VM/initramfs.cpio.
#   tests/vm/mkinitramfs.sh VM_DIR KVMEM_KO KVER
set -e
vm=$1 ko=$2 kver=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$vm/root
rm -rf "$root"
mkdir -p "$root/bin" "$root/lib" "$root/tests" "$root/data" "$root/tmp" "$root/usr/bin"
cp /bin/busybox "$root/bin/busybox"
cp "$here/init.sh" "$root/init"
chmod 755 "$root/init"
cp "$ko" "$root/lib/kvmem.ko"
cp "$vm"/bin/kvmem-* "$root/tests/"
cp "$vm"/usr/* "$root/usr/bin/"
rm -f "$root"/usr/bin/*.d	# the compiler's dependency files
cp "$here/session.sh" "$root/usr/bin/kvmem-vm-session"
cp "$here/policy.sh" "$root/usr/bin/kvmem-vm-policy"
cp "$here/bench.sh" "$root/usr/bin/kvmem-vm-bench"
# An optional observer of the session's kmod run (tests/vm/session.sh).
[ -d "$vm/observe" ] && cp "$vm"/observe/* "$root/usr/bin/"
chmod 755 "$root/usr/bin/kvmem-vm-session" "$root/usr/bin/kvmem-vm-policy" \
	"$root/usr/bin/kvmem-vm-bench"
cp -r "$vm"/data/ws-* "$root/data/"
# A few of the image's own modules, for an ext2 file system on a loop
# device (the O_DIRECT test; tmpfs has no O_DIRECT in 6.1). Optional.
mods=$vm/kernel/root/lib/modules/$kver/kernel
mkdir -p "$root/lib/extra"
# Device mapper too, for a read held in a suspended target.
for m in lib/crc16.ko crypto/crc32c_generic.ko fs/mbcache.ko fs/jbd2/jbd2.ko fs/ext4/ext4.ko \
	drivers/block/loop.ko drivers/md/dm-mod.ko; do
	[ -n "$mods" ] && [ -f "$mods/$m" ] && cp "$mods/$m" "$root/lib/extra/"
done
# Shared libraries of every program, at the paths the loader looks for.
for b in "$root"/tests/* "$root"/usr/bin/*; do
	case $b in *.o | */kvmem-vm-session | */kvmem-vm-policy | */kvmem-vm-bench | */kvmem-vm-observe) continue ;; esac
	ldd "$b" | sed -n 's/.*=> \(\/[^ ]*\).*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (.*/\1/p'
done | sort -u | while read -r lib; do
	mkdir -p "$root$(dirname "$lib")"
	cp -L "$lib" "$root$lib"
done
(cd "$root" && find . | busybox cpio -o -H newc -R 0:0 2>/dev/null) >"$vm/initramfs.cpio.tmp"
mv "$vm/initramfs.cpio.tmp" "$vm/initramfs.cpio"
echo "initramfs: $(du -h "$vm/initramfs.cpio" | cut -f1)"
