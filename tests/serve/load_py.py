#!/usr/bin/env python3
"""kvmem serve's throughput and latency where Node is not installed (the GPU
machine): N agentlang conversations at once, T streamed chat turns each,
the same figures as tests/serve/load.mjs's uninterrupted phase. Python's
standard library only (http.client, threads). No kill and restart here:
tests/cli/test_serve_load.sh covers that on every test run.

    load_py.py KVMEM CORPUS SEED N T OUT.json [serve args...]

CORPUS is a `kvmem synth sample` text (tests/serve/lib.sh's serve_corpus).
Prints one summary line and writes OUT.json; exit status 1 when a request
failed or a conversation saw a wrong-looking answer count.
"""
import http.client
import json
import random
import re
import subprocess
import sys
import threading
import time

FACT = re.compile(r"^[a-z0-9]+\.[a-z]+ [a-z]+\.[a-z]+ = ")


def corpus(path):
    text = open(path, encoding="utf-8").read()
    if text.startswith("<bos> "):
        text = text[len("<bos> "):]
    lines = [l for l in text.split("\n") if l and not l.startswith("----") and not l.startswith("?")]
    return lines, [l for l in lines if FACT.match(l)]


def turns(lines, facts, rng, n, per=6):
    """As common.mjs's turns(): a few workspace lines, then a question about
    a fact seen so far in this conversation."""
    start = rng.randrange(max(1, len(lines) - n * per))
    seen, out = [], []
    for t in range(n):
        chunk = lines[start + t * per:start + (t + 1) * per]
        seen += [l for l in chunk if FACT.match(l)]
        fact = rng.choice(seen or facts)
        out.append("\n".join(chunk) + "\n? " + fact[:fact.index(" = ")] + " =")
    return out


def chat_turn(port, conv, messages, max_tokens=8):
    """One streamed chat turn; returns (content, usage, ttft_ms, ms)."""
    body = json.dumps({"model": "agentlang", "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/chat/completions", body,
              {"Content-Type": "application/json", "X-Kvmem-Conversation": conv})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    content, usage, ttft = "", None, None
    for raw in r:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ch = json.loads(line[6:])
        for choice in ch.get("choices") or []:
            d = (choice.get("delta") or {}).get("content")
            if d:
                if ttft is None:
                    ttft = (time.perf_counter() - t0) * 1e3
                content += d
        if ch.get("usage"):
            usage = ch["usage"]
    c.close()
    return content, usage, ttft, (time.perf_counter() - t0) * 1e3


def pct(a, p):
    s = sorted(a)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else None


def main():
    if len(sys.argv) < 7:
        print(__doc__.strip().splitlines()[6].strip(), file=sys.stderr)
        return 2
    kvmem, corpus_file, seed, n, t, out_file = sys.argv[1:7]
    n, t = int(n), int(t)
    lines, facts = corpus(corpus_file)
    srv = subprocess.Popen([kvmem, "serve", "--port", "0", "--quiet", *sys.argv[7:]],
                           stdout=subprocess.PIPE, text=True)
    port = None
    t_end = time.time() + 120
    while port is None and time.time() < t_end:
        line = srv.stdout.readline()
        if not line:
            break
        m = re.search(r"listening on http://[^ ]+:(\d+)/v1", line)
        if m:
            port = int(m.group(1))
    if port is None:
        srv.kill()
        print("kvmem serve did not start", file=sys.stderr)
        return 1
    results, failures, lock = [], [], threading.Lock()

    def conversation(i):
        rng = random.Random(f"{seed}-{i}")
        messages = []
        for q in turns(lines, facts, rng, t):
            messages.append({"role": "user", "content": q})
            try:
                content, usage, ttft, ms = chat_turn(port, f"load-{seed}-{i}", messages)
            except Exception as e:  # noqa: BLE001 - reported, counted as a failure
                with lock:
                    failures.append(f"conversation {i}: {e}")
                return
            messages.append({"role": "assistant", "content": content})
            with lock:
                results.append((usage or {}, ttft, ms))

    t0 = time.perf_counter()
    th = [threading.Thread(target=conversation, args=(i,)) for i in range(n)]
    for x in th:
        x.start()
    for x in th:
        x.join()
    wall = time.perf_counter() - t0
    srv.terminate()
    srv.wait(timeout=60)
    ms = [r[2] for r in results]
    tt = [r[1] for r in results if r[1] is not None]
    toks = sum(r[0].get("completion_tokens", 0) for r in results)
    prompt = sum(r[0].get("prompt_tokens", 0) for r in results)
    s = {"requests": len(results), "failures": failures, "wall_s": round(wall, 3),
         "requests_per_s": round(len(results) / wall, 2),
         "completion_tokens": toks, "prompt_tokens": prompt,
         "completion_tokens_per_s": round(toks / wall, 1),
         "prompt_tokens_per_s": round(prompt / wall, 1),
         "latency_ms_p50": round(pct(ms, 50) or 0, 1), "latency_ms_p99": round(pct(ms, 99) or 0, 1),
         "ttft_ms_p50": round(pct(tt, 50) or 0, 1), "ttft_ms_p99": round(pct(tt, 99) or 0, 1),
         "serve_args": sys.argv[7:]}
    json.dump(s, open(out_file, "w"), indent=1)
    print(f"{s['requests']} requests in {s['wall_s']} s ({s['requests_per_s']}/s), "
          f"{s['completion_tokens_per_s']} decoded tok/s, {s['prompt_tokens_per_s']} prefilled tok/s, "
          f"latency p50 {s['latency_ms_p50']} ms p99 {s['latency_ms_p99']} ms, first token "
          f"p50 {s['ttft_ms_p50']} ms p99 {s['ttft_ms_p99']} ms; {len(failures)} failed")
    for f in failures[:5]:
        print("FAIL:", f)
    return 1 if failures or len(results) != n * t else 0


if __name__ == "__main__":
    sys.exit(main())
