#!/bin/bash
# Issue 9 item 12 (first half): the session script is streamed. Five lines
# of {"append_random": 268435456} once took 5.2 GB before the first step;
# now memory stays bounded by the chunk, not by the script's token count,
# and a script fed through a pipe runs each line as it arrives.
. "$(dirname "$0")/lib.sh"
cli_setup streaming

# 1. Memory: run the huge script for a few seconds and read the peak RSS.
for i in 1 2 3 4 5; do echo '{"append_random": 268435456}'; done >"$tmp/huge"
echo '{"decode": 1}' >>"$tmp/huge"
"$KVMEM" run --model "$M" --script "$tmp/huge" --chunk 64 >/dev/null 2>&1 &
pid=$!
sleep 4
hwm=$(awk '/^VmHWM:/ { print $2 }' /proc/$pid/status 2>/dev/null)
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
[ -n "$hwm" ] || bad "the run ended before it was measured"
[ "${hwm:-0}" -lt $((400 * 1024)) ] || bad "peak RSS ${hwm} kB after 4 s: the script is expanded in memory"

# 2. A pipe: each line runs when it arrives, before the script ends.
mkfifo "$tmp/pipe"
"$KVMEM" run --model "$M" --script "$tmp/pipe" --json >"$tmp/out" 2>"$tmp/err" &
pid=$!
exec 3>"$tmp/pipe"
echo '{"append_random": 50, "seed": 4}' >&3
for i in $(seq 200); do grep -q '"step":1' "$tmp/out" && break; sleep 0.05; done
grep -q '"step":1' "$tmp/out" || bad "the first line did not run before the script ended"
echo '{"decode": 3}' >&3
exec 3>&-
wait $pid || bad "the piped session failed: $(cat "$tmp/err")"
[ "$(grep -c '"step"' "$tmp/out")" -eq 2 ] || bad "piped session: $(cat "$tmp/out")"

# 3. The same steps from a file and from a pipe give the same tokens, and a
#    regular file with a bad last line is refused before any step runs.
printf '{"append_random": 50, "seed": 4}\n{"decode": 3}\n' >"$tmp/file"
a=$("$KVMEM" run --model "$M" --script "$tmp/file" --json 2>/dev/null | sed 's/"ms":[0-9.]*//')
b=$(sed 's/"ms":[0-9.]*//' "$tmp/out")
[ "$a" = "$b" ] || bad "file and pipe differ: $a / $b"
printf '{"append_random": 50}\n{"decode": 3}\n{"decode": -1}\n' >"$tmp/badlast"
out=$("$KVMEM" run --model "$M" --script "$tmp/badlast" --json 2>&1)
[ $? -eq 2 ] || bad "a bad last line: not exit 2"
grep -q '"step"' <<<"$out" && bad "steps ran before the bad line 3 was seen: $out"
grep -q "badlast:3:" <<<"$out" || bad "the bad line is not named: $out"

cli_done "item 12 script streaming"
