#!/bin/bash
# A bounded load test of kvmem serve on loopback: 16 conversations at once,
# 12 turns each through the openai client, the server killed with SIGKILL
# mid-load and started again; every conversation goes on from its last
# completed turn and ends equal (answers and workspace sizes) to an
# uninterrupted twin: nothing lost, no cross-talk. Prints the latency and
# throughput figures (Documentation/benchmarks.md). KVMEM_SERVE_LOAD="N T K"
# changes the size.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../serve/lib.sh"
cli_setup serve_load
serve_node
serve_corpus "$tmp/corpus.txt" "$seed" 20000
set -- ${KVMEM_SERVE_LOAD:-16 12 90}
timeout 600 node "$NODEDIR/load.mjs" "$KVMEM" "$tmp/corpus.txt" "$seed" "$1" "$2" "$3" \
	"$tmp/load.json" --max-open 64 || bad "load test"
[ -f "$tmp/load.json" ] && node -e '
	const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
	for (const k of ["with_kill", "uninterrupted"]) {
		const s = r[k];
		console.log(`${k}: ${s.requests} requests in ${s.wall_s} s (${s.requests_per_s}/s), ` +
			`${s.completion_tokens_per_s} decoded tok/s, ${s.prompt_tokens_per_s} prefilled tok/s, ` +
			`latency p50 ${s.latency_ms_p50} ms p99 ${s.latency_ms_p99} ms, ` +
			`first token p50 ${s.ttft_ms_p50} ms p99 ${s.ttft_ms_p99} ms`);
	}
	console.log(`replayed turns ${r.replayed_turns}, conversations reopened ${r.restores}`);
	if (r.restores < 1) process.exit(1);' "$tmp/load.json" || bad "no conversation was reopened"
cli_done serve_load
