/*
 * paged_attn.h - where a KV row lives in the device block pool, and the
 * split-and-merge of flash-decoding over it: the indexing shared by the
 * CUDA kernel (lib/cuda/attention.cu) and the CPU (lib/device/dev_emu.c,
 * tests/test_devpool.c), so that the CPU tests check the very arithmetic
 * the kernel runs.
 *
 * Plain C11 that nvcc also compiles (KVP_HD from attn_common.h); no
 * project headers but attn_common.h.
 *
 * THE POOL.  nslots slots of slot_bytes each, one after another; a slot
 * holds one KV block in the layout of lib/kv/kv_geometry.h:
 *
 *   K[kv_head][token][dim]  then  V[kv_head][token][dim]   (token < G)
 *
 * THE DEVICE BLOCK TABLE of one (sequence, layer): n entries, entry i
 * naming the slot of the i-th block attended and its valid tokens
 * (ntok NULL: all G).  Logical order is not needed: attention over a set
 * does not depend on its order beyond fp32 rounding.
 *
 * THE SPLITS.  Query head h reads KV head kvp_paged_kv_head(h).  Each
 * head's table entries are cut into `splits` contiguous shares
 * (kvp_paged_split_range); each share gives a partial (m, l, acc[dim]) at
 * kvp_paged_partial(); the partials of a head merge in split order into
 * the output (kvp_paged_merge_head).
 */
#ifndef KVP_CUDA_PAGED_ATTN_H
#define KVP_CUDA_PAGED_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "lib/cuda/attn_common.h"

/* The shape of one attention call over the pool. */
struct kvp_paged_shape {
	uint32_t q_heads, kv_heads; /* q_heads a multiple of kv_heads */
	uint32_t head_dim;	    /* elements per head */
	uint32_t block_tokens;	    /* G */
	int dtype;		    /* KVP_ATTN_FP16 / BF16 / FP32 */
	uint64_t slot_bytes;	    /* distance between two slots */
};

/* KV head read by query head h. */
KVP_HD uint32_t kvp_paged_kv_head(const struct kvp_paged_shape *s, uint32_t h)
{
	return h / (s->q_heads / s->kv_heads);
}

/* Bytes of K (or of V) of one block: the V half starts there. */
KVP_HD uint64_t kvp_paged_half_bytes(const struct kvp_paged_shape *s)
{
	return (uint64_t)s->kv_heads * s->block_tokens * s->head_dim *
	       kvp_attn_esize(s->dtype);
}

/* Bytes of one KV block (K and V). */
KVP_HD uint64_t kvp_paged_block_bytes(const struct kvp_paged_shape *s)
{
	return 2 * kvp_paged_half_bytes(s);
}

/* Byte offset in the pool of K row (slot, kv_head, token). */
KVP_HD uint64_t kvp_paged_k_off(const struct kvp_paged_shape *s, uint32_t slot,
				uint32_t kv_head, uint32_t token)
{
	return (uint64_t)slot * s->slot_bytes +
	       ((uint64_t)kv_head * s->block_tokens + token) * s->head_dim *
		   kvp_attn_esize(s->dtype);
}

/* Byte offset in the pool of V row (slot, kv_head, token). */
KVP_HD uint64_t kvp_paged_v_off(const struct kvp_paged_shape *s, uint32_t slot,
				uint32_t kv_head, uint32_t token)
{
	return kvp_paged_k_off(s, slot, kv_head, token) +
	       kvp_paged_half_bytes(s);
}

/* Valid tokens of table entry i. */
KVP_HD uint32_t kvp_paged_ntok(const struct kvp_paged_shape *s,
			       const uint32_t *ntok, uint32_t i)
{
	return ntok ? ntok[i] : s->block_tokens;
}

/* Entries [*lo, *hi) of n that split `split` of `splits` takes. */
KVP_HD void kvp_paged_split_range(uint32_t n, uint32_t split, uint32_t splits,
				  uint32_t *lo, uint32_t *hi)
{
	*lo = (uint32_t)((uint64_t)n * split / splits);
	*hi = (uint32_t)((uint64_t)n * (split + 1) / splits);
}

/* Floats of one partial: m, l, acc[dim]. */
KVP_HD uint32_t kvp_paged_partial_floats(uint32_t dim)
{
	return dim + 2;
}

/* The partial of (head h, split) in scratch. */
KVP_HD float *kvp_paged_partial(float *scratch, uint32_t h, uint32_t split,
				uint32_t splits, uint32_t dim)
{
	return scratch + ((size_t)h * splits + split) *
			     kvp_paged_partial_floats(dim);
}

/*
 * One share, scalar: the partial of query head h over table entries
 * [lo, hi), q already scaled by 1/sqrt(dim).  The kernel computes the same
 * partial with 128 threads; this is the CPU's version of it.
 */
KVP_HD void kvp_paged_share(const struct kvp_paged_shape *s, const void *pool,
			    const uint32_t *slots, const uint32_t *ntok,
			    uint32_t lo, uint32_t hi, uint32_t h,
			    const float *qs, float *part)
{
	uint32_t j = kvp_paged_kv_head(s, h), i, d;

	part[0] = KVP_ATTN_NEG_INF;
	part[1] = 0.0f;
	for (d = 0; d < s->head_dim; d++)
		part[2 + d] = 0.0f;
	for (i = lo; i < hi; i++) {
		const char *k = (const char *)pool +
				kvp_paged_k_off(s, slots[i], j, 0);
		const char *v = (const char *)pool +
				kvp_paged_v_off(s, slots[i], j, 0);

		kvp_attn_block_head(s->dtype, k, v, kvp_paged_ntok(s, ntok, i),
				    s->head_dim, qs, &part[0], &part[1],
				    part + 2);
	}
}

/* Merge head h's splits (in order) into out[h * dim ..]. */
KVP_HD void kvp_paged_merge_head(float *scratch, uint32_t h, uint32_t splits,
				 uint32_t dim, float *out)
{
	float *base = kvp_paged_partial(scratch, h, 0, splits, dim);
	uint32_t sp;

	for (sp = 1; sp < splits; sp++) {
		float *p = kvp_paged_partial(scratch, h, sp, splits, dim);

		kvp_attn_merge(&base[0], &base[1], base + 2, p[0], p[1], p + 2,
			       dim);
	}
	kvp_attn_finish(base[1], base + 2, out + (size_t)h * dim, dim);
}

#endif /* KVP_CUDA_PAGED_ATTN_H */
