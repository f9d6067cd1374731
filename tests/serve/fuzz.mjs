// Seeded malformed requests against kvmem serve over raw sockets
// (tests/cli/test_serve_fuzz.sh, with the ASan build):
//
//   node fuzz.mjs PORT SEED COUNT
//
// Mutated JSON bodies (flipped, dropped, inserted bytes, cuts), fields of
// the wrong type, deep nesting, huge numbers and strings, invalid UTF-8,
// odd methods, paths and headers, lying Content-Lengths, garbage chunked
// bodies, and now and then a valid request on a few conversations at once.
// Every request that can be answered must be, within 30 s; then the
// server must still answer /health and a valid chat.
import net from "node:net";
import { rng } from "./common.mjs";

const [port, seed, countArg] = process.argv.slice(2);
const COUNT = +countArg;
const r = rng(seed);
const int = (n) => Math.floor(r() * n);
const pick = (a) => a[int(a.length)];

const valid = () => ({
	model: "agentlang",
	messages: [{ role: "user", content: pick(["? api.conf db.port =", "$ cat api.conf\napi.conf db.port = 5432\n? api.conf db.port ="]) }],
	max_tokens: int(4) + 1,
});
const junk = [null, true, false, 0, -1, 1e308, -1e308, 1.5, 2 ** 63, "x", "", [], {}, [[[]]], { a: { b: {} } },
	"\ud800", "a".repeat(3000), 12345678901234567890];

function mutateJson() {
	const b = valid();
	const k = int(8);
	if (k === 0) b[pick(["model", "messages", "max_tokens", "temperature", "top_p", "stream", "seed", "n",
		"stream_options", "tools", "tool_choice", "conversation", "chat_template_kwargs", "stop", "zzz"])] = pick(junk);
	else if (k === 1) b.messages = [pick(junk)];
	else if (k === 2) b.messages[0][pick(["role", "content", "tool_calls", "name", "x"])] = pick(junk);
	else if (k === 3) b.messages.push({ role: "assistant", content: "x", tool_calls: pick(junk) });
	else if (k === 4) b.tools = [pick(junk), { type: "function", function: pick(junk) }];
	else if (k === 5) b.stream = true;
	else if (k === 6) b.max_tokens = pick([0, 1, 2000000, -5, 3.5]);
	else b.messages = Array.from({ length: int(50) }, () => ({ role: pick(["user", "assistant", "tool", "system"]), content: pick(["", "? a =", "x"]) }));
	let s = Buffer.from(JSON.stringify(b));
	// Byte-level damage to some.
	const dmg = int(4);
	for (let i = 0; i < dmg; i++) {
		const at = int(s.length);
		const op = int(4);
		if (op === 0) s[at] = int(256);
		else if (op === 1) s = Buffer.concat([s.subarray(0, at), s.subarray(at + 1)]);
		else if (op === 2) s = Buffer.concat([s.subarray(0, at), Buffer.from([int(256)]), s.subarray(at)]);
		else s = s.subarray(0, at);
	}
	return s;
}

function body() {
	switch (int(6)) {
	case 0: return Buffer.from("[".repeat(int(100000)));
	case 1: return Buffer.from('{"messages":' + "[".repeat(int(5000)) + "]".repeat(int(5000)) + "}");
	case 2: return Buffer.from(Array.from({ length: int(200) }, () => int(256)));
	case 3: return Buffer.from('{"model":"agentlang","messages":[{"role":"user","content":"' + "\\u00".repeat(int(10)) + '"}]}');
	default: return mutateJson();
	}
}

