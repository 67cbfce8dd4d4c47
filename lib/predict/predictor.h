/*
 * predictor.h - which KV blocks one decode step reads, per layer and sequence.
 *
 * One interface, three predictors (enum kvp_predictor_kind in
 * lib/kv/kv_tunables.h):
 *
 *   exact    every block of the sequence: full attention.  Its "prediction"
 *            is the layer-ahead schedule itself: layer l+1's blocks are
 *            known before layer l computes, so the caller prefetches them
 *            prefetch_depth_layers ahead.
 *   window   StreamingLLM: the blocks holding the first sink_tokens tokens
 *            plus the most recent blocks, within budget_tokens.
 *   lowrank  KVSwap-style grouped prediction.  Per layer, a projection P
 *            (kv_heads*head_dim x r, orthonormal columns) of the keys to rank
 *            r is learnt from prefill keys by randomized subspace (power)
 *            iteration on their covariance.  Every observed key (all KV
 *            heads concatenated) is kept projected, P^T k, in fp16, resident:
 *            r / (2 * kv_heads * head_dim) of the KV (1/16 at r = 128 for
 *            llama3-8b).  The step's query is folded per KV head (the sum of
 *            the query heads of each group, which gives the sum over heads
 *            of q_h . k) and projected the same way; token scores are
 *            (P^T qbar) . (P^T k), max-pooled per KV block (group of G
 *            tokens); the top budget_tokens / G blocks are chosen.
 *
 * Every predictor also always chooses the sequence's last block (the
 * newest tokens, held in the rolling buffer); it counts in the budget.
 *
 * Results are logical block numbers sorted by physical block number,
 * i.e. by address within the layer (reads in address order), ties none.
 *
 * Layer ahead: kvp_predictor_select(.., layer + 1, ..) only reads that
 * layer's metadata and the query passed in, so it may run while layer l
 * computes.  With the synthetic workload the query of layer l+1 is known
 * ahead (kvp_kv_synth_query); in a real model it comes from layer l's
 * hidden state (KVSwap uses the previous layer's input as the stand-in).
 *
 * Locking: none inside.  Calls on different layers may run concurrently;
 * calls on one layer (fit, observe, select) must be serialised by the
 * caller.  Sequence ids are 0 .. max_seqs-1.
 */
#ifndef KVP_PREDICTOR_H
#define KVP_PREDICTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/kv/attention.h"
#include "lib/kv/block_table.h"
#include "lib/kv/kv_geometry.h"
#include "lib/kv/kv_tunables.h"

struct kvp_predictor;

struct kvp_predictor_opts {
	enum kvp_predictor_kind kind;
	uint32_t budget_tokens; /* M: tokens per layer and sequence (sparse) */
	uint32_t sink_tokens;	/* window: leading tokens always kept */
	uint32_t rank;		/* lowrank: r, <= kv_heads * head_dim */
	uint32_t fit_tokens;	/* lowrank: keys buffered for a lazy fit */
	uint32_t power_iters;	/* lowrank: subspace iterations */
	uint32_t max_seqs;	/* sequence ids below this */
	uint64_t seed;		/* lowrank: the random start of the iteration */
};

/*
 * Defaults from lib/kv/kv_tunables.h: M = 400, sink 4, r = 128, fit_tokens
 * 1024, power_iters 4, max_seqs 64, seed 1; kind as given.
 */
void kvp_predictor_opts_default(struct kvp_predictor_opts *o,
				enum kvp_predictor_kind kind);

/* "exact", "window", "lowrank" <-> kind.  parse: 0 or -EINVAL. */
const char *kvp_predictor_kind_name(enum kvp_predictor_kind kind);
int kvp_predictor_kind_parse(const char *name, enum kvp_predictor_kind *out);

/* kvp_predictor_max_rank - the largest lowrank rank geometry g allows:
 * kv_heads * head_dim (a key's dimension). */
uint32_t kvp_predictor_max_rank(const struct kvp_kv_geometry *g);

/*
 * kvp_predictor_create - a predictor for geometry g (copied).
 * Returns 0 and *out, -EINVAL (bad geometry or option: rank 0 or over
 * kvp_predictor_max_rank, budget under G, max_seqs 0), -ENOMEM.
 */
int kvp_predictor_create(const struct kvp_kv_geometry *g,
			 const struct kvp_predictor_opts *o,
			 struct kvp_predictor **out);
void kvp_predictor_destroy(struct kvp_predictor *p);
/* The kind that selects now (kvp_predictor_retune changes it). */
enum kvp_predictor_kind kvp_predictor_kind(const struct kvp_predictor *p);

/*
 * kvp_predictor_retune - change how a live predictor selects: its kind,
 * budget_tokens and sink_tokens (the other fields of @o are ignored).
 * What a predictor keeps stays: one created lowrank goes on observing
 * keys while exact or window selects, so that it can select again; one
 * created exact or window has no keys and cannot become lowrank
 * (-EOPNOTSUPP).  -EINVAL: a kind out of range, a sparse budget under G.
 * Unchanged on failure.  Serialise with every other call (no select may
 * run meanwhile).
 */
