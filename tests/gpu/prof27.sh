#!/bin/bash
# On the GPU machine (issues #27, #26): Nsight Compute on the kernels whose
# speed the issues' tables turn on, each call alone (prof_once in
# check_util.c brackets it with cudaProfilerStart/Stop when KVMEM_GPU_PROF
# is set). From the repo root (gpu_setup unpacks the bundle):
#
#   tests/gpu/prof27.sh OUTDIR [SECONDS]     (GEMM=0: the decode kernels alone)
#
#  - decode attention v5 over one layer of 32K keys, 8 KV heads, 32 query
#    heads: the bf16 view (dec_kernel) and the fp8 view (dec8_kernel, its
#    default form) from `kvmem_gpu_check --fp8 --quick --bench`;
#  - with it (the same run, since 2026-12-04): prefill attention v4 over
#    32 tokens and 32K keys, bf16 and over fp8 (flash_kernel), and a
#    rematerialisation from pages in device memory, bf16 (gather_kernel)
#    and fp8 (f8_gather_kernel); SASS="k1 k2 ..." names the kernels whose
#    SASS with stall samples comes back (default: the decode forms);
#  - the qkv GEMM (4096 -> 6144) as the lone decode's GEMV and as the
#    tensor-core GEMM at 16 and 64 rows from `--gemm-tc-shapes`.
# ncu --set full, the clocks left alone (H200.md); the reports as text in
# OUTDIR/prof27/{dec,gemm}.txt (and the dec kernels' SASS with stall
# samples, sass_*.csv), the sections that say where a kernel
# waits (speed of light, memory, occupancy, warp states) printed.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/prof27.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-240}))
gpu_setup prof27 build-gpu
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)}
[ -x "$NCU" ] || { bad "no ncu on this machine"; gpu_done; }
export KVMEM_GPU_PROF=1
prof() {	# NAME ARGS...: ncu over the check program's profiled calls
	local name=$1
	shift
	if timeout "$(gpu_left 120)" "$NCU" --clock-control none --profile-from-start off \
		--set full --import-source no -f -o "$log/$name" "$G" "$@" >"$log/$name.run" \
		2>"$log/$name.err" && "$NCU" -i "$log/$name.ncu-rep" >"$log/$name.txt" 2>>"$log/$name.err"; then
		ok "ncu $name: $(grep -c '^  [a-z_]*kernel\|^  [a-z_0-9<>, ]*(' "$log/$name.txt") kernels"
	else
		bad "ncu $name (exit $?)"
		tail -5 "$log/$name.err"
	fi
	grep -E '^  [A-Za-z_].*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issue Slots Busy|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Executed Ipc A|L1/TEX Hit|L2 Hit' \
		"$log/$name.txt"
}
prof dec --fp8 --quick --bench
# Where each kernel's warps wait, instruction by instruction (SASS with
# the sampled stall reasons), the kernels' lines of the bench beside.
for k in ${SASS:-dec8_kernel dec8r_kernel dec_kernel}; do
	"$NCU" -i "$log/dec.ncu-rep" -k "regex:^$k" --page source --print-source sass --csv \
		>"$log/sass_$k.csv" 2>>"$log/dec.err" && ok "sass of $k: $(wc -l <"$log/sass_$k.csv") lines"
done
grep 'decode attention v5\|fp8 view' "$log/dec.run" | head -8
[ "${GEMM:-1}" = 0 ] || prof gemm --gemm-tc-shapes
# The run tool brings back eight files a call: the text as one tar.
[ -n "${OUT:-}" ] && tar cf "$OUT/prof27.tar" -C "$OUT" --exclude='*.ncu-rep' prof27 &&
	rm -rf "${OUT:?}/prof27"
gpu_done
