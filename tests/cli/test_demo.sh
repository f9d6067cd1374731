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

out=$("$KVMEM" demo $short 2>&1) || fail "first run failed: $out"
grep -q "wrote the built-in model" <<<"$out" || fail "first run did not install the model"
grep -q "^Summary: subblock answered [0-2] of 2" <<<"$out" || fail "no summary: $out"
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
"$KVMEM" demo --policy nosuch >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown policy did not exit 2"
echo "demo: all checks passed"
