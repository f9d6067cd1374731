#!/bin/bash
# make install into a scratch DESTDIR, then build the "embed kvmem" example
# (Documentation/examples/embed.c) the way a user would, with
# `pkg-config --cflags --libs kvmem`, and run it: two sessions over one
# workspace, the second continuing the first's history. Also: the shared
# library exports kvmem_ names only, and carries its soname.
set -u
cd "$(dirname "$0")/../.."
KVMEM=${KVMEM:-build/kvmem}
build=$(dirname "$KVMEM")
tmp=$(mktemp -d /tmp/kvmem-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

command -v pkg-config >/dev/null || { echo "FAIL: pkg-config is missing (tools/deps.sh installs it)"; exit 1; }
if ! make --no-print-directory BUILD="$build" O="$build" install DESTDIR="$tmp/dest" PREFIX=/usr \
	>"$tmp/install.log" 2>&1; then
	cat "$tmp/install.log"
	echo "FAIL: make install"
	exit 1
fi
for f in usr/include/kvmem/store.h usr/include/linux/kvmem.h usr/lib/libkvmem.a \
	usr/lib/libkvmem.so usr/lib/pkgconfig/kvmem.pc usr/bin/kvmem; do
	[ -e "$tmp/dest/$f" ] || bad "not installed: $f"
done
for h in agentlang.h kernels.h kernels_bf16.h kernels_cuda.h cuda.h engine.h workspace.h; do
	[ -e "$tmp/dest/usr/include/kvmem/$h" ] && bad "$h is not part of the API"
done

# Only kvmem_ names leave the shared library, under its soname (the version
# node, an absolute symbol, left out; test_abi.sh checks the list itself).
nm -D --defined-only "$tmp/dest/usr/lib/libkvmem.so" | awk '$2 != "A" {sub(/@.*/, "", $3); print $3}' \
	>"$tmp/names"
others=$(grep -v '^kvmem_' "$tmp/names")
[ -z "$others" ] || bad "libkvmem.so exports other names: $(echo $others | head -c 300)"
grep -qx 'kvmem_session_create' "$tmp/names" || bad "kvmem_session_create is not exported"
grep -qx 'kvmem_json_load\|kvmem_json_write_str\|kvmem_st_open\|kvmem_write_all\|kvmem_hostpool_create' "$tmp/names" &&
	bad "private kvmem_ helpers are exported"
objdump -p "$tmp/dest/usr/lib/libkvmem.so" | grep -q 'SONAME.*libkvmem\.so\.[0-9]' ||
	bad "no soname"

export PKG_CONFIG_PATH="$tmp/dest/usr/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$tmp/dest"
flags=$(pkg-config --cflags --libs kvmem) || bad "pkg-config kvmem"
# A static link needs every library libkvmem.a calls into, jansson too.
pkg-config --static --libs kvmem | grep -q -- '-ljansson' || bad "kvmem.pc: Libs.private lacks -ljansson"
if ! cc -std=c11 -Wall -Wextra -Werror Documentation/examples/embed.c $flags -o "$tmp/embed" \
	2>"$tmp/cc.log"; then
	cat "$tmp/cc.log"
	bad "the embed example does not build against the installed kvmem"
else
	ldd "$tmp/embed" | grep -q 'libkvmem.so' || bad "the example is not linked to libkvmem.so"
	if ! OMP_WAIT_POLICY=passive LD_LIBRARY_PATH="$tmp/dest/usr/lib" "$tmp/embed" "$tmp/run" \
		>"$tmp/embed.out" 2>&1; then
		cat "$tmp/embed.out"
		bad "the embed example failed"
	fi
	grep -q '^reopened with 0 tokens' "$tmp/embed.out" || bad "first run: $(cat "$tmp/embed.out")"
	grep -q '^reopened with 308 tokens' "$tmp/embed.out" ||
		bad "second run did not continue the first's 308 tokens: $(cat "$tmp/embed.out")"
	[ "$(grep -c '^decoded:' "$tmp/embed.out")" = 2 ] || bad "expected two decodes"
fi
[ $fail = 0 ] && echo "install: all checks passed"
exit $fail
