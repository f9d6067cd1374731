# Helpers of kvmem serve's tests (sourced after tests/cli/lib.sh).
#   serve_node          install tests/serve/package.json's packages (the official
#                       openai client, the tokenizer references) into a cache in
#                       the build folder, copy the test scripts beside them;
#                       exit 77 only when node/npm cannot install them
#   serve_start ARGS    start "$KVMEM serve --port 0 ARGS" (KVMEM_HOME as set),
#                       wait for its "listening" line: SPID, PORT, BASE
#   serve_stop          SIGTERM and wait
#   serve_corpus FILE N agentlang text for conversations (kvmem synth sample)
SERVE_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

serve_node() {
	local sum
	command -v node >/dev/null && command -v npm >/dev/null ||
		{ echo "skip: node and npm are not installed (tools/deps.sh installs them)"; exit 77; }
	NODEDIR=${KVMEM_NODE_DIR:-$(cd "$(dirname "$KVMEM")" && pwd)/serve-node}
	sum=$(cat "$SERVE_SRC/package.json" | sha256sum | cut -c1-16)
	if [ "$(cat "$NODEDIR/.sum" 2>/dev/null)" != "$sum" ]; then
		mkdir -p "$NODEDIR"
		cp "$SERVE_SRC/package.json" "$NODEDIR/"
		if ! (cd "$NODEDIR" && timeout 600 npm install --no-audit --no-fund --no-package-lock \
			--loglevel=error >"$NODEDIR/npm.log" 2>&1); then
			tail -5 "$NODEDIR/npm.log"
			echo "skip: npm could not install tests/serve/package.json (registry unreachable?)"
			exit 77
		fi
		echo "$sum" >"$NODEDIR/.sum"
	fi
	# ES modules find packages from their own folder: run them from there.
	cp "$SERVE_SRC"/*.mjs "$NODEDIR/"
}

serve_start() {
	local i seen
	touch "$tmp/serve.out"	# read below before the server may have opened it
	"$KVMEM" serve --port 0 "$@" >>"$tmp/serve.out" 2>>"$tmp/serve.err" &
	SPID=$!
	for i in $(seq 1 600); do
		# One look at the file for both the count and the port (read
		# twice, a line the new server writes between the two reads
		# would pair its count with the old server's port), whole
		# lines only (a line half written has no /v1 yet).
		seen=$(grep -E 'listening on http://[^ ]*:[0-9]+/v1$' "$tmp/serve.out")
		PORT=$(sed -n 's|.*listening on http://[^ ]*:\([0-9][0-9]*\)/v1$|\1|p' <<<"$seen" | tail -1)
		if [ -n "$PORT" ] && [ "$(grep -c . <<<"$seen")" -gt "${SERVE_STARTS:-0}" ]; then
			SERVE_STARTS=$(grep -c . <<<"$seen")
			BASE="http://127.0.0.1:$PORT"
			return 0
		fi
		kill -0 "$SPID" 2>/dev/null || { echo "kvmem serve died:"; tail -5 "$tmp/serve.err"; return 1; }
		sleep 0.1
	done
	echo "kvmem serve did not start in 60 s"
	return 1
}

serve_stop() {
	kill -TERM "$SPID" 2>/dev/null
	wait "$SPID" 2>/dev/null
}

serve_corpus() {
	"$KVMEM" synth sample --seed "$2" --tokens "$3" --questions 0 >"$1" 2>/dev/null ||
		"$KVMEM" synth sample --seed "$2" --tokens "$3" >"$1"
}
