// One raw HTTP exchange with kvmem serve, for requests curl will not send
// (a NUL in a header, two Content-Lengths, a 20 KiB request line):
//
//   node raw.mjs PORT REQUEST [WAIT_MS]
//
// REQUEST is a JavaScript string literal's body (\r\n, \x00, and
// ${"a".repeat(20000)} are expanded). Prints the status line, then the
// body, and exits 0 once the server closed the connection (or WAIT_MS,
// default 10000, passed: exit 1).
import net from "node:net";

const [port, spec, waitArg] = process.argv.slice(2);
const req = Function("return `" + spec + "`")();
const s = net.connect(+port, "127.0.0.1");
const chunks = [];
const timer = setTimeout(() => {
	console.log("(no answer in time)");
	process.exit(1);
}, +(waitArg ?? 10000));
s.on("data", (d) => chunks.push(d));
s.on("error", () => {});
s.on("close", () => {
	clearTimeout(timer);
	const text = Buffer.concat(chunks).toString("latin1");
	const head = text.slice(0, text.indexOf("\r\n\r\n"));
	console.log(head.split("\r\n")[0]);
	for (const h of head.split("\r\n").slice(1)) console.log("header " + h);
	console.log(text.slice(text.indexOf("\r\n\r\n") + 4));
	process.exit(0);
});
s.write(Buffer.from(req, "latin1"));