int kvp_predictor_retune(struct kvp_predictor *p,
			 const struct kvp_predictor_opts *o);

/* Does this predictor read the query (lowrank selects) / keys (created
 * lowrank)? */
bool kvp_predictor_needs_query(const struct kvp_predictor *p);
bool kvp_predictor_needs_keys(const struct kvp_predictor *p);

/*
 * kvp_predictor_fit - learn layer's key projection from the keys of the
 * sample blocks (best: all of the prefill's blocks of that layer).  Up to
 * fit_tokens keys are used: from a larger sample, the fit_tokens / 4 keys
 * of largest norm (rare strong directions such as sinks and heavy hitters,
 * which a uniform subsample misses) plus evenly spaced others.  lowrank only; others return 0 and do
 * nothing.  Refitting a layer that already holds projected keys fails with
 * -EBUSY.  Returns 0, -EINVAL (layer, empty sample), -ENOMEM; the layer is
 * unchanged on failure.
 */
int kvp_predictor_fit(struct kvp_predictor *p, uint32_t layer,
		      const struct kvp_attn_blocks *sample);

/*
 * kvp_predictor_observe - tell the predictor the keys of tokens
 * [token, token + ntokens) of sequence seq in layer `layer`; they lie in
 * the one KV block `kvblock` (geometry layout) in slots token % G ...
 * Call it for every token written (prefill and decode), in token order
 * per (seq, layer).  lowrank: projects and keeps them; if the layer has no
 * projection yet, keys are buffered and the layer is fitted from the first
 * fit_tokens of them when that many arrived (or at the first select),
 * then projected; call kvp_predictor_fit first to fit from a sample that
 * spans the whole context instead.  Other kinds: no-op.
 * Returns 0, -EINVAL (seq, layer, a range crossing a block, tokens not
 * following the last observed one), -ENOMEM (nothing kept).
 */
int kvp_predictor_observe(struct kvp_predictor *p, uint32_t seq, uint32_t layer,
			  uint64_t token, uint32_t ntokens,
			  const void *kvblock);

/*
 * kvp_predictor_forget - drop what is kept of sequence seq (all layers),
 * e.g. when its block table is destroyed.  Fits are kept.
 */
void kvp_predictor_forget(struct kvp_predictor *p, uint32_t seq);

/*
 * kvp_predictor_max_blocks - room kvp_predictor_select needs for a table
 * of nblocks blocks: nblocks for exact, else min(nblocks, budget / G + 1).
 */
size_t kvp_predictor_max_blocks(const struct kvp_predictor *p,
				uint32_t nblocks);
/* The same from the options a predictor would be created with (its kind
 * and budget_tokens), for KV blocks of block_tokens tokens. */
size_t kvp_predictor_opts_max_blocks(const struct kvp_predictor_opts *o,
				     uint32_t block_tokens, uint32_t nblocks);

/*
 * kvp_predictor_select - choose the blocks sequence seq reads in `layer` at
 * this step.
 *
 * bt: the sequence's block table; q: the layer's query for this step
 * (q_heads * head_dim floats; may be NULL unless needs_query).  Writes the
 * chosen logical blocks, sorted by physical block number, to
 * lblocks[0..*n); cap >= kvp_predictor_max_blocks().  lowrank scores only
 * tokens it observed for (seq, layer); blocks past those are chosen
 * anyway (they are the newest).  Returns 0, -EINVAL (seq, layer, missing
 * q, empty table), -ENOSPC (cap too small), -ENOMEM; *n untouched on
 * failure.
 */
int kvp_predictor_select(struct kvp_predictor *p, uint32_t seq, uint32_t layer,
			 const struct kvp_block_table *bt, const float *q,
			 uint32_t *lblocks, size_t cap, size_t *n);

/*
 * Resident metadata: bytes kept now (projected keys, projections,
 * buffered keys), and the ratio of projected-key bytes per token and
 * layer to KV bytes per token and layer (0 for exact and window; 1/16 for
 * lowrank r = 128 on llama3-8b).
 */
size_t kvp_predictor_metadata_bytes(const struct kvp_predictor *p);
/*
 * The most the metadata reaches, after kvp_predictor_reserve(@more), while
 * @more[seq] more tokens of each sequence are observed in every layer
 * (max_seqs entries; NULL: none): what a RAM budget fitted now must leave
 * it for the decode to come (kvp_kvcache_fit_ram).  Saturates at
 * SIZE_MAX.  The metadata counts what is allocated (lowrank's projected
 * keys by their capacity), and kvp_predictor_reserve makes that capacity
 * what the tokens to come take, so that observing them allocates
 * nothing more.
 */
size_t kvp_predictor_metadata_peak(const struct kvp_predictor *p,
				   const uint64_t *more);
/* Room for @more[seq] more tokens of each sequence, exactly, allocated now
 * (lowrank's projected keys; the others keep none): 0, or -ENOMEM with
 * the room as it was or between the two. */
int kvp_predictor_reserve(struct kvp_predictor *p, const uint64_t *more);
double kvp_predictor_metadata_ratio(const struct kvp_predictor *p);

#endif /* KVP_PREDICTOR_H */
