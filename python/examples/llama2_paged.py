#!/usr/bin/python3
"""llama2_paged.py - a small inference engine in Python whose KV is paged.

    PYTHONPATH=build/python /usr/bin/python3 python/examples/llama2_paged.py \\
        MODEL [--prompt-tokens 1,20,24] [--generate 32] [--budget 2M] \\
        [--cache-dir DIR [--remote redis://127.0.0.1:6379] [--salt S]]

The forward pass is kvpager.llama2_ref's (numpy, a llama2.c checkpoint);
its K and V live in a kvpager region instead of numpy arrays: written
through a numpy view of the region, read back by the library's decode
attention (kvp_attn_decode) through the region, under a RAM budget.  Each
layer's KV blocks fill a pager block of their own (--block), so that a
model as small as stories260K still pages: 5 layers of 1 MiB against a
2 MiB budget evict and reload at every step.  Before a layer attends, the
next layer's block is prefetched.

With --cache-dir, the prompt's leading chunks (--chunk-tokens each) are
read from a kvpager.PrefixCache instead of computed when an earlier run
stored them (in that directory, or in Redis with --remote), and the
chunks computed are stored for the next run: the tokens are the same,
because a chunk holds the K and V the forward pass made.  With
--block-tokens 4 --chunk-tokens 64 the keys are `kvpager run --model`'s
for the same checkpoint and prompt: each reads the chunks the other
stored.

Prints `tokens: ...` as `kvpager run --model` does, greedy decoding;
python/tests/test_examples.py checks they are the C main job's.
"""

import argparse
import sys

import numpy as np

import kvpager
from kvpager import llama2_ref


