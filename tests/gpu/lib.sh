# Shared by the GPU machine's check scripts (sourced, not run): the bundle,
# the check program, the pass/fail counts and the sanitizer runs.
#
#   . tests/gpu/lib.sh
#   gpu_setup NAME "$@"     B (build folder), san ("nosan" or empty), log
#                           ($OUT/NAME or a temporary folder), G (the check
#                           program), K (the CLI), t0; unpacks the bundle,
#                           sets LD_LIBRARY_PATH and PATH; exits with
#                           "0 passed, 1 failed" when a program is missing
#   gpu_need FILE...        the same exit for other files the script runs
#   count LOG RC            add a check program's "ok"/"FAIL" lines to the
#                           counts (a non-zero exit with no FAIL: a crash)
#   ok / bad TEXT           one pass / one failure, printed
#   gpu_check SECONDS LOG OPTION
#                           run "$G" OPTION into $log/LOG, print its lines
#                           (not its own total) and count them
#   gpu_sanitize ARGS...    compute-sanitizer memcheck and racecheck over
#                           "$G" ARGS, one pass or failure each (none when
#                           $san is nosan)
#   gpu_engine_ab VAR OLD NEW SECONDS ROWS ARGS...
#                           kvmem bench engine --backend cuda ARGS with
#                           VAR=OLD, then VAR=NEW (logs engine_vOLD.log,
#                           engine_vNEW.log), one pass or failure each (ROWS,
#                           a function printing a log's table rows, must
#                           find some); false when there is no CLI
#   gpu_engine_join ROWS OLD NEW
#                           the two runs' rows joined on their first field
#   gpu_left N              the seconds a step may take: N, or what is left
#                           before $gpu_end (seconds since the epoch; unset:
#                           no end), 1 once nothing is (never 0:
#                           "timeout 0" would mean no limit)
#   gpu_unit TEST N [VAR=V] build-gpu's unit test TEST with the cuda backend
#                           (and VAR=V), at most gpu_left N seconds, into
#                           $log/TEST.log: one pass or failure (a skip when
#                           under 5 s are left)
#   gpu_serve NAME PORT [VAR=V...] [-- ARGS...]
#                           kvmem serve at the 8B geometry on cuda, fp8 views,
#                           on PORT (data in $log/data-NAME, its output in
#                           $log/serve-NAME.{out,err}) with the env
#                           assignments and serve ARGS; srv its pid; waits
#                           for /health (150 s; a failure and false if not)
#   gpu_serve_load NAME PORT ARGS...
#                           bench serve --url on PORT --mode closed ARGS into
#                           $log/NAME.{out,err}: one pass or failure, its
#                           summary lines and the /metrics named by
#                           $gpu_serve_metrics (a regex of names) after it;
#                           the whole /metrics in $log/NAME.metrics
#   gpu_done                the "N passed, N failed" line and the exit code
pass=0 fail=0

ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }

count() { # log file, exit code
	local n_ok n_bad
	n_ok=$(grep -c '^ok ' "$1")
	n_bad=$(grep -c '^FAIL ' "$1")
	if [ "$2" -ne 0 ] && [ "$n_bad" -eq 0 ]; then n_bad=1; fi
	pass=$((pass + n_ok)); fail=$((fail + n_bad))
}

gpu_need() {
	local f
	for f in "$@"; do
		if [ ! -x "$f" ]; then
			echo "no $f (build it with tools/gpu/bundle.sh and carry" \
				"build-gpu/bundle.tar.xz, or make BUILD=$B gpu-check-static)"
			echo "0 passed, 1 failed"
			exit 1
		fi
	done
}

