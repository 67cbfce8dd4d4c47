/*
 * kv_source.h - where the KV cache's K, V and queries come from.
 *
 * The KV cache (kvcache.h) stores, pages and attends over K and V; it does
 * not make them.  A source does: the synthetic generator
 * (lib/synth/kv_synth.h, kvp_kv_source_synth) or a model's forward pass.
 * The decode loop is the same for every source: it calls the source's ops
 * at fixed points, in the order written below, so a source that computes
 * layer l from layer l-1 (a transformer) sees its inputs before it is
 * asked for its outputs.
 *
 * Positions: token t of a sequence is its (t+1)-th token; "the step at
 * pos" is the decode step that appends token pos-1 and attends to tokens
 * 0 .. pos-1 (pos >= 1).
 *
 * THE CALLS OF ONE DECODE STEP (kvp_kvcache_step over sequences S), for
 * layer l = 0, 1, ..., layers-1, in this order:
 *
 *   plan_query(s, l', pos')  for planned layers l' ahead of l (this step
 *                            or the next), only when the predictor needs a
 *                            query (lowrank); pos' is that step's pos
 *   fill(s, l, pos-1, 1)     for every s in S: the new token's K and V
 *   query(s, l, pos)         for every s in S: the query that attends
 *   attended(s, l, pos, out) for every s in S, right after its attention:
 *                            the attention output (q_heads * head_dim
 *                            floats, head-major), from which a model makes
 *                            layer l+1's input
 *
 * So fill(s, l) comes after attended(s, l-1) of the same step, and
 * query(s, l) after fill(s, l).  The calls of one step come from the
 * caller's thread.
 *
 * THE CALLS OF A PREFILL (kvp_kvcache_prefill of ntokens tokens from
 * token t0 of sequence s):
 *
 *   prefill_begin(s, t0, ntokens)   once, before any fill
 *   fill(s, l, t, n)                each (layer, token) of the range once,
 *                                   tokens of one layer in ascending order
 *   prefill_end(s)                  once, after the last fill, also when
 *                                   the prefill fails after
 *                                   prefill_begin succeeded
 *
 * Fills of different layers may run concurrently on several threads,
 * unless the source sets KVP_KV_SOURCE_LAYER_ORDER: then every fill of
 * layer l of the call returns before the first fill of layer l+1 starts
 * (one layer at a time, the caller's thread or one helper at a time).  A
 * model sets it, computes layer l of the whole range on its first fill of
 * layer l (attending within the prompt on its own) and hands out the K and
 * V of the later fills from what it computed.
 *
 * Every op returns 0 or -errno (query and plan_query: an error fails the
 * step, whose contract in kvcache.h then applies).  Ops marked optional
 * may be NULL.
 */
#ifndef KVP_KV_SOURCE_H
#define KVP_KV_SOURCE_H

#include <stdbool.h>
#include <stdint.h>

/* Fills of a prefill come layer by layer (see THE CALLS OF A PREFILL). */
#define KVP_KV_SOURCE_LAYER_ORDER (1u << 0)

struct kvp_kv_source_ops {
	/*
	 * K and V of tokens [token, token + ntokens) of (seq, layer) into
	 * the KV block kvblock (kv_geometry.h layout and dtype) at slots
	 * token % G ...; the range lies in one KV block; other slots are
	 * left as they are.  Thread-safe across layers unless the source
	 * sets KVP_KV_SOURCE_LAYER_ORDER.
	 */
	int (*fill)(void *arg, uint32_t seq, uint32_t layer, uint64_t token,
		    uint32_t ntokens, void *kvblock);
	/* The query (q_heads * head_dim floats, head-major) of (seq, layer)
	 * for the step at pos, into q. */
	int (*query)(void *arg, uint32_t seq, uint32_t layer, uint64_t pos,
		     float *q);
	/*
	 * Optional: the query a predictor plans with, for a layer and step
	 * ahead of the one computing (a guess is fine: it only chooses which
	 * blocks are read).  NULL: query is exact ahead of time too, and is
	 * called instead (the synthetic source).
	 */
	int (*plan_query)(void *arg, uint32_t seq, uint32_t layer, uint64_t pos,
			  float *q);
	/* Optional: the attention output of (seq, layer) at the step at
	 * pos (see THE CALLS OF ONE DECODE STEP). */
	int (*attended)(void *arg, uint32_t seq, uint32_t layer, uint64_t pos,
			const float *out);
	/* Optional: a prefill of tokens [token, token + ntokens) of seq
	 * starts; on failure, nothing was appended. */
	int (*prefill_begin)(void *arg, uint32_t seq, uint64_t token,
			     uint64_t ntokens);
	/* Optional: that prefill ended (done or failed). */
	void (*prefill_end)(void *arg, uint32_t seq);
};

/* A source: its ops, their first argument, KVP_KV_SOURCE_* flags. */
struct kvp_kv_source {
	const struct kvp_kv_source_ops *ops;
	void *arg;
	unsigned flags;
};

#endif /* KVP_KV_SOURCE_H */
