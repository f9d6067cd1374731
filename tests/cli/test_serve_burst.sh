#!/bin/bash
# kvmem serve under a burst of connections past its limit (--max-queue +
# 16 handed to libmicrohttpd). Before the screen counted them, a burst
# reached libmicrohttpd's own connection limit, whose 0.9.75 then locked a
# mutex it held: the server answered nothing more, ever, and SIGTERM could
# not stop it. Now every connection gets an answer (200, 429 from the
# queue, or 503 with Retry-After from the screen), none is reset, and the
# server answers and stops afterwards. Needs python3 (the burst's clients).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../serve/lib.sh"
cli_setup serve_burst
command -v python3 >/dev/null || { echo "skip: python3 is not installed"; exit 77; }

serve_start --max-queue 2 --max-tokens 16 || exit 1

# N clients at once, each one request; prints the answers' counts by status
# ("reset", "timeout" or "nojson" for what a client should never see).
burst() {
	python3 - "$PORT" "$1" <<'EOF'
import collections, json, socket, sys, threading
port, n = int(sys.argv[1]), int(sys.argv[2])
seen, lock = collections.Counter(), threading.Lock()
body = b'{"prompt":"? api.conf db.port =","max_tokens":16}'
def one():
    what = "reset"
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=90)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            got += d
        status = got.split(b" ", 2)[1].decode() if got.startswith(b"HTTP/1.1 ") else "none"
        what = status
        json.loads(got.split(b"\r\n\r\n", 1)[1])
        if status == "503" and b"\r\nRetry-After: " not in got:
            what = "503-no-retry-after"
    except socket.timeout:
        what = "timeout"
    except (ConnectionError, OSError):
        what = "reset"
    except ValueError:
        what = "nojson"
    with lock:
        seen[what] += 1
ts = [threading.Thread(target=one) for _ in range(n)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(" ".join(f"{k}={v}" for k, v in sorted(seen.items())))
EOF
}

# /health answers 200 within 10 s (connections close on the server's side a
# moment after their clients go: 503 until then), else says what it got.
health_soon() {
	local i code
	for i in $(seq 1 50); do
		code=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "$BASE/health")
		[ "$code" = 200 ] && return 0
		sleep 0.2
	done
	bad "/health $1: $code (000: the server hangs)"
}

got=$(burst 240)
echo "240 requests at once: $got"
grep -qE '(^| )(reset|timeout|nojson|none|503-no-retry-after)=' <<<"$got" &&
	bad "a request of the burst got no proper answer: $got"
grep -qE '(^| )200=' <<<"$got" || bad "no request of the burst was answered 200: $got"
grep -qE '(^| )(429|503)=' <<<"$got" || bad "a burst past --max-queue was never refused: $got"
health_soon "after the burst"

# 19 connections that send half a body hold 18 places (the limit at
# --max-queue 2); the 19th is answered 503 at once, and when the clients
# go their places come back.
got=$(timeout 60 python3 - "$PORT" <<'EOF'
import socket, sys, time
port = int(sys.argv[1])
held = []
for i in range(18):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    held.append(s)
time.sleep(1)
s = socket.create_connection(("127.0.0.1", port), timeout=20)
s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
print(s.recv(400).split(b"\r\n")[0].decode())
EOF
)
grep -q "^HTTP/1.1 503 " <<<"$got" || bad "the 19th connection at --max-queue 2: '$got', not 503"
health_soon "after the held connections closed"

kill -TERM "$SPID"
for i in $(seq 1 100); do
	kill -0 "$SPID" 2>/dev/null || break
	sleep 0.1
done
if kill -0 "$SPID" 2>/dev/null; then
	kill -9 "$SPID"
	bad "kvmem serve did not stop within 10 s of SIGTERM"
fi
wait "$SPID" 2>/dev/null
cli_done "serve burst"