class PagedKV:
    """llama2_ref's KV store protocol (append, attend) over a region.

    Layout: layer l's KV blocks (the geometry's: K[kv_head][slot][dim] then
    V, G tokens each) from byte l * block of the region, one after
    another; the region has one pager block per layer."""

    def __init__(self, pager: kvpager.Pager, cfg: llama2_ref.Config,
                 capacity: int, block: int, block_tokens: int = 16):
        self.g = kvpager.KVGeometry(layers=cfg.layers, q_heads=cfg.heads,
                                    kv_heads=cfg.kv_heads,
                                    head_dim=cfg.head_dim, dtype="fp32",
                                    block_tokens=block_tokens)
        g, stride = self.g, self.g.block_stride
        self.nblocks = -(-capacity // block_tokens)
        if self.nblocks * stride > block:
            raise ValueError(f"--block {block}: a layer's KV needs "
                             f"{self.nblocks * stride} bytes")
        self.region = pager.region(cfg.layers * block, block_bytes=block,
                                   name="llama2-kv")
        raw = self.region.array(np.uint8).reshape(cfg.layers, block)
        # Per layer: [blocks, stride] bytes for attention, and the same
        # memory as [blocks, K/V, kv_heads, G, head_dim] floats to write.
        self.rows = [raw[l, :self.nblocks * stride].reshape(self.nblocks,
                                                           stride)
                     for l in range(cfg.layers)]
        self.kv = [r.view(np.float32)[:, :g.block_bytes // 4].reshape(
            self.nblocks, 2, g.kv_heads, block_tokens, g.head_dim)
            for r in self.rows]
        self.attn = kvpager.Attention(g, threads=1)

    def append(self, layer, pos, k, v):
        b, s = divmod(pos, self.g.block_tokens)
        self.kv[layer][b, 0, :, s] = k
        self.kv[layer][b, 1, :, s] = v

    def attend(self, layer, q, pos):
        G = self.g.block_tokens
        n = pos // G + 1
        ntok = np.full(n, G, dtype=np.uint32)
        ntok[-1] = pos % G + 1
        if layer + 1 < self.g.layers:  # the next layer's pager block
            self.region.prefetch([layer + 1]).close()
        return self.attn(self.rows[layer], q, index=np.arange(n),
                         ntokens=ntok)

    def _slots(self, first, n):
        return np.divmod(np.arange(first, first + n), self.g.block_tokens)

    def save_chunk(self, px, first, out):
        """Tokens [first, first + C) into @out, a PrefixCache payload
        (px.chunk_array()), read through the region: whole KV blocks
        (px.in_blocks, G divides C) are the region's own bytes."""
        k, v = px.chunk_kv(out)
        if px.in_blocks:
            b = first // self.g.block_tokens
            for l, kv in enumerate(self.kv):
                k[l] = kv[b:b + k.shape[1], 0]
                v[l] = kv[b:b + k.shape[1], 1]
            return
        b, s = self._slots(first, k.shape[1])
        for l, kv in enumerate(self.kv):
            k[l] = kv[b, 0, :, s]
            v[l] = kv[b, 1, :, s]

    def load_chunk(self, px, first, buf):
        """The inverse: a payload's K and V at tokens [first, first + C)."""
        k, v = px.chunk_kv(buf)
        if px.in_blocks:
            b = first // self.g.block_tokens
            for l, kv in enumerate(self.kv):
                kv[b:b + k.shape[1], 0] = k[l]
                kv[b:b + k.shape[1], 1] = v[l]
            return
        b, s = self._slots(first, k.shape[1])
        for l, kv in enumerate(self.kv):
            kv[b, 0, :, s] = k[l]
            kv[b, 1, :, s] = v[l]

    def close(self):
        self.attn.close()
        del self.rows, self.kv  # the views, before their region
        self.region.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-tokens", default="1",
                    help="comma-separated token ids (1 is BOS)")
    ap.add_argument("--generate", type=int, default=32)
    ap.add_argument("--budget", default="2M")
    ap.add_argument("--block", type=int, default=1 << 20,
                    help="pager block: one per layer")
    ap.add_argument("--cache-dir", help="a prefix cache directory")
    ap.add_argument("--remote", help="the Redis tier below it (a URL)")
    ap.add_argument("--salt", help="the cache's namespace")
    ap.add_argument("--chunk-tokens", type=int, default=16,
                    help="tokens per stored chunk")
    ap.add_argument("--block-tokens", type=int, default=16,
                    help="tokens per KV block; the keys bind it and the "
                    "chunk size (kvpager run --model: 4 and 64)")
    a = ap.parse_args()
    if a.remote and not a.cache_dir:
        ap.error("--remote needs --cache-dir")
    prompt = [int(t) for t in a.prompt_tokens.split(",")]
    w = llama2_ref.Weights(a.model)
    with kvpager.Pager(budget=a.budget, pool_prefault_bytes=0) as pager:
        kv = PagedKV(pager, w.cfg, len(prompt) + a.generate, a.block,
                     a.block_tokens)
        model = llama2_ref.Model(w, kv=kv)
        px = kvpager.PrefixCache(
            a.cache_dir, geometry=kv.g, model_file=a.model,
            chunk_tokens=a.chunk_tokens, salt=a.salt,
            remote=a.remote) if a.cache_dir else None
        hit = 0
        if px:  # the stored leading chunks instead of their forward pass
            px.set_prompt(prompt)
            buf = px.chunk_array()
            C = a.chunk_tokens
            while hit // C < px.restorable and px.get(hit // C, buf):
                kv.load_chunk(px, hit, buf)
                hit += C
        logits = model.prefill(prompt, start=hit)
        if px:  # offer what was computed, stored behind the decode
            for i in range(hit // C, px.chunks):
                kv.save_chunk(px, i * C, buf)
                px.put(i, buf)
        tokens, _ = model.decode(logits, len(prompt), a.generate)
        st = kv.region.stats()
        kv.close()
        if px:
            px.close()
            print(f"prefix: {hit} of {len(prompt)} prompt tokens from the "
                  f"cache", file=sys.stderr)
    print("tokens:", " ".join(map(str, tokens)))
    print(f"paged: {st['bytes_read_total'] >> 20} MiB read, "
          f"{st['evictions_dirty_total'] + st['evictions_clean_total']} "
          f"evictions, {st['prefetch_issued_total']} blocks prefetched",
          file=sys.stderr)


if __name__ == "__main__":
    main()
