/*
 * kvcache.c - the KV cache (kvcache.h): create and destroy, totals, the
 * block table text and the view's hook, accessors.  Its other parts are
 * in the files kvcache_i.h lists.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kmod-helpers/mem.h"
#include "lib/kv/kvcache_i.h"

#define KV_DEFAULT(name, type, min, max, def, runtime, choices, doc)           \
	static const uint64_t kvdef_##name __attribute__((unused)) = (def);
KVP_KV_TUNABLES(KV_DEFAULT)
#undef KV_DEFAULT

/* Each backend's ops, by enum kvp_kvcache_backend. */
static const struct kvc_backend_ops *const backends[] = {
	[KVP_KVCACHE_PAGER] = &kvc_backend_pager,
	[KVP_KVCACHE_RAM] = &kvc_backend_ram,
	[KVP_KVCACHE_MMAP] = &kvc_backend_mmap,
};

const char *kvp_kvcache_backend_name(enum kvp_kvcache_backend b)
{
	return (unsigned)b < sizeof(backends) / sizeof(backends[0])
		   ? backends[b]->name
		   : "?";
}

void kvp_kvcache_opts_default(struct kvp_kvcache_opts *o,
			      const struct kvp_kv_geometry *g)
{
	memset(o, 0, sizeof(*o));
	if (g)
		o->geo = *g;
	o->max_seqs = 1;
	o->backend = KVP_KVCACHE_PAGER;
	o->prefetch = true;
	o->prefetch_depth = (uint32_t)kvdef_prefetch_depth_layers;
	o->cross_step = true;
	o->cold_after = -1;
	kvp_predictor_opts_default(&o->pred,
				   (enum kvp_predictor_kind)kvdef_predictor);
	o->attn_threads = (unsigned)kvdef_attention_threads;
	o->reuse_slots = true;
}

/* ---- growable scratch ---------------------------------------------- */

int kvc_grow(void **p, size_t *cap, size_t need, size_t elem)
{
	void *np;
	size_t nc;

	if (need <= *cap)
		return 0;
	nc = *cap ? *cap : 64;
	while (nc < need)
		nc *= 2;
	np = realloc(*p, nc * elem);
	if (!np)
		return -ENOMEM;
	*p = np;
	*cap = nc;
	return 0;
}

