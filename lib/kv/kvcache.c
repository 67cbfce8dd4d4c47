/*
 * kvcache.c - a KV cache on a pager region (see kvcache.h).
 *
 * The decode step, per layer l (L layers, depth d, plans in a ring of d+1):
 *
 *   plan(l+d)      predictor select for every sequence, pager blocks
 *                  deduplicated, residency counted (reuse), prefetch
 *                  submitted; the waiter thread records its completion
 *   fill(l)        the new token's K and V into the rolling block, observe
 *   wait(l)        on the waiter's record of plan l; pin its pager blocks
 *   compute(l)     attention over plan l's blocks + the rolling block
 *   unpin(l)       (COLD for a scan), flush rolling blocks that filled
 *
 * Layer l's blocks are planned from fill[l] as it is before the step's
 * token lands in layer l: the region blocks are the logical blocks below
 * fill[l] / G; the block fill[l] / G is the rolling one.  A plan made for
 * the next step (cross_step) is made after layer l was flushed in this
 * step, so the same rule holds; the only block that can change physical
 * number between plan and compute is the rolling one (copy on write),
 * which is never in a plan.
 *
 * Flushes are made with no prefetch in flight for that layer's pager
 * blocks (plans for layer l are submitted only after layer l computed in
 * the previous step, or before it in this one and then waited for), so the
 * ABSENT check before a store write cannot race with a load of ours.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "lib/view/fuse_view.h"
#include "lib/kv/kvcache_i.h"

#define KV_DEFAULT(name, type, min, max, def, runtime, choices, doc)           \
	static const uint64_t kvdef_##name __attribute__((unused)) = (def);
KVP_KV_TUNABLES(KV_DEFAULT)
#undef KV_DEFAULT

static bool kvc_source_ok(const struct kvp_kv_source *src)
{
	return src && src->ops && src->ops->fill && src->ops->query;
}

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

static int stage_reserve(struct kvp_kvcache *c, size_t bytes)
{
	void *p;

	if (bytes <= c->stage_cap)
		return 0;
	if (c->stage)
		munmap(c->stage, c->stage_cap);
	c->stage = NULL;
	c->stage_cap = 0;
	p = kvc_big_alloc(bytes);
	if (!p)
		return -ENOMEM;
	c->stage = p;
	c->stage_cap = bytes;
	return 0;
}

/* ---- reading and writing KV blocks ------------------------------------- */

/* Physical blocks [p, p + n) of layer from data (n * stride bytes). */
static int write_blocks(struct kvp_kvcache *c, uint32_t layer, uint32_t p,
			uint32_t n, const char *data, bool flush)
{
	return c->be->write(c, kvp_kv_layout_offset(&c->l, layer, p), data,
			    (size_t)n * c->stride, flush);
}

/* Logical block lb of seq in layer as it is now (rolling or backing). */
static int read_logical(struct kvp_kvcache *c, struct kvc_seq *s,
			uint32_t layer, uint32_t lb, char *dst)
{
	uint32_t p;

	if (s->fill[layer] % c->g.block_tokens &&
	    lb == s->fill[layer] / c->g.block_tokens) {
		memcpy(dst, s->rb + (size_t)layer * c->stride, c->stride);
		return 0;
	}
	p = kvp_block_table_physical(s->bt, lb);
	if (p == KVP_BLOCK_NONE)
		return -EINVAL;
	return c->be->read(c, layer, &p, 1, dst);
}

/* ---- the waiter thread ----------------------------------------------- */

