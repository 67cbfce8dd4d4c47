"""llama2_ref - an independent numpy forward pass of a llama2.c checkpoint.

Path: python/kvpager/llama2_ref.py (import as ``kvpager.llama2_ref`` with
python/ on sys.path).  Pure numpy; no part of the C library is used, so it
can cross-check kvpager's C forward pass (lib/model/, tests/t_model_numpy.sh)
and serve as the compute of an example engine whose K and V live elsewhere.

The KV store is pluggable: any object with

    append(layer, pos, k, v)   K and V (float32 arrays [kv_heads, head_dim])
                               of token ``pos`` in ``layer``
    attend(layer, q, pos)      attention of q ([q_heads, head_dim]) over
                               tokens 0 .. pos of ``layer``; returns
                               [q_heads, head_dim]

``DenseKV`` keeps them in numpy arrays (the default).  A binding that keeps
K and V in kvpager gives its own object with those two methods.

The math is llama2.c's: RMSNorm (eps 1e-5), rotary embeddings with theta
10000 on adjacent pairs of each head, grouped-query attention scaled by
1/sqrt(head_dim), SwiGLU FFN, final RMSNorm, classifier (tied to the
embedding when the header's vocab_size is positive).  Everything runs in
float32 except the softmax's sum, as the C code does.
"""

import struct

import numpy as np

HEADER = struct.Struct("<7i")


class Config:
    """The checkpoint header: dim, hidden_dim, layers, heads, kv_heads,
    vocab, seq_len, shared_classifier; head_dim = dim // heads."""

    def __init__(self, dim, hidden_dim, layers, heads, kv_heads, vocab,
                 seq_len, shared_classifier):
        self.dim = dim
        self.hidden_dim = hidden_dim
        self.layers = layers
        self.heads = heads
        self.kv_heads = kv_heads
        self.vocab = vocab
        self.seq_len = seq_len
        self.shared_classifier = shared_classifier
        self.head_dim = dim // heads


