#!/bin/bash
# Issue 29: tools/train/blend.py, ALPHA * A + (1 - ALPHA) * B weight by
# weight. Two fresh random tiny models (kvmem generate, two seeds): ALPHA 1
# and 0 give A's and B's tensors back byte for byte; at a drawn ALPHA every
# value of every tensor is the bf16 nearest the exact blend (checked here
# against the two bf16 values around it, not with blend.py's rounding); the
# blend loads and decodes in kvmem; --alpha-for gives the tensors it names
# their own share. Two models of different shapes, a
# truncated file and an ALPHA outside 0..1 are refused with a message that
# names what is wrong, and leave no model behind.
. "$(dirname "$0")/lib.sh"
cli_setup train_blend
command -v python3 >/dev/null || { echo "train_blend: no python3: skipped"; exit 77; }
BLEND=tools/train/blend.py
"$KVMEM" generate --preset tiny --seed $((seed + 1)) --out "$tmp/b" >/dev/null ||
	bad "kvmem generate (B) failed"

python3 "$BLEND" --a "$M" --b "$tmp/b" --alpha 1 --out "$tmp/one" >/dev/null || bad "alpha 1 failed"
python3 "$BLEND" --a "$M" --b "$tmp/b" --alpha 0 --out "$tmp/zero" >/dev/null || bad "alpha 0 failed"
# --alpha-for: the embeddings A's, every other tensor B's
python3 "$BLEND" --a "$M" --b "$tmp/b" --alpha 0 --alpha-for 'embed_tokens=1' \
	--out "$tmp/part" >"$tmp/out" || bad "--alpha-for failed"
grep -q "; 1 at their own share)" "$tmp/out" || bad "--alpha-for: $(cat "$tmp/out")"
alpha=$(python3 -c "import random; random.seed($seed); print(round(random.uniform(0.1, 0.9), 3))")
python3 "$BLEND" --a "$M" --b "$tmp/b" --alpha "$alpha" --out "$tmp/mix" >"$tmp/out" ||
	bad "alpha $alpha failed"
grep -q "blend.py: $tmp/mix = $alpha \* " "$tmp/out" || bad "no closing line: $(cat "$tmp/out")"

python3 - "$M" "$tmp/b" "$tmp/one" "$tmp/zero" "$tmp/mix" "$tmp/part" "$alpha" <<'EOF' || bad "tensors differ"
import json, struct, sys
a, b, one, zero, mix, part, alpha = sys.argv[1:7] + [float(sys.argv[7])]

def load(d):
    raw = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    return {k: (v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}

def val(u):   # a bf16's bits as a number
    return struct.unpack("<f", struct.pack("<I", u << 16))[0]

A, B, ONE, ZERO, MIX, PART = map(load, (a, b, one, zero, mix, part))
bad = 0
for name in A:
    if ONE[name] != A[name] or ZERO[name] != B[name]:
        print("alpha 1 / 0: %s is not A's / B's" % name)
        bad += 1
    own = "A" if "embed_tokens" in name else "B"
    if PART[name] != (A if own == "A" else B)[name]:
        print("--alpha-for 'embed_tokens=1': %s is not %s's" % (name, own))
        bad += 1
    n = len(A[name][1]) // 2
    ua, ub, um = (struct.unpack("<%dH" % n, t[name][1]) for t in (A, B, MIX))
    if MIX[name][0] != A[name][0]:
        print("%s: shape %s, A's %s" % (name, MIX[name][0], A[name][0]))
        bad += 1
    for i in range(n):
        exact = alpha * val(ua[i]) + (1 - alpha) * val(ub[i])
        got = val(um[i])
        # the neighbours of the blend's bf16 are no nearer the exact value
        for nb in (um[i] - 1, um[i] + 1):
            if 0 <= nb < 0x10000 and (nb & 0x7f80) != 0x7f80 and \
                    abs(val(nb) - exact) < abs(got - exact):
                print("%s[%d]: %r for %r (a %r, b %r)" % (name, i, got, exact,
                                                         val(ua[i]), val(ub[i])))
                bad += 1
                break
        if bad > 10:
            sys.exit(1)
print("train_blend: %d tensors checked" % len(A))
sys.exit(1 if bad else 0)
EOF
for d in one mix; do
	[ "$(cat "$tmp/$d/config.json")" = "$(cat "$M/config.json")" ] || bad "$d: config.json is not A's"
	grep -q "\"alpha\"" "$tmp/$d/record.json" || bad "$d: record.json names no alpha"
	"$KVMEM" run --model "$tmp/$d" --random 8 --decode 4 >"$tmp/run.log" 2>&1 ||
		bad "kvmem run on the $d blend failed: $(tail -3 "$tmp/run.log")"
done

# Refusals: another shape, a truncated file, ALPHA outside 0..1
cp -r "$tmp/b" "$tmp/other"	# the same tensors, another width in its config
sed -i 's/"hidden_size": *\([0-9]*\)/"hidden_size": 2\1/' "$tmp/other/config.json"
python3 "$BLEND" --a "$M" --b "$tmp/other" --alpha 0.5 --out "$tmp/x1" 2>"$tmp/err" &&
	bad "two architectures were blended"
grep -q "differ in config.json (.*hidden_size" "$tmp/err" || bad "architectures: $(cat "$tmp/err")"
cp -r "$tmp/b" "$tmp/cut"
truncate -s 5000 "$tmp/cut/model.safetensors"
python3 "$BLEND" --a "$M" --b "$tmp/cut" --alpha 0.5 --out "$tmp/x2" 2>"$tmp/err" &&
	bad "a truncated model was blended"
grep -q "cut/model.safetensors: truncated or damaged: tensor .* the file holds" "$tmp/err" ||
	bad "truncated: $(cat "$tmp/err")"
python3 "$BLEND" --a "$M" --b "$tmp/b" --alpha 1.5 --out "$tmp/x3" 2>"$tmp/err" &&
	bad "alpha 1.5 was taken"
grep -q "alpha 1.5 is outside 0..1" "$tmp/err" || bad "alpha 1.5: $(cat "$tmp/err")"
python3 "$BLEND" --a "$M" --b "$tmp/b" --alpha 0.5 --alpha-for 'no_such_tensor=1' \
	--out "$tmp/x4" 2>"$tmp/err" && bad "a pattern that matches nothing was taken"
grep -q "alpha-for no_such_tensor=1: no tensor's name holds that pattern" "$tmp/err" ||
	bad "--alpha-for no_such_tensor=1: $(cat "$tmp/err")"
for x in x1 x2 x3 x4; do
	[ -e "$tmp/$x" ] && bad "a refused blend left $x behind"
done
cli_done train_blend
