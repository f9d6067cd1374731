#!/usr/bin/env python3
# One agentlang conversation through kvmem serve, its turns sent round robin
# to the servers given (two servers sharing a store, or one alone: a twin),
# made from a `kvmem synth sample` text as tests/serve/common.mjs makes them.
# Prints one JSON line per turn: the answer and the workspace's tokens; exits
# 1 at the first turn refused. The same SEED gives the same turns whatever
# TURNS (up to 16): a longer run continues a shorter one.
#   shared.py CORPUS SEED TURNS CONVERSATION BASE [BASE...]
import json
import random
import re
import sys
import urllib.error
import urllib.request

corpus, seed, n, conv, bases = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
fact = re.compile(r"^[a-z0-9]+\.[a-z]+ [a-z]+\.[a-z]+ = ")
with open(corpus, encoding="utf-8") as f:
    lines = [l for l in f.read().replace("<bos> ", "", 1).split("\n")
             if l and not l.startswith("----") and not l.startswith("?")]
facts = [l for l in lines if fact.match(l)]
r = random.Random(seed)
per = 6
# Where the turns start does not depend on how many are asked for (up to
# REACH): a conversation replayed with more turns begins with the same
# messages (test_rados.sh's 'held' sends 1 turn, then 2; with the start
# drawn below len(lines) - n * per, some seeds began the second elsewhere).
REACH = 16
start = r.randrange(max(1, len(lines) - REACH * per))
messages, seen = [], []
for t in range(n):
    chunk = lines[start + t * per:start + (t + 1) * per]
    seen += [l for l in chunk if fact.match(l)]
    pool = seen or facts
    fa = pool[r.randrange(len(pool))]
    messages.append({"role": "user", "content": "\n".join(chunk) + "\n? " + fa[:fa.index(" = ")] + " ="})
    body = json.dumps({"messages": messages, "max_tokens": 8, "temperature": 0}).encode()
    req = urllib.request.Request(bases[t % len(bases)] + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json",
                                          "X-Kvmem-Conversation": conv})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            out = json.load(resp)
    except urllib.error.HTTPError as e:
        print(json.dumps({"turn": t, "status": e.code, "error": e.read().decode()[:2000]}))
        sys.exit(1)
    answer = out["choices"][0]["message"]["content"]
    messages.append({"role": "assistant", "content": answer})
    print(json.dumps({"turn": t, "answer": answer,
                      "workspace_tokens": out["kvmem"]["workspace_tokens"]}), flush=True)
