#!/bin/sh
# Install the Debian packages kvmem builds and tests with, if any are missing.
# Runs as root (CI, a fresh machine) or through sudo; does nothing when all
# packages are present, so `make test` stays fast on a ready machine.
set -e
PKGS="gcc make libc6-dev libopenblas-dev liburing-dev libnuma-dev libxxhash-dev
      libcmocka-dev systemtap-sdt-dev gnuplot-nox pkgconf binutils"
# The tokenizer (user/tokenizer/: PCRE2 for the pre-tokenizer's regex, libunistring
# for NFC), jansson (every JSON the library and kvmem serve read) and kvmem
# serve's HTTP (libmicrohttpd).
PKGS="$PKGS libpcre2-dev libunistring-dev libmicrohttpd-dev libjansson-dev"
# mkfs.ext4 (the full-disk test on a loop-mounted ext4, tests/unit/test_faults.c).
PKGS="$PKGS e2fsprogs"
# The kernel module and its VM suite (make kmod, make vmtest: tests/vm/vm.mk):
# Debian's 6.1 headers to build against (the image itself is downloaded into
# the build folder at test time), linux-source-6.1 for kselftest_harness.h
# and checkpatch.pl, qemu and a static busybox for the VM, clang and libbpf
# for the BPF victim program.
PKGS="$PKGS linux-headers-amd64 linux-source-6.1 xz-utils qemu-system-x86 busybox-static
      clang libbpf-dev"
# The eBPF tools (make bpf: bpf/bpf.mk): clang and libbpf-dev above, llvm-strip,
# and bpftool for vmlinux.h and the skeletons.
PKGS="$PKGS llvm bpftool"
# The fuzzing harness (make fuzz: tests/fuzz/fuzz.mk): clang above with its
# libFuzzer and sanitizer runtimes, and its OpenMP runtime.
PKGS="$PKGS libclang-rt-dev libomp-dev"
# kvmem serve's tests drive it with the official openai npm client and check the
# tokenizer against npm references (tests/serve/): node and npm. A machine
# with its own Node.js (a nodesource build carries npm) keeps it.
command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs"
command -v npm >/dev/null 2>&1 || PKGS="$PKGS npm"
# RADOS workspaces (user/pager/store_rados.c) and their tests, which start
# a cluster of their own (tests/rados/cluster.sh): librados's header (the
# library itself is opened at first use), a monitor and an OSD (Ceph 16),
# uuidgen. Best effort: without them the RADOS tests say "skipped".
CEPH_PKGS="librados-dev ceph-mon ceph-osd uuid-runtime"
# train.py's self-test of the paged training path (tests/cli/test_train_paged.sh):
# Debian's CPU PyTorch. Best effort as well: without it that test says "skipped".
CEPH_PKGS="$CEPH_PKGS python3-torch python3-numpy"
missing_of() {
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
			printf ' %s' "$p"
	done
}
missing=$(missing_of $PKGS)
missing_ceph=$(missing_of $CEPH_PKGS)
[ -z "$missing" ] && [ -z "$missing_ceph" ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || [ -z "$missing" ]
if [ -n "$missing" ]; then
	echo "kvmem: installing missing Debian packages:$missing"
	$SUDO apt-get install -y -qq --no-install-recommends $missing
fi
if [ -n "$missing_ceph" ]; then
	echo "kvmem: installing missing Debian packages:$missing_ceph"
	$SUDO apt-get install -y -qq --no-install-recommends $missing_ceph ||
		echo "kvmem: warning: could not install$missing_ceph: the RADOS (or train.py) tests will be skipped"
fi