void *kvc_big_alloc(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

/* ---- create / destroy -------------------------------------------------- */

static int cow_noop(void *arg, const struct kvp_block_copy *cp)
{
	struct kvp_kvcache *c = arg;

	/* The shared partial block's data is in each holder's rolling
	 * buffer: the writer keeps its own, now for cp->dst. */
	c->st.cow_copies++;
	return 0;
}

int kvp_kvcache_layout_for(const struct kvp_kvcache_opts *o,
			   struct kvp_kv_layout *out)
{
	uint64_t cap_blocks;

	if (!o || !out || kvp_kv_geometry_check(&o->geo))
		return -EINVAL;
	cap_blocks = (o->capacity_tokens + o->geo.block_tokens - 1) /
			 o->geo.block_tokens +
		     o->max_seqs;
	return kvp_kv_layout_init(out, &o->geo, cap_blocks,
				  o->pager_block_bytes);
}

int kvp_kvcache_create(const struct kvp_kvcache_opts *o,
		       struct kvp_kvcache **out)
{
	struct kvp_kvcache *c;
	size_t pbb;
	int err;

	if (!o || !out || kvp_kv_geometry_check(&o->geo) || !o->max_seqs ||
	    !o->capacity_tokens || o->backend > KVP_KVCACHE_MMAP)
		return -EINVAL;
	if (o->prefetch &&
	    (o->prefetch_depth < 1 ||
	     (o->geo.layers > 1 && o->prefetch_depth > o->geo.layers - 1)))
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->o = *o;
	c->g = o->geo;
	c->be = backends[o->backend];
	if (!c->o.prefetch)
		c->o.prefetch_depth = 1;
	if (c->o.prefetch_depth < 1)
		c->o.prefetch_depth = 1;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->tlock, NULL);
	pthread_cond_init(&c->cv, NULL);
	err = kvp_kvcache_layout_for(o, &c->l);
	if (err)
		goto fail;
	pbb = c->l.pager_block_bytes;
	c->stride = c->l.block_stride;
	c->bb = kvp_kv_block_bytes(&c->g);
	c->qfloats = (size_t)c->g.q_heads * c->g.head_dim;
	c->npb = c->l.region_bytes / pbb;
	c->budget = o->budget_bytes ? o->budget_bytes : c->l.region_bytes / 4;
	c->cold = o->cold_after < 0 ? o->pred.kind == KVP_PREDICTOR_EXACT
				    : o->cold_after > 0;
	err = -ENOMEM;
	c->seqs = calloc(o->max_seqs, sizeof(*c->seqs));
	c->fitted = calloc(c->g.layers, sizeof(bool));
	c->step_seqs = calloc(o->max_seqs, sizeof(uint32_t));
	c->qbuf = malloc(sizeof(float) * c->qfloats);
	c->obuf = malloc(sizeof(float) * c->qfloats);
	c->pbbuf = aligned_alloc(4096, pbb);
	if (!c->seqs || !c->fitted || !c->step_seqs || !c->qbuf || !c->obuf ||
	    !c->pbbuf)
		goto fail;
	err = kvp_block_alloc_create(c->l.capacity_blocks, &c->alloc);
	if (err)
		goto fail;
	kvp_block_alloc_set_copy(c->alloc, cow_noop, c);
	c->pred_kind0 = o->pred.kind;
	{
		struct kvp_predictor_opts po = o->pred;

		if (po.max_seqs < o->max_seqs)
			po.max_seqs = o->max_seqs;
		err = kvp_predictor_create(&c->g, &po, &c->pred);
		if (err)
			goto fail;
	}
	err = kvp_attn_pool_create(o->attn_threads, &c->pool);
	if (err)
		goto fail;

	err = c->be->open(c);
	if (err)
		goto fail;
	err = kvc_slots_init(c);
	if (err)
		goto fail;
	err = kvc_plans_init(c);
	if (err)
		goto fail;
	err = kvc_dev_init(c);
	if (err)
		goto fail;
	*out = c;
	return 0;
fail:
	kvp_kvcache_destroy(c);
	return err;
}

void kvp_kvcache_destroy(struct kvp_kvcache *c)
{
	uint32_t i;

	if (!c)
		return;
	kvc_plans_fini(c);
	for (i = 0; c->seqs && i < c->o.max_seqs; i++)
		if (c->seqs[i].live)
			kvc_seq_drop(c, i, false);
	kvc_dev_fini(c);
	if (c->sl_of && c->pager) {
		/* a pager passed in gets back what the slots took */
		struct kvp_config cfg;

		kvp_pager_config(c->pager, &cfg);
		cfg.ram_budget_bytes = c->budget + kvc_slots_bytes(c);
		(void)kvp_pager_reconfigure(c->pager, &cfg, NULL);
	}
	kvc_slots_fini(c);
	c->be->close(c);
	kvc_samples_free(c);
	kvp_attn_pool_destroy(c->pool);
	kvp_predictor_destroy(c->pred);
	kvp_block_alloc_destroy(c->alloc);
	kvp_mem_io_free(c->stage, c->stage_cap);
	free(c->step_seqs);
	free(c->sel);
	free(c->ptrs);
	free(c->ntok);
	free(c->qbuf);
	free(c->obuf);
	free(c->pbbuf);
	free(c->seqs);
	free(c->fitted);
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->tlock);
	pthread_cond_destroy(&c->cv);
	free(c);
}