gpu_setup() { # name, then the script's arguments: [BUILD] [nosan]
	local name=$1
	shift
	B=${1:-build-gpu}
	san=${2:-}
	[ "$B" = nosan ] && { B=build-gpu; san=nosan; }
	log=${OUT:+$OUT/$name}
	log=${log:-$(mktemp -d "/tmp/kvmem-$name.XXXXXX")}
	mkdir -p "$log"
	export LD_LIBRARY_PATH=$PWD/$B/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	export PATH=$PATH:/usr/local/cuda/bin
	export OMP_WAIT_POLICY=passive
	t0=$(date +%s)
	# The bundle is unpacked every time (a warm machine may hold an older one).
	# So a branch's bundle must travel as $B/bundle.tar.xz itself: one carried
	# under another name and unpacked by hand is overwritten here by the last
	# call's (thirty-ninth session: an experiment's check ran main's binary).
	[ -f "$B/bundle.tar.xz" ] && tar xJf "$B/bundle.tar.xz"
	G=$B/gpu/kvmem_gpu_check-static
	[ -x "$G" ] || G=$B/gpu/kvmem_gpu_check
	K=$B/kvmem
	gpu_need "$G"
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem \
		--format=csv,noheader 2>/dev/null
}

gpu_check() { # seconds, log file name, check program option
	local rc
	echo "== kvmem_gpu_check $3"
	timeout "$1" "$G" "$3" >"$log/$2" 2>&1
	rc=$?
	grep -v 'passed, .* failed$' "$log/$2"
	[ $rc -eq 0 ] || echo "(kvmem_gpu_check $3 exited $rc)"
	count "$log/$2" $rc
}

gpu_sanitize() { # check program arguments
	local tool rc
	[ "$san" = nosan ] && return 0
	if ! command -v compute-sanitizer >/dev/null; then
		bad "compute-sanitizer not found"
		return 0
	fi
	for tool in memcheck racecheck; do
		echo "== compute-sanitizer --tool $tool, $*"
		timeout 90 compute-sanitizer --tool $tool --error-exitcode 99 "$G" "$@" \
			>"$log/$tool.log" 2>&1
		rc=$?
		grep -E '^FAIL|^========= (ERROR|RACECHECK|Invalid|Race)|SUMMARY' "$log/$tool.log" |
			head -10
		if [ $rc -eq 0 ]; then
			ok "compute-sanitizer $tool: clean"
		else
			bad "compute-sanitizer $tool (exit $rc)"
		fi
	done
}

gpu_engine_ab() { # variable, old value, new value, seconds, rows function, bench arguments
	local var=$1 old=$2 new=$3 secs=$4 rows=$5 ver rc
	shift 5
	if [ ! -x "$K" ]; then
		bad "no $K: the engine A/B was not run"
		return 1
	fi
	for ver in $old $new; do
		echo "== $var=$ver $K bench engine --backend cuda $*"
		env "$var=$ver" timeout "$secs" "$K" bench engine --backend cuda "$@" \
			>"$log/engine_v$ver.log" 2>&1
		rc=$?
		grep -E '^(machine|ceilings|decode:|prefill|decode at|[0-9])' "$log/engine_v$ver.log"
		if [ $rc -eq 0 ] && [ -n "$($rows "$log/engine_v$ver.log")" ]; then
			ok "bench engine, $var=$ver"
		else
			bad "bench engine, $var=$ver (exit $rc)"
			tail -5 "$log/engine_v$ver.log"
		fi
	done
}

gpu_engine_join() { # rows function, old value, new value
	join <($1 "$log/engine_v$2.log" | sort) <($1 "$log/engine_v$3.log" | sort) | sort -n
}

gpu_left() { # seconds wanted
	local l
	[ -z "${gpu_end:-}" ] && { echo "$1"; return; }
	l=$((gpu_end - $(date +%s)))
	[ "$l" -lt 1 ] && l=1
	[ "$l" -lt "$1" ] && echo "$l" || echo "$1"
}

