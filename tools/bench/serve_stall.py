#!/usr/bin/env python3
"""How long one conversation's view work stalls the others' decode.

This starts a server (KVMEM, default build/kvmem; the cpu backend unless
BACKEND is set), makes conversation B with a long prompt, then streams a
long answer A (no conversation) and, mid-stream, sends B's next turn.
What B's turn does first is MODE's:

  restore  (default) B's view was given up (--idle-release 0.3): its turn
           lays it out again from its pages.
  select   B's history is past the view's budget (--budget BUDGET, 512
           unless set; HISTORY=N makes it N times as long): its turn ends
           in a step-boundary selection (score, plan, place blocks).
  reopen   B was closed (--idle-close 1): its turn opens the workspace
           again and adopts its stored state (pages read from disk;
           --budget BUDGET, 0 unless set: the view holds it all).

VIEW_SLICE=MS passes --view-slice MS (the server's default: 5 ms a round).

Printed: A's gaps between tokens (median, and the longest while B's turn
starts), B's work (/metrics: the view layout's, the selections', or the
whole turn's time for a reopen) and the view's tokens.

    MODE=select tools/bench/serve_stall.py [REPEATS]   (Python's standard library only)
"""
import http.client, json, os, re, socket, statistics, subprocess, sys, tempfile, threading, time

KVMEM = os.environ.get("KVMEM", "build/kvmem")
BACKEND = os.environ.get("BACKEND", "cpu")
MODE = os.environ.get("MODE", "restore")
BUDGET = os.environ.get("BUDGET", "512" if MODE == "select" else "0")  # the view's (0: all of it)
SERVE_ARGS = {"restore": ["--idle-release", "0.3", "--budget", "0"],
              "select": ["--budget", BUDGET],
              "reopen": ["--idle-close", "1", "--budget", BUDGET]}
# agentlang text (tests/cli/test_serve_admit.sh's lines), about 2K tokens
LINES = ("$ ls\nexecutor.json executor.conf payments.props executor.props\npayments.props\n"
         "$ cat payments.props\npayments.props pool.workers = 18\npayments.props dns.cluster = host14\n"
         "payments.props pool.bucket = 0x2a97\npayments.props quota.cluster = host08\n") * (
         40 * int(os.environ.get("HISTORY", "1")))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def post(port, path, body, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    return r.status, r.read()


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    m = re.search(r"^%s (\S+)$" % name, text, re.M)
    return float(m.group(1)) if m else float("nan")


def stream_times(port, body, out):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    while True:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data: {"):
            out.append(time.monotonic())


def once(port, rep):
    conv = {"X-Kvmem-Conversation": "b%d" % rep}
    first = LINES + "? payments.props pool.workers ="
    st, body = post(port, "/v1/completions", {"prompt": first, "max_tokens": 4}, conv)
    assert st == 200, (st, body)
    first += json.loads(body)["choices"][0]["text"]
    time.sleep(2.5 if MODE == "reopen" else 1.0)  # --idle-release 0.3, --idle-close 1: B's view, or B, goes
    work = {"restore": "kvmem_view_restore_seconds_total", "select": "kvmem_selection_seconds_total",
            "reopen": "kvmem_view_restore_seconds_total"}[MODE]
    before = metric(port, work)
    reopens = metric(port, "kvmem_conversation_restores_total")
    toks_before = metric(port, "kvmem_view_restore_tokens_total")
    times = []
    a = threading.Thread(target=stream_times, args=(port, {"prompt": "$ cat api.conf\napi.conf db.port = 5432\n",
                                                            "max_tokens": 600, "ignore_eos": True,
                                                            "stream": True}, times))
    a.start()
    time.sleep(0.25)
    t_b = time.monotonic()
    st, _ = post(port, "/v1/completions", {"prompt": first + "\n? payments.props dns.cluster =", "max_tokens": 4},
                 conv)
    t_b_end = time.monotonic()
    a.join()
    assert st == 200, st
    gaps = [b - a for a, b in zip(times, times[1:])]
    during = [g for (t0, g) in zip(times, gaps) if t_b - 0.05 <= t0 <= t_b_end]
    if MODE == "reopen":
        assert metric(port, "kvmem_conversation_restores_total") > reopens, "B was not closed and reopened"
    restore = metric(port, work) - before
    rtoks = metric(port, "kvmem_view_restore_tokens_total") - toks_before
    if MODE == "reopen":
        restore = t_b_end - t_b  # the whole turn: the open and adopt are not counted apart
    return statistics.median(gaps) * 1e3, max(during) * 1e3 if during else float("nan"), restore * 1e3, rtoks


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    port = free_port()
    home = tempfile.mkdtemp(prefix="kvmem-stall.")
    if MODE not in SERVE_ARGS:
        sys.exit("serve_stall.py: MODE is restore, select or reopen, not %r" % MODE)
    extra = ["--view-slice", os.environ["VIEW_SLICE"]] if os.environ.get("VIEW_SLICE") else []
    srv = subprocess.Popen([KVMEM, "serve", "--backend", BACKEND, "--port", str(port), "--quiet"] + SERVE_ARGS[MODE] + extra, env={**os.environ, "KVMEM_HOME": home},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        print("kvmem serve (%s, backend %s, MODE %s), %d runs: A's gaps between tokens while B's turn starts"
              % (KVMEM, BACKEND, MODE, reps))
        print("%4s %14s %22s %14s %12s" % ("run", "A median ms", "A longest, B's start",
                                           {"restore": "B layout ms", "select": "B select ms",
                                            "reopen": "B turn ms"}[MODE], "B laid tokens"))
        for rep in range(reps):
            med, worst, restore, rtoks = once(port, rep)
            print("%4d %14.2f %22.2f %14.2f %12d" % (rep + 1, med, worst, restore, rtoks))
    finally:
        srv.terminate()
        srv.wait()
        subprocess.run(["rm", "-rf", home])


if __name__ == "__main__":
    main()