function request(i) {
	const conv = pick(["", "", "c1", "c2", "c3", "../x", "a/b", "%2e%2e", "x".repeat(300), "\u00e9", "ok.1", "-a"]);
	const kind = int(20);
	let method = "POST", path = "/v1/chat/completions", b, headers = [], lie = false, chunked = false;
	if (kind === 0) method = pick(["GET", "PUT", "DELETE", "OPTIONS", "PATCH", "FOO"]);
	if (kind === 1) path = pick(["/v1/completions", "/v1/models", "/metrics", "/health", "/", "/v1/../etc/passwd",
		"/v1/chat/completions?x=1", "/" + "a".repeat(5000), "/v1/%00", "*"]);
	if (kind === 2) b = Buffer.from(JSON.stringify(valid()));
	else if (kind === 3) b = Buffer.from(JSON.stringify({ model: "agentlang", prompt: pick(junk), max_tokens: 2 }));
	else b = body();
	if (kind === 3) path = "/v1/completions";
	if (conv) headers.push(`X-Kvmem-Conversation: ${conv}`);
	if (kind === 4) headers.push("Authorization: Bearer " + "x".repeat(int(100)));
	if (kind === 5) headers.push(pick(["Expect: 100-continue", "Transfer-Encoding: gzip", "Content-Type: text/plain", "X: " + "y".repeat(9000)]));
	if (kind === 6) lie = true;
	if (kind === 7) chunked = true;
	let head = `${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n`;
	for (const h of headers) head += h + "\r\n";
	if (chunked) {
		head += "Transfer-Encoding: chunked\r\n\r\n";
		const parts = [];
		for (let off = 0; off < b.length;) {
			const n = Math.min(b.length - off, int(64) + 1);
			parts.push(Buffer.from((int(10) ? n.toString(16) : "zz") + "\r\n"), b.subarray(off, off + n), Buffer.from("\r\n"));
			off += n;
		}
		parts.push(Buffer.from(int(3) ? "0\r\n\r\n" : ""));
		return { data: Buffer.concat([Buffer.from(head), ...parts]), expectAnswer: false };
	}
	head += `Content-Length: ${lie ? b.length + 1 + int(1000) : b.length}\r\n\r\n`;
	return { data: Buffer.concat([Buffer.from(head), b]), expectAnswer: !lie, valid: kind === 2 };
}

function send(req) {
	return new Promise((resolve) => {
		const s = net.connect(+port, "127.0.0.1");
		let got = "";
		const timer = setTimeout(() => { s.destroy(); resolve({ timeout: true, got }); },
			req.expectAnswer ? 30000 : 2000);
		s.on("data", (d) => { got += d.toString("latin1"); });
		s.on("error", () => {});
		s.on("close", () => { clearTimeout(timer); resolve({ timeout: false, got }); });
		s.write(req.data);
		if (!req.expectAnswer) setTimeout(() => s.end(), 200);
	});
}

let hangs = 0, answered = 0, ok200 = 0, noanswer = 0;
const statuses = {};
let next = 0;
async function worker() {
	while (next < COUNT) {
		const i = next++;
		const req = request(i);
		const res = await send(req);
		const m = /^HTTP\/1\.[01] (\d+)/.exec(res.got);
		if (m) {
			answered++;
			statuses[m[1]] = (statuses[m[1]] ?? 0) + 1;
			if (m[1] === "200") ok200++;
			if (m[1] !== "200" && m[1] !== "100" && !/"error":\{"message":/.test(res.got) && /^HTTP\/1\.1 [45]\d\d/.test(res.got) && /application\/json/.test(res.got))
				console.error(`request ${i}: an error without an OpenAI body`);
		} else if (req.expectAnswer) {
			if (res.timeout) {
				hangs++;
				if (process.env.FUZZ_DEBUG)
					console.error(`hung: ${req.data.subarray(0, 300).toString("latin1").replace(/\r\n/g, " | ")}`);
			}
			else noanswer++;
		}
	}
}
await Promise.all(Array.from({ length: 8 }, worker));
console.log(`fuzz: ${COUNT} requests, ${answered} answered (${JSON.stringify(statuses)}), ${noanswer} closed without an answer, ${hangs} hung`);
const h = await fetch(`http://127.0.0.1:${port}/health`).then((x) => x.status).catch(() => 0);
const c = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, { method: "POST",
	body: JSON.stringify(valid()) }).then((x) => x.status).catch(() => 0);
if (hangs || h !== 200 || c !== 200 || ok200 === 0) {
	console.error(`FAIL: hangs ${hangs}, /health ${h}, chat ${c}, 200s ${ok200}`);
	process.exit(1);
}
