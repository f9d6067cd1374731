#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Sum an Nsight Compute census of `kvmem bench engine --prefill P` per
prefill chunk (tests/gpu/prefill_census.sh makes the CSV: one
gpu__time_duration row per kernel).

A forward starts at its embedding kernel: the first forward is bench
engine's warm-up chunk, the next P / CHUNK are the prefill. Kernels fall in
three classes: cuBLASLt's GEMMs, attention (kernels/cuda/attention*.cu) and
the rest (norms, RoPE and the scatter, SwiGLU, the logits). Each chunk's
GEMM and attention FLOPs come from the geometry (Qwen3-8B unless told), so
the table shows each class's rate; the rest is listed by kernel.
"""
import argparse
import csv
import re
import sys
from collections import defaultdict

UNIT = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
        "s": 1e3, "second": 1e3}


def kernels(path):
    """(name, ms) in launch order."""
    lines = [l for l in open(path) if l.startswith('"')]
    out = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        out.append((r["Kernel Name"], v * UNIT.get(r["Metric Unit"], 1e-6)))
    return out


def cls(name):
    n = name.lower()
    # kernels/cuda/attention*.cu: the flash kernel (v2-v4), its split
    # combine, v5's decode kernels and v6's wgmma kernel.
    if re.search(r"attn|attention|flash_kernel|combine|dec\w*_kernel|wgmma", n):
        return "attention"
    if re.search(r"gemm|nvjet|xmma|cutlass|gemv", n):
        return "gemm"
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--forwards", type=int, required=True, help="the prefill's chunks: P / CHUNK")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=12288)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    a = ap.parse_args()
    ks = kernels(a.csv)
    starts = [i for i, (n, _) in enumerate(ks) if "embedding" in n]
    if len(starts) < 2:
        sys.exit(f"{a.csv}: fewer than two forwards (embedding kernels) in the census")
    qw, kw = a.heads * a.head_dim, a.kv_heads * a.head_dim
    per_tok = 2.0 * a.layers * (a.hidden * (qw + 2 * kw) + qw * a.hidden + 3.0 * a.inter * a.hidden)
    # The prefill's forwards: the --forwards after the warm-up (bench
    # engine's decode part follows them).
    fwd = []
    for j, s in enumerate(starts[1:a.forwards + 1], 1):
        e = starts[j + 1] if j + 1 < len(starts) else len(ks)
        fwd.append(ks[s:e])
    tot = defaultdict(float)
    other = defaultdict(float)
    print(f"{'chunk':>5} {'keys':>7} {'ms':>8} {'GEMM ms':>8} {'TF/s':>6} {'attn ms':>8} {'TF/s':>6} {'rest ms':>8}")
    pos = 0
    for i, f in enumerate(fwd):
        t = defaultdict(float)
        for n, ms in f:
            c = cls(n)
            t[c] += ms
            if c == "other":
                other[re.sub(r"^void |[(<].*", "", n)] += ms
        g_fl = per_tok * a.chunk
        keys = (pos + a.chunk) * (pos + a.chunk + 1) / 2 - pos * (pos + 1) / 2
        at_fl = 4.0 * a.layers * a.heads * a.head_dim * keys
        print(f"{i:>5} {pos + a.chunk:>7} {sum(t.values()):8.2f} {t['gemm']:8.2f} "
              f"{g_fl / t['gemm'] / 1e9 if t['gemm'] else 0:6.0f} {t['attention']:8.2f} "
              f"{at_fl / t['attention'] / 1e9 if t['attention'] else 0:6.0f} {t['other']:8.2f}")
        for c in t:
            tot[c] += t[c]
        tot["gemm_fl"] += g_fl
        tot["attn_fl"] += at_fl
        pos += a.chunk
    s = tot["gemm"] + tot["attention"] + tot["other"]
    print(f"all {len(fwd)} forwards: {s:.1f} ms = GEMM {tot['gemm']:.1f} "
          f"({tot['gemm_fl'] / tot['gemm'] / 1e9 if tot['gemm'] else 0:.0f} TF/s), "
          f"attention {tot['attention']:.1f} "
          f"({tot['attn_fl'] / tot['attention'] / 1e9 if tot['attention'] else 0:.0f} TF/s), "
          f"rest {tot['other']:.1f} "
          f"({100 * tot['other'] / s:.1f}%)")
    print("the rest, by kernel (ms over all forwards):")
    for n, ms in sorted(other.items(), key=lambda x: -x[1]):
        print(f"  {ms:8.2f}  {n}")


if __name__ == "__main__":
    main()