static void *waiter_main(void *arg)
{
	struct kvp_kvcache *c = arg;
	struct kvc_plan *pl;
	int err;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		while (!c->wq_len && !c->waiter_stop)
			pthread_cond_wait(&c->cv, &c->mu);
		if (!c->wq_len && c->waiter_stop)
			break;
		pl = c->wq[c->wq_head];
		pthread_mutex_unlock(&c->mu);
		err = kvp_prefetch_wait(pl->pf, -1);
		pthread_mutex_lock(&c->mu);
		pl->t_done = kvc_now_s();
		pl->err = err;
		pl->done = true;
		/* the union of [submit, done] intervals, in submit order */
		if (pl->t_submit >= c->busy_end)
			c->busy_s += pl->t_done - pl->t_submit;
		else if (pl->t_done > c->busy_end)
			c->busy_s += pl->t_done - c->busy_end;
		if (pl->t_done > c->busy_end)
			c->busy_end = pl->t_done;
		c->wq_head = (c->wq_head + 1) % c->nplans;
		c->wq_len--;
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

static void plan_wait(struct kvp_kvcache *c, struct kvc_plan *pl)
{
	if (!pl->queued)
		return;
	pthread_mutex_lock(&c->mu);
	while (!pl->done)
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
}

/* Pin or unpin a plan's pager blocks, run by run. */
static int plan_pin(struct kvp_kvcache *c, struct kvc_plan *pl, bool pin)
{
	size_t i = 0, j;
	int err;

	while (i < pl->npb) {
		for (j = i + 1; j < pl->npb && pl->pb[j] == pl->pb[j - 1] + 1;
		     j++)
			;
		err = 0;
		if (pin)
			err = c->be->pin(c, pl->pb[i], j - i);
		else
			c->be->unpin(c, pl->pb[i], j - i);
		if (err && pin) {
			/* undo the runs pinned so far */
			size_t k = 0, m;

			while (k < i) {
				for (m = k + 1;
				     m < i && pl->pb[m] == pl->pb[m - 1] + 1;
				     m++)
					;
				c->be->unpin(c, pl->pb[k], m - k);
				k = m;
			}
			return err;
		}
		if (!pin && c->cold && c->be->advise_cold)
			c->be->advise_cold(c, pl->pb[i], j - i);
		i = j;
	}
	return 0;
}

static void plan_release(struct kvp_kvcache *c, struct kvc_plan *pl)
{
	if (!pl->used)
		return;
	plan_wait(c, pl);
	if (pl->pinned)
		plan_pin(c, pl, false);
	pl->pinned = false;
	if (pl->pf)
		kvp_prefetch_release(pl->pf);
	pl->pf = NULL;
	pl->used = pl->queued = pl->done = false;
}

void kvp_kvcache_drain(struct kvp_kvcache *c)
{
	uint32_t i;

	for (i = 0; i < c->nplans; i++)
		plan_release(c, &c->plans[i]);
	c->plans_valid = false;
}

/* The query a plan selects with (kv_source.h: plan_query, else query). */
static int plan_query(struct kvp_kvcache *c, uint32_t seq, uint32_t layer,
		      uint64_t pos, float *q)
{
	const struct kvp_kv_source_ops *ops = c->src.ops;

	return ops->plan_query ? ops->plan_query(c->src.arg, seq, layer, pos, q)
			       : ops->query(c->src.arg, seq, layer, pos, q);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static bool pb_resident(const struct kvc_plan *pl, uint64_t pb)
{
	size_t lo = 0, hi = pl->npb;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (pl->pb[mid] < pb)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < pl->npb && pl->pb[lo] == pb && pl->res[lo];
}

/*
 * Plan layer gl % layers of step gl / layers for the sequences of the
 * step: select, map to pager blocks, count reuse, prefetch.
 */
static int plan_make(struct kvp_kvcache *c, uint64_t gl)
{
	struct kvc_plan *pl = &c->plans[gl % c->nplans];
	uint32_t layer = (uint32_t)(gl % c->g.layers), G = c->g.block_tokens;
	uint64_t ahead = gl / c->g.layers - c->gstep;
	size_t total = 0, i, k, w;
	double t0;
	int err;

	plan_release(c, pl);
	pl->gl = gl;
	pl->layer = layer;
	pl->nseq = c->nstep_seqs;
	pl->chosen = pl->reused = 0;
	if (kvc_grow((void **)&pl->off, &pl->off_cap, pl->nseq + 1,
		     sizeof(size_t)))
		return -ENOMEM;
	for (i = 0; i < pl->nseq; i++) {
		struct kvc_seq *s = &c->seqs[c->step_seqs[i]];
		uint32_t nb = kvp_block_table_blocks(s->bt);
		uint64_t nfull = s->fill[layer] / G;
		size_t cap = kvp_predictor_max_blocks(c->pred, nb), n = 0;
		const float *q = NULL;

		pl->off[i] = total;
		if (kvc_grow((void **)&c->sel, &c->sel_cap, cap + 1,
			     sizeof(uint32_t)) ||
		    kvc_grow((void **)&pl->lb, &pl->lb_cap, total + cap + 1,
			     sizeof(uint32_t)))
			return -ENOMEM;
		if (kvp_predictor_needs_query(c->pred))
			q = c->qbuf;
		t0 = kvc_now_s();
		err = q ? plan_query(c, c->step_seqs[i], layer,
				     kvp_block_table_tokens(s->bt) + ahead,
				     c->qbuf)
			: 0;
		if (!err)
			err = kvp_predictor_select(c->pred, c->step_seqs[i],
						   layer, s->bt, q, c->sel,
						   c->sel_cap, &n);
		c->cur.t_predict_s += kvc_now_s() - t0;
		if (err)
			return err;
		for (k = 0; k < n; k++)
			if (c->sel[k] < nfull)
				pl->lb[total++] = c->sel[k];
	}
	pl->off[pl->nseq] = total;
	if (kvc_grow((void **)&pl->pb, &pl->pb_cap, total + 1,
		     sizeof(uint64_t)))
		return -ENOMEM;
	{
		size_t oc = pl->pb_cap;
		bool *nr = realloc(pl->res, sizeof(bool) * oc);

		if (!nr)
			return -ENOMEM;
		pl->res = nr;
	}
	for (i = 0, k = 0; i < pl->nseq; i++) {
		struct kvc_seq *s = &c->seqs[c->step_seqs[i]];
		const uint32_t *map = kvp_block_table_map(s->bt);

		for (w = pl->off[i]; w < pl->off[i + 1]; w++)
			pl->pb[k++] = kvp_kv_layout_pager_block(&c->l, layer,
								map[pl->lb[w]]);
	}
	for (i = 1; i < k && pl->pb[i - 1] <= pl->pb[i]; i++)
		;
	if (i < k)
		qsort(pl->pb, k, sizeof(uint64_t), cmp_u64);
	for (i = 0, w = 0; i < k; i++)
		if (!w || pl->pb[w - 1] != pl->pb[i])
			pl->pb[w++] = pl->pb[i];
	pl->npb = w;
	/* reuse: chosen blocks already resident, before anything is read */
	for (i = 0; i < pl->npb; i++)
		pl->res[i] = c->be->resident(c, pl->pb[i]);
	for (i = 0; i < pl->nseq; i++) {
		struct kvc_seq *s = &c->seqs[c->step_seqs[i]];
		const uint32_t *map = kvp_block_table_map(s->bt);

		for (w = pl->off[i]; w < pl->off[i + 1]; w++) {
			pl->chosen++;
			pl->reused +=
			    pb_resident(pl, kvp_kv_layout_pager_block(
						&c->l, layer, map[pl->lb[w]]));
		}
	}
	pl->used = true;
	pl->queued = pl->done = pl->pinned = false;
	pl->pf = NULL;
	pl->err = 0;
	if (!c->o.prefetch || !pl->npb || !c->be->prefetch)
		return 0;
	err = c->be->prefetch(c, pl);
	if (err || !pl->pf)
		return err;
	pthread_mutex_lock(&c->mu);
	c->wq[(c->wq_head + c->wq_len) % c->nplans] = pl;
	c->wq_len++;
	pl->queued = true;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	return 0;
}

static struct kvc_plan *plan_get(struct kvp_kvcache *c, uint64_t gl, int *err)
{
	struct kvc_plan *pl = &c->plans[gl % c->nplans];

	*err = 0;
	if (!pl->used || pl->gl != gl)
		*err = plan_make(c, gl);
	return *err ? NULL : pl;
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

int kvp_kvcache_create(const struct kvp_kvcache_opts *o,
		       struct kvp_kvcache **out)
{
	struct kvp_kvcache *c;
	uint64_t cap_blocks;
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
	cap_blocks = (o->capacity_tokens + o->geo.block_tokens - 1) /
			 o->geo.block_tokens +
		     o->max_seqs;
	err =
	    kvp_kv_layout_init(&c->l, &c->g, cap_blocks, o->pager_block_bytes);
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
	c->nplans = c->o.prefetch_depth + 1;
	/* room for the deepest ring kvp_kvcache_retune may ask for */
	c->plans_cap = c->g.layers > c->nplans ? c->g.layers : c->nplans;
	c->plans = calloc(c->plans_cap, sizeof(*c->plans));
	c->wq = calloc(c->plans_cap, sizeof(*c->wq));
	c->step_seqs = calloc(o->max_seqs, sizeof(uint32_t));
	c->qbuf = malloc(sizeof(float) * c->qfloats);
	c->obuf = malloc(sizeof(float) * c->qfloats);
	c->pbbuf = aligned_alloc(4096, pbb);
	if (!c->seqs || !c->fitted || !c->plans || !c->wq || !c->step_seqs ||
	    !c->qbuf || !c->obuf || !c->pbbuf)
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
	if (c->o.prefetch && c->be->async_prefetch) {
		err = -pthread_create(&c->waiter, NULL, waiter_main, c);
		if (err)
			goto fail;
		c->waiter_on = true;
	}
	*out = c;
	return 0;
fail:
	kvp_kvcache_destroy(c);
	return err;
}

static void seq_drop(struct kvp_kvcache *c, uint32_t id, bool discard);

void kvp_kvcache_destroy(struct kvp_kvcache *c)
{
	uint32_t i;

	if (!c)
		return;
	if (c->view)
		kvp_view_set_seqs(kvp_fuse_view_tree(c->view), NULL, NULL);
	if (c->plans)
		kvp_kvcache_drain(c);
	if (c->waiter_on) {
		pthread_mutex_lock(&c->mu);
		c->waiter_stop = true;
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
		pthread_join(c->waiter, NULL);
	}
	for (i = 0; c->seqs && i < c->o.max_seqs; i++)
		if (c->seqs[i].live)
			seq_drop(c, i, false);
	c->be->close(c);
	for (i = 0; c->plans && i < c->plans_cap; i++) {
		free(c->plans[i].lb);
		free(c->plans[i].off);
		free(c->plans[i].pb);
		free(c->plans[i].res);
	}
	for (i = 0; i < c->nsamples; i++) {
		free(c->samples[i].q);
		free(c->samples[i].out);
		free(c->samples[i].lb);
	}
	free(c->samples);
	kvp_attn_pool_destroy(c->pool);
	kvp_predictor_destroy(c->pred);
	kvp_block_alloc_destroy(c->alloc);
	if (c->stage)
		munmap(c->stage, c->stage_cap);
	free(c->plans);
	free(c->wq);
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

/* ---- sequences -------------------------------------------------------- */

static int seq_init(struct kvp_kvcache *c, uint32_t *id)
{
	uint32_t i;

	for (i = 0; i < c->o.max_seqs; i++)
		if (!c->seqs[i].live)
			break;
	if (i == c->o.max_seqs)
		return -ENOSPC;
	c->seqs[i].fill = calloc(c->g.layers, sizeof(uint64_t));
	c->seqs[i].rbpin = malloc(c->g.layers * sizeof(uint64_t));
	c->seqs[i].rb = aligned_alloc(
	    4096, ((size_t)c->g.layers * c->stride + 4095) / 4096 * 4096);
	if (!c->seqs[i].fill || !c->seqs[i].rb || !c->seqs[i].rbpin) {
		free(c->seqs[i].fill);
		free(c->seqs[i].rb);
		free(c->seqs[i].rbpin);
		c->seqs[i].fill = NULL;
		c->seqs[i].rb = NULL;
		c->seqs[i].rbpin = NULL;
		return -ENOMEM;
	}
	memset(c->seqs[i].rbpin, 0xff, c->g.layers * sizeof(uint64_t));
	memset(c->seqs[i].rb, 0, (size_t)c->g.layers * c->stride);
	*id = i;
	return 0;
}

int kvp_kvcache_seq_create(struct kvp_kvcache *c, uint32_t *id)
{
	int err;

	if (!c || !id)
		return -EINVAL;
	err = seq_init(c, id);
	if (err)
		return err;
	pthread_mutex_lock(&c->tlock);
	err = kvp_block_table_create(c->alloc, c->g.block_tokens,
				     &c->seqs[*id].bt);
	pthread_mutex_unlock(&c->tlock);
	if (err) {
		free(c->seqs[*id].fill);
		free(c->seqs[*id].rb);
		c->seqs[*id].fill = NULL;
		c->seqs[*id].rb = NULL;
		return err;
	}
	pthread_mutex_lock(&c->tlock);
	c->seqs[*id].live = true;
	pthread_mutex_unlock(&c->tlock);
	return 0;
}

static bool seq_ok(const struct kvp_kvcache *c, uint32_t id)
{
	return c && id < c->o.max_seqs && c->seqs[id].live;
}

int kvp_kvcache_seq_fork(struct kvp_kvcache *c, uint32_t parent,
			 uint64_t ntokens, uint32_t *id)
{
	struct kvc_seq *ps, *cs;
	uint32_t layer, G, lb, nb;
	int err;

	if (!seq_ok(c, parent) || !id)
		return -EINVAL;
	ps = &c->seqs[parent];
	if (ntokens == UINT64_MAX)
		ntokens = kvp_block_table_tokens(ps->bt);
	if (ntokens > kvp_block_table_tokens(ps->bt))
		return -EINVAL;
	kvp_kvcache_drain(c);
	err = seq_init(c, id);
	if (err)
		return err;
	cs = &c->seqs[*id];
	pthread_mutex_lock(&c->tlock);
	err = kvp_block_table_fork(ps->bt, ntokens, &cs->bt);
	if (!err)
		cs->live = true;
	pthread_mutex_unlock(&c->tlock);
	if (err) {
		free(cs->fill);
		free(cs->rb);
		cs->fill = NULL;
		cs->rb = NULL;
		return err;
	}
	G = c->g.block_tokens;
	nb = (uint32_t)((ntokens + G - 1) / G);
	for (layer = 0; layer < c->g.layers; layer++) {
		char *rbl = cs->rb + (size_t)layer * c->stride;

		cs->fill[layer] = ntokens;
		/* the shared part of the last block into the rolling buffer */
		if (ntokens % G) {
			err = read_logical(c, ps, layer, nb - 1, rbl);
			if (err)
				goto fail;
		}
		if (!kvp_predictor_needs_keys(c->pred))
			continue;
		for (lb = 0; lb < nb; lb++) {
			uint64_t t0 = (uint64_t)lb * G;
			uint32_t n =
			    (uint32_t)(ntokens - t0 < G ? ntokens - t0 : G);

			err = read_logical(c, cs, layer, lb, c->pbbuf);
			if (!err)
				err = kvp_predictor_observe(c->pred, *id, layer,
							    t0, n, c->pbbuf);
			if (err)
				goto fail;
		}
	}
	return 0;
fail:
	seq_drop(c, *id, true);
	return err;
}

static void seq_drop(struct kvp_kvcache *c, uint32_t id, bool discard)
{
	struct kvc_seq *s = &c->seqs[id];
	uint32_t nb = kvp_block_table_blocks(s->bt), *freed = NULL,
		 *spans = NULL, layer;
	size_t nfreed = 0, nspans, i;

	for (layer = 0; s->rbpin && layer < c->g.layers; layer++)
		if (s->rbpin[layer] != UINT64_MAX)
			c->be->unpin(c, s->rbpin[layer], 1);
	if (discard && nb && c->be->discard) {
		freed = malloc(sizeof(uint32_t) * nb);
		spans = malloc(sizeof(uint32_t) * nb);
	}
	pthread_mutex_lock(&c->tlock);
	s->live = false;
	kvp_block_table_destroy(s->bt, freed && spans ? freed : NULL, &nfreed);
	pthread_mutex_unlock(&c->tlock);
	if (freed && spans) {
		nspans = kvp_block_alloc_free_spans(c->alloc,
						    c->l.blocks_per_pager_block,
						    freed, nfreed, spans);
		for (i = 0; i < nspans; i++) {
			for (layer = 0; layer < c->g.layers; layer++) {
				uint64_t pb = kvp_kv_layout_pager_block(
				    &c->l, layer, spans[i]);

				if (!c->be->discard(c, pb))
					c->st.discarded_pager_blocks++;
			}
		}
	}
	free(freed);
	free(spans);
	kvp_predictor_forget(c->pred, id);
	free(s->fill);
	free(s->rb);
	free(s->rbpin);
	memset(s, 0, sizeof(*s));
}

int kvp_kvcache_seq_free(struct kvp_kvcache *c, uint32_t id)
{
	if (!seq_ok(c, id))
		return -EINVAL;
	kvp_kvcache_drain(c);
	seq_drop(c, id, true);
	return 0;
}

uint64_t kvp_kvcache_seq_tokens(const struct kvp_kvcache *c, uint32_t id)
{
	return seq_ok(c, id) ? kvp_block_table_tokens(c->seqs[id].bt) : 0;
}

const struct kvp_block_table *kvp_kvcache_seq_table(const struct kvp_kvcache *c,
						    uint32_t id)
{
	return seq_ok(c, id) ? c->seqs[id].bt : NULL;
}

uint32_t kvp_kvcache_seq_list(const struct kvp_kvcache *c, uint32_t *ids,
			      uint32_t max)
{
	uint32_t i, n = 0;

	for (i = 0; c && i < c->o.max_seqs; i++) {
		if (!c->seqs[i].live)
			continue;
		if (n < max && ids)
			ids[n] = i;
		n++;
	}
	return n;
}

/* ---- prefill ------------------------------------------------------------ */

/* Prefill of one layer's full blocks, run on its own thread: different
 * layers' predictor calls may run concurrently, the source is thread-safe. */
struct layer_job {
	struct kvp_kvcache *c;
	const struct kvp_kv_source *src;
	uint32_t seq, layer;
	uint32_t first, nb; /* logical blocks */
	char *dst;	    /* nb * stride */
	int err;
	double t_pred;
};

static void *layer_worker(void *arg)
{
	struct layer_job *j = arg;
	struct kvp_kvcache *c = j->c;
	uint32_t G = c->g.block_tokens, b;
	double t0;

	for (b = 0; b < j->nb && !j->err; b++)
		j->err = j->src->ops->fill(j->src->arg, j->seq, j->layer,
					   (uint64_t)(j->first + b) * G, G,
					   j->dst + (size_t)b * c->stride);
	if (j->err || !kvp_predictor_needs_keys(c->pred))
		return NULL;
	t0 = kvc_now_s();
	if (!c->fitted[j->layer] && (uint64_t)j->nb * G >= 64) {
		const void **ptrs = malloc(sizeof(void *) * j->nb);
		struct kvp_attn_blocks sb = { ptrs, NULL, j->nb };

		if (!ptrs) {
			j->err = -ENOMEM;
			return NULL;
		}
		for (b = 0; b < j->nb; b++)
			ptrs[b] = j->dst + (size_t)b * c->stride;
		j->err = kvp_predictor_fit(c->pred, j->layer, &sb);
		free(ptrs);
		if (j->err == -EBUSY)
			j->err = 0;
		if (j->err)
			return NULL;
		c->fitted[j->layer] = true;
	}
	for (b = 0; b < j->nb && !j->err; b++)
		j->err = kvp_predictor_observe(c->pred, j->seq, j->layer,
					       (uint64_t)(j->first + b) * G, G,
					       j->dst + (size_t)b * c->stride);
	j->t_pred = kvc_now_s() - t0;
	return NULL;
}

/*
 * Keep the pager block of (s, layer)'s rolling block pinned while it rolls,
 * when it holds that KV block alone: the pager's readahead skips pinned
 * blocks, so it never loads the block's stale store contents, and the
 * flush finds it ABSENT and writes it to the store.  Called after every
 * change of fill or of the block's physical number (copy on write).
 */
static void rb_repin(struct kvp_kvcache *c, struct kvc_seq *s, uint32_t layer)
{
	uint32_t G = c->g.block_tokens, lb = (uint32_t)(s->fill[layer] / G), p;
	uint64_t want = UINT64_MAX;

	if (!c->be->pin || c->l.blocks_per_pager_block != 1)
		return;
	p = kvp_block_table_physical(s->bt, lb);
	if (p != KVP_BLOCK_NONE)
		want = kvp_kv_layout_pager_block(&c->l, layer, p);
	if (want == s->rbpin[layer])
		return;
	if (s->rbpin[layer] != UINT64_MAX)
		c->be->unpin(c, s->rbpin[layer], 1);
	s->rbpin[layer] = UINT64_MAX;
	if (want != UINT64_MAX && !c->be->pin(c, want, 1))
		s->rbpin[layer] = want;
}

/* Tokens into the rolling block of (s, layer): [fill, fill + n), one block. */
static int rb_append(struct kvp_kvcache *c, uint32_t id, uint32_t layer,
		     const struct kvp_kv_source *src, uint32_t n)
{
	struct kvc_seq *s = &c->seqs[id];
	char *rbl = s->rb + (size_t)layer * c->stride;
	uint64_t tok = s->fill[layer];
	double t0 = kvc_now_s();
	int err;

	rb_repin(c, s, layer);
	err = src->ops->fill(src->arg, id, layer, tok, n, rbl);
	c->cur.t_fill_s += kvc_now_s() - t0;
	if (err)
		return err;
	if (kvp_predictor_needs_keys(c->pred)) {
		t0 = kvc_now_s();
		err = kvp_predictor_observe(c->pred, id, layer, tok, n, rbl);
		c->cur.t_predict_s += kvc_now_s() - t0;
		if (err)
			return err;
	}
	s->fill[layer] = tok + n;
	return 0;
}

/* Write the rolling block of (s, layer) if it is full. */
static int rb_flush(struct kvp_kvcache *c, uint32_t id, uint32_t layer)
{
	struct kvc_seq *s = &c->seqs[id];
	uint32_t G = c->g.block_tokens, p;

	if (s->fill[layer] % G || !s->fill[layer])
		return 0;
	int err;

	p = kvp_block_table_physical(s->bt, (uint32_t)(s->fill[layer] / G - 1));
	if (p == KVP_BLOCK_NONE)
		return -EINVAL;
	err = write_blocks(c, layer, p, 1, s->rb + (size_t)layer * c->stride,
			   true);
	rb_repin(c, s, layer); /* the next block, if the table has it yet */
	return err;
}

/*
 * Prefill of layers [layer, layer + n) of id, tokens [t0tok, t0tok +
 * ntokens): the head that completes each layer's rolling block, the full
 * blocks [first, last) (one thread per layer), the tail that starts the
 * next rolling block.  A layer's tokens go to the source in order.
 */
static int prefill_layers(struct kvp_kvcache *c, uint32_t id,
			  const struct kvp_kv_source *src, uint32_t layer,
			  uint32_t n, uint64_t t0tok, uint64_t ntokens)
{
	struct kvc_seq *s = &c->seqs[id];
	const uint32_t *map = kvp_block_table_map(s->bt);
	uint32_t G = c->g.block_tokens, first, last, nb, i, k;
	uint64_t head = t0tok % G ? G - t0tok % G : 0;
	struct layer_job jobs[8];
	pthread_t th[8];
	bool started[8] = { false };
	int err;

	if (head > ntokens)
		head = ntokens;
	for (k = 0; head && k < n; k++) {
		err = rb_append(c, id, layer + k, src, (uint32_t)head);
		if (!err)
			err = rb_flush(c, id, layer + k);
		if (err)
			return err;
	}
	first = (uint32_t)((t0tok + head) / G);
	last = (uint32_t)((t0tok + ntokens) / G);
	nb = last > first ? last - first : 0;
	for (k = 0; nb && k < n; k++) {
		jobs[k] =
		    (struct layer_job){ c,
					src,
					id,
					layer + k,
					first,
					nb,
					c->stage + (size_t)k * nb * c->stride,
					0,
					0 };
		if (k && !pthread_create(&th[k], NULL, layer_worker, &jobs[k]))
			started[k] = true;
	}
	if (nb)
		layer_worker(&jobs[0]);
	for (k = 1; nb && k < n; k++) {
		if (started[k])
			pthread_join(th[k], NULL);
		else
			layer_worker(&jobs[k]);
	}
	for (k = 0; nb && k < n; k++) {
		if (jobs[k].err)
			return jobs[k].err;
		c->cur.t_predict_s += jobs[k].t_pred;
	}
	for (k = 0; nb && k < n; k++) {
		/* runs of consecutive physical blocks */
		for (i = 0; i < nb;) {
			uint32_t j = i + 1;

			while (j < nb &&
			       map[first + j] == map[first + j - 1] + 1)
				j++;
			err = write_blocks(c, layer + k, map[first + i], j - i,
					   jobs[k].dst + (size_t)i * c->stride,
					   false);
			if (err)
				return err;
			i = j;
		}
		s->fill[layer + k] = (uint64_t)last * G;
	}
	/* the last partial block stays in the rolling buffer */
	if (!((t0tok + ntokens) % G) || (uint64_t)last * G < t0tok + head)
		return 0;
	for (k = 0; k < n; k++) {
		s->fill[layer + k] = (uint64_t)last * G;
		err = rb_append(c, id, layer + k, src,
				(uint32_t)((t0tok + ntokens) % G));
		if (err)
			return err;
	}
	return 0;
}

int kvp_kvcache_prefill(struct kvp_kvcache *c, uint32_t id, uint64_t ntokens,
			const struct kvp_kv_source *src,
			kvp_kvcache_progress_fn progress, void *parg)
{
	struct kvc_seq *s;
	uint32_t G, layer, n, nt;
	uint64_t t0tok, total_bytes, done_bytes = 0, nfull;
	double t0 = kvc_now_s();
	int err;

	if (!seq_ok(c, id) || !kvc_source_ok(src))
		return -EINVAL;
	if (!ntokens)
		return 0;
	kvp_kvcache_drain(c);
	s = &c->seqs[id];
	G = c->g.block_tokens;
	t0tok = kvp_block_table_tokens(s->bt);
	memset(&c->cur, 0, sizeof(c->cur));
	if (src->ops->prefill_begin) {
		err = src->ops->prefill_begin(src->arg, id, t0tok, ntokens);
		if (err)
			return err;
	}
	pthread_mutex_lock(&c->tlock);
	err = kvp_block_table_append(s->bt, (uint32_t)ntokens, NULL, NULL);
	pthread_mutex_unlock(&c->tlock);
	if (err)
		goto out;
	total_bytes = ntokens * kvp_kv_token_bytes(&c->g);
	/* full blocks: (t0tok + ntokens) / G - ceil(t0tok / G), or none */
	nfull = (t0tok + ntokens) / G;
	nfull = nfull > (t0tok + G - 1) / G ? nfull - (t0tok + G - 1) / G : 0;
	nt = kvp_attn_pool_threads(c->pool);
	if (nt > 8)
		nt = 8;
	if (nt < 1 || src->flags & KVP_KV_SOURCE_LAYER_ORDER)
		nt = 1;
	if (nfull) {
		err = stage_reserve(c, (size_t)nt * nfull * c->stride);
		if (err)
			goto out;
	}
	/* nt layers at a time, one thread each: fill, fit, observe */
	for (layer = 0; layer < c->g.layers; layer += n) {
		n = c->g.layers - layer < nt ? c->g.layers - layer : nt;
		err = prefill_layers(c, id, src, layer, n, t0tok, ntokens);
		if (err)
			goto out;
		done_bytes +=
		    (uint64_t)n * ntokens * kvp_kv_token_layer_bytes(&c->g);
		if (progress && done_bytes < total_bytes)
			progress(parg, done_bytes, total_bytes);
	}
	if (progress)
		progress(parg, total_bytes, total_bytes);
	c->st.prefill_tokens += ntokens;
	c->st.prefill_bytes += total_bytes;
	c->st.t_prefill_s += kvc_now_s() - t0;
	if (c->be->prefilled)
		c->be->prefilled(c);
out:
	if (src->ops->prefill_end)
		src->ops->prefill_end(src->arg, id);
	return err;
}

/* ---- the decode step ---------------------------------------------------- */

static void record_sample(struct kvp_kvcache *c, uint32_t id, uint32_t layer,
			  uint64_t npos, const float *q, const float *o,
			  const struct kvc_plan *pl, size_t i, uint32_t rblb)
{
	struct kvc_sample *sm, *ns;
	size_t n = pl->off[i + 1] - pl->off[i];

	if (c->nsamples >= c->o.max_samples)
		return;
	ns = realloc(c->samples, sizeof(*ns) * (c->nsamples + 1));
	if (!ns)
		return;
	c->samples = ns;
	sm = &ns[c->nsamples];
	sm->q = malloc(sizeof(float) * c->qfloats);
	sm->out = malloc(sizeof(float) * c->qfloats);
	sm->lb = malloc(sizeof(uint32_t) * (n + 1));
	if (!sm->q || !sm->out || !sm->lb) {
		free(sm->q);
		free(sm->out);
		free(sm->lb);
		return;
	}
	sm->seq = id;
	sm->layer = layer;
	sm->npos = npos;
	memcpy(sm->q, q, sizeof(float) * c->qfloats);
	memcpy(sm->out, o, sizeof(float) * c->qfloats);
	memcpy(sm->lb, pl->lb + pl->off[i], sizeof(uint32_t) * n);
	sm->lb[n] = rblb;
	sm->n = n + 1;
	c->nsamples++;
}

static bool layer_sampled(struct kvp_kvcache *c, uint32_t layer)
{
	uint32_t k = c->o.sample_layers, L = c->g.layers, i;

	if (!c->o.sample_every || !k || c->gstep % c->o.sample_every)
		return false;
	if (k >= L)
		return true;
	for (i = 0; i < k; i++)
		if (layer == (uint32_t)(((uint64_t)i * L + L / 2) / k))
			return true;
	return false;
}

static int compute_layer(struct kvp_kvcache *c, struct kvc_plan *pl,
			 const struct kvp_kv_source *src, float *out,
			 uint32_t nstep)
{
	uint32_t layer = pl->layer, G = c->g.block_tokens, i;
	bool sample = layer_sampled(c, layer);
	int err;

	for (i = 0; i < pl->nseq; i++) {
		uint32_t id = c->step_seqs[i];
		struct kvc_seq *s = &c->seqs[id];
		const uint32_t *map = kvp_block_table_map(s->bt);
		size_t n = pl->off[i + 1] - pl->off[i], k;
		uint32_t rblb = (uint32_t)((s->fill[layer] - 1) / G);
		struct kvp_attn_blocks b;
		float *o =
		    out ? out + ((size_t)i * c->g.layers + layer) * c->qfloats
			: c->obuf;
		double t0;

		if (kvc_grow((void **)&c->ptrs, &c->ptr_cap, n + 1,
			     sizeof(void *)))
			return -ENOMEM;
		{
			size_t cap = c->ptr_cap;
			uint32_t *nt = realloc(c->ntok, sizeof(uint32_t) * cap);

			if (!nt)
				return -ENOMEM;
			c->ntok = nt;
		}
		for (k = 0; k < n; k++) {
			c->ptrs[k] = c->base + kvp_kv_layout_offset(
						   &c->l, layer,
						   map[pl->lb[pl->off[i] + k]]);
			c->ntok[k] = G;
		}
		c->ptrs[n] = s->rb + (size_t)layer * c->stride;
		c->ntok[n] = (uint32_t)(s->fill[layer] - (uint64_t)rblb * G);
		b.ptrs = c->ptrs;
		b.ntokens = c->ntok;
		b.n = n + 1;
		err = src->ops->query(src->arg, id, layer, s->fill[layer],
				      c->qbuf);
		if (err)
			return err;
		t0 = kvc_now_s();
		err = kvp_attn_decode(&c->g, &b, c->qbuf, o, c->pool);
		c->cur.t_compute_s += kvc_now_s() - t0;
		if (!err && src->ops->attended)
			err = src->ops->attended(src->arg, id, layer,
						 s->fill[layer], o);
		if (err)
			return err;
		if (sample)
			record_sample(c, id, layer, s->fill[layer], c->qbuf, o,
				      pl, i, rblb);
	}
	(void)nstep;
	return 0;
}

int kvp_kvcache_step(struct kvp_kvcache *c, const uint32_t *seqs, uint32_t n,
		     const struct kvp_kv_source *src, float *out,
		     struct kvp_kvcache_step_stats *st)
{
	uint64_t gl0, gl;
	uint32_t L = c ? c->g.layers : 0, d, i, layer;
	double t0 = kvc_now_s();
	int err = 0;

	if (!c || !seqs || !n || n > c->o.max_seqs || !kvc_source_ok(src))
		return -EINVAL;
	for (i = 0; i < n; i++)
		if (!seq_ok(c, seqs[i]))
			return -EINVAL;
	/* plans carried from the last step are for the same sequences only */
	if (c->plans_valid &&
	    (n != c->nstep_seqs ||
	     memcmp(seqs, c->step_seqs, sizeof(uint32_t) * n)))
		kvp_kvcache_drain(c);
	memcpy(c->step_seqs, seqs, sizeof(uint32_t) * n);
	c->nstep_seqs = n;
	c->plans_valid = true;
	c->src = *src;
	memset(&c->cur, 0, sizeof(c->cur));
	if (c->be->step_begin)
		c->be->step_begin(c);
	for (i = 0; i < n; i++) {
		err =
		    kvp_block_table_append(c->seqs[seqs[i]].bt, 1, NULL, NULL);
		if (err)
			goto out;
	}
	d = c->o.prefetch ? c->o.prefetch_depth : 0;
	gl0 = c->gstep * L;
	for (layer = 0; layer < L; layer++) {
		struct kvc_plan *pl;
		double tw;

		gl = gl0 + layer;
		pl = plan_get(c, gl, &err);
		if (!pl)
			goto out;
		/* plan ahead: layers l+1 .. l+d, into the next step if asked */
		for (i = 1; i <= d; i++) {
			struct kvc_plan *ah;

			/* a plan for this very layer of the next step
			 * (one layer) would be made before this step's
			 * token lands and miss the block it fills */
			if (i >= L || (layer + i >= L && !c->o.cross_step))
				break;
			ah = &c->plans[(gl + i) % c->nplans];
			if (ah->used && ah->gl == gl + i)
				continue;
			err = plan_make(c, gl + i);
			if (err)
				goto out;
		}
		for (i = 0; i < n; i++) {
			err = rb_append(c, seqs[i], layer, src, 1);
			if (err)
				goto out;
		}
		tw = kvc_now_s();
		plan_wait(c, pl);
		c->cur.t_wait_s += kvc_now_s() - tw;
		if (pl->err) {
			err = pl->err;
			goto out;
		}
		if (c->o.prefetch && pl->npb && c->be->pin) {
			if (plan_pin(c, pl, true))
				c->st.pin_failures++;
			else
				pl->pinned = true;
		}
		err = compute_layer(c, pl, src, out, n);
		if (err)
			goto out;
		c->cur.chosen_blocks += pl->chosen;
		c->cur.reused_blocks += pl->reused;
		if (c->be->layer_done)
			c->be->layer_done(c, pl);
		if (pl->pinned) {
			plan_pin(c, pl, false);
			pl->pinned = false;
		} else if (c->cold && c->be->advise_cold) {
			size_t k;

			for (k = 0; k < pl->npb; k++)
				c->be->advise_cold(c, pl->pb[k], 1);
		}
		for (i = 0; i < n; i++) {
			err = rb_flush(c, seqs[i], layer);
			if (err)
				goto out;
		}
		plan_release(c, pl);
	}
	if (!c->o.cross_step)
		kvp_kvcache_drain(c);
out:
	c->gstep++;
	if (c->be->step_end)
		c->be->step_end(c, &c->cur, !err);
	c->cur.steps = 1;
	c->cur.tokens = n;
	c->cur.t_step_s = kvc_now_s() - t0;
	{
		struct kvp_kvcache_step_stats *a = &c->st.sum, *b = &c->cur;

		a->steps += b->steps;
		a->tokens += b->tokens;
		a->t_step_s += b->t_step_s;
		a->t_compute_s += b->t_compute_s;
		a->t_predict_s += b->t_predict_s;
		a->t_wait_s += b->t_wait_s;
		a->t_fill_s += b->t_fill_s;
		a->bytes_read += b->bytes_read;
		a->bytes_written += b->bytes_written;
		a->demand_faults += b->demand_faults;
		a->prefetch_issued += b->prefetch_issued;
		a->prefetch_hit += b->prefetch_hit;
		a->prefetch_late += b->prefetch_late;
		a->prefetch_wasted += b->prefetch_wasted;
		a->chosen_blocks += b->chosen_blocks;
		a->reused_blocks += b->reused_blocks;
		a->flush_store += b->flush_store;
		a->flush_region += b->flush_region;
	}
	if (st)
		*st = c->cur;
	return err;
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

/* ---- quality ------------------------------------------------------------ */

int kvp_kvcache_quality(struct kvp_kvcache *c, double *recall,
			double *rel_error, double *mass, uint32_t *nsamples)
{
	double rs = 0, es = 0, ms = 0;
	uint32_t k, cnt = 0, G = c->g.block_tokens;
	char *buf = NULL;
	size_t bufcap = 0;
	const void **ptrs = NULL;
	uint32_t *ntok = NULL, *phys = NULL;
	float *mv = NULL, *ex = malloc(sizeof(float) * c->qfloats);
	int err = 0;

	kvp_kvcache_drain(c);
	if (!ex)
		return -ENOMEM;
	for (k = 0; k < c->nsamples; k++) {
		struct kvc_sample *sm = &c->samples[k];
		struct kvc_seq *s = &c->seqs[sm->seq];
		uint32_t nb = (uint32_t)((sm->npos + G - 1) / G), i, nfull;
		struct kvp_attn_blocks all;
		double am = 0;

		if (!s->live || kvp_block_table_tokens(s->bt) < sm->npos)
			continue;
		if ((size_t)nb * c->stride > bufcap) {
			if (buf)
				munmap(buf, bufcap);
			bufcap = (size_t)nb * c->stride;
			buf = kvc_big_alloc(bufcap);
			free(ptrs);
			free(ntok);
			free(phys);
			free(mv);
			ptrs = malloc(sizeof(void *) * nb);
			ntok = malloc(sizeof(uint32_t) * nb);
			phys = malloc(sizeof(uint32_t) * nb);
			mv = malloc(sizeof(float) * nb);
			if (!buf || !ptrs || !ntok || !phys || !mv) {
				if (!buf)
					bufcap = 0;
				err = -ENOMEM;
				goto out;
			}
		}
		/* full blocks now in the backing, then whatever is rolling */
		nfull = (uint32_t)(s->fill[sm->layer] / G);
		if (nfull > nb)
			nfull = nb;
		for (i = 0; i < nfull; i++)
			phys[i] = kvp_block_table_physical(s->bt, i);
		err = c->be->read(c, sm->layer, phys, nfull, buf);
		if (err)
			goto out;
		for (i = nfull; i < nb; i++) {
			err = read_logical(c, s, sm->layer, i,
					   buf + (size_t)i * c->stride);
			if (err)
				goto out;
		}
		for (i = 0; i < nb; i++) {
			ptrs[i] = buf + (size_t)i * c->stride;
			ntok[i] = G;
		}
		ntok[nb - 1] = (uint32_t)(sm->npos - (uint64_t)(nb - 1) * G);
		all.ptrs = ptrs;
		all.ntokens = ntok;
		all.n = nb;
		err = kvp_attn_decode(&c->g, &all, sm->q, ex, c->pool);
		if (!err)
			err = kvp_attn_block_mass(&c->g, &all, sm->q, mv,
						  c->pool);
		if (err)
			goto out;
		rs += kvp_attn_recall(mv, nb, sm->lb, sm->n, &am);
		ms += am;
		es += kvp_attn_rel_error(sm->out, ex, c->qfloats);
		cnt++;
	}
out:
	if (buf)
		munmap(buf, bufcap);
	free(ptrs);
	free(ntok);
	free(phys);
	free(mv);
	free(ex);
	if (err)
		return err;
	*recall = cnt ? rs / cnt : 0;
	*rel_error = cnt ? es / cnt : 0;
	if (mass)
		*mass = cnt ? ms / cnt : 0;
	if (nsamples)
		*nsamples = cnt;
	return 0;
}

int kvp_kvcache_sample_info(const struct kvp_kvcache *c, uint32_t k,
			    uint32_t *seq, uint32_t *layer, uint64_t *npos,
			    const uint32_t **lb, size_t *n)
{
	const struct kvc_sample *sm;

	if (!c || k >= c->nsamples)
		return -ENOENT;
	sm = &c->samples[k];
	*seq = sm->seq;
	*layer = sm->layer;
	*npos = sm->npos;
	*lb = sm->lb;
	*n = sm->n;
	return 0;
}

/* ---- debug view --------------------------------------------------------- */

int kvp_kvcache_format_block_table(struct kvp_kvcache *c, uint32_t id,
				   char *buf, size_t len)
{
	const struct kvc_seq *s;
	uint32_t nb, lb, G;
	size_t used = 0;
	int w;

	if (!seq_ok(c, id) || (!buf && len))
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

static uint32_t view_list(void *arg, uint32_t *ids, uint32_t max)
{
	struct kvp_kvcache *c = arg;
	uint32_t n;

	pthread_mutex_lock(&c->tlock);
	n = kvp_kvcache_seq_list(c, ids, max);
	pthread_mutex_unlock(&c->tlock);
	return n;
}

static int view_format(void *arg, uint32_t id, char *buf, size_t len)
{
	struct kvp_kvcache *c = arg;
	int n;

	pthread_mutex_lock(&c->tlock);
	n = seq_ok(c, id) ? kvp_kvcache_format_block_table(c, id, buf, len)
			  : -ENOENT;
	pthread_mutex_unlock(&c->tlock);
	return n;
}

void kvp_kvcache_attach_view(struct kvp_kvcache *c, struct kvp_fuse_view *v)
{
	static const struct kvp_view_seq_ops ops = { view_list, view_format };

	if (c->view)
		kvp_view_set_seqs(kvp_fuse_view_tree(c->view), NULL, NULL);
	c->view = v;
	if (v)
		kvp_view_set_seqs(kvp_fuse_view_tree(v), &ops, c);
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
	return c->budget;
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
	else if (kv->prefetch_depth_layers >= c->plans_cap ||
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
	if (depth && c->be->async_prefetch && !c->waiter_on) {
		err = -pthread_create(&c->waiter, NULL, waiter_main, c);
		if (err) {
			if (bad)
				*bad = "prefetch_depth_layers";
			return err;
		}
		c->waiter_on = true;
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
	return 0;
}
