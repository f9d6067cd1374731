#!/bin/bash
# The public API's floor (issue 23): libkvmem.so exports exactly the names
# user/libkvmem.map lists, each under its version node; every listed name is
# declared by a header under include/kvmem/; no public header declares a
# kernel or a backend's ops table; each public header compiles on its own,
# as C11 and as C++.
set -u
cd "$(dirname "$0")/../.."
KVMEM=${KVMEM:-build/kvmem}
so=$(dirname "$KVMEM")/libkvmem.so
map=user/libkvmem.map
tmp=$(mktemp -d /tmp/kvmem-abi.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

[ -e "$so" ] || { echo "FAIL: $so is not built"; exit 1; }

# The map's names (comments and the local: * clause left out).
sed -e 's#/\*.*\*/##' -e '/^ *\*/d' -e '/^\/\*/d' "$map" | tr -d '\t ' |
	grep -E '^kvmem_[a-z0-9_]+;$' | tr -d ';' | sort >"$tmp/listed"
[ -s "$tmp/listed" ] || bad "no names in $map"
sort -c "$tmp/listed" 2>/dev/null; dups=$(uniq -d "$tmp/listed")
[ -z "$dups" ] || bad "listed twice in $map: $dups"

# What the library exports, with the version each name carries.
# (the version nodes themselves are absolute symbols, type A: left out)
nm -D --defined-only --with-symbol-versions "$so" | awk '$2 != "A" {print $3}' |
	sort >"$tmp/exported_v"
unversioned=$(grep -v '@@KVMEM_[0-9.]*$' "$tmp/exported_v")
[ -z "$unversioned" ] || bad "exported without a version node: $(echo $unversioned)"
sed 's/@.*//' "$tmp/exported_v" | sort >"$tmp/exported"
extra=$(comm -13 "$tmp/listed" "$tmp/exported")
missing=$(comm -23 "$tmp/listed" "$tmp/exported")
[ -z "$extra" ] || bad "exported but not in $map: $(echo $extra)"
[ -z "$missing" ] || bad "in $map but not exported: $(echo $missing)"

# Every listed name is declared by a public header.
for s in $(cat "$tmp/listed"); do
	grep -qw "$s" include/kvmem/*.h || bad "$s is exported but no include/kvmem/ header declares it"
done

# Every function a public header declares is listed (else it would be
# declared and not exported): declarations start at column 0 with a type;
# static inline functions are not exported and are left out.
grep -h -E '^[a-z][a-z0-9_ ]*[ *]kvmem_[a-z0-9_]+\(' include/kvmem/*.h | grep -v '^static ' |
	grep -oE 'kvmem_[a-z0-9_]+\(' | tr -d '(' | sort -u >"$tmp/declared"
[ -s "$tmp/declared" ] || bad "found no declarations under include/kvmem/"
unlisted=$(comm -23 "$tmp/declared" "$tmp/listed")
[ -z "$unlisted" ] || bad "declared in include/kvmem/ but not in $map: $(echo $unlisted)"

# The seams' insides and the kernels stay private.
for pat in 'kvmem_backend_ops' 'kvmem_matmul' 'kvmem_attention' 'kvmem_rmsnorm' 'kvmem_cuda_' \
	'kvmem_hostpool' 'kvmem_plan_build' 'kvmem_repl_ops'; do
	where=$(grep -lw "$pat" include/kvmem/*.h)
	[ -z "$where" ] || bad "a public header declares $pat: $where"
done

# Each header alone: a program that includes only it compiles.
for h in include/kvmem/*.h; do
	echo "#include \"kvmem/$(basename "$h")\"" >"$tmp/one.c"
	cc -std=c11 -Wall -Wextra -Werror -Iinclude -Iinclude/uapi -fsyntax-only "$tmp/one.c" \
		2>"$tmp/err" || bad "$h does not compile on its own (C11): $(head -3 "$tmp/err")"
	if command -v c++ >/dev/null; then
		cp "$tmp/one.c" "$tmp/one.cc"
		c++ -std=c++17 -Wall -Wextra -Werror -Iinclude -Iinclude/uapi -fsyntax-only \
			"$tmp/one.cc" 2>"$tmp/err" ||
			bad "$h does not compile on its own (C++): $(head -3 "$tmp/err")"
	fi
done

n=$(wc -l <"$tmp/listed")
[ "$fail" -eq 0 ] && echo "abi: $n names exported under their version nodes, each declared in include/kvmem/"
exit "$fail"
