// Shared by kvmem serve's node tests: agentlang conversations made from a
// `kvmem synth sample` text, and the official openai client pointed at a
// kvmem server.
import fs from "node:fs";
import OpenAI from "openai";

// A replayable PRNG (xorshift32) from the test's seed.
export function rng(seed) {
	let s = (Number(BigInt(seed) % 4294967291n) >>> 0) || 1;
	return () => {
		s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
		return s / 4294967296;
	};
}

// The workspace's lines (without <bos> and the trailer), and its facts.
export function corpus(file) {
	const lines = fs.readFileSync(file, "utf8").replace(/^<bos> /, "").split("\n")
		.filter((l) => l && !l.startsWith("----") && !l.startsWith("?"));
	const facts = lines.filter((l) => /^[a-z0-9]+\.[a-z]+ [a-z]+\.[a-z]+ = /.test(l));
	return { lines, facts };
}

// Turn t of a conversation: a few workspace lines, then a question about a
// fact seen so far in this conversation (its answer is the value).
export function turns(c, seed, n, per = 6) {
	const r = rng(seed);
	const start = Math.floor(r() * Math.max(1, c.lines.length - n * per));
	const out = [];
	const seen = [];
	for (let t = 0; t < n; t++) {
		const chunk = c.lines.slice(start + t * per, start + (t + 1) * per);
		for (const l of chunk)
			if (/^[a-z0-9]+\.[a-z]+ [a-z]+\.[a-z]+ = /.test(l)) seen.push(l);
		const pool = seen.length ? seen : c.facts;
		const fact = pool[Math.floor(r() * pool.length)];
		const q = "? " + fact.slice(0, fact.indexOf(" = ")) + " =";
		out.push(chunk.join("\n") + "\n" + q);
	}
	return out;
}

export function client(base, apiKey = "none") {
	return new OpenAI({ baseURL: base + "/v1", apiKey, maxRetries: 0, timeout: 120000 });
}

// One chat turn of a conversation through the official client; streams
// when asked. Returns { content, usage, kvmem, ttft, ms }.
export async function chatTurn(cl, model, conv, messages, { stream = false, max_tokens = 8 } = {}) {
	const t0 = performance.now();
	const opts = conv ? { headers: { "X-Kvmem-Conversation": conv } } : {};
	if (!stream) {
		const r = await cl.chat.completions.create({ model, messages, max_tokens, temperature: 0 }, opts);
		return { content: r.choices[0].message.content, usage: r.usage, kvmem: r.kvmem,
			finish: r.choices[0].finish_reason, ms: performance.now() - t0, ttft: null };
	}
	const s = await cl.chat.completions.create({ model, messages, max_tokens, temperature: 0,
		stream: true, stream_options: { include_usage: true } }, opts);
	let content = "", usage = null, kvmem = null, ttft = null, finish = null;
	for await (const ch of s) {
		if (ch.choices?.length) {
			const d = ch.choices[0].delta?.content;
			if (d) {
				if (ttft === null) ttft = performance.now() - t0;
				content += d;
			}
			if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
		}
		if (ch.usage) { usage = ch.usage; kvmem = ch.kvmem; }
	}
	return { content, usage, kvmem, finish, ttft, ms: performance.now() - t0 };
}

export function check(ok, what) {
	if (!ok) {
		console.error("FAIL: " + what);
		process.exitCode = 1;
	}
	return ok;
}