gpu_unit() { # test name, seconds, [VAR=VALUE]
	local t rc
	t=$(gpu_left "$2")
	if [ "$t" -lt 5 ]; then
		echo "skip $1 on cuda (no time left)"
		return 0
	fi
	env KVMEM_TEST_BACKEND=cuda ${3:-} timeout "$t" "$B/tests/$1" >"$log/$1.log" 2>&1
	rc=$?
	if [ $rc -eq 0 ]; then
		ok "$1 on cuda${3:+, $3} ($(grep -c '^\[       OK' "$log/$1.log") cases)"
	else
		bad "$1 on cuda${3:+, $3} (exit $rc)"
		grep -E 'ERROR|FAILED|LINE|seed|differ|error' "$log/$1.log" | head -10
	fi
}

# kvmem bench step on cuda, one dtype, the warm tier: log name, dtype,
# workspace tokens, view, phases (--only), seconds at most, then env
# assignments for the run (may be none). Needs $tmp. STEPS: warm steps (2);
# POLICY: the selection (bench step's --policy; meank when unset).
gpu_step() {
	local name=$1 dt=$2 tokens=$3 view=$4 only=$5 secs=$6 rc
	shift 6
	mkdir -p "$tmp/b"
	echo "== ${*:+$* }kvmem bench step --kv-dtype $dt --only $only ($view-token view over $tokens)"
	env "$@" timeout "$(gpu_left "$secs")" "$K" bench step --backend cuda --kv-dtype "$dt" \
		--only "$only" --tokens "$tokens" --view "$view" --steps "${STEPS:-2}" --decode 32 \
		--tiers warm ${POLICY:+--policy "$POLICY"} --dir "$tmp/b" >"$log/$name.log" 2>&1
	rc=$?
	if [ $rc -eq 0 ]; then
		ok "bench step $only, $dt, $view-token view${*:+, $*}"
	else
		bad "bench step $only, $dt, $view-token view${*:+, $*} (exit $rc)"
		tail -5 "$log/$name.log"
	fi
	rm -rf "$tmp/b"
	grep -E 'median step|decode in a|per token:|prefilling|peers:' "$log/$name.log" | cut -c1-400
	return $rc
}

# The session's warm step and decode at a 32K view over 49K tokens, one
# dtype: log name, dtype, then env assignments for the run (may be none).
gpu_step32k() {
	local name=$1 dt=$2
	shift 2
	gpu_step "$name" "$dt" 49152 32768 step,decode 40 "$@"
}

# kvmem_gpu_check --fp8 [ARGS] within SECONDS: the fp8 kernels against
# their twins (the batched ones against their lone calls), with --bench
# then fp8 beside bf16 (decode attention, rematerialisation); the log in
# LOG/fp8_check.log. gpu_fp8_bench SECONDS is --bench.
gpu_fp8_check() { # seconds, then kvmem_gpu_check's arguments past --fp8
	local secs=$1 rc
	shift
	echo "== kvmem_gpu_check --fp8 $*"
	timeout "$(gpu_left "$secs")" "$G" --fp8 "$@" >"$log/fp8_check.log" 2>&1
	rc=$?
	grep -E '^(rematerial|decode attention|FAIL)|batched|put, rows|passed' \
		"$log/fp8_check.log" | cut -c1-300
	count "$log/fp8_check.log" $rc
}

gpu_fp8_bench() { # seconds
	gpu_fp8_check "$1" --bench
}

# kvmem bench batch on cuda at the 8B geometry with the tensor-core GEMM, its
# JSON in LOG.json: log name, seconds, then bench batch's arguments.
gpu_batch() {
	local name=$1 secs=$2
	shift 2
	echo "== KVMEM_CUDA_GEMM_TC=1 kvmem bench batch $*"
	if KVMEM_CUDA_GEMM_TC=1 timeout "$(gpu_left "$secs")" "$K" bench batch --backend cuda \
		--preset 8b --json "$@" >"$log/$name.json" 2>"$log/$name.err"; then
		ok "bench batch $*"
	else
		bad "bench batch $* (exit $?)"
		tail -3 "$log/$name.err"
	fi
	grep -o '"sessions": *[0-9]*\|"host_peak_rss_gb": *[0-9.]*\|"median_batch_tokens_per_s": *[0-9.]*\|"median_alone_tokens_per_s": *[0-9.]*' \
		"$log/$name.json" | tr '\n' ' '
	echo
}

