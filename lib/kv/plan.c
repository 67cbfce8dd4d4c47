/*
 * plan.c - the KV cache's prefetch plans (kvcache_i.h).
 *
 * A plan is what one layer of one step reads: the predictor's blocks for
 * each sequence of the step, their distinct pager blocks (ascending), how
 * many were resident when planned (reuse), and the backend's prefetch of
 * them.  Plans live in a ring of prefetch_depth + 1, indexed by the global
 * layer index gl = step * layers + layer, so that the step can plan layers
 * l+1 .. l+depth (into the next step with cross_step) while layer l
 * computes.
 *
 * A plan's life: free -> made (kvc_plan_make: selected, mapped, prefetch
 * submitted and queued to the waiter) -> waited (kvc_plan_wait) -> pinned
 * for the compute (kvc_plan_pin) -> unpinned -> released
 * (kvc_plan_release, also from any state by kvp_kvcache_drain).
 *
 * The waiter thread, when the backend prefetches asynchronously, waits
 * for each queued prefetch (and reads into reuse slots, slots.c) in
 * submit order and records when it completed,
 * so that the step's wait is only for what is not done, and the union of
 * the loads' [submit, done] intervals (T_load) is measured where the loads
 * happen.  It shares only what c->mu guards (kvcache_i.h).
 */
#include <errno.h>
#include <stdlib.h>

#include "lib/kv/kvcache_i.h"

