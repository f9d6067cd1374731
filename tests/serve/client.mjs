// kvmem serve through the official openai client (tests/cli/test_serve.sh).
//
//   node client.mjs basic  BASE MODEL CORPUS STATE SEED
//   node client.mjs resume BASE MODEL CORPUS STATE SEED
//
// basic: a chat with no conversation, the same streamed (equal text, usage
// at the end), a completion streamed and not (equal), and three turns of
// conversation "mt-SEED" whose messages go to STATE. resume (after the
// server restarted): two more turns of it, the first reopened from disk
// with no re-prefill, then the same five turns in a fresh twin
// conversation in one go: every answer and workspace size must be equal.
import fs from "node:fs";
import { corpus, turns, client, chatTurn, check } from "./common.mjs";

const [mode, base, model, corpusFile, stateFile, seed] = process.argv.slice(2);
const cl = client(base);
const c = corpus(corpusFile);
const qs = turns(c, seed, 5);
const conv = `mt-${seed}`;

async function basic() {
	const msgs = [{ role: "user", content: qs[0] }];
	const a = await chatTurn(cl, model, null, msgs);
	const b = await chatTurn(cl, model, null, msgs, { stream: true });
	check(a.content.length > 0, "a chat answer");
	check(a.content === b.content, `streamed chat equals the whole answer ('${a.content}' vs '${b.content}')`);
	check(b.usage && b.usage.completion_tokens > 0 && b.usage.prompt_tokens === a.usage.prompt_tokens,
		"usage comes with the stream's last chunk");
	const models = await cl.models.list();
	check(models.data.some((m) => m.id === model), "GET /v1/models lists the model");

	const prompt = "<bos> " + qs[1];
	const t1 = await cl.completions.create({ model, prompt, max_tokens: 6, temperature: 0 });
	let t2 = "";
	for await (const ch of await cl.completions.create({ model, prompt, max_tokens: 6, temperature: 0, stream: true }))
		t2 += ch.choices?.[0]?.text ?? "";
	check(t1.choices[0].text === t2, `streamed completion equals the whole one ('${t1.choices[0].text}' vs '${t2}')`);

	const messages = [];
	const answers = [];
	for (let t = 0; t < 3; t++) {
		messages.push({ role: "user", content: qs[t] });
		const r = await chatTurn(cl, model, conv, messages, { stream: t === 1 });
		check(r.kvmem && r.kvmem.conversation === conv, "the answer names its conversation");
		check(t === 0 || r.usage.prompt_tokens < 200, `turn ${t} appended only its new turn (${r.usage.prompt_tokens} tokens)`);
		messages.push({ role: "assistant", content: r.content });
		answers.push({ content: r.content, ws: r.kvmem.workspace_tokens });
	}
	fs.writeFileSync(stateFile, JSON.stringify({ messages, answers }));
	console.log(`basic: chat '${a.content}', completion '${t1.choices[0].text}', conversation ${conv}: ` +
		answers.map((x) => x.content).join(" | "));
}

async function resume() {
	const st = JSON.parse(fs.readFileSync(stateFile, "utf8"));
	const messages = st.messages, answers = st.answers;
	for (let t = 3; t < 5; t++) {
		messages.push({ role: "user", content: qs[t] });
		const r = await chatTurn(cl, model, conv, messages, { stream: t === 4 });
		if (t === 3) {
			check(r.kvmem.restored === true, "the conversation was reopened from its workspace");
			check(r.usage.prompt_tokens < 200, `after the restart only the new turn was prefilled (${r.usage.prompt_tokens} tokens)`);
		}
		messages.push({ role: "assistant", content: r.content });
		answers.push({ content: r.content, ws: r.kvmem.workspace_tokens });
	}
	// The uninterrupted twin: the same turns in one go.
	const twin = [];
	const tm = [];
	for (let t = 0; t < 5; t++) {
		tm.push({ role: "user", content: qs[t] });
		const r = await chatTurn(cl, model, `${conv}-twin`, tm);
		tm.push({ role: "assistant", content: r.content });
		twin.push({ content: r.content, ws: r.kvmem.workspace_tokens });
	}
	check(JSON.stringify(twin) === JSON.stringify(answers),
		`answers across the restart equal the twin's:\n  ${JSON.stringify(answers)}\n  ${JSON.stringify(twin)}`);
	// A mismatch is refused with a clear 409.
	const wrong = messages.slice(0, 3).concat([{ role: "user", content: "? nope.conf db.port =" }]);
	wrong[1] = { role: "assistant", content: "not what was said" };
	try {
		await chatTurn(cl, model, conv, wrong);
		check(false, "a request whose earlier turns differ is refused");
	} catch (e) {
		check(e.status === 409 && /differs/.test(e.message), `409 for differing turns (${e.status} ${e.message})`);
	}
	console.log(`resume: ${answers.map((x) => x.content).join(" | ")} (twin equal)`);
}

try {
	await (mode === "basic" ? basic() : resume());
} catch (e) {
	console.error("FAIL: " + (e.stack || e));
	process.exitCode = 1;
}