void kvp_kvcache_stats(const struct kvp_kvcache *c,
		       struct kvp_kvcache_stats *out)
{
	struct kvp_kvcache *m = (struct kvp_kvcache *)c;

	*out = c->st;
	pthread_mutex_lock(&m->mu);
	out->t_load_busy_s = c->busy_s;
	pthread_mutex_unlock(&m->mu);
}

/* ---- the block table text and the view's hook ------------------------ */

int kvp_kvcache_format_block_table(struct kvp_kvcache *c, uint32_t id,
				   char *buf, size_t len)
{
	const struct kvc_seq *s;
	uint32_t nb, lb, G;
	size_t used = 0;
	int w;

	if (!kvc_seq_ok(c, id) || (!buf && len))
		return -EINVAL;
	s = &c->seqs[id];
	nb = kvp_block_table_blocks(s->bt);
	G = c->g.block_tokens;
	if (len)
		buf[0] = 0;
	for (lb = 0; lb < nb; lb++) {
		uint32_t p = kvp_block_table_physical(s->bt, lb);
		const char *where;

		/* a partial last block is rolling in every layer */
		if (s->fill[0] % G && lb == s->fill[0] / G)
			where = "rolling";
		else
			where = c->be->where(
			    c, kvp_kv_layout_pager_block(&c->l, 0, p));
		w = snprintf(used < len ? buf + used : NULL,
			     used < len ? len - used : 0, "%u %u %u %u %s\n",
			     lb, p, kvp_block_table_valid(s->bt, lb),
			     kvp_block_alloc_refcount(c->alloc, p), where);
		if (w < 0)
			return -EINVAL;
		used += (size_t)w;
	}
	return (int)used;
}

uint32_t kvp_kvcache_view_list(void *cache, uint32_t *ids, uint32_t max)
{
	struct kvp_kvcache *c = cache;
	uint32_t n;

	pthread_mutex_lock(&c->tlock);
	n = kvp_kvcache_seq_list(c, ids, max);
	pthread_mutex_unlock(&c->tlock);
	return n;
}

int kvp_kvcache_view_block_table(void *cache, uint32_t id, char *buf,
				 size_t len)
{
	struct kvp_kvcache *c = cache;
	int n;

	pthread_mutex_lock(&c->tlock);
	n = kvc_seq_ok(c, id) ? kvp_kvcache_format_block_table(c, id, buf, len)
			      : -ENOENT;
	pthread_mutex_unlock(&c->tlock);
	return n;
}

/* ---- accessors ------------------------------------------------------------ */

const struct kvp_kv_layout *kvp_kvcache_layout(const struct kvp_kvcache *c)
{
	return &c->l;
}

struct kvp_region *kvp_kvcache_region(const struct kvp_kvcache *c)
{
	return c->region;
}

struct kvp_pager *kvp_kvcache_pager(const struct kvp_kvcache *c)
{
	return c->pager;
}

struct kvp_predictor *kvp_kvcache_predictor(const struct kvp_kvcache *c)
{
	return c->pred;
}

uint64_t kvp_kvcache_budget_bytes(const struct kvp_kvcache *c)
{
	return c->budget + kvc_slots_bytes(c);
}

void kvp_kvcache_ram(const struct kvp_kvcache *c, struct kvp_kvcache_ram *out)
{
	uint64_t rb = ((uint64_t)c->g.layers * c->stride + 4095) / 4096 * 4096;
	uint32_t i;

	memset(out, 0, sizeof(*out));
	out->slots = kvc_slots_bytes(c);
	out->frames = c->o.backend == KVP_KVCACHE_RAM ? c->l.region_bytes
						      : c->budget + out->slots;
	out->metadata = kvp_predictor_metadata_bytes(c->pred);
	for (i = 0; i < c->o.max_seqs; i++)
		if (c->seqs[i].live)
			out->rolling += rb; /* as seq.c allocates it */
	out->staging = c->stage_cap + c->l.pager_block_bytes;
	out->total = out->frames + out->metadata + out->rolling + out->staging;
}

