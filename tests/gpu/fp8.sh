#!/bin/bash
# fp8 KV on the GPU machine: the kernels checked against their CPU twins,
# then the fp8 / bf16 figures of issue #27 that the kernels and the pager
# give, in one run.
#
#   tests/gpu/fp8.sh [BUILD] [nosan]    BUILD: default build-gpu
#
# Run from the repository root with the bundle of tools/gpu/bundle.sh
# (carry build-gpu/bundle.tar.xz; it is unpacked here), or with a build
# folder that has gpu/kvmem_gpu_check[-static] and kvmem.
#
# 1. kvmem_gpu_check --fp8 (tests/gpu/check_fp8.c): quantising rows of f32
#    and bf16 and dequantising, bit for bit; the gather from fp8 pages in
#    pinned host and device memory, bit for bit; decode attention over bf16
#    and fp8 K/V against its twin.
# 2. kvmem_gpu_check --fp8 --bench: at Qwen3-8B's geometry, rematerialising
#    256 blocks x 36 layers from pinned host pages (tokens/s, fp8 / bf16)
#    and decode attention per layer at 32K and 128K keys (fp8 / bf16, the
#    same kernel; the main path's bf16 kernel beside them).
# 3. kvmem bench pager --dtype bf16 --pages 128k, then --dtype fp8 --pages
#    64k (both Qwen3-8B pages: 131072 and 67584 bytes): page-in tokens/s
#    from the disk, fp8 / bf16 (each run is one check: it must finish).
# 4. compute-sanitizer memcheck and racecheck over --fp8 --quick; "nosan"
#    skips them.
#
# Ends with "N passed, N failed". Logs in $OUT/fp8/ when OUT is set.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/lib.sh
gpu_setup fp8 "$@"

gpu_check 120 check.log --fp8
echo "== kvmem_gpu_check --fp8 --bench"
timeout 120 "$G" --fp8 --bench >"$log/bench.log" 2>&1
grep -E '^(==|rematerial|decode attention,)' "$log/bench.log"
count "$log/bench.log" $?
echo "($(($(date +%s) - t0)) s)"

if [ -x "$K" ]; then
	for dt in bf16:128k fp8:64k; do
		echo "== kvmem bench pager --dtype ${dt%:*} --pages ${dt#*:} --size 512M"
		timeout 150 "$K" bench pager --dtype "${dt%:*}" --pages "${dt#*:}" --size 512M \
			--rounds 3 >"$log/pager_${dt%:*}.log" 2>&1
		rc=$?
		grep -E '^ +[0-9]+ KiB' "$log/pager_${dt%:*}.log"
		[ $rc -eq 0 ] && ok "bench pager --dtype ${dt%:*}" || bad "bench pager --dtype ${dt%:*} (exit $rc)"
	done
	# page-in MB/s: the 7th field once a LOW mark is gone; tokens/s of a
	# layer = MB/s / page bytes x 32
	awk 'FNR == 1 { f++ } { gsub(/LOW/, ""); $0 = $0 } $2 == "KiB" { mb[f] = $7 }
	     END { if (mb[1] && mb[2]) {
		t16 = mb[1] * 1e6 / 131072 * 32; t8 = mb[2] * 1e6 / 67584 * 32
		printf "page-in from disk: bf16 %.0f tokens/s a layer, fp8 %.0f; fp8 / bf16 %.2f (target >= 1.9)\n", t16, t8, t8 / t16 } }' \
		"$log/pager_bf16.log" "$log/pager_fp8.log"
else
	bad "no $K: the pager figures were not measured"
fi
echo "($(($(date +%s) - t0)) s)"

gpu_sanitize --fp8 --quick
gpu_done
