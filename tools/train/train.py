#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Train kvmem's small Qwen3 model on the agentlang corpus.

Reads a corpus written by `kvmem synth corpus` (fixed-length sequences of
agentlang ids after a 64-byte header), builds a Qwen3ForCausalLM of a few
million parameters whose native window is the corpus's sequence length,
trains it in bf16 autocast with AdamW and a cosine schedule until a wall-clock
budget or a step count runs out, reports the loss and the exact-match accuracy
of answers on held-out corpora, and exports a Hugging Face model directory
(save_pretrained, safetensors, bf16) plus record.json.

Needs torch and transformers (Qwen3), numpy. tools/train/README.md explains
the choices; tools/train/run_gpu.sh is the one-shot run on the GPU machine.
"""
import argparse
import json
import math
import os
import platform
import struct
import sys
import time

HEADERS = {1: 64, 2: 128, 3: 128, 4: 160}  # corpus version -> header bytes (agentlang.h)
MAGIC = b"KVMSYN1\0"


def die(msg):
    print(f"train.py: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def log(msg):
    print(msg, flush=True)


try:
    import numpy as np
except ImportError:
    die("numpy is not installed")
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    die("torch is not installed")


# ---- corpus -----------------------------------------------------------------
class Corpus:
    """A corpus file: header fields and a read-only [n_seqs, seq_len] array."""

    def __init__(self, path):
        self.path = path
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                h = f.read(max(HEADERS.values()))
        except OSError as e:
            die(f"{path}: cannot read: {e}")
        if len(h) < HEADERS[1] or h[:8] != MAGIC:
            die(f"{path}: not a kvmem synth corpus (bad magic)")
        version, hdr, self.vocab, self.seq_len = struct.unpack_from("<IIII", h, 8)
        if HEADERS.get(version) != hdr or len(h) < hdr:
            die(f"{path}: corpus version {version} header {hdr}: this script reads "
                + ", ".join(f"{v} / {b}" for v, b in HEADERS.items()))
        self.header = hdr
        # Version 2: how the view sequences were made (agentlang.h).
        self.view_policy, self.max_ratio, self.stale_permille, self.drop_permille = "", 16, 0, 0
        if version >= 2:
            self.view_policy = h[64:96].split(b"\0")[0].decode("ascii", "replace")
            self.max_ratio, self.stale_permille, self.drop_permille = struct.unpack_from("<III", h, 96)
        self.n_seqs, self.seed = struct.unpack_from("<QQ", h, 24)
        (self.id_bytes,) = struct.unpack_from("<I", h, 40)
        (self.pad, self.bos, self.eos, self.q, self.a, self.end) = struct.unpack_from("<6H", h, 44)
        self.view_permille, self.vocab_hash = struct.unpack_from("<II", h, 56)
        if self.id_bytes not in (2, 4):
            die(f"{path}: ids of {self.id_bytes} bytes")
        # Version 3: paged view sequences, their records after the ids.
        self.paged_permille, self.window, self.n_paged, index_at = 0, 0, 0, 0
        if version >= 3:
            self.paged_permille, self.window, self.n_paged = struct.unpack_from("<III", h, 108)
            (index_at,) = struct.unpack_from("<Q", h, 120)
        # Version 4: whole paged sequences (their windows tile the workspace)
        # and each paged question's needle; a record's header is 32 bytes.
        self.version = version
        self.whole_permille, self.whole_min_ratio, self.n_whole = 0, 0, 0
        self.lookalikes = 0  # look-alike lines a needle of every view sequence; 0: drawn
        if version >= 4:
            self.whole_permille, self.whole_min_ratio, self.n_whole = struct.unpack_from("<III", h, 128)
            self.lookalikes = struct.unpack_from("<I", h, 140)[0]
        want = hdr + self.n_seqs * self.seq_len * self.id_bytes
        if self.n_paged:
            if index_at < want or index_at + 16 * self.n_paged != size:
                die(f"{path}: paged index at {index_at} for {self.n_paged} sequences does not "
                    f"fit a file of {size} bytes (truncated or still being written?)")
        elif size != want:
            die(f"{path}: {size} bytes, the header promises {want} (truncated or still being written?)")
        dtype = np.uint16 if self.id_bytes == 2 else np.uint32
        self.ids = np.memmap(path, dtype=dtype, mode="r", offset=hdr,
                             shape=(self.n_seqs, self.seq_len))
        self.paged_seqs = np.zeros(0, dtype=np.int64)
        if self.n_paged:
            self.raw = np.memmap(path, dtype=np.uint8, mode="r")
            ix = np.frombuffer(self.raw[index_at:index_at + 16 * self.n_paged], dtype="<u8")
            ix = ix.reshape(-1, 2).astype(np.int64)
            self.paged_seqs, self.paged_offsets = ix[:, 0], ix[:, 1]
            if (np.diff(self.paged_seqs) <= 0).any() or self.paged_seqs[-1] >= self.n_seqs:
                die(f"{path}: the paged index is not in sequence order")
        self.whole_ks = np.zeros(0, dtype=np.int64)  # index places of the whole records
        if self.n_paged and version >= 4:
            flags = np.array([self.raw[o + 16] for o in self.paged_offsets])
            self.whole_ks = np.nonzero(flags & 1)[0].astype(np.int64)
            if len(self.whole_ks) != self.n_whole:
                die(f"{path}: {len(self.whole_ks)} whole records, the header says {self.n_whole}")

    def _record_head(self, k):
        """A record's fields before its windows' places: (offset of win_start,
        n_view, n_windows, workspace tokens, window, whole, needles)."""
        off = int(self.paged_offsets[k])
        nv, nw, ws, W = struct.unpack_from("<IIII", bytes(self.raw[off:off + 16]))
        if self.version < 4:
            return off + 16, nv, nw, ws, W, False, None
        flags, nq = struct.unpack_from("<II", bytes(self.raw[off + 16:off + 24]))
        needles = np.frombuffer(self.raw[off + 32:off + 32 + 4 * nq], dtype="<u4").astype(np.int64)
        return off + 32 + 4 * nq, nv, nw, ws, W, bool(flags & 1), needles

    def page_info(self, k):
        """Paged sequence k's workspace side: (whole, needles [n_q] (None
        before version 4), win_start, win_end [n_windows], workspace tokens)."""
        at, _, nw, ws, _, whole, needles = self._record_head(k)
        se = np.frombuffer(self.raw[at:at + 8 * nw], dtype="<u4").astype(np.int64)
        return whole, needles, se[:nw], se[nw:], ws

    def page_record(self, k):
        """Paged sequence k (its place in the index): (sequence number, the
        view's length, window ids [n_windows, window] int64, each view
        token's window and place in it [n_view] int64)."""
        at, nv, nw, _, W, _, _ = self._record_head(k)
        if W != self.window:
            die(f"{self.path}: paged record {k} has windows of {W} tokens, the header {self.window}")
        nve = (nv + 1) // 2 * 2
        at += 8 * nw
        win = np.frombuffer(self.raw[at:at + 2 * nv], dtype="<u2").astype(np.int64)
        pos = np.frombuffer(self.raw[at + 2 * nve:at + 2 * nve + 2 * nv], dtype="<u2").astype(np.int64)
        at += 4 * nve
        ids = np.frombuffer(self.raw[at:at + 2 * nw * W], dtype="<u2").astype(np.int64).reshape(nw, W)
        return int(self.paged_seqs[k]), nv, ids, win, pos

    @property
    def tokens(self):
        return self.n_seqs * self.seq_len

    def to_device(self, device, limit=None):
        """All (or the first `limit`) sequences as an int16/int32 tensor on device."""
        n = self.n_seqs if limit is None else min(limit, self.n_seqs)
        out = torch.empty((n, self.seq_len),
                          dtype=torch.int16 if self.vocab < 32768 else torch.int32, device=device)
        step = max(1, (64 << 20) // (self.seq_len * 4))
        for s in range(0, n, step):
            chunk = np.asarray(self.ids[s:min(s + step, n)]).astype(
                np.int16 if self.vocab < 32768 else np.int32)
            out[s:s + len(chunk)] = torch.from_numpy(chunk).to(device, non_blocking=False)
        return out


def answer_mask(x, c):
    """For inputs x [B, T]: a [B, T-1] mask over the targets x[:, 1:] that are
    answer tokens: in a question line ("? file key = value <end>"), what
    follows the answer marker "=", <end> included. The marker is the same
    token as a fact's "=", so only markers inside question lines count."""
    is_q = (x == c.q).to(torch.int32)
    inq = torch.cumsum(is_q - (x == c.end).to(torch.int32), dim=1) == 1  # "?" .. before <end>
    ca = torch.cumsum(((x == c.a) & inq).to(torch.int32), dim=1)
    # ca at the latest "?" (ca never decreases, so a running max finds it)
    ca_q = torch.cummax(torch.where(is_q.bool(), ca, torch.zeros_like(ca)), dim=1).values
    inside = inq & (ca > ca_q)  # from the marker up to before <end>
    return inside[:, :-1] & (x[:, 1:] != c.a)


def question_ids(x, c):
    """[B, T-1]: for each target position, the number of question markers
    among the inputs up to it: with the row, a question's identity."""
    return torch.cumsum((x[:, :-1] == c.q).to(torch.int64), dim=1)


# ---- Mean-K: the block summaries kvmem's meank policy scores -------------------
# kvmem's meank (user/select/policy_meank.c, kernels/cpu/score.c) scores a
# 32-token block, per (layer, KV head), by the share
#     exp(s q.mu_b) / sum_c exp(s q.mu_c),   s = 1 / sqrt(head_dim),
# where mu_b is the mean of the block's raw keys (after k-norm, before RoPE)
# and q the mean raw query of the head's group at the question's answer
# marker, RoPE-averaged over the view's distances 0..span-1
# (kvmem_rope_mean); the shares add up over layers and KV heads. A model
# trained only to answer puts the fact in one key of a line that the
# block's other 31 keys drown out: at 64x meank finds the needle for about a
# quarter of the questions (recall.md). The auxiliary loss below trains the
# keys for that score: -log of the needle block's mean share, at every
# question of every sequence, against the other whole blocks before it.
# The needle block needs no label: it holds the '=' of the latest earlier
# fact line whose file and key are the question's (a question line is
# "? file key =", the fact "file key = value").
MEANK_BLOCK = 32  # kvmem's block; --meank-block 16 for a session made with --block 16
MEANK_BROKEN = []  # why the Mean-K loss was switched off, if it was
PAGED_BROKEN = []  # why the paged batches were switched off, if they were
WHOLE_BROKEN = []  # why the whole-workspace Mean-K loss was switched off, if it was


def rope_mean_coeffs(head_dim, theta, span, device):
    """kvmem_rope_mean's C and S per frequency pair: the mean over distances
    0..span-1 of cos and sin of the pair's angle."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    w = theta ** (-2.0 * i / head_dim)
    n = float(span)
    h = torch.sin(w / 2)
    tiny = h.abs() < 1e-12
    hs = torch.where(tiny, torch.ones_like(h), h)
    cs = torch.where(tiny, torch.full_like(h, n), torch.sin(n * w / 2) / hs * torch.cos((n - 1) * w / 2))
    sn = torch.where(tiny, torch.zeros_like(h), torch.sin(n * w / 2) / hs * torch.sin((n - 1) * w / 2))
    return (cs / n).float().to(device), (sn / n).float().to(device)


def meank_targets(x, c):
    """Question markers of x [B, T] with a needle block: rows, positions,
    needle blocks, and how many whole blocks precede each question."""
    B, T = x.shape
    x = x.long()
    pos = torch.arange(T, device=x.device).expand(B, T)
    is_q, is_a = x == c.q, x == c.a
    inq = torch.cumsum(is_q.int() - (x == c.end).int(), dim=1) == 1
    ca = torch.cumsum((is_a & inq).int(), dim=1)
    ca_q = torch.cummax(torch.where(is_q, ca, torch.zeros_like(ca)), dim=1).values
    qpos = torch.cummax(torch.where(is_q, pos, torch.full_like(pos, -1)), dim=1).values
    marker = is_a & inq & (ca == ca_q + 1) & (qpos >= 0)
    span = pos - qpos - 1  # tokens of "file key"
    # Exact 10-bit packing of up to 6 tokens (ids < 1024): H[n][j] is the
    # n tokens before j. 1023 pads the left edge: no agentlang id.
    if c.vocab > 1023:
        return None
    pad = torch.full((B, 7), 1023, dtype=torch.long, device=x.device)
    xp = torch.cat([pad, x], dim=1)
    rows_all, pos_all, blk_all, nb_all = [], [], [], []
    H = torch.zeros_like(x)
    for n in range(1, 7):
        H = H + (xp[:, 7 - n:7 - n + T] << (10 * (n - 1)))  # adds x[j - n]
        if n < 2:
            continue
        # H so far packs x[j-1] in the low bits .. x[j-n] high: the same
        # packing for a question's marker and a fact's '='.
        mk = marker & (span == n)
        if not mk.any():
            continue
        r, m = mk.nonzero(as_tuple=True)
        before = xp[:, 7 - n - 1:7 - n - 1 + T]  # x[j - n - 1]: '?' for question lines
        fact_eq = is_a & (before != c.q)
        cand = (H[r] == H[r, m].unsqueeze(1)) & fact_eq[r] & (pos[r] < qpos[r, m].unsqueeze(1))
        j = torch.where(cand, pos[r], torch.full_like(pos[r], -1)).max(dim=1).values
        nb = qpos[r, m] // MEANK_BLOCK
        ok = (j >= 0) & (j // MEANK_BLOCK < nb) & (nb >= 2)
        rows_all.append(r[ok])
        pos_all.append(m[ok])
        blk_all.append((j // MEANK_BLOCK)[ok])
        nb_all.append(nb[ok])
    if not rows_all:
        return None
    out = tuple(torch.cat(v) for v in (rows_all, pos_all, blk_all, nb_all))
    return out if out[0].numel() else None


def meank_loss(model, hidden, x, c, rope_cs):
    """The auxiliary loss (mean over questions) and the share of questions
    whose needle block has the largest mean share, from the hidden states
    entering each layer (hidden[l], [B, T, hidden]). None without questions."""
    t = meank_targets(x, c)
    if t is None:
        return None
    rows, pos, blk, nb = t
    layers = model.model.layers
    B, T = x.shape
    nbT = T // MEANK_BLOCK
    cs, sn = rope_cs
    shares = 0
    for l, layer in enumerate(layers):
        at = layer.self_attn
        h = layer.input_layernorm(hidden[l])
        D = cs.numel() * 2
        k = at.k_norm(at.k_proj(h).view(B, T, -1, D)).float()
        hkv = k.shape[2]
        mu = k[:, :nbT * MEANK_BLOCK].reshape(B, nbT, MEANK_BLOCK, hkv, D).mean(2)
        q = at.q_norm(at.q_proj(h[rows, pos]).view(rows.numel(), -1, D)).float()
        q = q.view(rows.numel(), hkv, -1, D).mean(2)  # the group's mean query
        a, b = q[..., :D // 2], q[..., D // 2:]
        q = torch.cat([cs * a - sn * b, cs * b + sn * a], dim=-1)
        z = torch.einsum("mhd,mbhd->mhb", q, mu[rows]) / math.sqrt(D)
        valid = torch.arange(nbT, device=x.device).unsqueeze(0) < nb.unsqueeze(1)
        z = z.masked_fill(~valid.unsqueeze(1), float("-inf"))
        shares = shares + torch.softmax(z, dim=-1).sum(1)
    p = shares / (hkv * len(layers))  # [M, nbT]: the mean share, what meank ranks by
    pt = p.gather(1, blk.unsqueeze(1)).squeeze(1)
    loss = -torch.log(pt.clamp(min=1e-9)).mean()
    hit = (p.argmax(1) == blk).float().mean()
    return loss, hit, rows.numel()


# ---- paged view sequences: K/V as kvmem makes them ---------------------------
# kvmem answers from a view whose keys and values were computed when the
# workspace was prefilled, in the workspace's own context, and rotated again
# at the view's compact positions 0..n_view-1. A paged view sequence of the
# corpus (version 3) carries windows of workspace tokens that end at its kept
# blocks; the paged path runs each window through the model (no gradients),
# takes each kept token's K and V from its window, turns its key from its
# place in the window to its compact place (RoPE is a rotation: rotating an
# already rotated key by the difference is the key rotated at the new place),
# and runs the questions, with gradients, over that cache at the positions
# after the view. Qwen3 in transformers rotates after q/k-norm with the
# rotate_half convention: the cache's keys are normed and rotated.

def rope_inv_freq(head_dim, theta, device=None):
    """The default RoPE frequencies: theta^(-2i/head_dim), i < head_dim/2."""
    i = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)
    return (1.0 / theta ** (i / head_dim)).float()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def rope_apply(x, positions, head_dim, theta):
    """x [..., T, D] rotated at positions [..., T] (transformers' convention:
    cos/sin of cat(freqs, freqs), x * cos + rotate_half(x) * sin)."""
    ang = positions.to(torch.float64).unsqueeze(-1) * rope_inv_freq(head_dim, theta, x.device).double()
    ang = torch.cat([ang, ang], dim=-1)
    xf = x.float()
    return (xf * ang.cos().float() + rotate_half(xf) * ang.sin().float()).to(x.dtype)


def rerotate(k, delta, head_dim, theta):
    """Keys k [..., T, D] already rotated at some positions, rotated by delta
    [..., T] more: equal to the raw keys rotated at (position + delta)."""
    return rope_apply(k, delta, head_dim, theta)


class PagedBatch:
    """What the paged path needs for a batch of paged sequences, built on the
    host: the windows [NW, W], each view slot's flat index into the windows'
    tokens (window * W + place) and its rotation delta (compact place minus
    place in the window), which slots hold a view token, and the questions
    [P, Lq] at positions n_view.. (right-padded with <pad>)."""

    def __init__(self, corpus, ks, pad, device, window_pos0=0):
        recs = []
        for k in ks:
            seq, nv, ids, win, off = corpus.page_record(k)
            # Only the windows the view uses: a whole record's windows tile
            # the workspace, most of them without a kept token.
            used = np.unique(win)
            if len(used) < ids.shape[0]:
                ids, win = ids[used], np.searchsorted(used, win)
            recs.append((seq, nv, ids, win, off))
        self.P = len(recs)
        self.W = corpus.window
        self.n_view = [r[1] for r in recs]
        S = max(self.n_view)
        tails = []
        for seq, nv, _, _, _ in recs:
            row = np.asarray(corpus.ids[seq]).astype(np.int64)
            n = int((row != pad).nonzero()[0].max()) + 1 if (row != pad).any() else nv
            tails.append(row[nv:max(n, nv + 1)])
        Lq = max(len(t) for t in tails)
        windows, flat, delta, valid = [], np.zeros((self.P, S), np.int64), \
            np.zeros((self.P, S), np.int64), np.zeros((self.P, S), bool)
        q = np.full((self.P, Lq), pad, np.int64)
        nw0 = 0
        for b, (seq, nv, ids, win, off) in enumerate(recs):
            windows.append(ids)
            flat[b, :nv] = (nw0 + win) * self.W + off
            delta[b, :nv] = np.arange(nv) - (off + window_pos0)
            valid[b, :nv] = True
            q[b, :len(tails[b])] = tails[b]
            nw0 += ids.shape[0]
        self.n_windows = nw0
        t = lambda a: torch.from_numpy(a).to(device, non_blocking=True)
        self.windows = t(np.concatenate(windows, axis=0))
        self.flat, self.delta, self.valid = t(flat), t(delta), t(valid)
        self.q = t(q)
        nv_t = torch.tensor(self.n_view, device=device, dtype=torch.int64)
        self.positions = nv_t.unsqueeze(1) + torch.arange(Lq, device=device).unsqueeze(0)
        # 1 for every cache slot holding a view token and every question slot
        self.mask = torch.cat([self.valid, torch.ones((self.P, Lq), dtype=torch.bool,
                                                      device=device)], dim=1).long()
        self.window_tokens = nw0 * self.W


def assemble_pages(kw, vw, pb, head_dim, theta):
    """One layer's view cache from its windows' K/V ([NW, H, W, D]): [P, H, S, D]
    each, keys rotated at their compact places, zeros in the unused slots."""
    NW, H, W, D = kw.shape
    P, S = pb.flat.shape
    k = kw.permute(0, 2, 1, 3).reshape(NW * W, H, D)[pb.flat.reshape(-1)].view(P, S, H, D)
    v = vw.permute(0, 2, 1, 3).reshape(NW * W, H, D)[pb.flat.reshape(-1)].view(P, S, H, D)
    k = rerotate(k.permute(0, 2, 1, 3), pb.delta.unsqueeze(1).expand(P, H, S), head_dim, theta)
    v = v.permute(0, 2, 1, 3)
    keep = pb.valid.view(P, 1, S, 1)
    return k * keep, v * keep


def cache_kv(cache, layer):
    """A layer's (keys, values) from a transformers cache, 4.5x or 5.x."""
    if hasattr(cache, "layers") and len(getattr(cache, "layers")) > layer \
            and hasattr(cache.layers[layer], "keys"):
        return cache.layers[layer].keys, cache.layers[layer].values
    if hasattr(cache, "key_cache"):
        return cache.key_cache[layer], cache.value_cache[layer]
    return cache[layer][0], cache[layer][1]


def new_cache(config=None):
    from transformers import DynamicCache
    try:
        return DynamicCache()
    except TypeError:  # a transformers that wants the config
        return DynamicCache(config=config)


@torch.no_grad()
def window_kv(model, windows, chunk, window_pos0=0):
    """Every window's K and V per layer ([NW, H, W, D]), no gradients: the
    pages as the workspace's prefill made them."""
    base = model.model
    n_layers = len(base.layers)
    ks, vs = [[] for _ in range(n_layers)], [[] for _ in range(n_layers)]
    for s in range(0, windows.shape[0], chunk):
        x = windows[s:s + chunk]
        cache = new_cache(model.config)
        kw = {}
        if window_pos0:
            kw["position_ids"] = (torch.arange(x.shape[1], device=x.device) + window_pos0) \
                .unsqueeze(0).expand(x.shape[0], -1)
        base(input_ids=x, past_key_values=cache, use_cache=True, **kw)
        for l in range(n_layers):
            k, v = cache_kv(cache, l)
            ks[l].append(k)
            vs[l].append(v)
    return [torch.cat(k, 0) for k in ks], [torch.cat(v, 0) for v in vs]


def paged_forward(model, pb, head_dim, theta, chunk, window_pos0=0):
    """The questions' logits [P, Lq, vocab] over the view's pages."""
    ks, vs = window_kv(model, pb.windows, chunk, window_pos0)
    cache = new_cache(model.config)
    for l in range(len(ks)):
        k, v = assemble_pages(ks[l], vs[l], pb, head_dim, theta)
        cache.update(k, v, l)
    return model(input_ids=pb.q, past_key_values=cache, position_ids=pb.positions,
                 attention_mask=pb.mask, use_cache=True).logits


def paged_losses(model, pb, c, answer_weight, head_dim, theta, chunk):
    """As losses(), over the question tokens of a paged batch: the first
    question token is predicted from the cache's last slot, which has no
    logits here, so the targets are q[:, 1:]."""
    logits = paged_forward(model, pb, head_dim, theta, chunk)[:, :-1]
    lm_loss, ans_loss, ans = lm_answer_losses(logits, pb.q, c)
    return lm_loss + answer_weight * ans_loss, lm_loss, ans_loss, logits, ans


# ---- Mean-K over a whole workspace's blocks (issue 29, item 2) ---------------
# At 64x kvmem's meank ranks ~4096 blocks of a 128K-token workspace; the loss
# above ranks the <= 64 blocks of one 2K sequence, where the real competitors
# (look-alike lines of the same file and key, older values of the key) are
# mostly absent. A whole paged record (corpus version 4) carries windows that
# tile its workspace: every block's mean key is computed from the window that
# owns it, with at least W/2 tokens of workspace before it, as kvmem's prefill
# computes its summaries in the workspace's context; the question's query is
# the one kvmem scores with, from the question read over the view's pages;
# the loss is -log of the needle block's mean share among ALL the
# workspace's whole blocks. Gradients: through the query, and through the
# keys of the windows that own the needle block and each question's
# `hard` highest-scored other blocks (those windows run again with
# gradients); every other block is a detached constant in the denominator.

def corpus_newline(corpus, k):
    """The newline's id, read from paged record k's questions (each ends
    <end>, then a newline), or None where the corpus cannot say (a toy)."""
    end = getattr(corpus, "end", None)
    if end is None or not hasattr(corpus, "ids"):
        return None
    seq, nv = corpus.page_record(k)[:2]
    row = np.asarray(corpus.ids[seq]).astype(np.int64)[nv:]
    at = np.flatnonzero(row == end)
    return int(row[at[0] + 1]) if len(at) and at[0] + 1 < len(row) else None


def needle_line_blocks(ws_ids, needles, nl):
    """Each needle's line as blocks [n, 2] (first, last): from the token after
    the newline before its '=' to its own newline, the tokens kvmem bench
    recall counts in view (every block of the line) and ranks by its worst
    block; the '=''s block alone where there is no newline id (nl None)."""
    needles = np.asarray(needles, np.int64)
    out = np.stack([needles // MEANK_BLOCK, needles // MEANK_BLOCK], 1)
    if nl is None:
        return out
    brk = np.flatnonzero(np.asarray(ws_ids) == nl)
    for i, nd in enumerate(needles):
        j = np.searchsorted(brk, nd)  # newlines before the '=': brk[:j]
        a = brk[j - 1] + 1 if j > 0 else 0
        e = brk[j] if j < len(brk) else len(ws_ids) - 1
        out[i] = (a // MEANK_BLOCK, e // MEANK_BLOCK)
    return out


class WholeRecord:
    """A whole paged sequence's workspace side, on device: its windows
    [NW, W], each whole block's owner window, each whole-block token's flat
    index (owner * W + place), and each question's needle block and the
    first and last blocks of the needle's line."""

    def __init__(self, corpus, k, device):
        seq, nv, ids, win, off = corpus.page_record(k)
        whole, needles, start, end, ws = corpus.page_info(k)
        if not whole or needles is None:
            raise ValueError(f"paged record {k} is not whole")
        W = ids.shape[1]
        self.k, self.seq, self.n_view, self.W, self.ws_tokens = k, seq, nv, W, ws
        self.nb = ws // MEANK_BLOCK
        t_all = np.arange(ws)
        own = np.searchsorted(end, t_all, side="right")  # window k owns [end[k-1], end[k])
        t, owner = t_all[:self.nb * MEANK_BLOCK], own[:self.nb * MEANK_BLOCK]
        if (start[owner] > t).any() or owner.max(initial=0) >= len(end):
            raise ValueError(f"paged record {k}: its windows do not tile the workspace")
        self.start = start
        self.block_win_np = owner[::MEANK_BLOCK].copy()
        tt = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)
        self.windows = tt(ids)
        self.tok_win = tt(owner)
        self.tok_flat = tt(owner * W + t - start[owner])
        self.block_win = tt(self.block_win_np)
        self.needle_blk = tt(needles // MEANK_BLOCK)
        own = np.minimum(own, len(end) - 1)  # the tail past the whole blocks too
        ws_ids = ids[own, np.clip(t_all - start[own], 0, W - 1)]
        self.line_np = needle_line_blocks(ws_ids, needles, corpus_newline(corpus, k))
        self.line_blk = tt(self.line_np)
        self.n_q = len(needles)
        self.used = np.unique(win)  # the view's windows, as PagedBatch keeps them

    def block_tokens(self, blocks, wins):
        """Flat indices of blocks' tokens into the keys of windows `wins`
        (sorted, holding every block's owner) run as one batch: [nb, 32]."""
        b = blocks.cpu().numpy()
        w = self.block_win_np[b]
        place = np.searchsorted(wins, w)
        tok = b[:, None] * MEANK_BLOCK + np.arange(MEANK_BLOCK)[None, :]
        return torch.from_numpy(place[:, None] * self.W + tok - self.start[w][:, None]).to(
            self.windows.device)


def model_keys_fn(model, head_dim):
    """keys_fn for a transformers Qwen3: (windows [n, W], grad, want_kv) ->
    (per layer the raw keys [n, W, H, D] after k-norm, before RoPE: what
    kvmem's meank averages; per layer (K, V) as the cache holds them, or
    None)."""
    base = model.model

    def fn(windows, grad, want_kv=False):
        with torch.set_grad_enabled(grad):
            cache = new_cache(model.config) if want_kv else None
            kw = {"past_key_values": cache} if want_kv else {}
            hs = base(input_ids=windows, use_cache=want_kv, output_hidden_states=True,
                      **kw).hidden_states
            keys = []
            for l, layer in enumerate(base.layers):
                at = layer.self_attn
                h = layer.input_layernorm(hs[l])
                keys.append(at.k_norm(at.k_proj(h).view(h.shape[0], h.shape[1], -1, head_dim)))
            kv = [cache_kv(cache, l) for l in range(len(keys))] if want_kv else None
        return keys, kv
    return fn


@torch.no_grad()
def whole_block_means(keys_fn, rec, chunk, want_kv=False):
    """Every whole block's mean raw key, [layers, nb, H, D] fp32, from the
    windows that own the blocks, no gradients; with want_kv, also the K and
    V of the view's windows (rec.used, in that order) per layer."""
    NW = rec.windows.shape[0]
    mu, kvs = None, None
    blocks = torch.arange(rec.nb * MEANK_BLOCK, device=rec.windows.device) // MEANK_BLOCK
    used = torch.from_numpy(rec.used).to(rec.windows.device)
    for s in range(0, NW, chunk):
        n = min(chunk, NW - s)
        keys, kv = keys_fn(rec.windows[s:s + n], False, want_kv)
        if mu is None:
            L, H, D = len(keys), keys[0].shape[2], keys[0].shape[3]
            mu = torch.zeros(L, rec.nb, H, D, device=rec.windows.device)
            kvs = [([], []) for _ in range(L)]
        sel = (rec.tok_win >= s) & (rec.tok_win < s + n)
        idx, bl = rec.tok_flat[sel] - s * rec.W, blocks[sel]
        for l in range(len(keys)):
            flat = keys[l].reshape(n * rec.W, H, D)
            mu[l].index_add_(0, bl, flat[idx].float())
        if want_kv:
            pick = used[(used >= s) & (used < s + n)] - s
            for l in range(len(kv)):
                kvs[l][0].append(kv[l][0][pick])
                kvs[l][1].append(kv[l][1][pick])
    mu /= MEANK_BLOCK
    if want_kv:
        kvs = [(torch.cat(k, 0), torch.cat(v, 0)) for k, v in kvs]
    return mu, kvs


def meank_shares(q, mu):
    """Mean-K's mean share of each block, [M, nb], for queries q [layers, M,
    H, D] (RoPE-averaged) against block means mu [layers, nb, H, D]: the
    softmax over the blocks per layer and KV head, averaged."""
    # fp32 even under autocast: the needle's rank among thousands of blocks
    with torch.autocast(device_type=q.device.type, enabled=False):
        z = torch.einsum("lmhd,lbhd->lmhb", q.float(), mu.float()) / math.sqrt(q.shape[-1])
        return torch.softmax(z, dim=-1).mean(dim=(0, 2))


def whole_meank_loss(keys_fn, q, rec, mu, hard, grad=True, line=False):
    """-log of each question's needle block's mean share among all the
    workspace's whole blocks (mean over questions), its rank (0: first),
    the windows run again with gradients, and the rank of the worst block of
    the needle's line (kvmem bench recall's rank: the line is in view only
    when all its blocks are). q [layers, M, H, D]: the questions' queries
    (M = rec.n_q, in order), with or without grad; mu: whole_block_means.
    With line, every block of the needle's line is a target (the loss their
    mean -log share, the rank the worst one's). With grad and hard > 0, the
    target blocks and each question's `hard` best-scored other blocks get
    their means from their windows run again with gradients; the rest of mu
    stays detached."""
    n = q.shape[1]
    needle = rec.needle_blk[:n]
    l_lo, l_hi = rec.line_blk[:n, 0], rec.line_blk[:n, 1]
    lo, hi = (l_lo, l_hi) if line else (needle, needle)
    ok = hi < rec.nb  # a target in the workspace's last partial block: no whole block
    if not bool(ok.all()):
        q, lo, hi, l_lo, l_hi = q[:, ok], lo[ok], hi[ok], l_lo[ok], l_hi[ok]
    M = q.shape[1]
    wins = np.zeros(0, dtype=np.int64)
    if M == 0 or rec.nb < 2:
        return None

    def blocks(a, b):  # [M, K]: a..b, the last repeated
        K = int((b - a).max().item()) + 1
        return torch.minimum(a[:, None] + torch.arange(K, device=a.device)[None, :], b[:, None])
    tgt = blocks(lo, hi)
    if grad and hard > 0:
        with torch.no_grad():
            p0 = meank_shares(q.detach(), mu)
            p0.scatter_(1, tgt, -1.0)
            top = p0.topk(min(hard, rec.nb - 1), dim=1).indices
            sel = torch.unique(torch.cat([tgt.reshape(-1), top.reshape(-1)]))
        wins = np.unique(rec.block_win_np[sel.cpu().numpy()])
        keys, _ = keys_fn(rec.windows[torch.from_numpy(wins).to(rec.windows.device)], True, False)
        tok = rec.block_tokens(sel, wins)  # [S, 32]
        L, H, D = len(keys), keys[0].shape[2], keys[0].shape[3]
        mu_sel = torch.stack([keys[l].reshape(-1, H, D)[tok.reshape(-1)].view(
            sel.numel(), MEANK_BLOCK, H, D).float().mean(1) for l in range(L)])
        mu = mu.index_copy(1, sel, mu_sel)
    p = meank_shares(q, mu)
    pt = p.gather(1, tgt)
    valid = (torch.arange(tgt.shape[1], device=tgt.device)[None, :] <= (hi - lo)[:, None]).float()
    nll = -torch.log(pt.clamp(min=1e-9))
    loss = ((nll * valid).sum(1) / valid.sum(1)).mean()
    pd = p.detach()
    rank = (pd > pt.detach().min(1).values[:, None]).sum(1)
    worst = pd.gather(1, blocks(l_lo, l_hi.clamp(max=rec.nb - 1))).min(1).values
    line_rank = (pd > worst[:, None]).sum(1)
    return loss, rank, wins, line_rank


def question_queries(model, hidden, qrow, c, rope_cs):
    """The Mean-K query of every question in qrow ([Lq] ids after the view):
    at its answer marker (the first '=' after its '?'), the mean raw query of
    each KV head's group (q-norm, before RoPE), RoPE-averaged as
    kvmem_rope_mean: [layers, M, H, D]. hidden: the question forward's
    hidden states ([1, Lq, hidden] entering each layer)."""
    row = qrow.tolist()
    marks, inq = [], False
    for i, t in enumerate(row):
        if t == c.q:
            inq = True
        elif t == c.a and inq:
            marks.append(i)
            inq = False
    pos = torch.tensor(marks, device=qrow.device, dtype=torch.long)
    cs, sn = rope_cs
    D = cs.numel() * 2
    out = []
    for l, layer in enumerate(model.model.layers):
        at = layer.self_attn
        h = layer.input_layernorm(hidden[l][0, pos])
        hkv = at.k_proj.out_features // D
        qq = at.q_norm(at.q_proj(h).view(len(marks), -1, D)).float()
        qq = qq.view(len(marks), hkv, -1, D).mean(2)
        a, b = qq[..., :D // 2], qq[..., D // 2:]
        out.append(torch.cat([cs * a - sn * b, cs * b + sn * a], dim=-1))
    return torch.stack(out)


class _OneRecord:
    """A corpus seen as its record k alone (for PagedBatch)."""

    def __init__(self, corpus, k):
        self.c, self.k = corpus, k
        self.ids, self.window = corpus.ids, corpus.window

    def page_record(self, _):
        return self.c.page_record(self.k)


VIEW_BLOCK = 32  # the corpus's view blocks (user/agentlang/view_select.c), whatever MEANK_BLOCK


def needle_slots(corpus, k):
    """Paged record k's view slots [n_view] (bool) that hold a token of a
    32-token view block with one of its questions' needles in it: what
    --whole-query blind hides from the Mean-K queries. The corpus's views
    are chosen by lexical with the questions known, so they hold each
    needle; kvmem's meank scores with a query read over the view before
    the selection, which holds the needle only by chance."""
    _, nv, _, win, off = corpus.page_record(k)
    _, needles, start, _, _ = corpus.page_info(k)
    tok = np.asarray(start)[win] + off
    return np.isin(tok // VIEW_BLOCK, np.asarray(needles) // VIEW_BLOCK)


def question_pass(model, kvs, pb, mask, c, args, rope_cs):
    """The questions after the view (its K/V from the windows' kvs) under a
    mask: the Mean-K queries [layers, M, H, D]."""
    cache = new_cache(model.config)
    for l, (kw, vw) in enumerate(kvs):
        kk, vv = assemble_pages(kw, vw, pb, args.head_dim, args.rope_theta)
        cache.update(kk, vv, l)
    out = model(input_ids=pb.q, past_key_values=cache, position_ids=pb.positions,
                attention_mask=mask, use_cache=True, output_hidden_states=True)
    return question_queries(model, out.hidden_states, pb.q[0], c, rope_cs)


def whole_step(model, corpus, k, c, args, device, rope_cs, grad=True, other=False):
    """One whole record's Mean-K loss over its workspace: (loss, ranks [M],
    blocks, windows run, windows run again with gradients, workspace tokens,
    with other the ranks [M] under the other --whole-query, without
    gradients, or None, and the needle lines' ranks [M], kvmem's: their
    worst blocks'). --whole-target line makes every block of the needle's
    line a target of the loss (equals: the '=''s block). The view's K/V
    come from the same no-grad pass as the block means; the questions run
    over them (with gradients when grad) to give the queries: over the whole
    view (--whole-query view), or with the needles' view blocks hidden
    (blind, as kvmem's meank sees them)."""
    rec = WholeRecord(corpus, k, device)
    fn = model_keys_fn(model, args.head_dim)
    mu, kvs = whole_block_means(fn, rec, args.paged_chunk, want_kv=True)
    pb = PagedBatch(_OneRecord(corpus, k), [0], c.pad, device)
    blind = getattr(args, "whole_query", "view") == "blind"
    masks = (pb.mask, None)
    if blind or other:  # the needles' view slots hidden: only when asked for
        blind_mask = pb.mask.clone()
        hide = torch.from_numpy(needle_slots(corpus, k)).to(device)
        blind_mask[0, :hide.numel()] = blind_mask[0, :hide.numel()] * (~hide).long()
        masks = (blind_mask, pb.mask) if blind else (pb.mask, blind_mask)
    with torch.set_grad_enabled(grad):
        q = question_pass(model, kvs, pb, masks[0], c, args, rope_cs)
        if q.shape[1] != rec.n_q:
            raise ValueError(f"paged record {k}: {q.shape[1]} questions after the view, "
                             f"{rec.n_q} needles")
        line = getattr(args, "whole_target", "equals") == "line"
        r = whole_meank_loss(fn, q, rec, mu, args.meank_whole_hard if grad else 0, grad, line)
    if r is None:
        return None
    loss, rank, wins, line_rank = r
    rank2 = None
    if other:
        with torch.no_grad():
            r2 = whole_meank_loss(fn, question_pass(model, kvs, pb, masks[1], c, args, rope_cs),
                                  rec, mu, 0, False, line)
        rank2 = r2[1] if r2 is not None else None
    return (loss, rank, rec.nb, rec.windows.shape[0], len(wins), rec.ws_tokens, rank2,
            line_rank)


@torch.no_grad()
def evaluate_whole(model, corpus, c, args, device, amp, rope_cs, limit):
    """Mean-K over the whole workspace of (at most `limit`) whole records of
    a held-out corpus: how often the needle block ranks first, and within
    the bench's budget (args.meank_budget blocks: what decides meank's
    in-view rate), overall and by workspace size in windows; under "other"
    the same with the queries of the other --whole-query (view or blind)."""
    model.eval()
    n = min(limit, len(corpus.whole_ks))
    acc = [dict(nq=0, top1=0, inb=0, frac=0.0, by={}) for _ in range(3)]
    loss_sum = 0.0

    def add(a, r, nb, ratio):
        b = a["by"].setdefault(ratio, [0, 0])
        b[0] += len(r)
        b[1] += int((r < args.meank_budget).sum())
        a["nq"] += len(r)
        a["top1"] += int((r == 0).sum())
        a["inb"] += int((r < args.meank_budget).sum())
        a["frac"] += float((r / max(1, nb)).sum())

    for k in corpus.whole_ks[:n]:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            out = whole_step(model, corpus, int(k), c, args, device, rope_cs, grad=False,
                             other=True)
        if out is None:
            continue
        loss, rank, nb, _, _, ws, rank2, line_rank = out
        ratio = max(1, int(round(ws / corpus.seq_len)))
        ratio = 1 << (ratio.bit_length() - 1)
        add(acc[0], rank.cpu().numpy(), nb, ratio)
        if rank2 is not None:
            add(acc[1], rank2.cpu().numpy(), nb, ratio)
        add(acc[2], line_rank.cpu().numpy(), nb, ratio)
        loss_sum += loss.item() * rank.numel()
    model.train()

    def summary(a):
        return {"questions": a["nq"], "top1": a["top1"] / max(1, a["nq"]),
                "in_budget": a["inb"] / max(1, a["nq"]),
                "rank_fraction": a["frac"] / max(1, a["nq"]),
                "in_budget_by_ratio": {str(r): v[1] / max(1, v[0])
                                       for r, v in sorted(a["by"].items())},
                "questions_by_ratio": {str(r): v[0] for r, v in sorted(a["by"].items())}}
    mode = getattr(args, "whole_query", "view")
    r = summary(acc[0])
    r.update({"sequences": n, "budget_blocks": args.meank_budget, "query": mode,
              "loss": loss_sum / max(1, acc[0]["nq"])})
    r["other"] = dict(summary(acc[1]), query="view" if mode == "blind" else "blind")
    r["line"] = summary(acc[2])
    r["target"] = getattr(args, "whole_target", "equals")
    return r


def safe_evaluation(fn, broken, what, model, *a):
    """fn(model, *a), or None when it fails: the reason goes to `broken`
    (which switches that path off) and the log, so that one bounded run
    ends with its model whatever an optional path's evaluation does."""
    try:
        return fn(model, *a)
    except Exception as e:  # noqa: BLE001
        broken.append(f"evaluation: {type(e).__name__}: {e}")
        log(f"{what}: evaluation failed ({broken[-1]}); the {what} path is off")
        model.train()
        return None


def safe_evaluate_whole(model, corpus, c, args, device, amp, rope_cs, limit):
    """evaluate_whole, or None (and the whole path off) when it fails."""
    return safe_evaluation(evaluate_whole, WHOLE_BROKEN, "meank-whole", model, corpus, c, args,
                           device, amp, rope_cs, limit)


def whole_eval_line(name, r):
    def by(x):
        return ", ".join(f"{k}x {100 * v:.0f}%" for k, v in x["in_budget_by_ratio"].items())
    line = (f"{name}-whole: meank over the workspace: top-1 {100 * r['top1']:.1f}%, in budget "
            f"({r['budget_blocks']} blocks) {100 * r['in_budget']:.1f}% of {r['questions']} "
            f"({by(r)}), mean rank {100 * r['rank_fraction']:.2f}% of the blocks, "
            f"loss {r['loss']:.3f}")
    o = r.get("other")
    if o and o["questions"]:
        line += (f"; queries {o['query']}: top-1 {100 * o['top1']:.1f}%, in budget "
                 f"{100 * o['in_budget']:.1f}% ({by(o)}), mean rank "
                 f"{100 * o['rank_fraction']:.2f}%")
    li = r.get("line")
    if li and li["questions"]:
        line += (f"; whole lines (kvmem's in view): in budget {100 * li['in_budget']:.1f}% "
                 f"({by(li)}), mean rank {100 * li['rank_fraction']:.2f}%")
    return line


def exact_counts(logits, x, ans, c):
    """Questions with answers, and those whose every answer token is the
    argmax (targets x[:, 1:], answer mask ans)."""
    pred = logits.argmax(-1)
    wrong = (pred != x[:, 1:]) & ans
    qid = question_ids(x, c)
    rows = torch.arange(x.shape[0], device=x.device).unsqueeze(1).expand_as(qid)
    key = (rows * (qid.max() + 1) + qid)[ans]
    size = int(x.shape[0] * (qid.max().item() + 1))
    has = torch.zeros(size, device=x.device).index_add_(0, key, torch.ones_like(key, dtype=torch.float))
    bad = torch.zeros(size, device=x.device).index_add_(0, key, wrong[ans].float())
    return int((has > 0).sum().item()), int(((has > 0) & (bad == 0)).sum().item())


# ---- fp8 K/V in the loop (issue 27) -----------------------------------------
# kvmem's --kv-dtype fp8 keeps each token's raw K (after k-norm, before RoPE)
# and V as e4m3 with one power-of-two scale per row of head_dim values (a
# token in a KV head): kernels/kernels_fp8.h. --kv-fp8 trains with that round
# trip in the attention (fake quantisation): forward hooks on every layer's
# self_attn.k_norm and self_attn.v_proj give back the values kvmem would read,
# and pass the gradients through unchanged (straight-through). The rounding
# below gives kernels/cpu/fp8.c's bits (--self-test checks it against
# e4m3_fixture.txt, which test_fp8 checks against the C).
E4M3_FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e4m3_fixture.txt")


def _pow2(e):
    """2^e (fp32) for int32 e in fp32's normal range, exact on any device."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def e4m3_round(y, ties_away=False):
    """fp32 y to the nearest e4m3 value, as fp32: ties to even, +-448 past
    it (infinity too), NaN kept, the sign of zero kept; the value
    kvmem_e4m3_to_f32(kvmem_f32_to_e4m3(y)) gives. (ties_away: the wrong
    tie rule, for the self-test to show the fixture tells them apart.)"""
    a = y.abs()
    _, k = torch.frexp(a)
    # A step of 2^(k - 4) in the binade [2^(k-1), 2^k); below 2^-6 the
    # subnormals' 2^-9 (k clamped to -5); k capped where the value saturates.
    step = _pow2(k.clamp(-5, 10) - 4)
    v = (torch.floor(a / step + 0.5) if ties_away else torch.round(a / step)) * step
    v = v.masked_fill(a >= 448.0, 448.0)
    v = torch.where(torch.isnan(y), y, v)
    return torch.copysign(v, y)


def fp8_row_exp(x):
    """The exponent of each row's scale (the last axis, fp32): the power of two
    that brings the row's largest finite magnitude into (224, 448], clamped
    to [-126, 120]; 0 for a row with nothing finite but zeros."""
    a = x.abs().masked_fill(~torch.isfinite(x), 0.0).amax(-1, keepdim=True)
    f, k = torch.frexp(a)
    e = (k - 9 + (f > 0.875).to(k.dtype)).clamp(-126, 120)
    return e.masked_fill(a == 0, 0)


def fp8_roundtrip(x):
    """Rows (the last axis) through kvmem's fp8: e4m3(x / scale) * scale, the
    bits of kvmem_fp8_roundtrip_rows; computed in fp32, returned in x's
    dtype (exact in bf16 but for values under 2^-133)."""
    xf = x.float()
    e = fp8_row_exp(xf)
    return (e4m3_round(xf * _pow2(-e)) * _pow2(e)).to(x.dtype)


def fake_fp8(x, head_dim):
    """x [..., n * head_dim] with each run of head_dim values (a token in a KV
    head) through fp8_roundtrip; the gradient passes straight through. For
    finite x the forward is the rounded values themselves (q + 0)."""
    shape = x.shape
    if shape[-1] % head_dim:
        raise ValueError(f"fp8: a last axis of {shape[-1]} is not rows of {head_dim}")
    q = fp8_roundtrip(x.detach().reshape(*shape[:-1], -1, head_dim)).reshape(shape)
    return q + (x - x.detach())


class KVFP8:
    """Forward hooks on a model's self_attn.k_norm (raw K: after k-norm,
    before RoPE) and self_attn.v_proj (V) modules, found by name: while .on,
    their outputs are what kvmem's fp8 pages give back (fake_fp8). Installed
    once, before torch.compile, and left in place; .on is read at each call."""

    def __init__(self, model, head_dim):
        self.on, self.head_dim, self.handles = False, head_dim, []
        k = v = 0
        for name, mod in model.named_modules():
            if name.endswith("self_attn.k_norm") or name.endswith("self_attn.v_proj"):
                self.handles.append(mod.register_forward_hook(self._hook))
                k += name.endswith("k_norm")
                v += name.endswith("v_proj")
        if not k or k != v:
            raise ValueError(f"fp8: found {k} self_attn.k_norm and {v} self_attn.v_proj modules")
        self.layers = k

    def _hook(self, mod, inp, out):
        return fake_fp8(out, self.head_dim) if self.on else None

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def read_e4m3_fixture(path=E4M3_FIXTURE):
    """test_fp8's fixture: (decode {code: f32 bits}, encode [(x bits, code)],
    rows [(scale bits, in bits [n], out bits [n])])."""
    dec, enc, rows = {}, [], []
    with open(path) as f:
        for line in f:
            w = line.split()
            if not w or w[0].startswith("#"):
                continue
            if w[0] == "decode":
                dec[int(w[1], 16)] = int(w[2], 16)
            elif w[0] == "encode":
                enc.append((int(w[1], 16), int(w[2], 16)))
            elif w[0] == "row":
                rows.append((int(w[1], 16), [int(t, 16) for t in w[2].split(",")],
                             [int(t, 16) for t in w[3].split(",")]))
    return dec, enc, rows


def _f32(bits):
    return torch.tensor(np.array(bits, dtype=np.uint32).view(np.float32))


def _same_f32(a, b):
    """Bit for bit, every NaN alike (kvmem's one NaN code decodes to one)."""
    ia = a.contiguous().view(torch.int32)
    ib = b.contiguous().view(torch.int32)
    return bool(((ia == ib) | (torch.isnan(a) & torch.isnan(b))).all())


def fp8_self_test(check):
    """The fake quantisation against kernels/cpu/fp8.c's bits (e4m3_fixture.txt),
    its straight-through gradient, and the hooks on a toy module tree that
    names its modules as Qwen3 does."""
    try:
        dec, enc, rows = read_e4m3_fixture()
    except OSError as e:
        check(f"fp8: read {E4M3_FIXTURE}", False, str(e))
        return
    check("fp8: the fixture has every code, the encodings and the rows",
          len(dec) == 256 and len(enc) > 600 and len(rows) > 20,
          f"{len(enc)} values, {len(rows)} rows")
    x = _f32([b for b, _ in enc])
    want = _f32([dec[c] for _, c in enc])
    check("fp8: e4m3 rounding = kvmem_f32_to_e4m3 bit for bit (ties, subnormals, "
          "saturation, -0, NaN)", _same_f32(e4m3_round(x), want), f"{len(enc)} values")
    check("fp8: the fixture tells ties-away from ties-to-even",
          not _same_f32(e4m3_round(x, ties_away=True), want))
    ok_s = ok_r = True
    for s, xin, xout in rows:
        xi = _f32(xin).view(1, -1)
        ok_s &= _same_f32(_pow2(fp8_row_exp(xi)).view(1), _f32([s]))
        ok_r &= _same_f32(fp8_roundtrip(xi).view(-1), _f32(xout))
    check("fp8: row scales = kvmem_fp8_row_scale (zeros, NaN, infinity, the clamps)", ok_s,
          f"{len(rows)} rows")
    check("fp8: row round trips = kvmem_fp8_roundtrip_rows bit for bit", ok_r)
    # bf16 input: rounding its fp32 widening, the result exact in bf16
    xb = torch.randn(16, 64).mul(3.0).to(torch.bfloat16)
    qb = fp8_roundtrip(xb)
    check("fp8: bf16 rows round as their fp32 widening, exactly",
          qb.dtype == torch.bfloat16 and _same_f32(qb.float(), fp8_roundtrip(xb.float())))
    # straight-through: forward = the rounded rows, backward = identity
    xs = torch.randn(3, 5, 2 * 64, requires_grad=True)
    g = torch.randn(3, 5, 2 * 64)
    y = fake_fp8(xs, 64)
    (y * g).sum().backward()
    check("fp8: fake quantisation's forward = each (token, head) row's round trip",
          _same_f32(y.detach(), fp8_roundtrip(xs.detach().view(3, 5, 2, 64)).view(3, 5, 128))
          and not _same_f32(y.detach(), xs.detach()))
    check("fp8: the gradient passes through unchanged (straight-through)",
          xs.grad is not None and _same_f32(xs.grad, g))

    # The hooks on a toy attention that names its modules as Qwen3 does
    # (model.layers.N.self_attn.k_norm / v_proj) and uses them as it does:
    # K = k_norm(k_proj(h) viewed [B, T, H, D]), V = v_proj(h).
    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k_proj, self.v_proj = torch.nn.Linear(16, 32), torch.nn.Linear(16, 32)
            self.k_norm, self.o_proj = torch.nn.LayerNorm(8), torch.nn.Linear(32, 16)
            self.seen = None

        def forward(self, h):
            k = self.k_norm(self.k_proj(h).view(h.shape[0], h.shape[1], 4, 8))
            v = self.v_proj(h)
            self.seen = (k.detach(), v.detach())
            return h + self.o_proj(torch.tanh(k.reshape(v.shape) * v))

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attn()

        def forward(self, h):
            return self.self_attn(h)

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([Layer(), Layer()])

        def forward(self, h):
            for layer in self.model.layers:
                h = layer(h)
            return h

    toy = Toy()
    h = torch.randn(2, 3, 16)
    plain = toy(h)
    plain_seen = [l.self_attn.seen for l in toy.model.layers]
    kvq = KVFP8(toy, 8)
    off = toy(h)
    check("fp8 hooks: every layer's k_norm and v_proj found; off, the same bits",
          kvq.layers == 2 and len(kvq.handles) == 4 and _same_f32(off, plain))
    kvq.on = True
    on = toy(h)
    ok = True
    for l, (k0, v0) in zip(toy.model.layers, plain_seen):
        k1, v1 = l.self_attn.seen
        ok &= _same_f32(k1, fp8_roundtrip(k0)) if l is toy.model.layers[0] else True
        ok &= not _same_f32(k1, k0) and not _same_f32(v1, v0)
    k1, v1 = toy.model.layers[0].self_attn.seen
    ok &= _same_f32(v1, fp8_roundtrip(plain_seen[0][1].view(2, 3, 4, 8)).view(2, 3, 32))
    check("fp8 hooks: on, each layer's K and V rows are read back as fp8", ok and
          not _same_f32(on, plain))
    on.sum().backward()
    gk = toy.model.layers[0].self_attn.k_proj.weight.grad
    check("fp8 hooks: on, the gradients reach k_proj through the rounding",
          gk is not None and gk.abs().sum().item() > 0)
    kvq.remove()
    check("fp8 hooks: removed, the same bits as before", _same_f32(toy(h), plain))


# ---- self-test of the paged path --------------------------------------------
class _ToyCorpus:
    """The part of Corpus that PagedBatch reads, built in memory."""

    def __init__(self, seqs, records, window):
        self.ids, self.window, self.recs = np.asarray(seqs), window, records
        self.paged_seqs = np.array([r[0] for r in records])
        self.n_paged = len(records)

    def page_record(self, k):
        return self.recs[k]


def self_test(data=None):
    """Pure-torch checks of the re-rotation, the cache assembly, the masks and
    positions; with a corpus (data), that its paged records give back each
    paged sequence's view; with transformers, a tiny Qwen3's question logits
    from pages (windows at shifted positions, so the re-rotation matters)
    against a plain forward of the same sequence. 0 when every check passes."""
    torch.manual_seed(0)
    D, theta, bad = 64, 10000.0, []

    def check(name, ok, detail=""):
        log(f"self-test: {'ok  ' if ok else 'FAIL'} {name}{' (' + detail + ')' if detail else ''}")
        if not ok:
            bad.append(name)

    if data:
        cor = Corpus(data)
        check(f"{data} has paged sequences", cor.n_paged > 0, f"{cor.n_paged}")
        ok, n_win = True, 0
        for k in range(min(cor.n_paged, 64)):
            seq, nv, ids, win, off = cor.page_record(k)
            row = np.asarray(cor.ids[seq]).astype(np.int64)
            ok &= bool((ids[win, off] == row[:nv]).all()) and row[nv] == cor.q
            n_win += ids.shape[0]
        check("paged records give back each view's tokens, questions after them", ok,
              f"{min(cor.n_paged, 64)} sequences, {n_win} windows")
        pb = PagedBatch(cor, list(range(min(cor.n_paged, 4))), cor.pad, torch.device("cpu"))
        flat = pb.windows.reshape(-1)[pb.flat]
        ok = True
        for b in range(pb.P):
            seq = int(cor.paged_seqs[b])
            row = torch.from_numpy(np.asarray(cor.ids[seq]).astype(np.int64))
            ok &= bool((flat[b, :pb.n_view[b]] == row[:pb.n_view[b]]).all())
            ok &= bool((pb.q[b, :8] == row[pb.n_view[b]:pb.n_view[b] + 8]).all())
        check("a paged batch's slots hold the view's tokens", ok)
        if cor.version >= 4:
            check(f"{data} has whole paged sequences", cor.n_whole > 0, f"{cor.n_whole}")
            # version 3 is still read: the same corpus written as version 3
            import tempfile
            with tempfile.TemporaryDirectory() as td:
                old = Corpus(_write_v3(cor, os.path.join(td, "v3.bin")))
                ok = old.version == 3 and old.n_paged == cor.n_paged and old.n_whole == 0
                for k in range(min(cor.n_paged, 16)):
                    a, b = cor.page_record(k), old.page_record(k)
                    ok &= a[:2] == b[:2] and all((x == y).all() for x, y in zip(a[2:], b[2:]))
                    ok &= old.page_info(k)[1] is None
                check("a version-3 corpus reads as before (no needles, nothing whole)", ok)
        whole_self_test(check, cor)
    else:
        whole_self_test(check)

    # 1. Re-rotating a key rotated at p by (c - p) gives the key rotated at c.
    k = torch.randn(3, 2, 40, D)
    p = torch.randint(0, 4096, (3, 2, 40))
    cpos = torch.randint(0, 2048, (3, 2, 40))
    got = rerotate(rope_apply(k, p, D, theta), cpos - p, D, theta)
    want = rope_apply(k, cpos, D, theta)
    err = (got - want).abs().max().item()
    check("re-rotation p -> c equals rotation at c", err < 1e-4, f"max err {err:.2e}")
    # transformers' convention: the first half pairs with the second half
    x = torch.zeros(1, D)
    x[0, 0] = 1.0
    r = rope_apply(x, torch.tensor([1]), D, theta)
    check("rotate_half pairs i with i + D/2", abs(r[0, 0].item() - math.cos(1.0)) < 1e-6 and
          abs(r[0, D // 2].item() - math.sin(1.0)) < 1e-6)
    # 2. Scores depend on distances only.
    q = torch.randn(5, D)
    a, b, s = torch.randint(0, 1000, (5,)), torch.randint(0, 1000, (5,)), torch.randint(0, 1000, (5,))
    s1 = (rope_apply(q, a, D, theta) * rope_apply(k[0, 0, :5], b, D, theta)).sum(-1)
    s2 = (rope_apply(q, a + s, D, theta) * rope_apply(k[0, 0, :5], b + s, D, theta)).sum(-1)
    check("q.k depends on the distance only", (s1 - s2).abs().max().item() < 1e-3)

    # 3. Assembly: window K encodes (window, place); the view takes the right
    # ones, rotated by compact - place, zeros in the unused slots; masks and
    # positions put the questions after each row's view.
    W, pad, Q = 16, 0, 5
    seqs = np.zeros((3, 32), np.int64)
    recs = []
    rng = np.random.default_rng(1)
    for seq, nv, nw in ((0, 7, 2), (2, 11, 3)):
        ids = rng.integers(10, 700, (nw, W))
        win = np.sort(rng.integers(0, nw, nv))
        off = np.sort(rng.integers(0, W, nv))
        seqs[seq, :nv] = ids[win, off]
        seqs[seq, nv:nv + 4] = [Q, 11, 12, 13]
        recs.append((seq, nv, ids, win, off))
    toy = _ToyCorpus(seqs, recs, W)
    pb = PagedBatch(toy, [0, 1], pad, torch.device("cpu"))
    S = 11
    check("batch shapes", tuple(pb.flat.shape) == (2, S) and tuple(pb.q.shape) == (2, 4)
          and pb.n_windows == 5 and tuple(pb.mask.shape) == (2, S + 4))
    check("questions at positions after the view",
          pb.positions[0].tolist() == [7, 8, 9, 10] and pb.positions[1].tolist() == [11, 12, 13, 14])
    check("mask: view slots, not the padding, then the questions",
          pb.mask[0].tolist() == [1] * 7 + [0] * 4 + [1] * 4 and pb.mask[1].tolist() == [1] * 15)
    check("questions are the tokens after the view", pb.q[0].tolist() == [Q, 11, 12, 13])
    H = 2
    kw = torch.zeros(5, H, W, D)
    kw[..., 0] = torch.arange(5).view(5, 1, 1).float()  # window number
    kw[..., 1] = torch.arange(W).view(1, 1, W).float()  # place
    kw[..., D // 2:] = 0
    vw = kw.clone()
    kv, vv = assemble_pages(kw, vw, pb, D, theta)
    ok = True
    for b, (seq, nv, ids, win, off) in enumerate(recs):
        base = 0 if b == 0 else recs[0][2].shape[0]
        for i in range(S):
            if i >= nv:
                ok &= bool((kv[b, :, i] == 0).all() and (vv[b, :, i] == 0).all())
                continue
            ok &= vv[b, 0, i, 0].item() == base + win[i] and vv[b, 0, i, 1].item() == off[i]
            # the key: the raw (window, place) pair rotated by i - off[i]
            raw = torch.zeros(1, D)
            raw[0, 0], raw[0, 1] = base + win[i], off[i]
            want = rope_apply(raw, torch.tensor([i - off[i]]), D, theta)[0]
            ok &= bool((kv[b, 1, i] - want).abs().max() < 1e-4)
    check("the view's K/V come from the right window and place, keys re-rotated", ok)
    fp8_self_test(check)
    distill_self_test(check)

    # 4. With transformers: a tiny model's question logits from pages equal a
    # plain forward's when the pages hold the view's own context (windows
    # that start at the workspace's start: the kept tokens are a prefix),
    # computed 37 positions further on, then rotated back.
    try:
        from transformers import Qwen3Config, Qwen3ForCausalLM
    except ImportError:
        log("self-test: skip the model check (no transformers here)")
        return 1 if bad else 0
    cfg = dict(vocab_size=768, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
               use_cache=False, pad_token_id=0)
    config = None
    for kwr in ({"rope_parameters": {"rope_type": "default", "rope_theta": theta}},
                {"rope_theta": theta}):
        try:
            cand = Qwen3Config(**kwr, **cfg)
        except TypeError:
            continue
        if effective_theta(cand) == theta:
            config = cand
            break
    if config is None:
        check("tiny Qwen3 config", False)
        return 1
    try:
        model = Qwen3ForCausalLM._from_config(config, attn_implementation="sdpa")
    except Exception:  # noqa: BLE001
        config._attn_implementation = "sdpa"
        model = Qwen3ForCausalLM(config)
    model.eval()

    class C:
        pass
    cc = C()
    cc.pad, cc.q, cc.a, cc.end = 0, Q, 6, 7
    W = 64
    recs, seqs = [], np.zeros((2, 96), np.int64)
    for b, nv in enumerate((40, 29)):
        ws = rng.integers(10, 700, W)
        tail = [Q, 100 + b, 101, 6, 300 + b, 301, 7, 9]
        seqs[b, :nv] = ws[:nv]
        seqs[b, nv:nv + len(tail)] = tail
        recs.append((b, nv, ws.reshape(1, W), np.zeros(nv, np.int64), np.arange(nv)))
    toy = _ToyCorpus(seqs, recs, W)
    dev = torch.device("cpu")
    pb = PagedBatch(toy, [0, 1], 0, dev, window_pos0=37)
    with torch.no_grad():
        lp = paged_forward(model, pb, 16, theta, 8, window_pos0=37).float()
        for b, (_, nv, _, _, _) in enumerate(recs):
            x = torch.from_numpy(seqs[b:b + 1, :nv + 8])
            lf = model(input_ids=x, use_cache=False).logits.float()[0, nv:nv + 8]
            err = (lp[b, :8] - lf).abs().max().item()
            check(f"tiny model, row {b} (view {nv}): logits from pages = plain forward",
                  err < 2e-4, f"max |diff| {err:.2e}")
        # and the shift matters: without rotating back the logits differ
        pb0 = PagedBatch(toy, [0, 1], 0, dev, window_pos0=0)
        l0 = paged_forward(model, pb0, 16, theta, 8, window_pos0=37).float()
        check("a wrong rotation shows", (l0[0, :8] - lp[0, :8]).abs().max().item() > 1e-3)
    # gradients flow into the weights through the question tokens only
    model.train()
    pl, _, _, _, _ = paged_losses(model, pb, cc, 1.0, 16, theta, 8)
    pl.backward()
    g = model.model.layers[0].self_attn.q_proj.weight.grad
    check("the paged loss trains the weights", g is not None and g.abs().sum().item() > 0)

    # 5. The whole-workspace Mean-K path on the tiny model: a whole record of
    # 9 windows of 64; the loss is finite and trains k_proj (through the
    # windows run again) and q_proj (through the query); the held-out ranks.
    Ww, Nw = 64, 300
    ws = rng.integers(10, 700, Nw)
    kept = np.sort(rng.choice(Nw, 40, replace=False))
    tail = np.array([Q, 101, 102, 6, 300, 301, 7, 9, Q, 103, 6, 302, 7, 9])
    toyw = _ToyWhole([(ws, kept, [100, 201], tail)], Ww)

    class A:
        pass
    aa = A()
    aa.head_dim, aa.rope_theta, aa.paged_chunk, aa.meank_whole_hard, aa.meank_budget = \
        16, theta, 4, 2, 3
    rc16 = rope_mean_coeffs(16, theta, 64, dev)
    model.zero_grad(set_to_none=True)
    r = whole_step(model, toyw, 0, cc, aa, dev, rc16)
    r[0].backward()
    gk = model.model.layers[0].self_attn.k_proj.weight.grad
    gq = model.model.layers[1].self_attn.q_proj.weight.grad
    check("whole: the tiny model's workspace Mean-K loss trains k_proj and q_proj",
          math.isfinite(r[0].item()) and gk is not None and gk.abs().sum().item() > 0
          and gq is not None and gq.abs().sum().item() > 0 and r[3] == 9 and 0 < r[4] < 9,
          f"loss {r[0].item():.3f}, ranks {r[1].tolist()} of {r[2]} blocks, {r[4]} windows again")
    ev = evaluate_whole(model, toyw, cc, aa, dev, False, rc16, 4)
    check("whole: the held-out ranks", ev["questions"] == 2 and 0 <= ev["in_budget"] <= 1,
          whole_eval_line("toy", ev))
    check("whole: the held-out ranks with the other queries (blind)",
          ev["other"]["query"] == "blind" and ev["other"]["questions"] == 2)
    check("whole: the held-out lines' ranks (a toy has no newline: the '=' blocks')",
          ev["line"]["questions"] == 2 and ev["line"]["in_budget"] == ev["in_budget"] and
          ev["line"]["rank_fraction"] == ev["rank_fraction"])
    # --whole-query blind: the loss trains through queries that do not see
    # the needles' view blocks
    aa.whole_query = "blind"
    model.zero_grad(set_to_none=True)
    rb = whole_step(model, toyw, 0, cc, aa, dev, rc16, other=True)
    rb[0].backward()
    gq = model.model.layers[1].self_attn.q_proj.weight.grad
    check("whole: blind queries train q_proj, the view's ranks beside them",
          math.isfinite(rb[0].item()) and gq is not None and gq.abs().sum().item() > 0
          and rb[6] is not None and rb[6].numel() == rb[1].numel(),
          f"loss {rb[0].item():.3f}, ranks blind {rb[1].tolist()}, view {rb[6].tolist()}")
    del aa.whole_query
    # --whole-target line: every block of the needle's line a target; the
    # loss trains k_proj and ranks as kvmem does (the line's worst block)
    aa.whole_target = "line"
    model.zero_grad(set_to_none=True)
    rl = whole_step(model, toyw, 0, cc, aa, dev, rc16)
    rl[0].backward()
    gk = model.model.layers[0].self_attn.k_proj.weight.grad
    check("whole: line targets train k_proj; the loss's rank is the line's worst block's",
          math.isfinite(rl[0].item()) and gk is not None and gk.abs().sum().item() > 0
          and torch.equal(rl[7], rl[1]), f"loss {rl[0].item():.3f}, ranks {rl[1].tolist()}")
    del aa.whole_target

    # 6. fp8 K/V (--kv-fp8) on the tiny model: the hooks find both layers;
    # off they change nothing; on, layer 0's cached V (its input is the
    # embeddings either way) is its fp8 round trip, and the logits move.
    model.eval()
    x = torch.from_numpy(seqs[:1, :48])
    with torch.no_grad():
        def run():
            cache = new_cache(model.config)
            lg = model(input_ids=x, past_key_values=cache, use_cache=True).logits.float()
            return lg, cache_kv(cache, 0)[1].clone()
        l0, v0 = run()
        kvq = KVFP8(model, 16)
        l1, _ = run()
        kvq.on = True
        l2, v2 = run()
        kvq.on = False
        kvq.remove()
    check("fp8 hooks on a tiny Qwen3: both layers found; off, the same logits",
          kvq.layers == 2 and _same_f32(l0, l1))
    check("fp8 hooks on a tiny Qwen3: on, layer 0's cached V is its fp8 round trip; the "
          "logits move", _same_f32(v2.float(), fp8_roundtrip(v0).float())
          and not _same_f32(l2, l0), f"max |logit diff| {(l2 - l0).abs().max().item():.2e}")
    return 1 if bad else 0


# ---- self-test of the whole-workspace Mean-K path ---------------------------
def _tile(N, W):
    """The windows of a whole record (agentlang.h): window 0 is [0, min(N, W)),
    window k ends at min(N, W + k W/2) and starts W before its end."""
    half, ends = W // 2, []
    nw = 1 if N <= W else 1 + (N - W + half - 1) // half
    for k in range(nw):
        ends.append(min(N, W + k * half))
    ends = np.array(ends, dtype=np.int64)
    return np.maximum(ends - W, 0), ends


def _write_v3(cor, path):
    """cor (version 4, paged) written as version 3: a 128-byte header,
    records without flags and needles."""
    raw = bytes(cor.raw)
    ids_end = cor.header + cor.n_seqs * cor.seq_len * cor.id_bytes
    h = bytearray(raw[:128])
    struct.pack_into("<II", h, 8, 3, 128)
    body, index = bytearray(), []
    at = 128 + cor.n_seqs * cor.seq_len * cor.id_bytes
    for k in range(cor.n_paged):
        off = int(cor.paged_offsets[k])
        end = int(cor.paged_offsets[k + 1]) if k + 1 < cor.n_paged else int(
            struct.unpack_from("<Q", raw, 120)[0])
        nq = struct.unpack_from("<I", raw, off + 20)[0]
        rec = raw[off:off + 16] + raw[off + 32 + 4 * nq:end]
        index.append(struct.pack("<QQ", int(cor.paged_seqs[k]), at + len(body)))
        body += rec
    struct.pack_into("<Q", h, 120, at + len(body))
    with open(path, "wb") as f:
        f.write(bytes(h) + raw[cor.header:ids_end] + bytes(body) + b"".join(index))
    return path


class _ToyWhole:
    """Whole records built in memory: each a workspace ws (ids), its tiling,
    kept positions and needles; what WholeRecord and PagedBatch read."""

    def __init__(self, items, W, pad=0):
        self.window, self.recs, self.pad = W, [], pad
        rows = []
        for ws, kept, needles, tail in items:
            start, end = _tile(len(ws), W)
            ids = np.full((len(end), W), pad, np.int64)
            for w in range(len(end)):
                ids[w, :end[w] - start[w]] = ws[start[w]:end[w]]
            win = np.searchsorted(end, kept, side="right")
            row = np.concatenate([ws[kept], tail])
            self.recs.append((len(rows), len(kept), ids, win, kept - start[win],
                              (True, np.asarray(needles, np.int64), start, end, len(ws))))
            rows.append(row)
        self.whole_ks = np.arange(len(rows))
        L = max(len(r) for r in rows)
        self.ids = np.full((len(rows), L), pad, np.int64)
        for i, r in enumerate(rows):
            self.ids[i, :len(r)] = r
        self.seq_len = W

    def page_record(self, k):
        return self.recs[k][:5]

    def page_info(self, k):
        return self.recs[k][5]


class _ToyKeys:
    """A keys_fn whose raw key at t sees the R tokens up to t in its window
    (a causal convolution of embeddings E): where a window gives a token at
    least R - 1 tokens of context, its key equals a long forward's."""

    def __init__(self, vocab, L=2, H=2, D=8, R=5, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.E = torch.randn(vocab, L * H * D, generator=g).requires_grad_(True)
        self.a = torch.randn(R, generator=g)
        self.L, self.H, self.D, self.R = L, H, D, R
        self.calls = []

    def __call__(self, windows, grad, want_kv=False):
        self.calls.append((windows.shape[0], grad))
        with torch.set_grad_enabled(grad):
            e = self.E[windows]  # [n, W, L*H*D]
            k = sum(self.a[j] * F.pad(e, (0, 0, j, 0))[:, :e.shape[1]] for j in range(self.R))
            k = k.view(windows.shape[0], windows.shape[1], self.L, self.H, self.D)
            return [k[:, :, l] for l in range(self.L)], None


def whole_self_test(check, cor=None, c=None):
    """The checks of the whole-workspace Mean-K path that need no model."""
    dev = torch.device("cpu")
    if cor is not None and cor.n_whole:
        ok, okn, okt, n_q, n_win = True, True, True, 0, 0
        for k in cor.whole_ks[:16]:
            seq, nv, ids, win, off = cor.page_record(int(k))
            whole, needles, start, end, N = cor.page_info(int(k))
            ws = np.zeros(N, np.int64)
            for w in range(len(end)):  # the owners' tokens make the workspace
                a = end[w - 1] if w else 0
                ws[a:end[w]] = ids[w, a - start[w]:end[w] - start[w]]
            for w in range(len(end)):  # and every window agrees with it
                ok &= bool((ids[w, :end[w] - start[w]] == ws[start[w]:end[w]]).all())
                ok &= w == 0 or (start[w] <= end[w - 1] and (start[w] == 0 or end[w - 1] - start[w] >= cor.window // 2))
            row = np.asarray(cor.ids[seq]).astype(np.int64)
            ok &= bool((ws[start[win] + off] == row[:nv]).all())
            # each question's needle: a '=' with the question's file and key before it
            qs = [i for i in range(nv, len(row)) if row[i] == cor.q]
            okn &= len(qs) == len(needles)
            for qi, nd in zip(qs, needles):
                e = qi
                while row[e] != cor.a:
                    e += 1
                key = row[qi + 1:e]
                okn &= ws[nd] == cor.a and bool((ws[nd - len(key):nd] == key).all())
                n_q += 1
            rec = WholeRecord(cor, int(k), dev)
            okt &= bool((rec.windows.reshape(-1)[rec.tok_flat] ==
                         torch.from_numpy(ws[:rec.nb * MEANK_BLOCK])).all())
            allb = torch.arange(rec.nb)
            tok = rec.block_tokens(allb, np.arange(len(end)))
            okt &= bool((rec.windows.reshape(-1)[tok.reshape(-1)] ==
                         torch.from_numpy(ws[:rec.nb * MEANK_BLOCK])).all())
            n_win += len(end)
        n = min(16, cor.n_whole)
        check("whole records: the windows tile the workspace, W/2 of context, the view's "
              "tokens where they say", ok, f"{n} records, {n_win} windows")
        check("whole records: each question's needle is a '=' after the question's file and key",
              okn, f"{n_q} questions")
        check("whole records: each block's tokens are taken from the window that owns it", okt)
        # The views (chosen by lexical knowing the questions) hold each
        # needle's '=': the premise of --whole-query blind, which hides the
        # view slots of the needles' 32-token view blocks and nothing else.
        held, n_nd, okh = 0, 0, True
        for k in cor.whole_ks[:16]:
            _, nv, _, win, off = cor.page_record(int(k))
            _, needles, start, _, _ = cor.page_info(int(k))
            tok = start[win] + off
            hide = needle_slots(cor, int(k))
            okh &= bool((hide == np.isin(tok // VIEW_BLOCK, needles // VIEW_BLOCK)).all())
            okh &= not bool(np.isin(tok[~hide] // VIEW_BLOCK, needles // VIEW_BLOCK).any())
            held += int(np.isin(needles, tok).sum())
            n_nd += len(needles)
        check("whole records: blind queries hide the needles' view blocks, nothing else", okh)
        check("whole records: the views hold the needles (what blind queries take away)",
              held >= 0.9 * n_nd, f"{held} of {n_nd} needles' '=' in view")
        # Each needle's line: from a newline (or the start) to its own
        # newline, the '=' inside; how many lines span more than one block.
        okl, multi, n_l = True, 0, 0
        for k in cor.whole_ks[:16]:
            rec = WholeRecord(cor, int(k), dev)
            _, needles, start, end, N = cor.page_info(int(k))
            nl = corpus_newline(cor, int(k))
            t = np.arange(N)
            own = np.searchsorted(end, t, side="right")
            ids = cor.page_record(int(k))[2]
            wsi = ids[own, t - start[own]]
            for (b0, b1), nd in zip(rec.line_np, needles):
                a = nd
                while a > 0 and wsi[a - 1] != nl:
                    a -= 1
                e = nd
                while e < N - 1 and wsi[e] != nl:
                    e += 1
                okl &= nl is not None and b0 == a // MEANK_BLOCK and b1 == e // MEANK_BLOCK
                okl &= b0 <= nd // MEANK_BLOCK <= b1 and wsi[e] == nl
                multi += int(b1 > b0)
                n_l += 1
        check("whole records: each needle's line runs from a newline to its own, the '=' inside",
              okl, f"{multi} of {n_l} lines over more than one {MEANK_BLOCK}-token block")
        # block means from the windows = a long forward's (the toy's context
        # R <= W/2 is what every owned token has)
        rec = WholeRecord(cor, int(cor.whole_ks[0]), dev)
        whole_, _, start, end, N = cor.page_info(int(cor.whole_ks[0]))
        toy = _ToyKeys(max(cor.vocab, 1024), R=min(9, cor.window // 2))
        mu, _ = whole_block_means(toy, rec, 7)
        ws = np.zeros(N, np.int64)
        for w in range(len(end)):
            a = end[w - 1] if w else 0
            ws[a:end[w]] = rec.windows[w, a - start[w]:end[w] - start[w]].numpy()
        with torch.no_grad():
            keys, _ = toy(torch.from_numpy(ws[None, :rec.nb * MEANK_BLOCK]), False)
        want = torch.stack([k[0].view(rec.nb, MEANK_BLOCK, k.shape[2], k.shape[3]).mean(1)
                            for k in keys])
        err = (mu - want).abs().max().item()
        check("whole records: block means from the windows = one long forward's", err < 1e-4,
              f"{rec.nb} blocks, max err {err:.1e}")

    # needle_slots on a toy record: the kept tokens of the needles' view
    # blocks (96..127 and 192..223 for needles at 100 and 201), no others.
    kept = np.array([0, 5, 95, 96, 100, 127, 128, 150, 191, 192, 201, 223, 224, 290])
    toyn = _ToyWhole([(np.arange(10, 310), kept, [100, 201], np.array([1, 2]))], 64)
    want = np.isin(kept, [96, 100, 127, 192, 201, 223])
    check("whole: blind queries hide the kept tokens of the needles' view blocks only",
          bool((needle_slots(toyn, 0) == want).all()), f"{int(want.sum())} of {len(kept)} slots")

    # Synthetic workspaces: distinct token ids, so that a token's gradient
    # says which window's forward it came from.
    W, N, R = 128, 1500, 6
    rng = np.random.default_rng(3)
    ws = np.arange(N) + 1
    kept = np.sort(rng.choice(N, 200, replace=False))
    needles = [700, 1201, 64]
    toyc = _ToyWhole([(ws, kept, needles, np.array([2, 3, 4]))], W)
    rec = WholeRecord(toyc, 0, dev)
    toy = _ToyKeys(N + 8, R=R, seed=1)
    mu, _ = whole_block_means(toy, rec, 5)
    B = MEANK_BLOCK
    check("whole: block means over the windows = one long forward's (synthetic)",
          (mu - torch.stack([k[0, :rec.nb * B].reshape(rec.nb, B, 2, 8).mean(1) for k in
                             toy(torch.from_numpy(ws[None]), False)[0]])).abs().max().item() < 1e-4)
    q = torch.randn(2, 3, 2, 8, requires_grad=True)
    toy.E.grad = None
    loss, rank, wins, _ = whole_meank_loss(toy, q, rec, mu, hard=2)
    loss.backward()
    with torch.no_grad():
        p = meank_shares(q, mu)
        nb = torch.tensor(needles) // MEANK_BLOCK
        p[torch.arange(3), nb] = -1
        sel = torch.unique(torch.cat([nb, p.topk(2, dim=1).indices.reshape(-1)])).numpy()
    owners = np.unique(rec.block_win_np[sel])
    check("whole: the windows run again are the owners of the needle blocks and the 2 hardest",
          list(wins) == list(owners), f"{list(wins)}")
    g = toy.E.grad[1:N + 1].abs().sum(1) > 0  # token t's row is t + 1 - 1 = ws[t]
    reach = np.zeros(N, bool)
    for b in sel:
        reach[max(0, b * MEANK_BLOCK - R + 1):(b + 1) * MEANK_BLOCK] = True  # keys see R - 1 back
    check("whole: gradients reach the selected blocks' tokens and nothing else",
          bool((g.numpy() == reach).all()), f"{int(g.sum())} tokens")
    check("whole: gradients reach the query", q.grad is not None and q.grad.abs().sum().item() > 0)

    # The loss trains the needle block to the top: a toy whose embeddings
    # and queries learn, many look-alike tokens (a vocabulary of 40).
    ws2 = rng.integers(1, 40, 3000)
    kept2 = np.sort(rng.choice(3000, 300, replace=False))
    needles2 = [1000, 2500, 333, 2995]  # the last in a partial block at 16 and 32
    toyc2 = _ToyWhole([(ws2, kept2, needles2, np.array([2]))], W)
    rec2 = WholeRecord(toyc2, 0, dev)
    toy2 = _ToyKeys(48, R=R, seed=2)
    q2 = torch.randn(2, 4, 2, 8, requires_grad=True)
    opt = torch.optim.Adam([toy2.E, q2], lr=0.05)
    first = None
    for it in range(80):
        mu2, _ = whole_block_means(toy2, rec2, 8)
        loss, rank, _, _ = whole_meank_loss(toy2, q2, rec2, mu2, hard=4)
        first = loss.item() if first is None else first
        if int(rank.max()) == 0 and loss.item() < 0.5 * first:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    check("whole: the loss brings each needle block to rank 0 among all the blocks",
          int(rank.max()) == 0 and loss.item() < first and rank.numel() == 3,
          f"{rec2.nb} blocks, loss {first:.2f} -> {loss.item():.2f} in {it} steps, ranks "
          f"{rank.tolist()}; the needle in the last partial block left out")
    # ranks: the blocks scored above the needle's, counted directly
    with torch.no_grad():
        _, rank, _, lrank = whole_meank_loss(toy, q, rec, mu, hard=0, grad=False)
        p = meank_shares(q, mu)
        want = [int((p[m] > p[m, needles[m] // MEANK_BLOCK]).sum()) for m in range(3)]
    check("whole: a needle's rank is the count of blocks scored above it",
          rank.tolist() == want and max(want) > 0, f"{want}")

    # Lines: needle_line_blocks on a toy row (newline 9), then line targets
    # on the synthetic record: the line's rank is its worst block's, the
    # windows run again own every block of each line, the loss their mean.
    row = np.array([9, 1, 2, 3, 4, 9, 5, 6, 7, 8, 9, 1, 1, 1, 1, 1, 1, 1, 9])
    got = needle_line_blocks(row, [3, 8, 14], 9) * MEANK_BLOCK
    check("whole: a needle's line is the blocks from its newline to its own",
          got.tolist() == [[0, 0], [0, 0], [0, (18 // MEANK_BLOCK) * MEANK_BLOCK]] and
          needle_line_blocks(row, [3], None).tolist() == [[0, 0]], f"{got.tolist()}")
    rec.line_np = np.stack([rec.line_np[:, 0] - 1, rec.line_np[:, 1]], 1)  # lines of 2 blocks
    rec.line_blk = torch.from_numpy(rec.line_np).to(dev)
    toy.E.grad = None
    loss_l, rank_l, wins_l, lrank = whole_meank_loss(toy, q, rec, mu, hard=2, line=True)
    with torch.no_grad():
        p = meank_shares(q, mu)
        worst = torch.stack([p[m, rec.line_np[m]].min() for m in range(3)])
        want_l = [int((p[m] > worst[m]).sum()) for m in range(3)]
        p[torch.arange(3)[:, None], torch.from_numpy(rec.line_np)] = -1
        sel = np.unique(np.concatenate([rec.line_np.reshape(-1),
                                        p.topk(2, dim=1).indices.reshape(-1).numpy()]))
        want_loss = -torch.log(meank_shares(q, mu).gather(1, torch.from_numpy(rec.line_np))).mean()
    check("whole: line targets: the worst block's rank, every line block's window, their mean loss",
          rank_l.tolist() == want_l == lrank.tolist() and
          list(wins_l) == list(np.unique(rec.block_win_np[sel])) and
          abs(loss_l.item() - want_loss.item()) < 1e-4,
          f"ranks {want_l}, windows {list(wins_l)}")


# ---- model ------------------------------------------------------------------
def build_model(args, vocab, window, c):
    try:
        import transformers
        from transformers import Qwen3Config, Qwen3ForCausalLM
    except ImportError as e:
        die(f"transformers with Qwen3 is needed: {e}")
    common = dict(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
        max_position_embeddings=window, rms_norm_eps=1e-6, tie_word_embeddings=True,
        attention_bias=False, attention_dropout=0.0, initializer_range=0.02,
        bos_token_id=c.bos, eos_token_id=c.end, pad_token_id=c.pad, use_cache=False)
    cfg = None
    # transformers 5 takes rope_parameters; 4 takes rope_theta (and would keep
    # an unknown rope_parameters silently), so check what was understood.
    for kw in ({"rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta}},
               {"rope_theta": args.rope_theta}):
        try:
            cand = Qwen3Config(**kw, **common)
        except TypeError:
            continue
        if effective_theta(cand) == args.rope_theta:
            cfg = cand
            break
    if cfg is None:
        die(f"this transformers ({transformers.__version__}) did not take rope theta {args.rope_theta}")
    model = None
    for how in ("from_config", "attr"):
        try:
            if how == "from_config":
                model = Qwen3ForCausalLM._from_config(cfg, attn_implementation=args.attn)
            else:
                cfg._attn_implementation = args.attn
                model = Qwen3ForCausalLM(cfg)
            break
        except Exception as e:  # noqa: BLE001 - report and try the other way
            log(f"model: building with {how} failed ({e}); trying another way")
    if model is None:
        die("could not build Qwen3ForCausalLM")
    return model, transformers.__version__


def init_from(model, path, flag="--init"):
    """Start from a trained model's weights (a directory train.py exported:
    config.json + model.safetensors), for fine-tuning (--init) or as the
    teacher (--teacher); its shape must be the one the flags build."""
    from transformers import Qwen3ForCausalLM
    try:
        src = Qwen3ForCausalLM.from_pretrained(path)  # copied into the fp32 parameters below
    except Exception as e:  # noqa: BLE001 - say which directory and why
        die(f"{flag} {path}: cannot load a Qwen3 model: {e}")
    want, have = model.state_dict(), src.state_dict()
    bad = [k for k in want if k not in have or have[k].shape != want[k].shape]
    if bad:
        die(f"{flag} {path}: not the model these flags build ({len(bad)} tensors differ, "
            f"first {bad[0]}): pass its --layers/--hidden/... ")
    model.load_state_dict({k: have[k] for k in want})
    log(f"model: weights from {path} ({len(want)} tensors){'' if flag == '--init' else ', ' + flag}")


def effective_theta(cfg):
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        if "rope_theta" in rp:
            return float(rp["rope_theta"])
        for v in rp.values():  # per layer type
            if isinstance(v, dict) and "rope_theta" in v:
                return float(v["rope_theta"])
    theta = getattr(cfg, "rope_theta", None)
    return float(theta) if theta is not None else None


def count_params(model):
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


# ---- training ---------------------------------------------------------------
def lr_at(args, step, progress):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(1.0, max(0.0, progress))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def lm_answer_losses(logits, x, c):
    """The mean cross-entropy of logits [B, T-1, V] against x[:, 1:] over the
    non-pad targets and over the answer tokens, and the answer mask."""
    tgt = x[:, 1:]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                         reduction="none").view(tgt.shape)
    lm = tgt != c.pad
    ans = answer_mask(x, c)
    lm_loss = (ce * lm).sum() / lm.sum().clamp(min=1)
    ans_loss = (ce * ans).sum() / ans.sum().clamp(min=1)
    return lm_loss, ans_loss, ans


def distill_kl(logits, teacher_logits, x, pad):
    """KL(teacher || student) of each next-token distribution, averaged over
    the non-pad targets of x (logits [B, T-1, V] for x[:, 1:]): what keeps a
    fine-tuned model reading as the model it started from (--teacher)."""
    lp = F.log_softmax(logits.float(), dim=-1)
    lt = F.log_softmax(teacher_logits.float(), dim=-1)
    kl = (lt.exp() * (lt - lp)).sum(-1)
    m = (x[:, 1:] != pad).to(kl.dtype)
    return (kl * m).sum() / m.sum().clamp(min=1)


def distill_self_test(check):
    """distill_kl: 0 for the teacher's own logits, above 0 otherwise, blind to
    pad targets, and its gradient reaches the student's logits."""
    torch.manual_seed(5)
    pad = 0
    x = torch.randint(1, 50, (2, 9))
    x[1, 6:] = pad
    t = torch.randn(2, 8, 50)
    s = (t + 0.5 * torch.randn(2, 8, 50)).requires_grad_(True)
    same = distill_kl(t, t, x, pad).item()
    kl = distill_kl(s, t, x, pad)
    kl.backward()
    check("teacher KL: 0 for the teacher's own logits, above 0 for others",
          abs(same) < 1e-6 and kl.item() > 0, f"{same:.1e}, {kl.item():.3f}")
    s2 = s.detach().clone()
    s2[1, 5:] += 3.0 * torch.randn(3, 50)  # targets x[1, 6:] are pad
    check("teacher KL: pad targets do not count",
          abs(distill_kl(s2, t, x, pad).item() - kl.item()) < 1e-6)
    check("teacher KL: the gradient reaches the student's logits, not the pad rows",
          s.grad is not None and s.grad[0].abs().sum().item() > 0 and
          s.grad[1, 5:].abs().sum().item() == 0)


def losses(model, x, c, answer_weight, meank=None):
    """Mean CE over non-pad targets, mean CE over answer targets, their sum,
    and what accuracy needs. meank: (weight, the model's modules, RoPE-mean
    coefficients) adds the Mean-K loss; it is then returned last, with its
    hit rate, as (loss, hit, questions) or None."""
    inp = x[:, :-1]
    if meank is not None:
        out = model(input_ids=inp, use_cache=False, output_hidden_states=True)
        logits = out.logits
    else:
        logits = model(input_ids=inp, use_cache=False).logits
    lm_loss, ans_loss, ans = lm_answer_losses(logits, x, c)
    total = lm_loss + answer_weight * ans_loss
    if meank is None:
        return total, lm_loss, ans_loss, logits, ans
    weight, base, rope_cs = meank
    mk = None
    if not MEANK_BROKEN:
        try:
            mk = meank_loss(base, out.hidden_states, inp, c, rope_cs)
        except Exception as e:  # noqa: BLE001 - one run on the GPU: train on without it
            MEANK_BROKEN.append(f"{type(e).__name__}: {e}")
            log(f"meank loss: failed ({MEANK_BROKEN[0]}); off for the rest of the run")
    if mk is not None and weight > 0:
        total = total + weight * mk[0]
    return total, lm_loss, ans_loss, logits, ans, mk


@torch.no_grad()
def evaluate(model, data, c, batch, device, amp, rope_cs=None):
    """Loss and exact match of every question: all its answer tokens (the
    value and <end>) are the argmax given the true prefix — exactly when
    greedy decoding would produce the answer. With rope_cs, also how often
    Mean-K ranks the needle block first (inside the sequence's window)."""
    model.eval()
    n_q = n_ok = 0
    lm_sum = ans_sum = 0.0
    n_batches = 0
    mk_n, mk_hit, mk_loss = 0, 0.0, 0.0
    for s in range(0, data.shape[0], batch):
        x = data[s:s + batch].long()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            r = losses(model, x, c, 1.0, None if rope_cs is None else (0.0, model, rope_cs))
        _, lm_loss, ans_loss, logits, ans = r[:5]
        if rope_cs is not None and r[5] is not None:
            mk_n += r[5][2]
            mk_hit += r[5][1].item() * r[5][2]
            mk_loss += r[5][0].item() * r[5][2]
        nq, nok = exact_counts(logits, x, ans, c)
        n_q += nq
        n_ok += nok
        lm_sum += lm_loss.item()
        ans_sum += ans_loss.item()
        n_batches += 1
    model.train()
    r = {"questions": n_q, "accuracy": n_ok / max(1, n_q),
         "lm_loss": lm_sum / max(1, n_batches), "answer_loss": ans_sum / max(1, n_batches)}
    if rope_cs is not None:
        r["meank_questions"] = mk_n
        r["meank_top1"] = mk_hit / max(1, mk_n)
        r["meank_loss"] = mk_loss / max(1, mk_n)
    return r


@torch.no_grad()
def evaluate_paged(model, corpus, c, args, device, amp, limit):
    """Exact match of the questions of (at most `limit`) paged sequences of
    a held-out corpus, read from pages as kvmem makes them, beside the same
    questions read from the view computed afresh (the ordinary path)."""
    model.eval()
    n = min(limit, corpus.n_paged)
    n_q = n_ok = fq = fok = 0
    ans_sum, nb = 0.0, 0
    for s in range(0, n, args.paged_batch):
        ks = list(range(s, min(n, s + args.paged_batch)))
        pb = PagedBatch(corpus, ks, c.pad, device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            _, _, ans_loss, logits, ans = paged_losses(model, pb, c, 1.0, args.head_dim,
                                                       args.rope_theta, args.paged_chunk)
            q, ok = exact_counts(logits, pb.q, ans, c)
            x = torch.from_numpy(np.asarray(corpus.ids[corpus.paged_seqs[ks]]).astype(np.int64)).to(device)
            _, _, _, flog, fans = losses(model, x, c, 1.0)
            a, b = exact_counts(flog, x, fans, c)
        n_q, n_ok, fq, fok = n_q + q, n_ok + ok, fq + a, fok + b
        ans_sum += ans_loss.item()
        nb += 1
    model.train()
    return {"sequences": n, "questions": n_q, "accuracy": n_ok / max(1, n_q),
            "answer_loss": ans_sum / max(1, nb), "fresh_questions": fq,
            "fresh_accuracy": fok / max(1, fq)}


def safe_evaluate_paged(model, corpus, c, args, device, amp, limit):
    """evaluate_paged, or None (and the paged path off) when it fails."""
    return safe_evaluation(evaluate_paged, PAGED_BROKEN, "paged", model, corpus, c, args,
                           device, amp, limit)


def paged_eval_line(name, r):
    return (f"{name}-paged: acc {100 * r['accuracy']:.1f}% of {r['questions']} from pages "
            f"(answer {r['answer_loss']:.3f}), {100 * r['fresh_accuracy']:.1f}% of "
            f"{r['fresh_questions']} from the same views afresh")


def eval_line(name, r):
    mk = (f", meank top-1 {100 * r['meank_top1']:.1f}% of {r['meank_questions']}"
          if "meank_top1" in r else "")
    return (f"{name}: acc {100 * r['accuracy']:.1f}% of {r['questions']} "
            f"(lm {r['lm_loss']:.3f}, answer {r['answer_loss']:.3f}{mk})")


def load_vocab(path):
    if not path:
        return None
    pieces = {}
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                i, piece, glue = line.rstrip("\n").split("\t")[:3]
                pieces[int(i)] = ("\n" if piece == "\\n" else piece, glue == "1")
    except (OSError, ValueError) as e:
        log(f"vocab {path}: not used ({e})")
        return None
    return pieces


def decode(pieces, ids):
    out, start = [], True
    for i in ids:
        p, glue = pieces.get(int(i), (f"<{int(i)}>", False))
        if not (start or glue or p == "\n"):
            out.append(" ")
        out.append(p)
        start = p == "\n"
    return "".join(out)


@torch.no_grad()
def show_examples(model, data, c, pieces, device, amp, n=4):
    """The last questions of one held-out sequence: the expected answer and
    the model's argmax at each answer position (given the true prefix)."""
    x = data[:1].long()
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(input_ids=x[:, :-1], use_cache=False).logits
    pred = logits.argmax(-1)[0].tolist()
    row = x[0].tolist()
    for q0 in [i for i, t in enumerate(row) if t == c.q][-n:]:
        m = q0
        while m < len(row) and row[m] != c.a:
            m += 1
        e = m
        while e < len(row) and row[e] != c.end:
            e += 1
        if e >= len(row):
            continue
        q, want, got = row[q0:m + 1], row[m + 1:e + 1], pred[m:e]
        if pieces:
            log(f"  {decode(pieces, q)} {decode(pieces, want)}   model: {decode(pieces, got)}")
        else:
            log(f"  q {q} want {want} model {got}")


def fix_config(out_dir, args, vocab_hash):
    """Top-level rope_theta too (transformers 5 keeps it in rope_parameters),
    and the vocabulary hash kvmem checks before using the model."""
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    if "rope_theta" not in cfg:
        cfg["rope_theta"] = float(args.rope_theta)
    cfg["kvmem_vocab_hash"] = f"{vocab_hash:08x}"
    with open(path + ".tmp", "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)


def export(model, out_dir, args, c, dtype):
    os.makedirs(out_dir, exist_ok=True)
    m = model.to(dtype)
    try:
        m.generation_config.bos_token_id = c.bos
        m.generation_config.eos_token_id = [c.end, c.eos]
        m.generation_config.pad_token_id = c.pad
    except AttributeError:
        pass
    try:
        m.save_pretrained(out_dir, safe_serialization=True)
    except TypeError:  # a transformers that writes safetensors only, without the flag
        m.save_pretrained(out_dir)
    fix_config(out_dir, args, c.vocab_hash)
    files = sorted(os.listdir(out_dir))
    if "model.safetensors" not in files or "config.json" not in files:
        die(f"{out_dir}: save_pretrained wrote {files}, expected model.safetensors and config.json")
    return files


def check_export(model, out_dir, batch, c, device):
    """Reload the export and compare logits with the model in memory."""
    from transformers import Qwen3ForCausalLM
    again = Qwen3ForCausalLM.from_pretrained(out_dir)
    again.to(device=device, dtype=next(model.parameters()).dtype).eval()
    model.eval()
    with torch.no_grad():
        a = model(input_ids=batch[:, :-1], use_cache=False).logits.float()
        b = again(input_ids=batch[:, :-1], use_cache=False).logits.float()
    diff = (a - b).abs().max().item()
    same = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    return diff, same


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--data", help="training corpus (kvmem synth corpus)")
    ap.add_argument("--eval", action="append", default=[], metavar="NAME=FILE",
                    help="held-out corpus, repeatable (e.g. stream=eval_stream.bin)")
    ap.add_argument("--out", help="model directory to write")
    ap.add_argument("--record", help="record JSON path (default: OUT/record.json)")
    ap.add_argument("--vocab", help="`kvmem synth vocab` output, to print examples as text")
    ap.add_argument("--minutes", type=float, default=6.5, help="wall-clock budget of the loop")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: time only)")
    ap.add_argument("--smoke", action="store_true",
                    help="a 30-second run through every stage, to validate the pipeline")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--batch", type=int, default=64, help="sequences per step at full length")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--answer-weight", type=float, default=1.0,
                    help="loss = mean CE of all tokens + this * mean CE of answer tokens")
    ap.add_argument("--teacher", metavar="DIR",
                    help="a frozen exported model (e.g. models/agentlang) whose next-token "
                         "distributions the regular batches are pulled towards "
                         "(--teacher-weight): reading kept while other losses move the model")
    ap.add_argument("--teacher-weight", type=float, default=0.0,
                    help="weight of KL(teacher || model) over the regular batches' targets "
                         "(0: off)")
    ap.add_argument("--meank-weight", type=float, default=0.0,
                    help="weight of the Mean-K loss: -log of the needle block's mean share as "
                         "kvmem's meank scores it (0: off; the evaluations still report "
                         "meank's top-1 when set)")
    ap.add_argument("--meank-block", type=int, choices=(16, 32), default=32,
                    help="tokens a block for every Mean-K loss and evaluation: kvmem's --block "
                         "(32, its default; 16 halves the lines a block's mean key averages)")
    ap.add_argument("--meank-span", type=int, default=0,
                    help="distances the Mean-K query's RoPE is averaged over (0: seq_len - 32, "
                         "kvmem bench recall's budget + reserve)")
    ap.add_argument("--paged-batch", type=int, default=8,
                    help="paged view sequences per step (corpus version 3 with --paged): their "
                         "view's K/V computed as kvmem makes them, the questions trained over them")
    ap.add_argument("--paged-weight", type=float, default=1.0,
                    help="weight of the paged sequences' loss (their LM and answer terms)")
    ap.add_argument("--paged-from", type=float, default=-1.0,
                    help="share of the budget after which paged batches start (-1: the "
                         "curriculum's end)")
    ap.add_argument("--paged-chunk", type=int, default=64,
                    help="page windows per no-grad forward")
    ap.add_argument("--paged-eval", type=int, default=256,
                    help="paged sequences of each held-out corpus read from pages at the end "
                         "(a quarter of them at the periodic evaluations)")
    ap.add_argument("--meank-whole-weight", type=float, default=0.0,
                    help="weight of the Mean-K loss over a whole workspace's blocks (corpus "
                         "version 4 with --paged-whole): -log of the needle block's mean share "
                         "among all the workspace's blocks (0: off; held-out whole records are "
                         "still ranked at each evaluation)")
    ap.add_argument("--meank-whole-batch", type=int, default=2,
                    help="whole records a step for that loss (each: a no-grad forward of every "
                         "window of its workspace)")
    ap.add_argument("--meank-whole-hard", type=int, default=4,
                    help="per question, the best-scored other blocks whose windows run again "
                         "with gradients, beside the needle block's (0: gradients through the "
                         "query only)")
    ap.add_argument("--whole-query", choices=("view", "blind"), default="view",
                    help="the questions' Mean-K queries of the whole-workspace loss: read over "
                         "the record's view (view: lexical's, which holds each needle), or with "
                         "the needles' view blocks hidden (blind: as kvmem's meank reads its "
                         "query over the view before it selects); held-out records are ranked "
                         "both ways")
    ap.add_argument("--whole-target", choices=("equals", "line"), default="equals",
                    help="the whole-workspace loss's target blocks: the needle's '=' block "
                         "(equals), or every block of the needle's line (line: kvmem bench "
                         "recall counts a needle in view only when all of them are); held-out "
                         "records are ranked by whole lines either way")
    ap.add_argument("--meank-budget", type=int, default=0,
                    help="blocks meank may pick besides the sink and recent tokens, for the "
                         "'in budget' rate (0: kvmem bench recall's for the window: budget "
                         "L - 32 - L/8 less sink budget/100 and recent budget/12, in blocks)")
    ap.add_argument("--meank-whole-eval", type=int, default=64,
                    help="whole records of each held-out corpus ranked at the end (a quarter at "
                         "the periodic evaluations)")
    ap.add_argument("--kv-fp8", type=float, default=0.0, metavar="P",
                    help="share of the training steps whose attention reads each layer's raw K "
                         "(after k-norm, before RoPE) and V through kvmem's fp8 round trip (e4m3, a "
                         "power-of-two scale per token and KV head; straight-through gradients), "
                         "drawn step by step; held-out corpora are then evaluated both ways "
                         "(NAME and NAME-fp8). 0: off")
    ap.add_argument("--kv-fp8-eval", action="store_true",
                    help="evaluate the held-out corpora with fp8 K/V too (NAME-fp8) whatever "
                         "--kv-fp8 is: a control run's gap")
    ap.add_argument("--self-test", action="store_true",
                    help="check the paged path's parts (re-rotation, cache assembly, masks and "
                         "positions; with transformers, a tiny model's logits from pages against "
                         "a plain forward) and exit")
    ap.add_argument("--curriculum", type=float, default=0.15,
                    help="share of the budget trained on the first quarter of each sequence")
    ap.add_argument("--eval-every", type=float, default=45.0, help="seconds between evaluations")
    ap.add_argument("--eval-seqs", type=int, default=256, help="sequences per eval corpus (periodic)")
    ap.add_argument("--final-eval-seqs", type=int, default=1024)
    ap.add_argument("--compile", choices=["on", "off"], default="on",
                    help="torch.compile the model with static shapes (falls back to eager on "
                         "any error)")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="exported weights")
    ap.add_argument("--seed", type=int, default=1234, help="torch seed (init, batch order)")
    ap.add_argument("--init", metavar="DIR",
                    help="start from this exported model's weights (fine-tuning) instead of random ones")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    if not args.self_test and (not args.data or not args.out):
        ap.error("--data and --out are needed (or --self-test)")
    if not 0.0 <= args.kv_fp8 <= 1.0:
        ap.error(f"--kv-fp8 {args.kv_fp8:g}: a share of the steps, 0 to 1")
    if args.teacher_weight < 0 or (args.teacher_weight > 0) != bool(args.teacher):
        ap.error("--teacher DIR and a --teacher-weight above 0 go together")
    if args.smoke:
        args.minutes = min(args.minutes, 0.5)
        args.eval_every = 10.0
        args.eval_seqs = min(args.eval_seqs, 32)
        args.final_eval_seqs = min(args.final_eval_seqs, 64)
        args.warmup = min(args.warmup, 20)
        args.paged_eval = min(args.paged_eval, 32)
        args.meank_whole_eval = min(args.meank_whole_eval, 8)
    return args


def bench_budget_blocks(L):
    """The blocks kvmem bench recall's meank may choose in a window of L:
    its budget (L - 32 - L/8, whole blocks) less the planner's sink
    (budget / 100) and recent tokens (budget / 12)."""
    budget = (L - 32 - L // 8) // MEANK_BLOCK * MEANK_BLOCK
    return max(1, (budget - max(1, budget // 100) - max(1, budget // 12)) // MEANK_BLOCK)


def main(argv):
    global MEANK_BLOCK
    args = parse_args(argv)
    MEANK_BLOCK = args.meank_block
    if args.self_test:
        return self_test(args.data)
    t_start = time.time()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        die("CUDA is not available (use --device cpu to try this script without a GPU)")
    amp = device.type == "cuda" or os.environ.get("KVMEM_TRAIN_CPU_AMP") == "1"
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    c = Corpus(args.data)
    evals = []
    for spec in args.eval:
        name, _, path = spec.rpartition("=")
        e = Corpus(path)
        if (e.vocab, e.seq_len, e.vocab_hash) != (c.vocab, c.seq_len, c.vocab_hash):
            die(f"{path}: vocab/seq_len/vocab hash differ from {args.data}")
        evals.append((name or os.path.basename(path), e))
    L = c.seq_len
    log(f"data: {args.data}: {c.n_seqs} sequences x {L} tokens = {c.tokens / 1e6:.1f}M tokens, "
        f"seed {c.seed}, views {c.view_permille / 10:.0f}% "
        f"(by {c.view_policy or 'the generator mix'}, up to {c.max_ratio}x, "
        f"stale {c.stale_permille / 1000:g}, drop {c.drop_permille / 1000:g}), "
        f"vocab {c.vocab} (hash {c.vocab_hash:08x})")
    paged = c.n_paged > 0 and args.paged_batch > 0
    if c.n_paged:
        log(f"data: {c.n_paged} paged view sequences ({c.paged_permille / 10:g}% of the policy's "
            f"views of workspaces past the window), page windows of {c.window} tokens"
            f"{'' if paged else '; not used (--paged-batch 0)'}")
    whole = c.n_whole > 0 and args.meank_whole_weight > 0 and args.meank_whole_batch > 0
    if c.n_whole or args.meank_whole_weight > 0:
        log(f"data: {c.n_whole} whole paged sequences ({c.whole_permille / 10:g}% of the paged "
            f"ones of workspaces of {c.whole_min_ratio}x and more): their windows tile the "
            f"workspace{'' if whole else '; the whole-workspace Mean-K loss is off'}")
    if not args.meank_budget:
        args.meank_budget = bench_budget_blocks(L)
    t0 = time.time()
    data = c.to_device(device)
    eval_data = [(n, e.to_device(device, args.final_eval_seqs)) for n, e in evals]
    log(f"data: on {device} in {time.time() - t0:.1f} s")

    model, tf_version = build_model(args, c.vocab, L, c)
    if args.init:
        init_from(model, args.init)
    model.to(device)
    teacher = None
    if args.teacher_weight > 0:
        teacher, _ = build_model(args, c.vocab, L, c)
        init_from(teacher, args.teacher, "--teacher")
        teacher.to(device).eval().requires_grad_(False)
        log(f"teacher: KL to {args.teacher}'s next-token distributions on the regular "
            f"batches, weight {args.teacher_weight:g}")
    n_params = count_params(model)
    log(f"model: Qwen3 {args.layers} layers, hidden {args.hidden}, {args.heads} heads / "
        f"{args.kv_heads} KV heads x {args.head_dim}, mlp {args.intermediate}, window {L}, "
        f"rope theta {args.rope_theta:g}, {n_params / 1e6:.2f}M parameters, "
        f"attention {getattr(model.config, '_attn_implementation', '?')}, "
        f"torch {torch.__version__}, transformers {tf_version}")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt_kw = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    if device.type == "cuda":
        opt_kw["fused"] = True
    try:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], **opt_kw)
    except (TypeError, RuntimeError):
        opt_kw.pop("fused", None)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], **opt_kw)

    # fp8 K/V (--kv-fp8): the hooks go in before torch.compile and stay; each
    # step sets kvq.on (the compiled step guards on it: one graph a state).
    kvq = None
    if args.kv_fp8 > 0 or args.kv_fp8_eval:
        try:
            kvq = KVFP8(model, args.head_dim)
        except ValueError as e:
            die(f"--kv-fp8: {e}")
        log(f"fp8: raw K and V of {kvq.layers} layers through e4m3 (a scale a token and KV "
            f"head) on {100 * args.kv_fp8:g}% of the steps; held-out corpora evaluated both ways")
    fp8_rng = np.random.default_rng(args.seed + 27)
    fp8_steps = 0
    fwd = model  # what the training step runs: the model, or its compiled twin
    if args.compile == "on" and hasattr(torch, "compile") and device.type == "cuda":
        try:
            # Static shapes: the curriculum has two, each compiled once.
            fwd = torch.compile(model, dynamic=False)
        except Exception as e:  # noqa: BLE001
            log(f"compile: not used ({e})")

    rope_cs = None
    if args.meank_weight > 0:
        rope_cs = rope_mean_coeffs(args.head_dim, args.rope_theta,
                                   args.meank_span or L - 32, device)
    mk_avg = [None, None]  # smoothed Mean-K loss and top-1 of the training batches
    tkl = [None]  # the last regular batch's KL to the teacher
    rope_cs_w = None  # the whole-workspace Mean-K's (training and held-out ranks)
    if whole or any(e.n_whole for _, e in evals):
        rope_cs_w = rope_mean_coeffs(args.head_dim, args.rope_theta,
                                     args.meank_span or L - 32, device)
    wst = {"steps": 0, "seqs": 0, "questions": 0, "top1": 0, "in_budget": 0, "windows": 0,
           "window_tokens": 0, "grad_windows": 0, "seconds": 0.0, "loss": None}
    wperm, wperm_at = np.random.default_rng(args.seed + 1).permutation(c.whole_ks), 0

    def train_step(x):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            r = losses(fwd, x, c, args.answer_weight,
                       None if rope_cs is None else (args.meank_weight, model, rope_cs))
            loss, lm_loss, ans_loss = r[0], r[1], r[2]
            if teacher is not None:
                with torch.no_grad():
                    tl = teacher(input_ids=x[:, :-1], use_cache=False).logits
                kl = distill_kl(r[3], tl, x, c.pad)
                tkl[0] = kl.detach()
                loss = loss + args.teacher_weight * kl
        loss.backward()
        if rope_cs is not None and r[5] is not None:
            mk_avg[0], mk_avg[1] = r[5][0].detach(), r[5][1].detach()
        return loss.detach(), lm_loss.detach(), ans_loss.detach()

    shapes_ok = set()

    budget = args.minutes * 60.0
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    # Paged sequences train on the paged path only: the regular batches draw
    # from the others.
    if paged:
        pool = torch.from_numpy(np.setdiff1d(np.arange(c.n_seqs), c.paged_seqs)).to(device)
    else:
        pool = torch.arange(c.n_seqs, device=device)
    n_pool = pool.numel()
    new_perm = lambda: pool[torch.randperm(n_pool, device=device, generator=gen)]
    perm, perm_at, epochs = new_perm(), 0, 0
    prng = np.random.default_rng(args.seed)
    pperm, pperm_at, pepochs = prng.permutation(c.n_paged), 0, 0
    paged_from = args.curriculum if args.paged_from < 0 else args.paged_from
    pst = {"steps": 0, "seqs": 0, "windows": 0, "window_tokens": 0, "q_tokens": 0,
           "seconds": 0.0, "loss": None, "answer": None}
    step, seen_tokens = 0, 0
    last_eval = last_log = time.time()
    t_loop = time.time()
    history = []
    log(f"train: budget {args.minutes:g} min{f', {args.steps} steps' if args.steps else ''}, "
        f"batch {args.batch} x {L}, lr {args.lr:g} (warmup {args.warmup}, cosine to "
        f"{args.min_lr_frac:g}x), curriculum {args.curriculum:g} at {L // 4}, "
        f"answer weight {args.answer_weight:g}, compile {'on' if fwd is not model else 'off'}")
    loss_avg = lm_avg = ans_avg = None

    def fp8_on(fn):
        """fn() with the attention reading fp8 K/V."""
        kvq.on = True
        try:
            return fn()
        finally:
            kvq.on = False

    def run_evals(step):
        line = [f"eval @ step {step}:"]
        rec = {"step": step, "seconds": round(time.time() - t_loop, 1)}
        for (name, d), (_, e) in zip(eval_data, evals):
            ev = lambda: evaluate(model, d[:args.eval_seqs], c, max(1, args.batch // 2), device,
                                  amp, rope_cs)
            r = ev()
            line.append(eval_line(name, r))
            rec[name] = r
            if kvq is not None:
                r = fp8_on(ev)
                line.append(eval_line(name + "-fp8", r))
                rec[name + "-fp8"] = r
            if e.n_paged and args.paged_batch > 0 and not PAGED_BROKEN:
                evp = lambda: safe_evaluate_paged(model, e, c, args, device, amp,
                                                  max(1, args.paged_eval // 4))
                for tag, r in ((name, evp()), (name + "-fp8", fp8_on(evp) if kvq else None)):
                    if r is not None:
                        line.append(paged_eval_line(tag, r))
                        rec[tag + "-paged"] = r
            if e.n_whole and rope_cs_w is not None and not WHOLE_BROKEN:
                r = safe_evaluate_whole(model, e, c, args, device, amp, rope_cs_w,
                                        max(1, args.meank_whole_eval // 4))
                if r is not None:
                    line.append(whole_eval_line(name, r))
                    rec[name + "-whole"] = r
        history.append(rec)
        log("  ".join(line))

    # A fine-tune for fp8 starts with where the model stands, both ways.
    if evals and kvq is not None and args.init:
        run_evals(0)
        last_eval = time.time()
    while True:
        elapsed = time.time() - t_loop
        progress = max(elapsed / budget, step / args.steps if args.steps else 0.0)
        if progress >= 1.0:
            break
        cur = L // 4 if progress < args.curriculum else L
        nseq = args.batch * (L // cur)
        if perm_at + nseq > n_pool:
            perm, perm_at, epochs = new_perm(), 0, epochs + 1
            if nseq > n_pool:
                nseq = n_pool
        x = data[perm[perm_at:perm_at + nseq]][:, :cur].long()
        perm_at += nseq
        lr = lr_at(args, step, progress)
        for g in opt.param_groups:
            g["lr"] = lr
        if kvq is not None:
            # the whole step (its paged and whole batches too) reads fp8 K/V, or none of it
            kvq.on = args.kv_fp8 > 0 and fp8_rng.random() < args.kv_fp8
            fp8_steps += kvq.on
        # a compiled graph per shape and fp8 state
        shape = (tuple(x.shape), kvq is not None and kvq.on)
        try:
            loss, lm_loss, ans_loss = train_step(x)
        except Exception as e:  # noqa: BLE001 - a compile failure must not end the run
            if fwd is model or shape in shapes_ok:
                raise
            log(f"compile: failed on shape {tuple(x.shape)} ({type(e).__name__}: {e}); eager from now on")
            opt.zero_grad(set_to_none=True)
            fwd = model
            loss, lm_loss, ans_loss = train_step(x)
        shapes_ok.add(shape)
        if paged and progress >= paged_from:
            try:
                if pperm_at + args.paged_batch > c.n_paged:
                    pperm, pperm_at, pepochs = prng.permutation(c.n_paged), 0, pepochs + 1
                ks = pperm[pperm_at:pperm_at + args.paged_batch]
                pperm_at += len(ks)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                tp = time.time()
                pb = PagedBatch(c, ks, c.pad, device)
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
                    pl, _, pa, _, _ = paged_losses(model, pb, c, args.answer_weight, args.head_dim,
                                                   args.rope_theta, args.paged_chunk)
                (args.paged_weight * pl).backward()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                pst["seconds"] += time.time() - tp
                pst["steps"] += 1
                pst["seqs"] += pb.P
                pst["windows"] += pb.n_windows
                pst["window_tokens"] += pb.window_tokens
                pst["q_tokens"] += int((pb.q != c.pad).sum().item())
                pst["loss"], pst["answer"] = pl.detach(), pa.detach()
            except Exception as e:  # noqa: BLE001 - one bounded run: train on without it
                PAGED_BROKEN.append(f"step {step}: {type(e).__name__}: {e}")
                log(f"paged: failed ({PAGED_BROKEN[0]}); off for the rest of the run, "
                    f"this step's gradients dropped")
                paged = False
                opt.zero_grad(set_to_none=True)
                continue
        if whole and progress >= paged_from:
            try:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                tw = time.time()
                losses_w = []
                for _ in range(args.meank_whole_batch):
                    if wperm_at >= len(wperm):
                        wperm, wperm_at = np.random.default_rng(args.seed + step).permutation(
                            c.whole_ks), 0
                    k = int(wperm[wperm_at])
                    wperm_at += 1
                    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
                        out = whole_step(model, c, k, c, args, device, rope_cs_w)
                    if out is None:
                        continue
                    wl, rank, nb, nw, ngw, _, _, _ = out
                    (args.meank_whole_weight * wl / args.meank_whole_batch).backward()
                    losses_w.append(wl.detach())
                    wst["seqs"] += 1
                    wst["questions"] += rank.numel()
                    wst["top1"] += int((rank == 0).sum().item())
                    wst["in_budget"] += int((rank < args.meank_budget).sum().item())
                    wst["windows"] += nw
                    wst["window_tokens"] += nw * c.window
                    wst["grad_windows"] += ngw
                if device.type == "cuda":
                    torch.cuda.synchronize()
                wst["seconds"] += time.time() - tw
                wst["steps"] += 1
                if losses_w:
                    wst["loss"] = torch.stack(losses_w).mean()
            except Exception as e:  # noqa: BLE001 - one bounded run: train on without it
                WHOLE_BROKEN.append(f"step {step}: {type(e).__name__}: {e}")
                log(f"meank-whole: failed ({WHOLE_BROKEN[0]}); off for the rest of the run, "
                    f"this step's gradients dropped")
                whole = False
                opt.zero_grad(set_to_none=True)
                continue
        if kvq is not None:
            kvq.on = False
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        seen_tokens += x.numel()
        if step <= 3 or (step % 25 == 0 and time.time() - last_log >= 5.0):
            last_log = time.time()
            lv, lmv, av = loss.item(), lm_loss.item(), ans_loss.item()
            if not math.isfinite(lv):
                die(f"loss is {lv} at step {step}")
            k = 0.9 if loss_avg is not None else 0.0
            loss_avg = k * (loss_avg or 0) + (1 - k) * lv
            lm_avg = k * (lm_avg or 0) + (1 - k) * lmv
            ans_avg = k * (ans_avg or 0) + (1 - k) * av
            el = time.time() - t_loop
            mem = (f"  {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
                   if device.type == "cuda" and step <= 3 else "")
            mk = (f", meank {mk_avg[0].item():.3f} top-1 {100 * mk_avg[1].item():.0f}%"
                  if mk_avg[0] is not None else "")
            mk += f", teacher KL {tkl[0].item():.4f}" if tkl[0] is not None else ""
            log(f"step {step:5d}  {el:6.1f}s  len {cur}  lr {lr:.2e}  loss {lv:.3f} "
                f"(lm {lmv:.3f}, answer {av:.3f}{mk})  "
                f"{seen_tokens / max(el - pst['seconds'] - wst['seconds'], 1e-9) / 1e6:.2f}M tok/s{mem}")
            if wst["loss"] is not None:
                log(f"      meank-whole: loss {wst['loss'].item():.3f}, top-1 "
                    f"{100 * wst['top1'] / max(1, wst['questions']):.0f}%, in budget "
                    f"{100 * wst['in_budget'] / max(1, wst['questions']):.0f}% of "
                    f"{wst['questions']} questions in {wst['seqs']} workspaces, "
                    f"{wst['windows'] / max(1, wst['seqs']):.1f} windows "
                    f"({wst['grad_windows'] / max(1, wst['seqs']):.1f} with gradients) a workspace, "
                    f"{wst['window_tokens'] / max(wst['seconds'], 1e-9) / 1e6:.2f}M window tok/s, "
                    f"{100 * wst['seconds'] / max(el, 1e-9):.0f}% of the time")
            if pst["loss"] is not None:
                log(f"      paged: loss {pst['loss'].item():.3f} (answer {pst['answer'].item():.3f}), "
                    f"{pst['seqs']} sequences in {pst['steps']} steps, "
                    f"{pst['windows'] / max(1, pst['seqs']):.1f} windows a sequence, "
                    f"{pst['window_tokens'] / max(pst['seconds'], 1e-9) / 1e6:.2f}M window tok/s, "
                    f"{100 * pst['seconds'] / max(el, 1e-9):.0f}% of the time")
        if evals and time.time() - last_eval >= args.eval_every:
            run_evals(step)
            last_eval = time.time()
    train_s = time.time() - t_loop
    if kvq is not None:
        kvq.on = False
        log(f"train: {fp8_steps} of {step} steps read fp8 K/V")
    log(f"train: {step} steps, {seen_tokens / 1e6:.1f}M tokens ({epochs} full passes), "
        f"{train_s:.1f} s, {seen_tokens / max(train_s - pst['seconds'] - wst['seconds'], 1e-9) / 1e6:.2f}M "
        f"tok/s outside the paged and whole batches")
    if wst["steps"]:
        log(f"train: meank-whole {wst['seqs']} workspaces in {wst['steps']} steps, "
            f"{wst['questions']} questions, {wst['windows']} windows "
            f"({wst['window_tokens'] / 1e6:.1f}M window tokens, no grad), {wst['grad_windows']} "
            f"windows again with gradients, {wst['seconds']:.1f} s "
            f"({100 * wst['seconds'] / max(train_s, 1e-9):.0f}% of the loop), "
            f"{wst['window_tokens'] / max(wst['seconds'], 1e-9) / 1e6:.2f}M window tok/s")
    if pst["steps"]:
        log(f"train: paged {pst['seqs']} sequences in {pst['steps']} steps ({pepochs} full passes), "
            f"{pst['windows']} windows, {pst['window_tokens'] / 1e6:.1f}M window tokens (no grad) "
            f"and {pst['q_tokens'] / 1e3:.1f}k question tokens, {pst['seconds']:.1f} s "
            f"({100 * pst['seconds'] / max(train_s, 1e-9):.0f}% of the loop), "
            f"{pst['window_tokens'] / max(pst['seconds'], 1e-9) / 1e6:.2f}M window tok/s")

    final = {}
    for (name, d), (_, e) in zip(eval_data, evals):
        final[name] = evaluate(model, d, c, max(1, args.batch // 2), device, amp, rope_cs)
        log("final " + eval_line(name, final[name]))
        if kvq is not None:
            final[name + "-fp8"] = fp8_on(lambda: evaluate(model, d, c, max(1, args.batch // 2),
                                                           device, amp, rope_cs))
            log("final " + eval_line(name + "-fp8", final[name + "-fp8"]))
        if e.n_paged and args.paged_batch > 0 and not PAGED_BROKEN:
            evp = lambda: safe_evaluate_paged(model, e, c, args, device, amp, args.paged_eval)
            for tag, r in ((name, evp()), (name + "-fp8", fp8_on(evp) if kvq else None)):
                if r is not None:
                    final[tag + "-paged"] = r
                    log("final " + paged_eval_line(tag, r))
        if e.n_whole and rope_cs_w is not None and not WHOLE_BROKEN:
            r = safe_evaluate_whole(model, e, c, args, device, amp, rope_cs_w, args.meank_whole_eval)
            if r is not None:
                final[name + "-whole"] = r
                log("final " + whole_eval_line(name, r))
    pieces = load_vocab(args.vocab)
    for name, d in eval_data:
        log(f"examples from {name}:")
        show_examples(model, d, c, pieces, device, amp)

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    files = export(model, args.out, args, c, dtype)
    log(f"export: {args.out}: {', '.join(files)}")
    check = None
    try:
        probe = (eval_data[0][1] if eval_data else data)[:4].long()
        diff, same = check_export(model, args.out, probe, c, device)
        check = {"max_abs_logit_diff": diff, "argmax_agreement": same}
        log(f"export: reloaded, max |logit diff| {diff:.3g}, argmax agreement {100 * same:.2f}%")
        if same < 0.999:
            die("the exported model does not reproduce the trained one")
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - the record says so
        log(f"export: reload check skipped ({type(e).__name__}: {e})")

    record = {
        "what": "kvmem agentlang model: Qwen3ForCausalLM trained on `kvmem synth corpus`",
        "command": " ".join([os.path.basename(sys.argv[0])] + argv),
        "data": {"path": os.path.basename(args.data), "seed": c.seed, "sequences": c.n_seqs,
                 "seq_len": L, "tokens": c.tokens, "view_share": c.view_permille / 1000.0,
                 "view_policy": c.view_policy, "max_ratio": c.max_ratio,
                 "stale": c.stale_permille / 1000.0, "drop": c.drop_permille / 1000.0,
                 "paged": c.paged_permille / 1000.0, "page_window": c.window,
                 "paged_sequences": c.n_paged, "whole": c.whole_permille / 1000.0,
                 "whole_min_ratio": c.whole_min_ratio, "whole_sequences": c.n_whole,
                 "vocab": c.vocab, "vocab_hash": f"{c.vocab_hash:08x}"},
        "eval_data": {n: {"path": os.path.basename(e.path), "seed": e.seed, "sequences": e.n_seqs,
                          "view_share": e.view_permille / 1000.0,
                          "view_policy": e.view_policy,
                          "lookalikes": e.lookalikes or "drawn"} for n, e in evals},
        "model": {"layers": args.layers, "hidden": args.hidden, "intermediate": args.intermediate,
                  "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                  "window": L, "rope_theta": args.rope_theta, "parameters": n_params,
                  "dtype": args.dtype, "tie_word_embeddings": True},
        "train": {"steps": step, "tokens_seen": seen_tokens, "passes_over_data": epochs,
                  "seconds": round(train_s, 1), "batch": args.batch, "lr": args.lr,
                  "warmup": args.warmup, "min_lr_frac": args.min_lr_frac,
                  "weight_decay": args.weight_decay, "answer_weight": args.answer_weight,
                  "curriculum": args.curriculum, "compile": fwd is not model,
                  "meank_weight": args.meank_weight,
                  "meank_block": MEANK_BLOCK,
                  "meank_failed": MEANK_BROKEN[0] if MEANK_BROKEN else None,
                  "meank_span": (args.meank_span or L - 32) if args.meank_weight > 0 else None,
                  "final_meank_loss": mk_avg[0].item() if mk_avg[0] is not None else None,
                  "final_meank_top1": mk_avg[1].item() if mk_avg[1] is not None else None,
                  "paged_batch": args.paged_batch if paged else 0,
                  "paged_weight": args.paged_weight, "paged_from": paged_from,
                  "paged_failed": PAGED_BROKEN[0] if PAGED_BROKEN else None,
                  "paged_stats": {k: (v.item() if torch.is_tensor(v) else v) for k, v in pst.items()},
                  "meank_whole_weight": args.meank_whole_weight if whole else 0,
                  "meank_whole_batch": args.meank_whole_batch,
                  "meank_whole_hard": args.meank_whole_hard, "whole_query": args.whole_query,
                  "whole_target": args.whole_target,
                  "meank_budget": args.meank_budget,
                  "meank_whole_failed": WHOLE_BROKEN[0] if WHOLE_BROKEN else None,
                  "meank_whole_stats": {k: (v.item() if torch.is_tensor(v) else v)
                                        for k, v in wst.items()},
                  "teacher": args.teacher if teacher is not None else None,
                  "teacher_weight": args.teacher_weight,
                  "final_teacher_kl": tkl[0].item() if tkl[0] is not None else None,
                  "kv_fp8": args.kv_fp8, "kv_fp8_steps": fp8_steps,
                  "kv_fp8_eval": kvq is not None,
                  "torch_seed": args.seed,
                  "final_loss": loss_avg, "final_lm_loss": lm_avg, "final_answer_loss": ans_avg},
        "eval": final,
        "eval_history": history,
        "export_check": check,
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "gpu_seconds": round(time.time() - t_start, 1) if device.type == "cuda" else 0,
        "versions": {"torch": torch.__version__, "transformers": tf_version,
                     "python": platform.python_version()},
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    rec_path = args.record or os.path.join(args.out, "record.json")
    with open(rec_path, "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    log(f"record: {rec_path}; total {time.time() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
