#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The PyTorch peer of `kvmem bench batch --preset 8b`: batched decode at the
Qwen3-8B geometry (36 layers, hidden 4096, 32/8 heads of 128, MLP 12288,
vocabulary 151936), random bf16 weights on the GPU.

One decode step of B sequences, each with a KV cache of C tokens (random
values: the time does not depend on them): per layer RMSNorm, one matmul
for q|k|v over the B rows, the q/k head norms, RoPE, the new K/V written
into the cache, attention by F.scaled_dot_product_attention (a KV head's
4 query heads as 4 query rows over its keys: GQA without copying K/V),
o_proj, RMSNorm, gate|up in one matmul, SiLU, down; then the logits and
argmax. Written by hand (not transformers, whose decode is launch-bound at
7-8 tokens/s, FIELD-NOTES) and timed two ways: eager, and replayed as one
CUDA graph per step (no launch overhead: the strong peer).

Prints one JSON object per batch size: tokens/s eager and graphed.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

L, H, NH, NKV, D, I, V = 36, 4096, 32, 8, 128, 12288, 151936
EPS, THETA = 1e-6, 1000000.0


def rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w


def rope(x, cos, sin):
    a, b = x[..., : D // 2], x[..., D // 2:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), -1)


class Model:
    def __init__(self, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)

        def w(*shape):
            return (torch.randn(*shape, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02)

        self.embed = w(V, H)
        self.lm_head = w(V, H)
        self.norm = torch.ones(H, device="cuda", dtype=torch.bfloat16)
        self.layers = []
        for _ in range(L):
            self.layers.append(dict(
                wqkv=w((NH + 2 * NKV) * D, H), wo=w(H, NH * D), wgu=w(2 * I, H), wd=w(H, I),
                n1=torch.ones(H, device="cuda", dtype=torch.bfloat16),
                n2=torch.ones(H, device="cuda", dtype=torch.bfloat16),
                qn=torch.ones(D, device="cuda", dtype=torch.bfloat16),
                kn=torch.ones(D, device="cuda", dtype=torch.bfloat16)))

    def step(self, tok, pos, kc, vc):
        """tok [B] int64, pos: the new token's slot (the cache holds pos + 1
        keys after it); kc / vc: [L][B, NKV, C, D]. Returns the next tokens."""
        B = tok.shape[0]
        x = self.embed[tok]
        inv = 1.0 / (THETA ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D))
        ang = pos * inv
        cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
        for l, p in enumerate(self.layers):
            qkv = rms(x, p["n1"]) @ p["wqkv"].t()
            q = qkv[:, : NH * D].view(B, NH, D)
            k = qkv[:, NH * D: (NH + NKV) * D].view(B, NKV, D)
            v = qkv[:, (NH + NKV) * D:].view(B, NKV, D)
            q = rope(rms(q, p["qn"]), cos, sin)
            k = rope(rms(k, p["kn"]), cos, sin)
            kc[l][:, :, pos] = k
            vc[l][:, :, pos] = v
            att = F.scaled_dot_product_attention(q.view(B, NKV, NH // NKV, D),
                                                 kc[l][:, :, : pos + 1], vc[l][:, :, : pos + 1])
            x = x + att.reshape(B, NH * D) @ p["wo"].t()
            gu = rms(x, p["n2"]) @ p["wgu"].t()
            x = x + (F.silu(gu[:, :I]) * gu[:, I:]) @ p["wd"].t()
        return (rms(x, self.norm) @ self.lm_head.t()).argmax(-1)


def timed(fn, reps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,16,64")
    ap.add_argument("--context", type=int, default=1024, help="keys per sequence")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    m = Model(a.seed)
    dev = torch.cuda.get_device_name()
    C = a.context
    with torch.inference_mode():
        for B in [int(x) for x in a.batch.split(",")]:
            kc = [torch.randn(B, NKV, C, D, device="cuda", dtype=torch.bfloat16) for _ in range(L)]
            vc = [torch.randn(B, NKV, C, D, device="cuda", dtype=torch.bfloat16) for _ in range(L)]
            tok = torch.randint(0, V, (B,), device="cuda")
            pos = C - 1
            out = {}
            eager = timed(lambda: m.step(tok, pos, kc, vc), 2)     # warm-up
            eager = timed(lambda: m.step(tok, pos, kc, vc), a.steps)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                m.step(tok, pos, kc, vc)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out["next"] = m.step(tok, pos, kc, vc)
            graphed = timed(g.replay, 2)
            graphed = timed(g.replay, 2 * a.steps)
            print(json.dumps({"bench": "torch_batch_decode", "device": dev, "batch": B,
                              "context": C, "eager_step_ms": round(eager * 1e3, 3),
                              "eager_tokens_per_s": round(B / eager, 1),
                              "graph_step_ms": round(graphed * 1e3, 3),
                              "graph_tokens_per_s": round(B / graphed, 1)}), flush=True)
            del kc, vc, g, out
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
