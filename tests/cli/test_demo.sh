#!/bin/bash
# kvmem demo: writes its built-in model into the data directory once, repairs
# a damaged copy, runs a short session to its summary, refuses bad options.
set -u
KVMEM=${KVMEM:-build/kvmem}
[ -x "$KVMEM" ] || { echo "no $KVMEM"; exit 77; }
home=$(mktemp -d /tmp/kvmem-demo.XXXXXX)
trap 'rm -rf "$home"' EXIT
export KVMEM_HOME="$home/data"
fail() { echo "demo test: $*"; exit 1; }
short="--tokens 4096 --questions 2 --steps 2"

# Six questions: the default seed answers 4 of 6 with subblock (seeds
# 1000000011..19 answer 5 or 6; a sliding window 2 or 3). The floor of 3 leaves
# a margin of one for arithmetic that differs elsewhere, and 0 right (the
# demo's point lost) fails.
out=$("$KVMEM" demo --tokens 4096 --questions 6 --steps 2 2>&1) || fail "first run failed: $out"
grep -q "wrote the built-in model" <<<"$out" || fail "first run did not install the model"
right=$(sed -n 's/^Summary: subblock answered \([0-9]*\) of 6;.*/\1/p' <<<"$out")
[ -n "$right" ] || fail "no summary: $out"
[ "$right" -ge 3 ] || fail "subblock answered $right of 6 (it answers 4; the floor is 3): $out"
for f in config.json generation_config.json model.safetensors record.json; do
	cmp -s "models/agentlang/$f" "$KVMEM_HOME/models/agentlang/$f" ||
		fail "installed $f differs from models/agentlang/$f"
done

out=$("$KVMEM" demo $short 2>&1) || fail "second run failed: $out"
grep -q "wrote the built-in model" <<<"$out" && fail "second run rewrote an intact model"

# A damaged copy is put right, not used.
printf 'garbage' | dd of="$KVMEM_HOME/models/agentlang/model.safetensors" bs=1 seek=4096 \
	conv=notrunc status=none
out=$("$KVMEM" demo $short 2>&1) || fail "run over a damaged copy failed: $out"
grep -q "wrote the built-in model" <<<"$out" || fail "damaged copy not rewritten"
cmp -s models/agentlang/model.safetensors "$KVMEM_HOME/models/agentlang/model.safetensors" ||
	fail "damaged copy still differs"

"$KVMEM" demo --tokens nope >/dev/null 2>&1
[ $? -eq 2 ] || fail "a bad --tokens value did not exit 2"
"$KVMEM" demo --tokens 4.5k >/dev/null 2>&1
[ $? -eq 2 ] || fail "a fractional --tokens value did not exit 2"
"$KVMEM" demo --policy nosuch >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown policy did not exit 2"
"$KVMEM" demo --help | grep -q "^examples:" || fail "demo --help has no examples"
echo "demo: all checks passed"
