/*
 * step.c - the decode step of the KV cache (kvcache.h, kvcache_i.h).
 *
 * The decode step, per layer l (L layers, depth d, plans in a ring of d+1):
 *
 *   plan(l+d)      predictor select for every sequence, pager blocks
 *                  deduplicated, residency counted (reuse), prefetch
 *                  submitted; the waiter thread records its completion
 *   fill(l)        the new token's K and V from the source into the
 *                  rolling block (seq.c), observe
 *   wait(l)        on the waiter's record of plan l; settle its reuse
 *                  slots' reads (slots.c); pin its region's pager blocks
 *   compute(l)     the source's query, attention over plan l's blocks +
 *                  the rolling block, the output to the source (attended)
 *   unpin(l)       (COLD for a scan), flush rolling blocks that filled
 *
 * (plan.c makes the plans, seq.c appends and flushes, the backend reads,
 * pins and counts; kv_source.h lists the source's calls in this order.)
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
#include <stdlib.h>
#include <string.h>

#include "lib/kv/kvcache_i.h"

/* Attention of plan pl's layer for each of its sequences. */
static int compute_layer(struct kvp_kvcache *c, struct kvc_plan *pl,
			 const struct kvp_kv_source *src, float *out)
{
	uint32_t layer = pl->layer, G = c->g.block_tokens, i;
	size_t pbb = c->l.pager_block_bytes;
	bool sample = kvc_layer_sampled(c, layer);
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
			uint64_t off = kvp_kv_layout_offset(
			    &c->l, layer, map[pl->lb[pl->off[i] + k]]);
			const char *sa =
			    c->sl_of ? kvc_slots_addr(c, pl, off / pbb) : NULL;

			c->ptrs[k] = sa ? sa + off % pbb : c->base + off;
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
			kvc_sample_record(c, id, layer, s->fill[layer], c->qbuf,
					  o, pl, i, rblb);
	}
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
		if (!kvc_seq_ok(c, seqs[i]))
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
		pl = kvc_plan_get(c, gl, &err);
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
			err = kvc_plan_make(c, gl + i);
			if (err)
				goto out;
		}
		for (i = 0; i < n; i++) {
			err = kvc_rb_append(c, seqs[i], layer, src, 1);
			if (err)
				goto out;
		}
		tw = kvc_now_s();
		kvc_plan_wait(c, pl);
		c->cur.t_wait_s += kvc_now_s() - tw;
		if (pl->err) {
			err = pl->err;
			goto out;
		}
		if (c->sl_of)
			kvc_slots_settle(c, pl);
		if (c->o.prefetch && pl->npb && c->be->pin && !pl->pinned) {
			if (kvc_plan_pin(c, pl, true))
				c->st.pin_failures++;
			else
				pl->pinned = true;
		}
		if (c->da) {
			struct kvc_plan *nx =
			    layer + 1 < L ? &c->plans[(gl + 1) % c->nplans]
					  : NULL;

			err = kvc_dev_compute(c, pl, nx, src, out);
		} else {
			err = compute_layer(c, pl, src, out);
		}
		if (err)
			goto out;
		c->cur.chosen_blocks += pl->chosen;
		c->cur.reused_blocks += pl->reused;
		if (c->be->layer_done)
			c->be->layer_done(c, pl);
		if (pl->pinned) {
			kvc_plan_pin(c, pl, false);
			pl->pinned = false;
		} else if (c->cold && c->be->advise_cold) {
			size_t k;

			for (k = 0; k < pl->npb; k++)
				c->be->advise_cold(c, pl->pb[k], 1);
		}
		for (i = 0; i < n; i++) {
			err = kvc_rb_flush(c, seqs[i], layer);
			if (err)
				goto out;
		}
		kvc_plan_release(c, pl);
	}
	if (!c->o.cross_step)
		kvp_kvcache_drain(c);
out:
	if (c->da)
		kvc_dev_abandon(c); /* a failed step may leave one staged */
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
