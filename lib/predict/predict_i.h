/*
 * predict_i.h - private: what each predictor implements (lib/predict_*.c).
 */
#ifndef KVP_PREDICT_I_H
#define KVP_PREDICT_I_H

#include "lib/predict/predictor.h"

struct kvp_predictor {
	struct kvp_kv_geometry g;    /* copy */
	struct kvp_predictor_opts o; /* copy; kind: the one selecting */
	const struct kvp_predict_ops *ops; /* the created kind: its state */
	void *priv; /* the created kind's state */
};

struct kvp_predict_ops {
	const char *name;
	int (*init)(struct kvp_predictor *p);
	void (*fini)(struct kvp_predictor *p);
	int (*fit)(struct kvp_predictor *p, uint32_t layer,
		   const struct kvp_attn_blocks *sample);
	int (*observe)(struct kvp_predictor *p, uint32_t seq, uint32_t layer,
		       uint64_t token, uint32_t ntokens, const void *kvblock);
	void (*forget)(struct kvp_predictor *p, uint32_t seq);
	/* Write the chosen logical blocks, any order, distinct; cap is
	 * enough (checked by the caller). */
	int (*select)(struct kvp_predictor *p, uint32_t seq, uint32_t layer,
		      const struct kvp_block_table *bt, const float *q,
		      uint32_t *lblocks, size_t *n);
	size_t (*metadata_bytes)(const struct kvp_predictor *p);
	size_t (*metadata_peak)(const struct kvp_predictor *p,
				const uint64_t *more);
	int (*reserve)(struct kvp_predictor *p, const uint64_t *more);
};

extern const struct kvp_predict_ops kvp_predict_exact_ops;
extern const struct kvp_predict_ops kvp_predict_window_ops;
extern const struct kvp_predict_ops kvp_predict_lowrank_ops;

/* Blocks a sparse predictor may choose: budget / G, at least 1. */
static inline uint32_t kvp_budget_blocks(uint32_t budget_tokens, uint32_t G)
{
	uint32_t n = budget_tokens / G;

	return n ? n : 1;
}

static inline uint32_t kvp_predict_budget_blocks(const struct kvp_predictor *p)
{
	return kvp_budget_blocks(p->o.budget_tokens, p->g.block_tokens);
}

#endif /* KVP_PREDICT_I_H */
