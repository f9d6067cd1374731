#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Blend two agentlang models of one architecture: each weight becomes
ALPHA * A + (1 - ALPHA) * B.

A fine-tuned model and the model it started from lie in one basin: the
weights between them keep much of both (WiSE-FT, Wortsman et al. 2022).
Issue 29's recall models read paged views better than the shipped model and
hold a whole 2K window worse; a blend is the one lever on that trade that
needs no training run. Issue 29, recall.md ("Blending the recall model with
the shipped one").

    tools/train/blend.py --a models/agentlang-recall --b models/agentlang \\
        --alpha 0.5 --out build/blend50
    tools/train/blend.py ... --alpha 0.5 --alpha-for 'self_attn=1' ...  # A's attention kept

Standard library only (no numpy, no torch): the models are 11 MB of bf16.
Each value is computed in double and rounded once to bf16 (nearest, ties
to even). The two models must have the same config.json (vocabulary
hash included) and the same tensors, names, shapes and dtypes; OUT gets A's
config.json and generation_config.json, the blended model.safetensors and a
record.json naming both models (with their own record.json, where they have
one) and ALPHA.
"""
import argparse
import array
import hashlib
import json
import os
import re
import struct
import sys


def die(msg):
    print("blend.py: " + msg, file=sys.stderr)
    sys.exit(1)


def read_safetensors(path):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        die("cannot read %s: %s" % (path, e.strerror))
    if len(raw) < 8:
        die("%s: %d bytes, too short for a safetensors header" % (path, len(raw)))
    n = struct.unpack("<Q", raw[:8])[0]
    if n > len(raw) - 8:
        die("%s: header of %d bytes in a file of %d" % (path, n, len(raw)))
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        die("%s: header is not JSON (%s)" % (path, e))
    data = raw[8 + n:]
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        if not 0 <= lo <= hi <= len(data):
            die("%s: truncated or damaged: tensor %s needs data bytes %d..%d, the file holds %d"
                % (path, name, lo, hi, len(data)))
    return header, data


def bf16_to_float(b):
    h = array.array("H", b)
    w = array.array("I", (x << 16 for x in h))
    return array.array("f", w.tobytes())


def double_to_bf16(d):
    """The bf16 nearest each double (ties to even), rounded once: a double
    rounded to fp32 first and then to bf16 can land on a tie that was not one.
    The double's 52 mantissa bits are rounded to bf16's 7 (a carry moves the
    exponent, as it should); the result is then exactly an fp32, whose top
    16 bits are the bf16. Values below fp32's normal range (none in a model's
    weights) round through fp32."""
    q = array.array("Q", d.tobytes())
    r = array.array("Q", ((x + (1 << 44) - 1 + ((x >> 45) & 1)) >> 45 << 45
                          if (x >> 52) & 0x7ff >= 1023 - 126 else x for x in q))
    w = array.array("I", array.array("f", array.array("d", r.tobytes())).tobytes())
    return array.array("H", (x >> 16 if x & 0xffff == 0
                             else (x + 0x7fff + ((x >> 16) & 1)) >> 16 for x in w))


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        die("cannot read %s: %s" % (path, e.strerror))
    except ValueError as e:
        die("%s is not JSON (%s)" % (path, e))


def main(argv):
    ap = argparse.ArgumentParser(
        description="Blend two models of one architecture: ALPHA * A + (1 - ALPHA) * B.")
    ap.add_argument("--a", required=True, metavar="DIR", help="first model (its config is kept)")
    ap.add_argument("--b", required=True, metavar="DIR", help="second model")
    ap.add_argument("--alpha", required=True, type=float, help="A's share, 0..1")
    ap.add_argument("--alpha-for", action="append", default=[], metavar="PATTERN=ALPHA",
                    help="A's share for the tensors whose names hold PATTERN (a Python regular"
                         " expression, searched); the first that matches wins; repeatable")
    ap.add_argument("--out", required=True, metavar="DIR", help="model directory to write")
    args = ap.parse_args(argv)
    if not 0.0 <= args.alpha <= 1.0:
        die("--alpha %g is outside 0..1" % args.alpha)
    rules = []
    for r in args.alpha_for:
        pat, eq, val = r.rpartition("=")
        try:
            share = float(val)
            rx = re.compile(pat)
        except (ValueError, re.error) as e:
            die("--alpha-for %s: want PATTERN=ALPHA (%s)" % (r, e))
        if not eq or not pat:
            die("--alpha-for %s: want PATTERN=ALPHA" % r)
        if not 0.0 <= share <= 1.0:
            die("--alpha-for %s: %g is outside 0..1" % (r, share))
        rules.append([rx, share, 0, r])
    if sys.byteorder != "little":
        die("bf16 arrays are read in this machine's byte order: little-endian only")

    ca = load_json(os.path.join(args.a, "config.json"))
    cb = load_json(os.path.join(args.b, "config.json"))
    if ca != cb:
        keys = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
        die("%s and %s differ in config.json (%s): not one architecture"
            % (args.a, args.b, ", ".join(keys)))
    ha, da = read_safetensors(os.path.join(args.a, "model.safetensors"))
    hb, db = read_safetensors(os.path.join(args.b, "model.safetensors"))
    na = sorted(k for k in ha if k != "__metadata__")
    nb = sorted(k for k in hb if k != "__metadata__")
    if na != nb:
        only = sorted(set(na) ^ set(nb))
        die("the models' tensors differ: %s in one only" % only[0])

    out_header = {"__metadata__": ha.get("__metadata__", {"format": "pt"})}
    chunks = []
    off = 0
    shares = {}
    for name in sorted(na, key=lambda k: ha[k]["data_offsets"][0]):
        alpha = args.alpha
        for rule in rules:
            if rule[0].search(name):
                alpha = rule[1]
                rule[2] += 1
                break
        beta = 1.0 - alpha
        shares[name] = alpha
        ta, tb = ha[name], hb[name]
        if ta["dtype"] != "BF16" or tb["dtype"] != "BF16":
            die("tensor %s is %s / %s: only BF16 is blended" % (name, ta["dtype"], tb["dtype"]))
        if ta["shape"] != tb["shape"]:
            die("tensor %s has shape %s in A and %s in B" % (name, ta["shape"], tb["shape"]))
        fa = bf16_to_float(da[ta["data_offsets"][0]:ta["data_offsets"][1]])
        fb = bf16_to_float(db[tb["data_offsets"][0]:tb["data_offsets"][1]])
        if any(x != x or abs(x) == float("inf") for x in fa + fb):
            die("tensor %s holds a NaN or an infinity: not a model to blend" % name)
        mixed = array.array("d", (alpha * x + beta * y for x, y in zip(fa, fb)))
        blob = double_to_bf16(mixed).tobytes()
        out_header[name] = {"dtype": "BF16", "shape": ta["shape"],
                            "data_offsets": [off, off + len(blob)]}
        chunks.append(blob)
        off += len(blob)

    for rule in rules:
        if rule[2] == 0:
            die("--alpha-for %s: no tensor's name holds that pattern" % rule[3])
    head = json.dumps(out_header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)     # the data start 8-byte aligned
    os.makedirs(args.out, exist_ok=True)
    body = struct.pack("<Q", len(head)) + head + b"".join(chunks)
    tmp = os.path.join(args.out, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(body)
    os.replace(tmp, os.path.join(args.out, "model.safetensors"))
    for extra in ("config.json", "generation_config.json"):
        src = os.path.join(args.a, extra)
        if os.path.exists(src):
            with open(src, "rb") as f, open(os.path.join(args.out, extra), "wb") as g:
                g.write(f.read())

    def origin(d):
        with open(os.path.join(d, "model.safetensors"), "rb") as f:
            o = {"dir": d, "sha256_16": hashlib.sha256(f.read()).hexdigest()[:16]}
        rec = os.path.join(d, "record.json")
        if os.path.exists(rec):     # the model's own provenance, kept
            o["record"] = load_json(rec)
        return o

    record = {"what": "kvmem agentlang model: a blend of two models (tools/train/blend.py)",
              "command": "blend.py " + " ".join(argv),
              "alpha": args.alpha,
              "alpha_for": {n: a for n, a in shares.items() if a != args.alpha},
              "a": origin(args.a), "b": origin(args.b),
              "tensors": len(na), "bytes": off}
    with open(os.path.join(args.out, "record.json"), "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    print("blend.py: %s = %.3g * %s + %.3g * %s (%d tensors, %d bytes%s)"
          % (args.out, args.alpha, args.a, 1.0 - args.alpha, args.b, len(na), off,
             "; %d at their own share" % sum(r[2] for r in rules) if rules else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
