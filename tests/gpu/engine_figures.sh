#!/bin/bash
# On the GPU machine: the CUDA engine's figures (issue 11) in one call, from
# the bundle tools/gpu/bundle.sh built (carried as build-gpu/bundle.tar.xz),
# each beside its ceiling or peer measured in the same call.
#
#   tests/gpu/engine_figures.sh [PART...]   (default: engine torch select demo recall)
#
#   engine   kvmem bench engine --backend cuda (prefill 4K/16K/32K, decode
#            4K/32K; the GEMM rate and the copy rate measured in the run),
#            again with KVMEM_CUDA_PREFILL=$ALT_PREFILL when that is set;
#            nvidia-smi samples the SM clock and the power every 50 ms
#            meanwhile (a long prefill at full power may run below the
#            clock of the GEMM ceiling's short burst);
#   torch    tools/bench/torch_engine.py: PyTorch (sdpa, bf16) on the same
#            geometry and the same lengths, the engine's peer; with engine,
#            then the ratios and their bound (tools/bench/prefill_bound.py:
#            every kernel at its ceiling held at the power limit, measured
#            by kvmem_gpu_check --attn-prefill in the same call);
#   select   kvmem bench select --backend cuda at 1M and 10M tokens (31250
#            and 312500 blocks of 32), meank and subblock, against reading
#            the index once at the copy rate;
#   demo     kvmem demo --backend cuda (the embedded model, the default job);
#   recall   kvmem bench recall on cuda and on the host's CPUs on the same
#            seeds: exact-match accuracy per cell side by side
#            (RECALL_Q questions per cell, default 20).
#
# Ends with a plain "N passed, N failed" line (a part passes when its
# command exits 0; recall also when every cell of the two backends is
# within 2 questions). Logs go to $OUT when set.
set -u
cd "$(dirname "$0")/../.."
[ -x build-gpu/kvmem ] || tar xJf build-gpu/bundle.tar.xz
export LD_LIBRARY_PATH=$PWD/build-gpu/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_WAIT_POLICY=passive
K=$PWD/build-gpu/kvmem
out=${OUT:-/tmp}
parts=${*:-engine torch select demo recall}
pass=0 fail=0
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

if has engine; then
	el "bench engine"
	nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader,nounits \
		-lms 50 >"$out/clocks.csv" 2>/dev/null &
	smi=$!
	timeout 150 "$K" bench engine --backend cuda --prefill 4k,16k,32k --decode 4k,32k \
		--decode-tokens 64 >"$out/engine.log" 2>&1 && ok "bench engine" || bad "bench engine"
	kill $smi 2>/dev/null
	grep -E '^(ceilings|prefill|decode|[0-9])' "$out/engine.log"
	# The SM clock while the GPU drew more than half its peak power seen.
	awk -F', *' '$3 + 0 > 0 { n++; c[n] = $2; p[n] = $3; if ($3 > pm) pm = $3 }
		END { for (i = 1; i <= n; i++) if (p[i] > pm / 2) { k++; s += c[i];
			if (!lo || c[i] < lo) lo = c[i]; if (c[i] > hi) hi = c[i] }
		      if (k) printf "SM clock under load: mean %.0f MHz, %d-%d MHz over %d samples; peak power %.0f W\n", s / k, lo, hi, k, pm }' \
		"$out/clocks.csv"
	if [ -n "${ALT_PREFILL:-}" ]; then
		el "bench engine, KVMEM_CUDA_PREFILL=$ALT_PREFILL"
		KVMEM_CUDA_PREFILL=$ALT_PREFILL timeout 120 "$K" bench engine --backend cuda \
			--prefill 4k,16k,32k --decode 4k --decode-tokens 16 >"$out/engine_alt.log" 2>&1 &&
			ok "bench engine, prefill v$ALT_PREFILL" || bad "bench engine, prefill v$ALT_PREFILL"
		grep -E '^(ceilings|prefill|[0-9]+ +4096 )' "$out/engine_alt.log"
	fi
fi
if has torch; then
	el "PyTorch peer"
	timeout 200 python3 tools/bench/torch_engine.py --decode-tokens 32 >"$out/torch.log" 2>&1 &&
		ok "PyTorch peer" || { bad "PyTorch peer"; tail -5 "$out/torch.log"; }
	grep '^{' "$out/torch.log"
fi
if has select; then
	for pol in meank subblock; do
		el "bench select $pol"
		timeout 120 "$K" bench select --backend cuda --policy $pol --blocks 31250,312500 \
			>"$out/select_$pol.log" 2>&1 && ok "bench select $pol" || bad "bench select $pol"
		grep -vE '^\s*$' "$out/select_$pol.log" | tail -8
	done
fi
if has demo; then
	el "demo on cuda"
	home=$(mktemp -d)
	KVMEM_HOME=$home timeout 120 "$K" demo --backend cuda >"$out/demo.log" 2>&1 &&
		ok "demo on cuda: $(grep -m1 '^Summary' "$out/demo.log")" || bad "demo on cuda"
	tail -4 "$out/demo.log"
	rm -rf "$home"
fi
if has recall; then
	for be in cuda cpu; do
		el "recall on $be"
		timeout 240 "$K" bench recall --backend $be --model models/agentlang --sizes 1,4 \
			--depths 0.1,0.5,0.9 --questions "${RECALL_Q:-20}" --policies full,meank,subblock \
			--quiet --csv "$out/recall_$be.csv" >"$out/recall_$be.log" 2>&1 &&
			ok "recall on $be" || bad "recall on $be"
	done
	# Cell by cell: size, depth, policy, correct answers on each backend.
	if [ -s "$out/recall_cuda.csv" ] && [ -s "$out/recall_cpu.csv" ]; then
		python3 - "$out/recall_cuda.csv" "$out/recall_cpu.csv" <<'EOF' && ok "recall: cuda and cpu agree within 2 questions a cell" || bad "recall: the backends differ"
import csv, sys
def cells(path):
    rows = list(csv.DictReader(open(path)))
    key = lambda r: (r.get("size"), r.get("depth"), r.get("policy"))
    return {key(r): r for r in rows}
a, b = cells(sys.argv[1]), cells(sys.argv[2])
worst = 0
print("size depth policy: cuda correct / cpu correct (of n)")
for k in sorted(a):
    ra, rb = a[k], b.get(k)
    if rb is None:
        print(k, "missing on cpu"); sys.exit(1)
    n = int(ra["questions"])
    ca, cb = round(float(ra["accuracy"]) * n), round(float(rb["accuracy"]) * n)
    worst = max(worst, abs(ca - cb))
    print(*k, f": {ca} / {cb} (of {n})")
sys.exit(worst > 2)
EOF
	fi
fi
if has engine && has torch && [ -s "$out/engine.log" ] && [ -s "$out/torch.log" ]; then
	# The engine against its peer, and the bound the ceilings put on that
	# ratio: v6 and the GEMM held for a second at the power limit
	# (kvmem_gpu_check --attn-prefill), then tools/bench/prefill_bound.py.
	el "attention and GEMM held at the power limit"
	timeout 200 build-gpu/gpu/kvmem_gpu_check --attn-prefill >"$out/attn.log" 2>&1 &&
		ok "kvmem_gpu_check --attn-prefill" || bad "kvmem_gpu_check --attn-prefill"
	grep -A3 '^== held' "$out/attn.log"
	python3 tools/bench/prefill_bound.py "$out/engine.log" "$out/torch.log" "$out/attn.log" ||
		bad "prefill bound"
fi
el "done"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
