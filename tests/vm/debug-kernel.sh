#!/bin/sh
# Build the debug kernel of `make vmtest-debug` into $1 (cached: does
# nothing when $1/linux/arch/x86/boot/bzImage is newer than the config
# fragment): Debian's linux-source-6.1 ($2, a .tar.xz), `make tinyconfig`
# plus tests/vm/debug.config, then vmlinux, bzImage and Module.symvers (the
# module is built against this tree). Slow on two cores (nice -n 19).
#   tests/vm/debug-kernel.sh DIR SOURCE_TAR
set -e
dir=$1 tar=$2
here=$(cd "$(dirname "$0")" && pwd)
src=$dir/linux
jobs=${KVMEM_KERNEL_JOBS:-2}
if [ -f "$src/arch/x86/boot/bzImage" ] && [ "$src/arch/x86/boot/bzImage" -nt "$here/debug.config" ]; then
	exit 0
fi
[ -f "$tar" ] || { echo "kvmem vmtest-debug: $tar missing (apt-get install linux-source-6.1)" >&2; exit 1; }
# What a kernel build needs beyond the compiler: Kconfig's lexer and
# parser, bc for the timeconst header, libelf for objtool (ORC unwinder).
need=""
for t in flex:flex bison:bison bc:bc; do
	command -v "${t%%:*}" >/dev/null 2>&1 || need="$need ${t#*:}"
done
[ -f /usr/include/libelf.h ] || need="$need libelf-dev"
[ -f /usr/include/openssl/ssl.h ] || need="$need libssl-dev"
if [ -n "$need" ]; then
	echo "kvmem vmtest-debug: installing$need"
	apt-get install -y $need >"$dir/apt.log" 2>&1 ||
		{ cat "$dir/apt.log" >&2; echo "kvmem vmtest-debug: cannot install$need" >&2; exit 1; }
fi
mkdir -p "$dir"
if [ ! -f "$src/Makefile" ]; then
	rm -rf "$src" "$dir/linux-source-6.1"
	echo "kvmem vmtest-debug: unpacking $tar"
	tar -xJf "$tar" -C "$dir"
	mv "$dir/linux-source-6.1" "$src"
fi
cd "$src"
make -s ARCH=x86_64 tinyconfig >/dev/null
scripts/kconfig/merge_config.sh -m .config "$here/debug.config" >/dev/null
make -s ARCH=x86_64 olddefconfig
# Every option asked for must have survived olddefconfig (a dependency
# missing from the fragment drops it silently).
missing=0
grep '^CONFIG_' "$here/debug.config" | while read -r want; do
	grep -qx "$want" .config || { echo "kvmem vmtest-debug: $want did not survive olddefconfig" >&2; echo x; }
done | grep -q x && missing=1
[ $missing = 0 ] || exit 1
echo "kvmem vmtest-debug: building the debug kernel (nice -n 19 make -j$jobs; an hour or more on two cores)"
nice -n 19 make -s ARCH=x86_64 -j"$jobs" all
test -f arch/x86/boot/bzImage && test -f Module.symvers