# One line per bench batch JSON in $log: its name, then each row's sessions,
# rates (fastest and median), step and host milliseconds.
gpu_batch_summary() {
	local f
	for f in "$log"/*.json; do
		[ -e "$f" ] || continue
		printf '%-22s ' "$(basename "$f" .json)"
		grep -o '"sessions":[0-9]*\|"alone_tokens_per_s":[0-9.]*\|"batch_tokens_per_s":[0-9.]*\|"median_alone_tokens_per_s":[0-9.]*\|"median_batch_tokens_per_s":[0-9.]*\|"batch_step_ms":[0-9.]*\|"batch_host_ms":[0-9.]*' "$f" |
			sed 's/_tokens_per_s//;s/"//g' | tr '\n' ' '
		echo
	done
}

# The PyTorch peer of gpu_batch (tools/bench/torch_batch_decode.py, graphed,
# over full caches) within SECONDS: seconds, then BATCHES:CONTEXT pairs
# (1,16:32768); its lines in LOG/torch_CONTEXT.out.
gpu_torch_peer() {
	local secs=$1 bc
	shift
	for bc in "$@"; do
		echo "== python3 tools/bench/torch_batch_decode.py --batch ${bc%:*} --context ${bc#*:}"
		if timeout "$(gpu_left "$secs")" python3 tools/bench/torch_batch_decode.py \
			--batch "${bc%:*}" --context "${bc#*:}" >"$log/torch_${bc#*:}.out" 2>&1; then
			ok "PyTorch batched decode, batch ${bc%:*}, context ${bc#*:}"
		else
			bad "PyTorch batched decode, batch ${bc%:*}, context ${bc#*:} (exit $?)"
		fi
		tail -4 "$log/torch_${bc#*:}.out"
	done
}

# The start most scripts share: their time (SECONDS, else the default) from
# now, logs in OUT/NAME, the binaries there, the ceilings' held rate off.
gpu_begin() { # name, default seconds, the script's SECONDS argument
	gpu_end=$(($(date +%s) + ${3:-$2}))
	gpu_setup "$1" build-gpu
	gpu_need "$K" "$G"
	export KVMEM_CEILINGS_HELD=0
}

gpu_serve() { # name, port, then VAR=VALUE assignments, then -- and serve's arguments
	local name=$1 port=$2 envs=()
	shift 2
	while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
	[ "${1:-}" = "--" ] && shift
	env "${envs[@]}" "$K" serve --preset 8b --backend cuda --kv-dtype fp8 --port "$port" \
		--data-dir "$log/data-$name" "$@" >"$log/serve-$name.out" 2>"$log/serve-$name.err" &
	srv=$!
	for _ in $(seq 150); do
		curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
		kill -0 $srv 2>/dev/null || break
		sleep 1
	done
	bad "server $name did not start"
	tail -5 "$log/serve-$name.err"
	return 1
}

gpu_serve_metrics='kvmem_(batch_rounds_total|round_seconds_sum|round_predraws_total|round_predraw_seconds_total|session_lazy_draws_total)'

gpu_serve_load() { # name, port, then bench serve's arguments
	local name=$1 port=$2
	shift 2
	echo "== $name: kvmem bench serve --url ... $*"
	timeout "$(gpu_left 100)" "$K" bench serve --url "http://127.0.0.1:$port" --mode closed "$@" \
		>"$log/$name.out" 2>"$log/$name.err" && ok "bench serve $name" || bad "bench serve $name"
	grep -E "^closed|^poisson|^load" "$log/$name.out" | tail -4
	curl -sf "http://127.0.0.1:$port/metrics" >"$log/$name.metrics"
	grep -E "^$gpu_serve_metrics " "$log/$name.metrics" | tr '\n' ' '
	echo
}

gpu_done() {
	echo "logs: $log; $(($(date +%s) - t0)) s"
	echo "$pass passed, $fail failed"
	[ "$fail" -eq 0 ]
}