/* @steps more tokens for each live sequence, an entry for each of the
 * predictor's sequences (create gave it at least max_seqs); NULL: out of
 * memory. */
static uint64_t *kvc_more(const struct kvp_kvcache *c, uint64_t steps)
{
	uint32_t n = c->o.pred.max_seqs > c->o.max_seqs ? c->o.pred.max_seqs
							: c->o.max_seqs;
	uint64_t *more = calloc(n, sizeof(*more));
	uint32_t i;

	for (i = 0; more && i < c->o.max_seqs; i++)
		more[i] = c->seqs[i].live ? steps : 0;
	return more;
}

uint64_t kvp_kvcache_metadata_peak(const struct kvp_kvcache *c, uint64_t steps)
{
	uint64_t *more = kvc_more(c, steps);
	uint64_t peak = more ? kvp_predictor_metadata_peak(c->pred, more)
			     : UINT64_MAX;

	free(more);
	return peak;
}

int kvp_kvcache_fit_ram(struct kvp_kvcache *c, uint64_t total, uint64_t steps)
{
	struct kvp_kvcache_ram ram;
	struct kvp_config cfg;
	uint64_t other, frames, peak, *more;
	int err;

	if (c->o.backend != KVP_KVCACHE_PAGER || !c->pager)
		return -EINVAL;
	more = kvc_more(c, steps);
	if (!more)
		return -ENOMEM;
	peak = kvp_predictor_metadata_peak(c->pred, more);
	kvp_kvcache_ram(c, &ram);
	/* Staging without the prefill's area, which goes back (a prefill
	 * takes it again); the metadata as the steps will grow it, not as
	 * it is: the frames are not fitted again. */
	other = peak + ram.rolling + ram.staging - c->stage_cap;
	if (other < peak || other + (2u << 20) < other ||
	    other + (2u << 20) > total) {
		free(more);
		return -ENOSPC;
	}
	kvp_mem_io_free(c->stage, c->stage_cap);
	c->stage = NULL;
	c->stage_cap = 0;
	frames = total - other;
	if (c->sl_of) { /* the region keeps its floor, the slots the rest */
		err = kvc_slots_refit(c, frames);
	} else {
		kvp_pager_config(c->pager, &cfg);
		cfg.ram_budget_bytes = frames;
		err = kvp_pager_reconfigure(c->pager, &cfg, NULL);
		if (!err)
			c->budget = cfg.ram_budget_bytes;
	}
	/* The room the steps take, held now, the frames made smaller
	 * first: the decode allocates no metadata. */
	if (!err)
		err = kvp_predictor_reserve(c->pred, more);
	free(more);
	return err;
}

uint64_t kvp_kvcache_kv_bytes(const struct kvp_kvcache *c)
{
	uint64_t t = 0;
	uint32_t i;

	for (i = 0; i < c->o.max_seqs; i++)
		if (c->seqs[i].live)
			t += kvp_block_table_tokens(c->seqs[i].bt);
	return t * kvp_kv_token_bytes(&c->g);
}

/* ---- tunables on a running cache ------------------------------------ */

/* Whether @kv's predictor may choose more blocks a layer and sequence
 * than the device path was made for at create (d_cap entries over all
 * sequences, and the pool sized for them): a step's plan that does not
 * fit fails it, -E2BIG.  Reads only what create fixed. */
static bool kv_more_than_device(const struct kvp_kvcache *c,
				const struct kvp_kv_config *kv)
{
	struct kvp_predictor_opts po = {
		.kind = (enum kvp_predictor_kind)kv->predictor,
		.budget_tokens = kv->predict_budget_tokens < UINT32_MAX
				     ? (uint32_t)kv->predict_budget_tokens
				     : UINT32_MAX,
	};

	return kvp_predictor_opts_max_blocks(&po, c->g.block_tokens,
					     c->l.capacity_blocks) >
	       c->d_cap / c->o.max_seqs;
}

