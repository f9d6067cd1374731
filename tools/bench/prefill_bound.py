#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The bound the ceilings put on kvmem's prefill and on its ratio to PyTorch.

  prefill_bound.py ENGINE_LOG TORCH_LOG ATTN_LOG

ENGINE_LOG is `kvmem bench engine --backend cuda` (its GEMM rate held at the
power limit, its copy rate, its prefill rows), TORCH_LOG
tools/bench/torch_engine.py's JSON rows, ATTN_LOG `kvmem_gpu_check
--attn-prefill` (v6 at a 4096-query chunk over 32768 keys held for a second
at the power limit). All from one call on one GPU (tests/gpu/engine_figures.sh).

A prefill of P tokens (Qwen3-8B geometry, bench engine's default) cannot
take less than
  its GEMM FLOPs at the held GEMM rate
  + its attention FLOPs at v6's held rate (the best shape v6 has: the
    chunks of a long prefill, the causal diagonal aside)
  + the bytes its memory-bound passes must move (the two RMSNorms, the q/k
    norm + RoPE + view scatter, SwiGLU) at the copy rate.
The table prints that bound, the engine's fraction of it, and the ratio to
PyTorch the bound allows. A prefill too short to bring the GPU to its power
limit (4K: 0.1 s) runs nearer the burst clocks and can pass the bound; the
bound is for long ones. v6's rate is that of its best shape, so for
prefills whose attention is mostly the causal diagonal it is loose too.
"""
import json
import re
import sys

L, H, I, QH, KH, D, VOCAB = 36, 4096, 12288, 32, 8, 128, 151936


def gemm_flops(p):
    qw, kw = QH * D, KH * D
    return 2.0 * L * (H * (qw + 2 * kw) + qw * H + 3.0 * I * H) * p + 2.0 * VOCAB * H


def attn_flops(p):
    return 4.0 * L * QH * D * p * (p + 1) / 2


def pass_bytes(p):
    """Per token and layer: RMSNorm twice (fp32 in, bf16 out), the q/k step
    (qkv in; q out, K normalised in place, K and V into the view), SwiGLU
    (gate and up in, the product out)."""
    qw, kw = QH * D, KH * D
    rms = 2 * (4 + 2) * H
    qk = 2 * (qw + 2 * kw) + 2 * qw + 2 * kw + 2 * 2 * kw
    swiglu = 2 * 2 * I + 2 * I
    return float(rms + qk + swiglu) * L * p


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[1])
    eng, tor, att = (open(f).read() for f in sys.argv[1:])
    m = re.search(r"GEMM ([0-9.]+) TFLOP/s.*?, ([0-9.]+) held.*?copy ([0-9.]+) GB/s", eng)
    a = re.search(r"chunk 4096 @ 32768 view v6, held\s+[0-9.]+\s+([0-9.]+) TF/s", att)
    g = re.search(r"GEMM bf16 8192\^3, held\s+[0-9.]+ ms\s+([0-9.]+) TFLOP/s", att)
    if not m or not a:
        sys.exit("prefill_bound: no held GEMM rate in the engine log or no held v6 rate in the "
                 "attention log")
    burst, held, copy = (float(x) for x in m.groups())
    att_held = float(a.group(1))
    rows, p = {}, False
    for line in eng.splitlines():
        if line.startswith("prefill"):
            p = True
        elif line.startswith("decode at"):
            p = False
        elif p and re.match(r"^\d+\s", line):
            f = line.split()
            rows[int(f[0])] = float(f[2])
    torch = {}
    for line in tor.splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            if j.get("phase") == "prefill":
                torch[j["tokens"]] = j["tokens_per_s"]
    print(f"ceilings held at the power limit, this call: GEMM {held:.0f} TFLOP/s (burst {burst:.0f}"
          f"{f'; the check program: {float(g.group(1)):.0f}' if g else ''}), attention v6 "
          f"{att_held:.0f} TF/s ({att_held / held:.2f} of the held GEMM), copy {copy:.0f} GB/s")
    print(f"{'tokens':>7} {'kvmem':>8} {'bound':>8} {'of it':>6} {'PyTorch':>8} {'ratio':>6} "
          f"{'bound/PyTorch':>13}   bound: GEMM + attention + passes, ms")
    for n in sorted(rows):
        tg = gemm_flops(n) / (held * 1e12)
        ta = attn_flops(n) / (att_held * 1e12)
        tp = pass_bytes(n) / (copy * 1e9)
        bound = n / (tg + ta + tp)
        pt = torch.get(n)
        print(f"{n:>7} {rows[n]:>8.0f} {bound:>8.0f} {rows[n] / bound:>6.2f} "
              f"{pt if pt else 0:>8.0f} {rows[n] / pt if pt else 0:>5.2f}x {bound / pt if pt else 0:>12.2f}x"
              f"   {1e3 * tg:.0f} + {1e3 * ta:.0f} + {1e3 * tp:.0f}")


if __name__ == "__main__":
    main()
