/*
 * predictor.c - the predictor interface: options, dispatch, and the final
 * sort of every choice by physical block (address order within a layer).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/predict/predict_i.h"

static const struct kvp_predict_ops *const kinds[] = {
	[KVP_PREDICTOR_EXACT] = &kvp_predict_exact_ops,
	[KVP_PREDICTOR_WINDOW] = &kvp_predict_window_ops,
	[KVP_PREDICTOR_LOWRANK] = &kvp_predict_lowrank_ops,
};

#define NKINDS (sizeof(kinds) / sizeof(kinds[0]))

/* The defaults of lib/kv/kv_tunables.h, by name. */
#define KV_DEFAULT(name, type, min, max, def, runtime, choices, doc)           \
	static const uint64_t def_##name = (def);
KVP_KV_TUNABLES(KV_DEFAULT)
#undef KV_DEFAULT

void kvp_predictor_opts_default(struct kvp_predictor_opts *o,
				enum kvp_predictor_kind kind)
{
	memset(o, 0, sizeof(*o));
	o->kind = kind;
	o->budget_tokens = (uint32_t)def_predict_budget_tokens;
	o->sink_tokens = (uint32_t)def_sink_tokens;
	o->rank = (uint32_t)def_lowrank_rank;
	o->fit_tokens = (uint32_t)def_lowrank_fit_tokens;
	o->power_iters = 4;
	o->max_seqs = 64;
	o->seed = 1;
	(void)def_prefetch_depth_layers;
	(void)def_predictor;
	(void)def_kv_block_tokens;
	(void)def_attention_threads;
}

const char *kvp_predictor_kind_name(enum kvp_predictor_kind kind)
{
	return (unsigned)kind < NKINDS ? kinds[kind]->name : "?";
}

int kvp_predictor_kind_parse(const char *name, enum kvp_predictor_kind *out)
{
	unsigned i;

	for (i = 0; name && i < NKINDS; i++) {
		if (!strcmp(name, kinds[i]->name)) {
			*out = (enum kvp_predictor_kind)i;
			return 0;
		}
	}
	return -EINVAL;
}

uint32_t kvp_predictor_max_rank(const struct kvp_kv_geometry *g)
{
	return g->kv_heads * g->head_dim;
}

int kvp_predictor_create(const struct kvp_kv_geometry *g,
			 const struct kvp_predictor_opts *o,
			 struct kvp_predictor **out)
{
	struct kvp_predictor *p;
	int err;

	if (kvp_kv_geometry_check(g) || !o || (unsigned)o->kind >= NKINDS ||
	    o->max_seqs == 0)
		return -EINVAL;
	if (o->kind != KVP_PREDICTOR_EXACT &&
	    o->budget_tokens < g->block_tokens)
		return -EINVAL;
	if (o->kind == KVP_PREDICTOR_LOWRANK &&
	    (o->rank == 0 || o->rank > kvp_predictor_max_rank(g) ||
	     o->fit_tokens == 0))
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->g = *g;
	p->o = *o;
	if (p->o.power_iters == 0)
		p->o.power_iters = 1;
	p->ops = kinds[o->kind];
	err = p->ops->init ? p->ops->init(p) : 0;
	if (err) {
		free(p);
		return err;
	}
	*out = p;
	return 0;
}

void kvp_predictor_destroy(struct kvp_predictor *p)
{
	if (!p)
		return;
	if (p->ops->fini)
		p->ops->fini(p);
	free(p);
}

enum kvp_predictor_kind kvp_predictor_kind(const struct kvp_predictor *p)
{
	return p->o.kind;
}

bool kvp_predictor_needs_query(const struct kvp_predictor *p)
{
	return p->o.kind == KVP_PREDICTOR_LOWRANK;
}

bool kvp_predictor_needs_keys(const struct kvp_predictor *p)
{
	return p->ops == &kvp_predict_lowrank_ops;
}