int kvp_kvcache_retune_check(const struct kvp_kvcache *c,
			     const struct kvp_kv_config *kv, const char **bad)
{
	const char *b = NULL;
	int err = -EINVAL;

	/* Only what create fixed is read here: any thread may call. */
	if (kv->kv_block_tokens != c->g.block_tokens)
		b = "kv_block_tokens";
	else if (kv->lowrank_rank != c->o.pred.rank)
		b = "lowrank_rank";
	else if (kv->lowrank_fit_tokens != c->o.pred.fit_tokens)
		b = "lowrank_fit_tokens";
	else if (kv->attention_threads != c->o.attn_threads)
		b = "attention_threads";
	else if (kv->predictor > KVP_PREDICTOR_LOWRANK)
		b = "predictor";
	else if (kv->predictor == KVP_PREDICTOR_LOWRANK &&
		 c->pred_kind0 != KVP_PREDICTOR_LOWRANK) {
		b = "predictor";
		err = -EOPNOTSUPP;
	} else if (kv->predictor != KVP_PREDICTOR_EXACT &&
		   kv->predict_budget_tokens < c->g.block_tokens)
		b = "predict_budget_tokens";
	else if (c->da && kv_more_than_device(c, kv)) {
		/* the device path holds what the first predictor chooses */
		b = kv->predictor == KVP_PREDICTOR_EXACT
			? "predictor"
			: "predict_budget_tokens";
		err = -E2BIG;
	} else if (kv->prefetch_depth_layers >= c->plans_cap ||
		 (c->g.layers > 1 && kv->prefetch_depth_layers >= c->g.layers))
		b = "prefetch_depth_layers";
	if (!b)
		return 0;
	if (bad)
		*bad = b;
	return err;
}

int kvp_kvcache_retune(struct kvp_kvcache *c, const struct kvp_kv_config *kv,
		       const char **bad)
{
	struct kvp_predictor_opts po = c->o.pred;
	uint32_t depth = (uint32_t)kv->prefetch_depth_layers;
	int err = kvp_kvcache_retune_check(c, kv, bad);

	if (err)
		return err;
	if (depth && c->be->async_prefetch) {
		err = kvc_waiter_start(c);
		if (err) {
			if (bad)
				*bad = "prefetch_depth_layers";
			return err;
		}
	}
	po.kind = (enum kvp_predictor_kind)kv->predictor;
	po.budget_tokens = (uint32_t)kv->predict_budget_tokens;
	po.sink_tokens = (uint32_t)kv->sink_tokens;
	/* plans made ahead were chosen and sized by the old settings */
	kvp_kvcache_drain(c);
	err = kvp_predictor_retune(c->pred, &po);
	if (err) { /* the check above makes this unreachable */
		if (bad)
			*bad = "predictor";
		return err;
	}
	c->o.pred.kind = po.kind;
	c->o.pred.budget_tokens = po.budget_tokens;
	c->o.pred.sink_tokens = po.sink_tokens;
	c->cold = c->o.cold_after < 0 ? po.kind == KVP_PREDICTOR_EXACT
				      : c->o.cold_after > 0;
	c->o.prefetch = depth > 0;
	c->o.prefetch_depth = depth ? depth : 1;
	pthread_mutex_lock(&c->mu);
	c->nplans = c->o.prefetch_depth + 1; /* the queue is empty: drained */
	c->wq_head = 0;
	pthread_mutex_unlock(&c->mu);
	/* slots taken or given back as the predictor and prefetch now want;
	 * a refusal (more pinned) keeps the split, and plans use slots only
	 * while they are wanted */
	if (c->sl_of)
		(void)kvc_slots_refit(c, c->budget + kvc_slots_bytes(c));
	return 0;
}
