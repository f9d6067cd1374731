// A bounded load test of kvmem serve on loopback (tests/cli/test_serve_load.sh).
//
//   node load.mjs KVMEM CORPUS SEED N TURNS KILL_AFTER OUT.json [serve args...]
//
// Starts the server, runs N conversations at once (TURNS turns each,
// streamed, through the official openai client), kills the server with
// SIGKILL after KILL_AFTER completed requests, starts it again, and lets
// every conversation go on from its last completed turn (a turn whose
// answer was committed but not delivered is answered from the record).
// Then N twin conversations run the same turns with no interruption: every
// answer and every workspace size must equal the twin's. Writes the
// latency figures of both phases to OUT.json.
import { spawn } from "node:child_process";
import fs from "node:fs";
import { corpus, turns, client, chatTurn } from "./common.mjs";

const [kvmem, corpusFile, seed, nArg, tArg, killArg, outFile, ...serveArgs] = process.argv.slice(2);
const N = +nArg, T = +tArg, KILL_AFTER = +killArg;
const c = corpus(corpusFile);
const model = "agentlang";
let server = null, base = null, up = null, failures = [];

function fail(what) {
	failures.push(what);
	console.error("FAIL: " + what);
}

function start() {
	up = new Promise((resolve, reject) => {
		const p = spawn(kvmem, ["serve", "--port", "0", "--quiet", ...serveArgs],
			{ stdio: ["ignore", "pipe", "inherit"] });
		let out = "";
		const timer = setTimeout(() => reject(new Error("kvmem serve did not start in 60 s")), 60000);
		p.stdout.on("data", (d) => {
			out += d;
			const m = /listening on (http:\/\/[^ ]+):(\d+)\/v1/.exec(out);
			if (m && !base) {
				clearTimeout(timer);
				base = `http://127.0.0.1:${m[2]}`;
				resolve(base);
			}
		});
		p.on("exit", (code, sig) => { if (!base) reject(new Error(`kvmem serve exited (${code ?? sig})`)); });
		server = p;
	});
	return up;
}

function pct(a, p) {
	if (!a.length) return null;
	const s = [...a].sort((x, y) => x - y);
	return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))];
}

function stats(rs, wall) {
	const ms = rs.map((r) => r.ms), tt = rs.filter((r) => r.ttft !== null).map((r) => r.ttft);
	const toks = rs.reduce((a, r) => a + (r.usage?.completion_tokens ?? 0), 0);
	const prompt = rs.reduce((a, r) => a + (r.usage?.prompt_tokens ?? 0), 0);
	return {
		requests: rs.length, wall_s: +(wall / 1000).toFixed(3),
		requests_per_s: +(rs.length / (wall / 1000)).toFixed(2),
		completion_tokens: toks, prompt_tokens: prompt,
		completion_tokens_per_s: +(toks / (wall / 1000)).toFixed(1),
		prompt_tokens_per_s: +(prompt / (wall / 1000)).toFixed(1),
		latency_ms_p50: +pct(ms, 50).toFixed(1), latency_ms_p99: +pct(ms, 99).toFixed(1),
		ttft_ms_p50: tt.length ? +pct(tt, 50).toFixed(1) : null,
		ttft_ms_p99: tt.length ? +pct(tt, 99).toFixed(1) : null,
	};
}

let done = 0, killed = false, restarting = null;

async function conversation(id, qs, record, measured) {
	const messages = [];
	for (let t = 0; t < qs.length; t++) {
		messages.push({ role: "user", content: qs[t] });
		for (let attempt = 0; ; attempt++) {
			try {
				const r = await chatTurn(client(await up), model, id, messages, { stream: true });
				if (r.finish === null || r.usage === null) throw new Error("a stream cut short");
				messages.push({ role: "assistant", content: r.content });
				record.push({ content: r.content, ws: r.kvmem.workspace_tokens, replayed: r.kvmem.replayed });
				if (!r.kvmem.replayed) measured.push(r);
				if (++done === KILL_AFTER && !killed) {
					killed = true;
					// Mid-load: the other conversations have requests in flight.
					server.kill("SIGKILL");
					base = null;
					restarting = new Promise((res) => setTimeout(res, 200)).then(start);
					up = restarting;
				}
				break;
			} catch (e) {
				if (!killed || attempt > 50) {
					fail(`${id} turn ${t}: ${e.message}`);
					return;
				}
				await new Promise((res) => setTimeout(res, 100));
			}
		}
	}
}

await start();
const scripts = [];
for (let i = 0; i < N; i++) scripts.push(turns(c, `${seed}${i}`, T));
const answers = scripts.map(() => []), twins = scripts.map(() => []);
const phaseA = [], phaseB = [];
let t0 = performance.now();
await Promise.all(scripts.map((qs, i) => conversation(`load-${seed}-${i}`, qs, answers[i], phaseA)));
const wallA = performance.now() - t0;
if (!killed) fail(`the server was never killed (${done} requests)`);
t0 = performance.now();
await Promise.all(scripts.map((qs, i) => conversation(`twin-${seed}-${i}`, qs, twins[i], phaseB)));
const wallB = performance.now() - t0;
let replays = 0;
for (let i = 0; i < N; i++) {
	replays += answers[i].filter((a) => a.replayed).length;
	const a = answers[i].map((x) => [x.content, x.ws]), b = twins[i].map((x) => [x.content, x.ws]);
	if (a.length !== T) fail(`conversation ${i}: ${a.length} of ${T} turns answered`);
	if (JSON.stringify(a) !== JSON.stringify(b))
		fail(`conversation ${i} differs from its twin:\n  ${JSON.stringify(a)}\n  ${JSON.stringify(b)}`);
}
const metrics = await (await fetch(`${await up}/metrics`)).text();
server.kill("SIGTERM");
const out = {
	conversations: N, turns: T, killed_after: KILL_AFTER, replayed_turns: replays,
	with_kill: stats(phaseA, wallA), uninterrupted: stats(phaseB, wallB),
	restores: +(/^kvmem_conversation_restores_total (\S+)/m.exec(metrics)?.[1] ?? 0),
};
fs.writeFileSync(outFile, JSON.stringify(out, null, 1));
console.log(JSON.stringify(out));
if (failures.length) process.exit(1);
console.log(`load: ${N} conversations x ${T} turns, killed after ${KILL_AFTER}, all equal to their twins`);
