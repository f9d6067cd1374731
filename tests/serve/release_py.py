#!/usr/bin/env python3
"""Idle views and the pinned pool of kvmem serve where Node is not installed
(the GPU machine), Python's standard library only: the twin check of
tests/cli/test_serve_release.sh, with figures.

    release_py.py KVMEM CORPUS OUTDIR [serve args...]

Two servers (the serve args, e.g. --backend cuda) run the same completion
conversation, five turns of agentlang lines with sampled answers (a
temperature and a seed each turn) and their log probabilities, under
--budget 256 so selections move the view: the twin keeps its view
(--idle-release 0), the other gives it up between turns (--idle-release
0.3, waited for on /metrics). Checks: every turn's text, log probabilities,
usage and workspace tokens equal the twin's; the conversation never
reopened from disk; /metrics counts 5 views given up and 4 laid out again.
Figures: start-up (spawn to listening) and the pool's pinning as the server
prints it, at the twin's --host-cap 256M and the other's --host-cap HOSTCAP
(env, default 2700M); each turn's time in both; the views laid out again
(tokens, seconds); the backend's device bytes with the view held and given
up; the first two turns again on a server started with KVMEM_SERVE_PIN=0
(the peer: the first conversation's session pins the pool inside its
turn, as before) against the same turns where the pool was pinned at
start (equal answers; the first turn checked to be faster when pinning
takes over 0.1 s). Prints "ok"/"FAIL" lines, the figures as one JSON
line, and writes OUTDIR/release.json; exit 1 when a check failed.
"""
import http.client
import json
import os
import re
import subprocess
import sys
import time

KVMEM, CORPUS, OUT = sys.argv[1:4]
EXTRA = sys.argv[4:]
HOSTCAP = os.environ.get("HOSTCAP", "2700M")
BASE_OPTS = ["--max-tokens", "24", "--budget", "256", "--block", "32", "--idle-close", "0"]
fails = 0


def check(cond, what):
    global fails
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    fails += not cond


class Server:
    def __init__(self, name, args, env_extra=None):
        home = os.path.join(OUT, name)
        os.makedirs(home, exist_ok=True)
        env = dict(os.environ, KVMEM_HOME=home, **(env_extra or {}))
        self.err = open(os.path.join(OUT, name + ".err"), "w")
        t0 = time.perf_counter()
        self.p = subprocess.Popen([KVMEM, "serve", "--port", "0"] + BASE_OPTS + EXTRA + args,
                                  stdout=subprocess.PIPE, stderr=self.err, text=True, env=env)
        self.pin_s, self.pinned_mib, self.port = None, 0.0, None
        for line in self.p.stdout:
            m = re.search(r"host pool of ([0-9.]+) MiB pinned .* in ([0-9.]+) s", line)
            if m:
                self.pinned_mib, self.pin_s = float(m.group(1)), float(m.group(2))
            m = re.search(r"listening on http://[^ ]*:([0-9]+)/v1$", line.strip())
            if m:
                self.port = int(m.group(1))
                break
        self.start_s = time.perf_counter() - t0
        if not self.port:
            raise RuntimeError(f"kvmem serve {name} did not start (see {self.err.name})")

    def post(self, path, body, conv=None):
        t0 = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        h = {"Content-Type": "application/json"}
        if conv:
            h["X-Kvmem-Conversation"] = conv
        c.request("POST", path, json.dumps(body), h)
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
        return json.loads(data), time.perf_counter() - t0

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        out = {}
        for line in c.getresponse().read().decode().split("\n"):
            if line and not line.startswith("#"):
                k, v = line.split(" ", 1)
                out[k] = float(v)
        return out

    def until(self, name, n, secs=15):
        t = time.time() + secs
        while time.time() < t:
            if self.metrics().get(name, 0) >= n:
                return True
            time.sleep(0.1)
        return False

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()


text = open(CORPUS, encoding="utf-8").read()


