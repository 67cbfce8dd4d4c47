/*
 * attention.h - decode attention of one query step over paged KV, on the CPU.
 *
 * One call computes, for one sequence and one layer, the attention of the
 * step's query (q_heads x head_dim, fp32) over a list of KV blocks (the
 * layout of kv_geometry.h, any dtype): for each query head h and its KV head
 * h / (q_heads / kv_heads),
 *
 *   out[h] = sum_t softmax_t(q[h] . K[t] / sqrt(head_dim)) V[t]
 *
 * over the valid tokens t of the listed blocks, with scores, softmax and
 * accumulation in fp32 (online softmax per block, partial results of the
 * threads merged; the math is lib/cuda/attn_common.h, shared with the CUDA
 * kernel).  The list is any set of blocks: all of a sequence's (exact), or
 * those a predictor chose (sparse).  The order of the list does not change
 * the result beyond fp32 rounding.
 *
 * KV blocks are addressed by pointer, so they can live in a pager region,
 * in plain memory, or in a rolling buffer (the newest, partly filled
 * block): build the list with kvp_attn_blocks_from_table, then replace the
 * pointer of the last logical block if it lives elsewhere.
 *
 * Threads: a pool (kvp_attn_pool_create) splits one call's blocks over its
 * threads plus the caller.  A pool serves one call at a time (concurrent
 * calls on one pool serialise on its mutex); use one pool per decoding
 * thread.  A NULL pool computes in the calling thread alone.
 */
#ifndef KVP_ATTENTION_H
#define KVP_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/kv/block_table.h"
#include "lib/kv/kv_geometry.h"

struct kvp_attn_pool;

/* The KV blocks one call reads. */
struct kvp_attn_blocks {
	const void *const *ptrs; /* n KV blocks (K then V, geometry layout) */
	const uint32_t *ntokens; /* valid slots of each, 1..G; NULL: all G */
	size_t n;
};

/*
 * kvp_attn_pool_create - nthreads workers in all, counting the caller of
 * each kvp_attn_decode (0: one per online CPU; 1: no extra thread).
 * Returns 0 and *out, -EINVAL (over 256), -ENOMEM, -EAGAIN (threads);
 * nothing is left on failure.
 */
int kvp_attn_pool_create(unsigned nthreads, struct kvp_attn_pool **out);
/* Stop and join the workers.  NULL is a no-op.  No call may be running. */
void kvp_attn_pool_destroy(struct kvp_attn_pool *p);
/* Workers in all, counting the caller (1 for NULL). */
unsigned kvp_attn_pool_threads(const struct kvp_attn_pool *p);

/*
 * kvp_attn_decode - out = attention of q over the blocks of b.
 *
 * g: the geometry (assumed valid); q and out: q_heads * head_dim floats
 * each, head-major (q[h * head_dim + d]); out may not alias q.  Blocks are
 * read, never written; a block in a pager region may fault in.  Returns 0,
 * or -EINVAL (no blocks, a ntokens entry 0 or > G); out is untouched on
 * failure.  Uses AVX2/F16C code when the CPU has them (see
 * kvp_attn_simd_name), else portable code.
 */
int kvp_attn_decode(const struct kvp_kv_geometry *g,
		    const struct kvp_attn_blocks *b, const float *q, float *out,
		    struct kvp_attn_pool *p);

/* The same with the portable scalar code path only (for tests). */
int kvp_attn_decode_scalar(const struct kvp_kv_geometry *g,
			   const struct kvp_attn_blocks *b, const float *q,
			   float *out, struct kvp_attn_pool *p);

/* "avx2+f16c" or "scalar": the code path kvp_attn_decode takes here. */
const char *kvp_attn_simd_name(void);

/*
 * kvp_attn_blocks_from_table - the block list of one layer of one sequence.
 *
 * For the logical blocks lblocks[0..n) of bt (NULL: all of them, in
 * logical order, n ignored), writes ptrs[i] = base + kvp_kv_layout_offset(
 * l, layer, physical) and ntok[i] = valid tokens, and sets *out to point
 * at those arrays.  ptrs and ntok must hold as many entries as blocks are
 * listed.  Returns 0, or -EINVAL (a logical block past the end; layer out
 * of range), *out untouched on failure.
 */
int kvp_attn_blocks_from_table(const struct kvp_kv_layout *l, const void *base,
			       const struct kvp_block_table *bt, uint32_t layer,
			       const uint32_t *lblocks, size_t n,
			       const void **ptrs, uint32_t *ntok,
			       struct kvp_attn_blocks *out);

/*
 * kvp_attn_decode_table - kvp_attn_decode over logical blocks lblocks[0..n)
 * of bt in layer `layer` of a region at base laid out by l (lblocks NULL:
 * every block).  Same returns as the two calls above, plus -ENOMEM.
 */
int kvp_attn_decode_table(const struct kvp_kv_layout *l, const void *base,
			  const struct kvp_block_table *bt, uint32_t layer,
			  const uint32_t *lblocks, size_t n, const float *q,
			  float *out, struct kvp_attn_pool *p);

/*
 * kvp_attn_dense_ref - plain two-pass reference, for tests.  K and V are
 * dense fp32 [token][kv_head][head_dim], ntok >= 1 tokens.  Double
 * precision accumulation.  Returns 0 or -EINVAL.
 */
int kvp_attn_dense_ref(const struct kvp_kv_geometry *g, const float *K,
		       const float *V, size_t ntok, const float *q, float *out);

/*
 * kvp_attn_gather - copy the valid tokens of b, in list order, into dense
 * fp32 K and V ([token][kv_head][head_dim]; room for the total of valid
 * tokens).  Returns the number of tokens written.
 */
size_t kvp_attn_gather(const struct kvp_kv_geometry *g,
		       const struct kvp_attn_blocks *b, float *K, float *V);

/*
 * Quality of a sparse selection, against exact attention on the same step.
 *
 * kvp_attn_block_mass: mass[i] = the attention probability that block i of
 * b holds, averaged over the query heads (the masses sum to 1).  Exact:
 * reads every listed block.  Returns 0, -EINVAL, -ENOMEM.
 */
int kvp_attn_block_mass(const struct kvp_kv_geometry *g,
			const struct kvp_attn_blocks *b, const float *q,
			float *mass, struct kvp_attn_pool *p);

/*
 * kvp_attn_recall - with mass[0..n) from kvp_attn_block_mass over all of a
 * sequence's blocks in logical order, and chosen[0..k) distinct indices
 * into it (logical block numbers): the mass the chosen blocks hold divided
 * by the mass of the k heaviest blocks (the oracle with the same budget);
 * 1 when they are the heaviest.  *abs_mass (may be NULL) gets the chosen
 * blocks' mass itself (of 1).  k = 0 gives 0.  Indices >= n are ignored.
 */
double kvp_attn_recall(const float *mass, size_t n, const uint32_t *chosen,
		       size_t k, double *abs_mass);

/* ||approx - exact||_2 / ||exact||_2 over n floats (0 if both are zero). */
double kvp_attn_rel_error(const float *approx, const float *exact, size_t n);

#endif /* KVP_ATTENTION_H */
