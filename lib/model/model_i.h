/*
 * model_i.h - what the model's files share: the weights and the math.
 */
#ifndef KVP_MODEL_I_H
#define KVP_MODEL_I_H

#include <stddef.h>
#include <stdint.h>

#include "lib/model/model.h"

/* Pointers into the mapping (checkpoint) or the allocation (random). */
struct kvp_model_weights {
	const float *embed;	 /* [vocab][dim] */
	const float *att_norm;	 /* [layers][dim] */
	const float *wq;	 /* [layers][q_heads * head_dim][dim] */
	const float *wk;	 /* [layers][kv_heads * head_dim][dim] */
	const float *wv;	 /* [layers][kv_heads * head_dim][dim] */
	const float *wo;	 /* [layers][dim][q_heads * head_dim] */
	const float *ffn_norm;	 /* [layers][dim] */
	const float *w1;	 /* [layers][hidden_dim][dim] */
	const float *w2;	 /* [layers][dim][hidden_dim] */
	const float *w3;	 /* [layers][hidden_dim][dim] */
	const float *final_norm; /* [dim] */
	const float *cls;	 /* [vocab][dim] (the embedding when tied) */
};

struct kvp_model {
	struct kvp_model_config cfg;
	struct kvp_model_weights w;
	char *name;	/* path or "random:PRESET" */
	void *map;	/* the checkpoint's mapping, or NULL */
	size_t map_len; /* its length */
	float *alloc;	/* random weights, or NULL */
	size_t bytes;	/* weight bytes */
};

/* A pool of workers that split index ranges (forward.c). */
struct kvp_mpool;
int kvp_mpool_create(unsigned nthreads, struct kvp_mpool **out);
void kvp_mpool_destroy(struct kvp_mpool *p);
typedef void (*kvp_mpool_fn)(void *arg, uint32_t lo, uint32_t hi);
/* fn over [0, n) split in contiguous ranges, one per worker, caller too;
 * returns when all are done.  work: rough cost of the whole, below which
 * the caller runs it alone. */
void kvp_mpool_run(struct kvp_mpool *p, uint32_t n, uint64_t work,
		   kvp_mpool_fn fn, void *arg);

/* out[t][r] = W[r] . x[t] for rows [0, rows), tokens [0, ntok); x is
 * [ntok][cols], out [ntok][rows].  Rows are split over the pool. */
void kvp_model_matmul(struct kvp_mpool *p, float *out, const float *x,
		      const float *w, uint32_t ntok, uint32_t rows,
		      uint32_t cols);
/* out = x / rms(x) * w over n (out may be x). */
void kvp_model_rmsnorm(float *out, const float *x, const float *w, uint32_t n);
/* Rotate adjacent pairs of each head of v (nheads * head_dim) for pos. */
void kvp_model_rope(float *v, uint32_t nheads, uint32_t head_dim,
		    uint64_t pos);
/* h1 = silu(h1) * h3 over n. */
void kvp_model_swiglu(float *h1, const float *h3, uint32_t n);

#endif /* KVP_MODEL_I_H */