def turn(sv, conv, i, held):
    a = text.index("\n", 1000 + 3000 * i) + 1
    b = text.rindex("\n", 0, a + 600) + 1
    prompt = held + text[a:b]
    ans, secs = sv.post("/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0.8,
                                           "seed": 100 + i, "logprobs": 5, "ignore_eos": True},
                        conv)
    ch = ans["choices"][0]
    key = json.dumps([ch["text"], ch["logprobs"], ch["finish_reason"], ans["usage"],
                      ans["kvmem"]["workspace_tokens"]])
    return prompt + ch["text"], key, secs, ans["kvmem"]["restored"]


fig = {"backend_args": EXTRA}
twin = Server("twin", ["--idle-release", "0"])
fig["twin_start_s"], fig["twin_pin_s"], fig["twin_pinned_mib"] = twin.start_s, twin.pin_s, twin.pinned_mib
held, twin_keys, fig["twin_turn_s"] = "", [], []
for i in range(1, 6):
    held, key, secs, _ = turn(twin, "c", i, held)
    twin_keys.append(key)
    fig["twin_turn_s"].append(round(secs, 4))
check(twin.metrics().get("kvmem_views_released_total", -1) == 0, "--idle-release 0 gave no view up")
twin.stop()

idle = Server("idle", ["--idle-release", "0.3", "--host-cap", HOSTCAP])
fig["idle_start_s"], fig["idle_pin_s"], fig["idle_pinned_mib"] = idle.start_s, idle.pin_s, idle.pinned_mib
held, fig["idle_turn_s"], fig["device_bytes_held"], fig["device_bytes_given_up"] = "", [], [], []
restored_any = False
for i in range(1, 6):
    held, key, secs, restored = turn(idle, "c", i, held)
    restored_any |= restored
    fig["idle_turn_s"].append(round(secs, 4))
    fig["device_bytes_held"].append(idle.metrics().get("kvmem_tier_device_bytes"))
    check(key == twin_keys[i - 1], f"turn {i} after the view was given up equals the twin's "
          "(text, logprobs, usage, workspace tokens)")
    if key != twin_keys[i - 1]:
        print("  idle:", key[:300], "\n  twin:", twin_keys[i - 1][:300])
    check(idle.until("kvmem_views_released_total", i), f"view given up after turn {i}")
    fig["device_bytes_given_up"].append(idle.metrics().get("kvmem_tier_device_bytes"))
m = idle.metrics()
check(not restored_any and m.get("kvmem_conversation_restores_total") == 0,
      "never reopened from disk (no re-prefill)")
check(m.get("kvmem_views_restored_total") == 4, f"4 views laid out again ({m.get('kvmem_views_restored_total')})")
fig["restored_views"] = m.get("kvmem_views_restored_total")
fig["restore_tokens"] = m.get("kvmem_view_restore_tokens_total")
fig["restore_s"] = m.get("kvmem_view_restore_seconds_total")
fig["pinned_bytes_metric"] = m.get("kvmem_host_pool_pinned_bytes")
idle.stop()
# The peer: the pool pinned by the first session that lays pages out,
# inside its turn (and again after the last session over it closed).
peer = Server("peer", ["--idle-release", "0", "--host-cap", HOSTCAP], {"KVMEM_SERVE_PIN": "0"})
fig["peer_start_s"], fig["peer_pin_s"], fig["peer_turn_s"] = peer.start_s, peer.pin_s, []
held = ""
for i in range(1, 3):
    held, key, secs, _ = turn(peer, "c", i, held)
    fig["peer_turn_s"].append(round(secs, 4))
    check(key == twin_keys[i - 1], f"KVMEM_SERVE_PIN=0, turn {i} equals the twin's")
peer.stop()
check(peer.pin_s is None, "KVMEM_SERVE_PIN=0 pins nothing at start")
if fig["idle_pin_s"] and fig["idle_pin_s"] > 0.1:
    ours, theirs = fig["idle_turn_s"][0], fig["peer_turn_s"][0]
    check(ours < theirs, f"the first turn pays no pinning: {ours:.3f} s, {theirs:.3f} s when "
          f"its session pins the pool ({fig['idle_pin_s']:.3f} s at start)")
print(json.dumps(fig))
with open(os.path.join(OUT, "release.json"), "w") as f:
    json.dump(fig, f, indent=1)
sys.exit(1 if fails else 0)
