#!/bin/bash
# On the GPU machine: the paging pipeline's checks and figures (issue 12),
# from the bundle tools/gpu/bundle.sh built (carried as build-gpu/).
#
#   tests/gpu/paging_checks.sh [PART...]     (default: checks persist bench demo)
#
#   checks   the gather kernel against its twin (kvmem_gpu_check --gather) and
#            under compute-sanitizer memcheck and racecheck;
#   persist  kvmem run --workspace on the cuda backend: the CLI workspace
#            suite (tests/cli/test_pager_workspace.sh: two parts equal one
#            go, exact, verify, refusals); a CPU-written workspace continued
#            on the GPU and the reverse (one format), both verifying; a GPU
#            run killed with SIGKILL leaves a workspace that verifies and
#            continues;
#   bench    kvmem bench step: ceilings, rematerialisation, cold page-in,
#            stage-out at Qwen3-8B (36 layers) [bench36]; what fits under a
#            24 GB cap [fits]; the agent step and decode at 8B width with
#            $STEP_LAYERS layers [benchL]; memory at $MEM_SIZES with 1 layer
#            [memory] (each part alone by its name in brackets); the agent
#            step again with selections scored on the host [benchLhost, only
#            by its name];
#   decode   decode in a 64K view over 256K against plain decode, with the
#            decode steps' page writes on the writer thread (the default)
#            and in line (KVMEM_WRITER_MIN=64), at $STEP_LAYERS layers, then
#            once at 36 layers (Qwen3-8B) [decode36 alone];
#   demo     kvmem demo --scale $DEMO_SCALE on the GPU; reopen: once more on
#            the same workspace (no re-prefill).
#
# Ends with a plain "N passed, N failed" line. Logs go to $OUT when set.
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/build-gpu/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_WAIT_POLICY=passive
K=$PWD/build-gpu/kvmem
out=${OUT:-/tmp}
scratch=${SCRATCH:-/var/tmp/kvmem-paging}
STEP_LAYERS=${STEP_LAYERS:-4}
MEM_SIZES=${MEM_SIZES:-262144,4194304}
DEMO_SCALE=${DEMO_SCALE:-1M}
pass=0 fail=0
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
parts=${*:-checks persist bench demo reopen}
mkdir -p "$scratch"
t_start=$(date +%s)
elapsed() { echo "[$(($(date +%s) - t_start)) s] $*"; }

has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }

if has checks; then
	elapsed "gather checks"
	if timeout 120 build-gpu/gpu/kvmem_gpu_check --gather >"$out/gather.log" 2>&1; then
		ok "gather kernel vs its twin ($(grep -c '^ok' "$out/gather.log") cases)"
	else
		bad "gather kernel:"
		grep -E '^FAIL|seed|error' "$out/gather.log" | head -20
	fi
	for tool in memcheck racecheck; do
		if timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 \
			build-gpu/gpu/kvmem_gpu_check --gather --quick >"$out/gather_$tool.log" 2>&1; then
			ok "gather under compute-sanitizer $tool"
		else
			bad "gather under compute-sanitizer $tool"
			grep -E 'ERROR|Invalid|Race|FAIL' "$out/gather_$tool.log" | head -10
		fi
	done
fi

if has persist; then
	elapsed "persistence"
	if KVMEM=$K timeout 240 bash tests/cli/test_pager_workspace.sh >"$out/pager_workspace.log" 2>&1; then
		ok "tests/cli/test_pager_workspace.sh on the cuda backend (two parts = one go, exact)"
	else
		bad "tests/cli/test_pager_workspace.sh on cuda:"
		grep -E 'FAIL|error' "$out/pager_workspace.log" | head -10
	fi
	t=$scratch/persist
	rm -rf "$t" && mkdir -p "$t"
	"$K" generate --preset tiny --out "$t/m" >/dev/null
	printf '%s\n' '{"append_random": 900, "seed": 1}' '{"decode": 8}' \
		'{"append_random": 500, "seed": 2}' '{"decode": 8}' >"$t/a"
	printf '%s\n' '{"append_random": 300, "seed": 3}' '{"decode": 8}' >"$t/b"
	for order in "cpu cuda" "cuda cpu"; do
		set -- $order
		w=$t/ws-$1-$2
		if "$K" run --backend "$1" --model "$t/m" --script "$t/a" --workspace "$w" --budget 512 \
			--json >"$t/$1.1.log" 2>&1 &&
			"$K" run --backend "$2" --model "$t/m" --script "$t/b" --workspace "$w" --budget 512 \
				--json >"$t/$2.2.log" 2>&1 &&
			grep -q '"workspace_tokens":1724' "$t/$2.2.log" &&
			"$K" verify "$w" >"$t/verify-$1-$2.log" 2>&1; then
			ok "a workspace written on $1 ($("$K" stat "$w" | sed -n 2p | grep -o ' [bf][f0-9]* index' | cut -d' ' -f2) pages) continues on $2 and verifies"
		else
			bad "$1 -> $2 workspace:"
			tail -3 "$t/$1.1.log" "$t/$2.2.log" "$t/verify-$1-$2.log" 2>/dev/null
		fi
	done
	# A GPU run killed mid-way.
	for i in $(seq 1 60); do
		echo "{\"append_random\": 700, \"seed\": $i}"
		echo '{"decode": 4}'
	done >"$t/long"
	w=$t/ws-killed
	"$K" run --backend cuda --model "$t/m" --script "$t/long" --workspace "$w" --budget 512 \
		>"$t/killed.log" 2>&1 &
	pid=$!
	sleep 4
	kill -9 $pid 2>/dev/null
	wait $pid 2>/dev/null
	if "$K" verify "$w" >"$t/verify-killed.log" 2>&1 &&
		"$K" run --backend cuda --model "$t/m" --script "$t/b" --workspace "$w" --budget 512 \
			--json >"$t/after-kill.log" 2>&1; then
		ok "a GPU run killed by SIGKILL after 4 s ($(grep -c '^step' "$t/killed.log") steps done) leaves a workspace that verifies and continues ($(grep -o '"workspace_tokens":[0-9]*' "$t/after-kill.log" | tail -1))"
	else
		bad "killed GPU run:"
		tail -3 "$t/killed.log" "$t/verify-killed.log" "$t/after-kill.log"
	fi