int kvp_predictor_retune(struct kvp_predictor *p,
			 const struct kvp_predictor_opts *o)
{
	if ((unsigned)o->kind >= NKINDS)
		return -EINVAL;
	if (o->kind == KVP_PREDICTOR_LOWRANK &&
	    p->ops != &kvp_predict_lowrank_ops)
		return -EOPNOTSUPP;
	if (o->kind != KVP_PREDICTOR_EXACT &&
	    o->budget_tokens < p->g.block_tokens)
		return -EINVAL;
	p->o.kind = o->kind;
	p->o.budget_tokens = o->budget_tokens;
	p->o.sink_tokens = o->sink_tokens;
	return 0;
}

int kvp_predictor_fit(struct kvp_predictor *p, uint32_t layer,
		      const struct kvp_attn_blocks *sample)
{
	if (layer >= p->g.layers || !sample || sample->n == 0)
		return -EINVAL;
	return p->ops->fit ? p->ops->fit(p, layer, sample) : 0;
}

int kvp_predictor_observe(struct kvp_predictor *p, uint32_t seq, uint32_t layer,
			  uint64_t token, uint32_t ntokens, const void *kvblock)
{
	if (seq >= p->o.max_seqs || layer >= p->g.layers || ntokens == 0 ||
	    token % p->g.block_tokens + ntokens > p->g.block_tokens)
		return -EINVAL;
	return p->ops->observe
		   ? p->ops->observe(p, seq, layer, token, ntokens, kvblock)
		   : 0;
}

void kvp_predictor_forget(struct kvp_predictor *p, uint32_t seq)
{
	if (seq < p->o.max_seqs && p->ops->forget)
		p->ops->forget(p, seq);
}

size_t kvp_predictor_max_blocks(const struct kvp_predictor *p, uint32_t nblocks)
{
	return kvp_predictor_opts_max_blocks(&p->o, p->g.block_tokens, nblocks);
}

size_t kvp_predictor_opts_max_blocks(const struct kvp_predictor_opts *o,
				     uint32_t block_tokens, uint32_t nblocks)
{
	uint32_t b;

	if (o->kind == KVP_PREDICTOR_EXACT)
		return nblocks;
	b = kvp_budget_blocks(o->budget_tokens, block_tokens) + 1;
	return nblocks < b ? nblocks : b;
}

static int cmp_phys(const void *a, const void *b, void *arg)
{
	const uint32_t *map = arg;
	uint32_t x = map[*(const uint32_t *)a], y = map[*(const uint32_t *)b];

	return x < y ? -1 : x > y;
}

int kvp_predictor_select(struct kvp_predictor *p, uint32_t seq, uint32_t layer,
			 const struct kvp_block_table *bt, const float *q,
			 uint32_t *lblocks, size_t cap, size_t *n)
{
	uint32_t nb = kvp_block_table_blocks(bt);
	size_t got = 0;
	int err;

	if (seq >= p->o.max_seqs || layer >= p->g.layers || nb == 0 ||
	    kvp_block_table_block_tokens(bt) != p->g.block_tokens)
		return -EINVAL;
	if (kvp_predictor_needs_query(p) && !q)
		return -EINVAL;
	if (cap < kvp_predictor_max_blocks(p, nb))
		return -ENOSPC;
	err = kinds[p->o.kind]->select(p, seq, layer, bt, q, lblocks, &got);
	if (err)
		return err;
	qsort_r(lblocks, got, sizeof(*lblocks), cmp_phys,
		(void *)kvp_block_table_map(bt));
	*n = got;
	return 0;
}

size_t kvp_predictor_metadata_bytes(const struct kvp_predictor *p)
{
	return p->ops->metadata_bytes ? p->ops->metadata_bytes(p) : 0;
}

size_t kvp_predictor_metadata_peak(const struct kvp_predictor *p,
				   const uint64_t *more)
{
	return p->ops->metadata_peak ? p->ops->metadata_peak(p, more)
				     : kvp_predictor_metadata_bytes(p);
}

int kvp_predictor_reserve(struct kvp_predictor *p, const uint64_t *more)
{
	return p->ops->reserve ? p->ops->reserve(p, more) : 0;
}

double kvp_predictor_metadata_ratio(const struct kvp_predictor *p)
{
	if (!kvp_predictor_needs_keys(p))
		return 0;
	return (double)p->o.rank * 2 / (double)kvp_kv_token_layer_bytes(&p->g);
}
