#!/bin/bash
# Build what the GPU machine runs, here (it has nvcc and gcc but not our
# Debian -dev packages), into build-gpu/: the kvmem CLI and the unit tests
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
# The CLI, the backend-parametrised unit tests, and the ops' check program
# when tests/gpu/ has one.
targets="cli build-gpu/tests/test_ws_session build-gpu/tests/test_fwd_qlast"
ls tests/gpu/*.c >/dev/null 2>&1 && targets="$targets gpu-check"
make --no-print-directory BUILD=build-gpu -j"$(nproc)" $targets >/dev/null
mkdir -p build-gpu/lib
bins=(build-gpu/kvmem build-gpu/tests/test_ws_session build-gpu/tests/test_fwd_qlast)
[ -x build-gpu/gpu/kvmem_gpu_check ] && bins+=(build-gpu/gpu/kvmem_gpu_check)
for b in "${bins[@]}"; do
	[ -x "$b" ] && [ -f "$b" ] || continue
	ldd "$b" | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
	case "$(basename "$lib")" in
	# glibc, the C++ runtime (the GPU machine's is newer) and CUDA's own
	# (the GPU machine's toolkit: cuBLASLt alone is 500 MB).
	libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libcuda.so* | \
		libstdc++.so* | libgcc_s.so* | libcublas*.so* | libcudart.so*) ;;
	*) cp -L "$lib" build-gpu/lib/ ;;
	esac
done

# What travels: the binaries and their libraries, compressed (OpenBLAS alone
# is 36 MB). On the GPU machine: tar xJf build-gpu/bundle.tar.xz
files=(build-gpu/lib "${bins[@]}")
tar cJf build-gpu/bundle.tar.xz "${files[@]}"
du -sh build-gpu/bundle.tar.xz | sed 's/^/bundle: /'
