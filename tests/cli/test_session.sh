#!/bin/bash
# kvmem run (agent sessions) end to end on the tiny random model:
#  - a budget over the workspace: --check-exact passes for every policy and
#    block sizes 16..256 (logits bit-identical to full context);
#  - a budget ten times smaller: every policy runs, each step's view stays
#    within the budget and every decode step's view holds the pinned blocks;
#  - the stable layout (--layout stable) the same: exact over the workspace,
#    within budget and pins kept at a tenth; a bad layout exits 2;
#  - script errors name the line and exit 2.
# Needs $KVMEM (the kvmem binary); skipped (77) when the model generator is
# not built yet.
set -u
KVMEM=${KVMEM:-build/kvmem}
[ -x "$KVMEM" ] || { echo "no kvmem binary at $KVMEM"; exit 77; }
tmp=$(mktemp -d /tmp/kvmem-session.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if ! "$KVMEM" generate --preset tiny --out "$tmp/model" >/dev/null 2>&1; then
	echo "kvmem generate does not work yet: skipping"
	exit 77
fi
# A loaded 2-core box: let idle OpenMP threads sleep instead of spinning.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# 1002 tokens. Pinned: the "system prompt" [0, 20) and a "query" [378, 383),
# which sit in one block each for block sizes 16 and 32.
cat >"$tmp/script" <<'EOF'
{"append_random": 20, "seed": 1, "pin": true}
{"append_random": 150, "seed": 2}
{"decode": 10}
{"append_random": 198, "seed": 3}
{"append": [1, 2, 3, 4, 5], "pin": true}
{"decode": 30}
{"append_random": 300}
{"decode": 20}
{"append_random": 229, "seed": 9}
{"decode": 40}
EOF
total=1002
fail=0
policies="meank subblock refine quest recency random oracle"

bad() { echo "FAIL: $*"; fail=1; }

# Budget over the workspace: exact for every policy at 16 and 256, and for
# meank at every block size.
runs=""
for p in $policies; do runs="$runs $p:16 $p:256"; done
runs="$runs meank:32 meank:64 meank:128"
for r in $runs; do
	p=${r%%:*} b=${r##*:}
	if ! out=$("$KVMEM" run --model "$tmp/model" --script "$tmp/script" --policy "$p" \
		--block "$b" --budget $((total + 17)) --chunk 48 --check-exact --json 2>&1); then
		bad "exact run, policy $p block $b:"
		echo "$out" | tail -5
		continue
	fi
	n=$(echo "$out" | grep -c '"max_logit_diff":0,')
	[ "$n" -eq 10 ] || bad "policy $p block $b: only $n of 10 steps with logit difference 0"
done
# The stable layout over the workspace: no block leaves, the identity view.
for r in meank:16 random:32 subblock:64; do
	p=${r%%:*} b=${r##*:}
	if ! out=$("$KVMEM" run --model "$tmp/model" --script "$tmp/script" --policy "$p" \
		--block "$b" --budget $((total + 17)) --chunk 48 --check-exact --json \
		--layout stable 2>&1); then
		bad "exact stable run, policy $p block $b:"
		echo "$out" | tail -5
		continue
	fi
	n=$(echo "$out" | grep -c '"max_logit_diff":0,')
	[ "$n" -eq 10 ] || bad "stable, policy $p block $b: only $n of 10 steps with difference 0"
done

# Budget ten times smaller than the workspace: within budget, pins kept.
budget=$((total / 10))
for r in $policies meank:stable random:stable quest:stable; do
	p=${r%%:*} lay=compact
	[ "$p" != "$r" ] && lay=${r##*:}
	for b in 16 32; do
		if ! out=$("$KVMEM" run --model "$tmp/model" --script "$tmp/script" --policy "$p" \
			--block "$b" --budget $budget --chunk 32 --json --layout $lay \
			2>"$tmp/err"); then
			bad "small budget, policy $p block $b layout $lay: $(tail -3 "$tmp/err")"
			continue
		fi
		echo "$out" | awk -v budget=$budget -v B=$b -v what="policy $p block $b $lay" '
		function num(key,   m) {
			if (!match($0, "\"" key "\":[0-9]+"))
				return -1
			m = substr($0, RSTART, RLENGTH)
			sub(/.*:/, "", m)
			return m + 0
		}
		{
			steps++
			if (num("view_tokens") > budget) {
				print "FAIL: " what ": view over budget: " $0; bad = 1
			}
			if ($0 !~ /"op":"decode"/)
				next
			decodes++
			# Blocks of the view, from "blocks":[[a,b],...].
			s = $0
			sub(/.*"blocks":\[/, "", s)
			sub(/\]\],.*/, "", s)
			gsub(/[\[\]]/, "", s)
			n = split(s, v, ",")
			delete have
			for (i = 1; i + 1 <= n; i += 2)
				for (x = v[i]; x <= v[i + 1]; x++)
					have[x] = 1
			if (!have[0]) {
				print "FAIL: " what ": system prompt block 0 missing: " $0; bad = 1
			}
			if (num("workspace_tokens") > 383 && !have[int(378 / B)]) {
				print "FAIL: " what ": pinned query block missing: " $0; bad = 1
			}
		}
		END {
			if (steps != 10 || decodes != 4) {
				print "FAIL: " what ": " steps " steps, " decodes " decodes"; bad = 1
			}
			exit bad
		}' || fail=1
	done
done

# Script errors name the file and line; bad usage exits 2.
printf '{"append": [1, 2]}\n{"decode": -3}\n' >"$tmp/bad1"
printf '{"append": [1, 2]}\n\n{"append": [1, 99999]}\n' >"$tmp/bad2"
printf '{"append": [1, 2]\n' >"$tmp/bad3"
printf '{"decode": 2, "pin": true}\n' >"$tmp/bad4"
for t in bad1:2 bad2:3 bad3:1 bad4:1; do
	f=${t%%:*} line=${t##*:}
	"$KVMEM" run --model "$tmp/model" --script "$tmp/$f" >"$tmp/out" 2>&1
	rc=$?
	[ $rc -eq 2 ] || bad "$f: exit $rc, want 2"
	grep -q "$f:$line" "$tmp/out" || bad "$f: message does not name line $line: $(cat "$tmp/out")"
done
"$KVMEM" run --model "$tmp/model" --script "$tmp/script" --policy nosuch >"$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q "unknown policy" "$tmp/out" || bad "unknown policy not refused"
"$KVMEM" run --model "$tmp/model" --script "$tmp/script" --layout gaps >"$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q "layout wants compact .* or stable" "$tmp/out" ||
	bad "--layout gaps not refused: $(cat "$tmp/out")"
KVMEM_LAYOUT=gaps "$KVMEM" run --model "$tmp/model" --script "$tmp/script" >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "KVMEM_LAYOUT=gaps is not a layout" "$tmp/out" ||
	bad "KVMEM_LAYOUT=gaps not refused: $(cat "$tmp/out")"
KVMEM_LAYOUT=stable "$KVMEM" run --model "$tmp/model" --script "$tmp/script" --budget 200 \
	>"$tmp/out" 2>&1 && grep -q "layout stable" "$tmp/out" ||
	bad "KVMEM_LAYOUT=stable did not choose it: $(cat "$tmp/out")"
# Pins over the budget are a clear error.
printf '{"append_random": 200, "pin": true}\n{"decode": 1}\n' >"$tmp/pins"
"$KVMEM" run --model "$tmp/model" --script "$tmp/pins" --budget 64 --block 16 >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "budget is 64" "$tmp/out" || bad "pins over budget: $(cat "$tmp/out")"

[ $fail -eq 0 ] && echo "session CLI: all checks passed"
exit $fail
