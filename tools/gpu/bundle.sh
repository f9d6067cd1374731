#!/bin/bash
# Build what the GPU machine runs, here (it has nvcc and gcc but not our
# Debian -dev packages), into build-gpu/ (or $BUILD): the kvmem CLI and the unit tests
# with the cuda backend linked in, and beside them in build-gpu/lib every
# shared library they need that is not glibc or the CUDA driver (Debian 12's
# glibc is older than the GPU machine's, so its binaries run there). The
# run tool carries the folder: `carry: ["build-gpu"]`, then
#   LD_LIBRARY_PATH=build-gpu/lib build-gpu/kvmem ...
# CUDA's own libraries (cuBLASLt) and the C++ runtime come from the GPU
# machine (CUDA 13 there too). What travels must stay under the run tool's
# 64 MiB: it travels as build-gpu/bundle.tar.xz (carry that path).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build-gpu}
# The CLI, the backend-parametrised unit tests the scripts in tests/gpu run
# with KVMEM_TEST_BACKEND=cuda (test_ws_session, test_ws_batch: the batch
# invariance; test_serve_batch, test_ws_release: tests/gpu/serve24.sh), the
# tensor-parallel ones (tests/gpu/tp.sh), and the ops' check
# program when tests/gpu/ has one. One test a line: several engineers add to
# this list; a name whose tests/unit/NAME.c is absent is left out.
unit_tests=(
	test_ws_session
	test_ws_pool_fill
	test_ws_batch
	test_ws_append
	test_fwd_qlast
	test_fp8_session
	test_tp_nccl
	test_tp
	test_serve_batch
	test_ws_release
)
have=()
for t in "${unit_tests[@]}"; do
	[ -f tests/unit/$t.c ] && have+=("$B/tests/$t")
done
targets="cli ${have[*]}"
ls tests/gpu/*.c >/dev/null 2>&1 && targets="$targets gpu-check"
make --no-print-directory BUILD=$B -j"$(nproc)" $targets >/dev/null
mkdir -p $B/lib
bins=($B/kvmem "${have[@]}")
[ -x $B/gpu/kvmem_gpu_check ] && bins+=($B/gpu/kvmem_gpu_check)
for b in "${bins[@]}"; do
	[ -x "$b" ] && [ -f "$b" ] || continue
	ldd "$b" | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
	case "$(basename "$lib")" in
	# glibc, the C++ runtime (the GPU machine's is newer) and CUDA's own
	# (the GPU machine's toolkit: cuBLASLt alone is 500 MB).
	libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libcuda.so* | \
		libstdc++.so* | libgcc_s.so* | libcublas*.so* | libcudart.so*) ;;
	*) cp -L "$lib" $B/lib/ ;;
	esac
done

# What travels: the binaries and their libraries, compressed (OpenBLAS alone
# is 36 MB). On the GPU machine: tar xJf $B/bundle.tar.xz
# BUNDLE_ONLY="kvmem gpu/kvmem_gpu_check tests/test_ws_session ..." packs
# those alone (paths under $B; the libraries always), at xz -9: the whole
# bundle (44 MB) and the tracked files (28 MB) together pass the run tool's
# 64 MiB carry limit; the CLI, the check program and three tests are 20 MB.
files=($B/lib "${bins[@]}")
if [ -n "${BUNDLE_ONLY:-}" ]; then
	files=($B/lib)
	for f in $BUNDLE_ONLY; do
		[ -x "$B/$f" ] || { echo "bundle: no $B/$f (BUNDLE_ONLY)" >&2; exit 1; }
		files+=("$B/$f")
	done
fi
rm -f $B/bundle.tar.xz
XZ_OPT="${XZ_OPT:--9 -T$(nproc)}" tar cJf $B/bundle.tar.xz "${files[@]}"
du -sh $B/bundle.tar.xz | sed 's/^/bundle: /'
tracked=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
total=$((tracked + $(stat -c %s $B/bundle.tar.xz)))
[ "$total" -le $((64 << 20)) ] ||
	echo "bundle: with the tracked files $((total >> 20)) MiB: past the run tool's 64 MiB" \
		"carry limit (BUNDLE_ONLY packs fewer programs)" >&2
