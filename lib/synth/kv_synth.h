/*
 * kv_synth.h - synthetic KV cache and queries with planted attention structure.
 *
 * THE KV IS SYNTHETIC: no model runs.  Keys, values and queries are drawn,
 * deterministically from a seed, so that attention has the structure the
 * literature reports for real models, and so that predictors can be
 * scored against exact attention:
 *
 *   sink tokens    the first sink_tokens tokens: keys aligned with every
 *                  query (attention sinks);
 *   heavy hitters  about one token in heavy_every (position hashed): keys
 *                  aligned with every query of the layer;
 *   topic clusters tokens come in runs of one topic (mean run length
 *                  topic_run_tokens, clusters topics per layer); a step's
 *                  query aligns with the topic of one earlier token;
 *   recent window  a positional component (a few incommensurate
 *                  frequencies) that makes a query favour keys of the last
 *                  recent_tokens tokens before it;
 *   noise          everything else: small i.i.d.-looking noise.
 *
 * The *_logit options are the score q.k/sqrt(head_dim) each component adds
 * (approximately: directions are random, nearly orthogonal).  Each
 * component's direction spans all KV heads, so the keys of a layer have a
 * low-rank structure (about clusters + 2 + 6 directions) plus noise, as
 * real keys do.
 *
 * Cost: a key or value row is a cluster's base vector plus a window of a
 * precomputed noise table at a hashed offset, converted to the dtype with
 * F16C where available: well above disk speed (test_kv_synth measures it).
 * All calls on a created generator are read-only and thread-safe.
 */
#ifndef KVP_KV_SYNTH_H
#define KVP_KV_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/kv/kv_geometry.h"
#include "lib/kv/kv_source.h"

struct kvp_kv_synth;

struct kvp_kv_synth_opts {
	uint64_t seed;
	uint32_t sink_tokens;	   /* 4 */
	uint32_t clusters;	   /* topics per layer: 32 */
	uint32_t topic_run_tokens; /* mean tokens of one topic run: 256 */
	uint32_t heavy_every;	   /* one heavy hitter per this many: 2048 */
	uint32_t recent_tokens;	   /* the recent window queries favour: 32 */
	float sink_logit;	   /* 10 */
	float heavy_logit;	   /* 9 */
	float topic_logit;	   /* 6 */
	float recent_logit;	   /* 3 */
	float noise;		   /* std dev of the key noise's logit: 1 */
};

void kvp_kv_synth_opts_default(struct kvp_kv_synth_opts *o);

/*
 * kvp_kv_synth_create - a generator for geometry g (copied).  Allocates
 * the per-layer directions (a few MiB for llama3-8b) and the noise table.
 * Returns 0 and *out, -EINVAL (bad geometry or clusters 0), -ENOMEM.
 */
int kvp_kv_synth_create(const struct kvp_kv_geometry *g,
			const struct kvp_kv_synth_opts *o,
			struct kvp_kv_synth **out);
void kvp_kv_synth_destroy(struct kvp_kv_synth *s);

/*
 * kvp_kv_synth_fill - write K and V of tokens [token, token + ntokens) of
 * sequence seq, layer `layer`, into the KV block kvblock (geometry layout
 * and dtype; slots token % G ...).  The range must lie in one KV block.
 * Other slots are left as they are.  A token's K and V depend only on
 * (seed, seq, layer, token), so a forked prefix is regenerated identically
 * with the parent's seq.  Returns 0 or -EINVAL.
 */
int kvp_kv_synth_fill(const struct kvp_kv_synth *s, uint32_t seq,
		      uint32_t layer, uint64_t token, uint32_t ntokens,
		      void *kvblock);

/*
 * kvp_kv_synth_query - the query (q_heads * head_dim floats, head-major) of
 * layer `layer` of sequence seq at position pos (the step that attends to
 * tokens 0 .. pos-1; pos >= 1).  Available for any layer ahead of time.
 */
void kvp_kv_synth_query(const struct kvp_kv_synth *s, uint32_t seq,
			uint32_t layer, uint64_t pos, float *q);

/* Planted facts, for tests and reports. */
bool kvp_kv_synth_is_heavy(const struct kvp_kv_synth *s, uint32_t seq,
			   uint64_t token);
uint32_t kvp_kv_synth_topic(const struct kvp_kv_synth *s, uint32_t seq,
			    uint32_t layer, uint64_t token);
/* The topic the query at (seq, layer, pos) aligns with. */
uint32_t kvp_kv_synth_query_topic(const struct kvp_kv_synth *s, uint32_t seq,
				  uint32_t layer, uint64_t pos);

/*
 * kvp_kv_source_synth - a KV source (lib/kv/kv_source.h) over s: fill and
 * query are kvp_kv_synth_fill and kvp_kv_synth_query; no flags, no
 * optional ops.  s must outlive every use of src (synth_source.c).
 */
void kvp_kv_source_synth(struct kvp_kv_source *src,
			 const struct kvp_kv_synth *s);

#endif /* KVP_KV_SYNTH_H */
