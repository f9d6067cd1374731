// kvmem serve's crash rule (tests/cli/test_serve_crash.sh): the server ends
// between a turn's record (conversation.json) and its workspace commit
// (KVMEM_SERVE_FAULT=record:3, a fault for tests); started again, the
// conversation must reopen with its committed turns only, run the lost turn
// as a new one (not replay an answer its workspace never held) and go on
// equal to an uninterrupted twin, in tokens and in text.
//
//   node crash.mjs chat|text BASE MODEL CORPUS STATE SEED
//       turns 1 and 2 of conversation cr-chat-SEED (chat) or cr-text-SEED
//       (completions), then turn 3, during which the server must die
//   node crash.mjs after BASE MODEL CORPUS STATE SEED
//       both conversations: turn 3 again, turn 4, then the twins
import fs from "node:fs";
import { corpus, turns, client, chatTurn, check } from "./common.mjs";

const [mode, base, model, corpusFile, stateFile, seed] = process.argv.slice(2);
const cl = client(base);
const c = corpus(corpusFile);
const qs = turns(c, seed, 4);
const id = (kind) => `cr-${kind}-${seed}`;

// Turn t (0-based) of a conversation of the kind; hist holds what the
// conversation's client has sent and received so far.
async function turn(kind, conv, hist, t) {
	if (kind === "chat") {
		const r = await chatTurn(cl, model, conv, hist.messages.concat([{ role: "user", content: qs[t] }]));
		hist.messages.push({ role: "user", content: qs[t] }, { role: "assistant", content: r.content });
		return { content: r.content, prompt: r.usage.prompt_tokens, ws: r.kvmem.workspace_tokens,
			replayed: r.kvmem.replayed, restored: r.kvmem.restored };
	}
	const prompt = hist.text + (t ? "\n" : "<bos> ") + qs[t];
	const r = await cl.completions.create({ model, prompt, max_tokens: 8, temperature: 0 },
		{ headers: { "X-Kvmem-Conversation": conv } });
	hist.text = prompt + r.choices[0].text;
	return { content: r.choices[0].text, prompt: r.usage.prompt_tokens, ws: r.kvmem.workspace_tokens,
		replayed: r.kvmem.replayed, restored: r.kvmem.restored };
}

const fresh = () => ({ messages: [], text: "" });
const same = (a, b) => a.content === b.content && a.prompt === b.prompt && a.ws === b.ws;
const show = (x) => JSON.stringify({ content: x.content, prompt: x.prompt, ws: x.ws });

async function before(kind) {
	const hist = fresh(), done = [];
	for (let t = 0; t < 2; t++)
		done.push(await turn(kind, id(kind), hist, t));
	const st = fs.existsSync(stateFile) ? JSON.parse(fs.readFileSync(stateFile, "utf8")) : {};
	st[kind] = { hist, done };
	fs.writeFileSync(stateFile, JSON.stringify(st));
	try {
		const r = await turn(kind, id(kind), structuredClone(hist), 2);
		check(false, `${kind}: turn 3 was answered (${show(r)}): the fault did not end the server`);
	} catch (e) {
		check(e.status === undefined, `${kind}: turn 3 ended without an answer (${e.message})`);
	}
	console.log(`${kind}: ${done.map((x) => x.content).join(" | ")} | (server gone)`);
}

async function after() {
	const st = JSON.parse(fs.readFileSync(stateFile, "utf8"));
	for (const kind of ["chat", "text"]) {
		const { hist, done } = st[kind];
		const got = done.slice();
		// Turn 3 again: its answer never reached the workspace, so it must
		// run (not be replayed) on a conversation reopened at turn 2.
		const r = await turn(kind, id(kind), hist, 2);
		check(r.restored === true, `${kind}: the conversation was reopened from disk`);
		check(r.replayed === false, `${kind}: turn 3 ran again rather than replaying an answer the ` +
			`workspace does not hold (${show(r)})`);
		got.push(r, await turn(kind, id(kind), hist, 3));
		const twin = [], th = fresh();
		for (let t = 0; t < 4; t++)
			twin.push(await turn(kind, `${id(kind)}-twin`, th, t));
		const ok = check(got.every((x, t) => same(x, twin[t])), `${kind}: every turn equals the ` +
			`uninterrupted twin's (answer, tokens appended, workspace tokens):\n  ` +
			`${got.map(show).join("\n  ")}\ntwin:\n  ${twin.map(show).join("\n  ")}`);
		check(JSON.stringify(hist) === JSON.stringify(th), `${kind}: the conversation's text equals the twin's`);
		if (ok)
			console.log(`${kind}: ${got.map((x) => x.content).join(" | ")} (twin equal)`);
	}
}

try {
	await (mode === "after" ? after() : before(mode));
} catch (e) {
	console.error("FAIL: " + (e.stack || e));
	process.exitCode = 1;
}
