#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The PyTorch peer of `kvmem bench engine`: transformers' Qwen3 at the
Qwen3-8B geometry with random bf16 weights on the GPU, sdpa attention
(F.scaled_dot_product_attention), batch 1.

  prefill  one forward over P tokens (the KV cache kept, only the last
           position's logits: logits_to_keep=1), tokens/s;
  decode   one token at a time after a context of C tokens, tokens/s.

Prints one JSON object per row, like `kvmem bench engine --json`.
Needs torch and transformers (the GPU machine has both).
"""
import argparse
import json
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def geometry_8b():
    return Qwen3Config(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288,
        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=False, attn_implementation="sdpa",
        torch_dtype="bfloat16")


def sync_time():
    torch.cuda.synchronize()
    return time.perf_counter()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefill", default="4096,16384,32768")
    ap.add_argument("--decode", default="4096,32768")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    cfg = geometry_8b()
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    dev = torch.cuda.get_device_name()
    prefill = [int(x) for x in a.prefill.split(",")]
    decode = [int(x) for x in a.decode.split(",")]
    most = max(prefill + [c + a.decode_tokens for c in decode])
    ids = torch.randint(0, cfg.vocab_size, (1, most), device="cuda")
    with torch.inference_mode():
        model(ids[:, :512], logits_to_keep=1)       # warm-up
        for n in prefill:
            t0 = sync_time()
            model(ids[:, :n], logits_to_keep=1)
            t = sync_time() - t0
            print(json.dumps({"bench": "torch_engine", "device": dev, "phase": "prefill",
                              "tokens": n, "seconds": round(t, 6),
                              "tokens_per_s": round(n / t, 1),
                              "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)}),
                  flush=True)
            torch.cuda.empty_cache()
        for c in decode:
            out = model(ids[:, :c], use_cache=True, logits_to_keep=1)
            pkv = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            t0 = sync_time()
            for _ in range(a.decode_tokens):
                out = model(tok, past_key_values=pkv, use_cache=True)
                pkv = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)
            t = (sync_time() - t0) / a.decode_tokens
            print(json.dumps({"bench": "torch_engine", "device": dev, "phase": "decode",
                              "context": c, "tokens": a.decode_tokens,
                              "tokens_per_s": round(1 / t, 2)}), flush=True)
            del out, pkv
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
