#!/bin/sh
# Fetch Debian's kernel image for ABI $2 (e.g. 6.1.0-57-amd64) into $1/kernel:
# apt-get download + dpkg -x, never installed on this machine. Cached: does
# nothing when the image is there already.
set -e
vm=$1 kver=$2
dir=$vm/kernel
[ -n "$kver" ] || { echo "kvmem vmtest: no linux-headers-6.1.*-amd64 installed (tools/deps.sh installs linux-headers-amd64)" >&2; exit 1; }
[ -f "$dir/root/boot/vmlinuz-$kver" ] && exit 0
mkdir -p "$dir"
cd "$dir"
rm -f linux-image-*.deb
if ! apt-get download "linux-image-$kver" >download.log 2>&1; then
	apt-get update -qq >>download.log 2>&1 || true
	if ! apt-get download "linux-image-$kver" >>download.log 2>&1; then
		cat download.log >&2
		echo "kvmem vmtest: cannot download linux-image-$kver to match the installed headers;" \
			"upgrade both: apt-get install linux-headers-amd64" >&2
		exit 1
	fi
fi
rm -rf root
dpkg -x linux-image-"$kver"_*.deb root
test -f "root/boot/vmlinuz-$kver"