static void *waiter_main(void *arg)
{
	struct kvp_kvcache *c = arg;
	struct kvc_plan *pl;
	int err;

	/* It submits and reaps the step's loads: the pager's own priority. */
	if (c->pager)
		kvp_pager_thread_begin(c->pager, "kvp-kvwait");
	pthread_mutex_lock(&c->mu);
	for (;;) {
		while (!c->wq_len && !c->waiter_stop)
			pthread_cond_wait(&c->cv, &c->mu);
		if (!c->wq_len && c->waiter_stop)
			break;
		pl = c->wq[c->wq_head];
		pthread_mutex_unlock(&c->mu);
		err = pl->pf ? kvp_prefetch_wait(pl->pf, -1) : 0;
		if (pl->nio)
			kvc_slots_wait(c, pl);
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

void kvc_plan_wait(struct kvp_kvcache *c, struct kvc_plan *pl)
{
	if (!pl->queued)
		return;
	pthread_mutex_lock(&c->mu);
	while (!pl->done)
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
}

bool kvc_plan_done(struct kvp_kvcache *c, struct kvc_plan *pl)
{
	bool done;

	if (!pl->queued)
		return true;
	pthread_mutex_lock(&c->mu);
	done = pl->done;
	pthread_mutex_unlock(&c->mu);
	return done;
}

/* Is pl's pb[i] read from the region (not from a reuse slot)? */
static bool in_region(const struct kvp_kvcache *c, const struct kvc_plan *pl,
		      size_t i)
{
	return !c->sl_of || pl->slot[i] < 0;
}

/* The end of the run of region blocks that starts at pl->pb[i]. */
static size_t run_end(const struct kvp_kvcache *c, const struct kvc_plan *pl,
		      size_t i, size_t end)
{
	size_t j;

	for (j = i + 1; j < end && pl->pb[j] == pl->pb[j - 1] + 1 &&
			in_region(c, pl, j);
	     j++)
		;
	return j;
}

/* Pin or unpin a plan's pager blocks in the region, run by run. */
int kvc_plan_pin(struct kvp_kvcache *c, struct kvc_plan *pl, bool pin)
{
	size_t i = 0, j;
	int err;

	while (i < pl->npb) {
		if (!in_region(c, pl, i)) {
			i++;
			continue;
		}
		j = run_end(c, pl, i, pl->npb);
		err = 0;
		if (pin)
			err = c->be->pin(c, pl->pb[i], j - i);
		else
			c->be->unpin(c, pl->pb[i], j - i);
		if (err && pin) {
			/* undo the runs pinned so far */
			size_t k = 0, m;

			while (k < i) {
				if (!in_region(c, pl, k)) {
					k++;
					continue;
				}
				m = run_end(c, pl, k, i);
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

void kvc_plan_release(struct kvp_kvcache *c, struct kvc_plan *pl)
{
	if (!pl->used)
		return;
	kvc_plan_wait(c, pl);
	if (pl->pinned)
		kvc_plan_pin(c, pl, false);
	pl->pinned = false;
	if (pl->pf)
		kvp_prefetch_release(pl->pf);
	pl->pf = NULL;
	if (c->sl_of)
		kvc_slots_release(c, pl);
	pl->used = pl->queued = pl->done = false;
}

void kvp_kvcache_drain(struct kvp_kvcache *c)
{
	uint32_t i;

	for (i = 0; i < c->nplans; i++)
		kvc_plan_release(c, &c->plans[i]);
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

size_t kvc_plan_find(const struct kvc_plan *pl, uint64_t pb)
{
	size_t lo = 0, hi = pl->npb;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (pl->pb[mid] < pb)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < pl->npb && pl->pb[lo] == pb ? lo : pl->npb;
}

static bool pb_resident(const struct kvc_plan *pl, uint64_t pb)
{
	size_t i = kvc_plan_find(pl, pb);

	return i < pl->npb && pl->res[i];
}

/*
 * Plan layer gl % layers of step gl / layers for the sequences of the
 * step: select, map to pager blocks, count reuse, prefetch.
 */
int kvc_plan_make(struct kvp_kvcache *c, uint64_t gl)
{
	struct kvc_plan *pl = &c->plans[gl % c->nplans];
	uint32_t layer = (uint32_t)(gl % c->g.layers), G = c->g.block_tokens;
	uint64_t ahead = gl / c->g.layers - c->gstep;
	size_t total = 0, i, k, w;
	double t0;
	int err;

	kvc_plan_release(c, pl);
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
		int32_t *ns;

		if (!nr)
			return -ENOMEM;
		pl->res = nr;
		ns = realloc(pl->slot, sizeof(int32_t) * oc);
		if (!ns)
			return -ENOMEM;
		pl->slot = ns;
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
	/* a rolling flush of one of them still in flight lands first */
	if (c->be->write_wait) {
		err = c->be->write_wait(c, pl->pb, pl->npb);
		if (err)
			return err;
	}
	/* reuse: chosen blocks already resident (in the region or a slot),
	 * before anything is read */
	pl->settled = false;
	pl->nio = 0;
	if (kvc_slots_on(c)) {
		err = kvc_slots_plan(c, pl);
		if (err)
			return err;
	} else {
		for (i = 0; i < pl->npb; i++) {
			pl->res[i] = c->be->resident(c, pl->pb[i]);
			pl->slot[i] = -1;
		}
	}
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
	if (kvc_slots_on(c)) {
		/* the slots' reads; the region's blocks fault if evicted */
		c->cur.prefetch_issued += pl->npb;
		if (!pl->nio)
			return 0;
		pl->t_submit = kvc_now_s();
	} else {
		err = c->be->prefetch(c, pl);
		if (err || !pl->pf)
			return err;
	}
	pthread_mutex_lock(&c->mu);
	c->wq[(c->wq_head + c->wq_len) % c->nplans] = pl;
	c->wq_len++;
	pl->queued = true;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	return 0;
}

struct kvc_plan *kvc_plan_get(struct kvp_kvcache *c, uint64_t gl, int *err)
{
	struct kvc_plan *pl = &c->plans[gl % c->nplans];

	*err = 0;
	if (!pl->used || pl->gl != gl)
		*err = kvc_plan_make(c, gl);
	return *err ? NULL : pl;
}

int kvc_waiter_start(struct kvp_kvcache *c)
{
	int err;

	if (c->waiter_on)
		return 0;
	err = -pthread_create(&c->waiter, NULL, waiter_main, c);
	if (!err)
		c->waiter_on = true;
	return err;
}

int kvc_plans_init(struct kvp_kvcache *c)
{
	c->nplans = c->o.prefetch_depth + 1;
	/* room for the deepest ring kvp_kvcache_retune may ask for */
	c->plans_cap = c->g.layers > c->nplans ? c->g.layers : c->nplans;
	c->plans = calloc(c->plans_cap, sizeof(*c->plans));
	c->wq = calloc(c->plans_cap, sizeof(*c->wq));
	if (!c->plans || !c->wq)
		return -ENOMEM;
	if (c->o.prefetch && c->be->async_prefetch)
		return kvc_waiter_start(c);
	return 0;
}

void kvc_plans_fini(struct kvp_kvcache *c)
{
	uint32_t i;

	if (c->plans)
		kvp_kvcache_drain(c);
	if (c->waiter_on) {
		pthread_mutex_lock(&c->mu);
		c->waiter_stop = true;
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
		pthread_join(c->waiter, NULL);
		c->waiter_on = false;
	}
	for (i = 0; c->plans && i < c->plans_cap; i++) {
		free(c->plans[i].lb);
		free(c->plans[i].off);
		free(c->plans[i].pb);
		free(c->plans[i].res);
		free(c->plans[i].slot);
		free(c->plans[i].io);
	}
	free(c->plans);
	free(c->wq);
	c->plans = NULL;
	c->wq = NULL;
}