class Weights:
    """The checkpoint's float32 arrays, [out][in] as in the file."""

    def __init__(self, path):
        with open(path, "rb") as f:
            raw = f.read()
        h = HEADER.unpack_from(raw, 0)
        c = Config(h[0], h[1], h[2], h[3], h[4], abs(h[5]), h[6], h[5] > 0)
        self.cfg = c
        data = np.frombuffer(raw, dtype="<f4", offset=HEADER.size)
        kvd = c.kv_heads * c.head_dim
        off = [0]

        def take(*shape):
            n = int(np.prod(shape))
            a = data[off[0]:off[0] + n].reshape(shape)
            off[0] += n
            return a

        self.embed = take(c.vocab, c.dim)
        self.att_norm = take(c.layers, c.dim)
        self.wq = take(c.layers, c.dim, c.dim)
        self.wk = take(c.layers, kvd, c.dim)
        self.wv = take(c.layers, kvd, c.dim)
        self.wo = take(c.layers, c.dim, c.dim)
        self.ffn_norm = take(c.layers, c.dim)
        self.w1 = take(c.layers, c.hidden_dim, c.dim)
        self.w2 = take(c.layers, c.dim, c.hidden_dim)
        self.w3 = take(c.layers, c.hidden_dim, c.dim)
        self.final_norm = take(c.dim)
        take(c.seq_len, c.head_dim // 2)  # legacy RoPE tables, unused
        take(c.seq_len, c.head_dim // 2)
        self.cls = self.embed if c.shared_classifier else take(c.vocab, c.dim)
        if off[0] != data.size:
            raise ValueError("model %r: %d floats after the header, the "
                             "header implies %d" % (path, data.size, off[0]))


class DenseKV:
    """K and V in numpy arrays, all in RAM: the default store."""

    def __init__(self, cfg, capacity):
        shape = (cfg.layers, capacity, cfg.kv_heads, cfg.head_dim)
        self.k = np.zeros(shape, dtype=np.float32)
        self.v = np.zeros(shape, dtype=np.float32)
        self.group = cfg.heads // cfg.kv_heads
        self.scale = np.float32(1.0 / np.sqrt(cfg.head_dim))

    def append(self, layer, pos, k, v):
        self.k[layer, pos] = k
        self.v[layer, pos] = v

    def attend(self, layer, q, pos):
        k = np.repeat(self.k[layer, :pos + 1], self.group, axis=1)
        v = np.repeat(self.v[layer, :pos + 1], self.group, axis=1)
        s = np.einsum("hd,thd->ht", q, k) * self.scale
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True, dtype=np.float64).astype(np.float32)
        return np.einsum("ht,thd->hd", p, v).astype(np.float32)


def rmsnorm(x, w):
    ss = np.float32(np.mean(x.astype(np.float64) ** 2) + 1e-5)
    return (w * (x / np.sqrt(ss))).astype(np.float32)


def rope(v, pos, head_dim):
    """v: [heads, head_dim]; rotate pairs (2i, 2i+1) by pos * theta_i."""
    i = np.arange(0, head_dim, 2, dtype=np.float32)
    ang = np.float32(pos) * (1.0 / np.power(np.float32(10000.0),
                                            i / np.float32(head_dim)))
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    v0, v1 = v[:, 0::2].copy(), v[:, 1::2].copy()
    out = np.empty_like(v)
    out[:, 0::2] = v0 * c - v1 * s
    out[:, 1::2] = v0 * s + v1 * c
    return out


class Model:
    """A forward pass, one token at a time, over a pluggable KV store."""

    def __init__(self, weights, kv=None, capacity=None):
        self.w = weights
        self.cfg = weights.cfg
        self.kv = kv if kv is not None else DenseKV(
            self.cfg, capacity or self.cfg.seq_len)

    def forward(self, token, pos):
        """Logits (float32 [vocab]) of token at position pos; appends its
        K and V to the store."""
        c, w = self.cfg, self.w
        hd = c.head_dim
        x = w.embed[token].astype(np.float32).copy()
        for l in range(c.layers):
            xb = rmsnorm(x, w.att_norm[l])
            q = rope((w.wq[l] @ xb).reshape(c.heads, hd), pos, hd)
            k = rope((w.wk[l] @ xb).reshape(c.kv_heads, hd), pos, hd)
            v = (w.wv[l] @ xb).reshape(c.kv_heads, hd)
            self.kv.append(l, pos, k, v)
            att = self.kv.attend(l, q, pos).reshape(-1)
            x = x + w.wo[l] @ att
            xb = rmsnorm(x, w.ffn_norm[l])
            h1 = w.w1[l] @ xb
            h3 = w.w3[l] @ xb
            h = (h1 / (1.0 + np.exp(-h1))) * h3
            x = x + w.w2[l] @ h.astype(np.float32)
        return (w.cls @ rmsnorm(x, w.final_norm)).astype(np.float32)

    def prefill(self, prompt, start=0):
        """Feed prompt[start:] at its positions; the logits of its last
        token.  @start: the KV store already holds the first start tokens
        (restored from a prefix cache), so the forward pass begins there;
        the last token is always computed, for its logits."""
        if not 0 <= start < len(prompt):
            raise ValueError(f"start {start}: 0 .. {len(prompt) - 1}")
        logits = None
        for pos in range(start, len(prompt)):
            logits = self.forward(prompt[pos], pos)
        return logits

    def decode(self, logits, pos, steps):
        """Greedy decoding of steps tokens from the logits of the token at
        pos - 1.  Returns (tokens, logits): logits[i] is the distribution
        that chose tokens[i]."""
        out, lg = [], []
        for _ in range(steps):
            tok = int(np.argmax(logits))
            out.append(tok)
            lg.append(logits)
            logits = self.forward(tok, pos)
            pos += 1
        return out, np.array(lg)

    def generate(self, prompt, steps, start=0):
        """Greedy: prefill the prompt (from @start), then decode steps
        tokens.  Returns decode()'s (tokens, logits)."""
        return self.decode(self.prefill(prompt, start), len(prompt), steps)