fi

if has bench || has bench36; then
	elapsed "bench step, 36 layers"
	timeout 150 "$K" bench step --dir "$scratch/b36" --only ${BENCH36_ONLY:-ceilings,remat,coldin,stageout} \
		--coldin 2G --remat ${REMAT:-16384} --prefill 16384 2>&1 | tee "$out/bench_step_36.log"
	[ "${PIPESTATUS[0]}" = 0 ] && ok "bench step (36 layers)" || bad "bench step (36 layers)"
fi
if has bench || has fits; then
	elapsed "bench step, what fits at 24 GB"
	timeout 60 "$K" bench step --dir "$scratch/bf" --only fits --gpu-mem 24G 2>&1 |
		tee "$out/bench_step_fits.log"
	[ "${PIPESTATUS[0]}" = 0 ] && ok "bench step (fits)" || bad "bench step (fits)"
fi
if has bench || has benchL; then
	elapsed "bench step, $STEP_LAYERS layers"
	timeout 150 "$K" bench step --dir "$scratch/bL" --layers "$STEP_LAYERS" --only step,decode \
		--tokens 262144 --view 65536 --steps ${STEPS:-4} 2>&1 | tee "$out/bench_step_L.log"
	[ "${PIPESTATUS[0]}" = 0 ] && ok "bench step ($STEP_LAYERS layers)" || bad "bench step ($STEP_LAYERS layers)"
fi
if has benchLhost; then
	elapsed "bench step, $STEP_LAYERS layers, selections scored on the host"
	timeout 150 "$K" bench step --dir "$scratch/bL" --layers "$STEP_LAYERS" --only step \
		--tokens 262144 --view 65536 --steps ${STEPS:-4} --host-scoring 2>&1 |
		tee "$out/bench_step_L_host.log"
	[ "${PIPESTATUS[0]}" = 0 ] && ok "bench step ($STEP_LAYERS layers, host scoring)" ||
		bad "bench step ($STEP_LAYERS layers, host scoring)"
fi
if has decode; then
	for min in 1 64; do
		elapsed "decode in a paged view, $STEP_LAYERS layers, KVMEM_WRITER_MIN=$min"
		KVMEM_WRITER_MIN=$min timeout 150 "$K" bench step --dir "$scratch/bd" --layers "$STEP_LAYERS" \
			--only decode --tokens 262144 --view 65536 --steps 2 --decode 256 2>&1 |
			tee "$out/bench_decode_L_$min.log" | grep -A1 '^decode in'
		[ "${PIPESTATUS[0]}" = 0 ] && ok "decode ($STEP_LAYERS layers, stage min $min)" ||
			bad "decode ($STEP_LAYERS layers, stage min $min)"
	done
fi
if has decode || has decode36; then
	elapsed "decode in a paged view, 36 layers"
	timeout ${DEC36_TIMEOUT:-300} "$K" bench step --dir "$scratch/bd36" --only decode \
		--tokens 262144 --view 65536 --steps 2 --decode 128 2>&1 |
		tee "$out/bench_decode_36.log" | grep -A1 '^decode in'
	[ "${PIPESTATUS[0]}" = 0 ] && ok "decode (36 layers)" || bad "decode (36 layers)"
fi
if has bench || has memory; then
	elapsed "bench step, memory"
	timeout ${MEM_TIMEOUT:-300} "$K" bench step --dir "$scratch/bm" --layers 1 --only memory \
		--memory "$MEM_SIZES" --view 65536 2>&1 | tee "$out/bench_step_mem.log"
	[ "${PIPESTATUS[0]}" = 0 ] && ok "bench step (memory)" || bad "bench step (memory)"
fi

if has demo; then
	elapsed "demo --scale $DEMO_SCALE"
	timeout ${DEMO_TIMEOUT:-200} "$K" demo --scale "$DEMO_SCALE" --backend cuda \
		--workspace "$scratch/demo" 2>&1 | tee "$out/demo_scale.log"
	[ "${PIPESTATUS[0]}" = 0 ] && ok "demo --scale $DEMO_SCALE" || bad "demo --scale $DEMO_SCALE"
fi
if has reopen; then
	elapsed "demo again: reopened"
	timeout 90 "$K" demo --scale "$DEMO_SCALE" --backend cuda --workspace "$scratch/demo" \
		--quiet 2>&1 | tee "$out/demo_scale_reopen.log" | grep -E 'reopened|Summary|read'
	grep -q 'reopened' "$out/demo_scale_reopen.log" && ok "demo reopened with no re-prefill" ||
		bad "demo reopen"
fi
elapsed "done"
rm -rf "$scratch"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
