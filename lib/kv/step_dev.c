/*
 * step_dev.c - the KV cache's attention on a device (kvcache.h, ON A
 * DEVICE; kvcache_i.h).
 *
 * Per layer of a step, in step.c's compute slot:
 *
 *   stage(l)     if not staged ahead: plan l's blocks get pool slots, the
 *                missing ones go through staging (devattn.h)
 *   query        every sequence's query of layer l
 *   launch(l)    rolling blocks, queries, tables up; the kernel
 *   stage(l+1)   the next layer's plan, if its prefetch is done, pinned
 *                and staged on the copy stream while kernel l runs
 *                (skipped, counted in overlap_misses, when it is still
 *                loading or the pool's free slots are held)
 *   finish(l)    outputs back; attended for every sequence
 *
 * Stages are numbered by the global layer index gl; a stage is never
 * carried across steps (the next step may decode other sequences), so
 * the last layer stages nothing ahead.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/kv/kvcache_i.h"

int kvc_dev_init(struct kvp_kvcache *c)
{
	struct kvp_devattn_opts o;
	uint64_t per, nslots, all;
	char msg[256];
	int err;

	if (!c->o.device || !strcmp(c->o.device, "cpu"))
		return 0;
	err = kvp_device_open(c->o.device, &c->dev, msg, sizeof(msg));
	if (err)
		return err;
	per = kvp_predictor_max_blocks(c->pred, c->l.capacity_blocks);
	all = (uint64_t)c->l.capacity_blocks * c->g.layers;
	nslots = c->o.device_pool_bytes ? c->o.device_pool_bytes / c->bb
					: 2 * per * c->o.max_seqs;
	if (nslots > all)
		nslots = all;
	if (nslots < 1)
		nslots = 1;
	memset(&o, 0, sizeof(o));
	o.shape.q_heads = c->g.q_heads;
	o.shape.kv_heads = c->g.kv_heads;
	o.shape.head_dim = c->g.head_dim;
	o.shape.block_tokens = c->g.block_tokens;
	o.shape.dtype = (int)c->g.dtype;
	o.nslots = (uint32_t)(nslots < UINT32_MAX / 8 ? nslots : UINT32_MAX / 8);
	o.max_seqs = c->o.max_seqs;
	o.max_entries = (uint32_t)per;
	err = kvp_devattn_create(c->dev, &o, &c->da);
	if (err)
		return err;
	c->d_cap = (size_t)per * c->o.max_seqs;
	c->d_off = calloc(c->o.max_seqs + 1, sizeof(uint32_t));
	c->d_pb = calloc(c->d_cap + 1, sizeof(uint32_t));
	c->d_host = calloc(c->d_cap + 1, sizeof(void *));
	c->d_roll = calloc(c->o.max_seqs, sizeof(void *));
	c->d_rntok = calloc(c->o.max_seqs, sizeof(uint32_t));
	c->d_q = calloc((size_t)c->o.max_seqs * c->qfloats, sizeof(float));
	c->d_out = calloc((size_t)c->o.max_seqs * c->qfloats, sizeof(float));
	if (!c->d_off || !c->d_pb || !c->d_host || !c->d_roll ||
	    !c->d_rntok || !c->d_q || !c->d_out)
		return -ENOMEM;
	return 0;
}

void kvc_dev_fini(struct kvp_kvcache *c)
{
	kvc_dev_abandon(c);
	kvp_devattn_destroy(c->da);
	kvp_device_close(c->dev);
	free(c->d_off);
	free(c->d_pb);
	free(c->d_host);
	free(c->d_roll);
	free(c->d_rntok);
	free(c->d_q);
	free(c->d_out);
	c->da = NULL;
	c->dev = NULL;
}

void kvc_dev_abandon(struct kvp_kvcache *c)
{
	if (c->da && c->d_staged)
		kvp_devattn_abandon(c->da, c->d_stage);
	c->d_staged = false;
}

void kvc_dev_forget(struct kvp_kvcache *c, const uint32_t *freed, size_t n)
{
	uint32_t layer;
	size_t i;

	if (!c->da)
		return;
	if (!freed) {
		kvp_devattn_forget_all(c->da);
		return;
	}
	for (i = 0; i < n; i++)
		for (layer = 0; layer < c->g.layers; layer++)
			kvp_devattn_forget(c->da, layer, freed[i]);
}

/* Plan pl's region blocks to the device (stage gl). */
static int stage_plan(struct kvp_kvcache *c, const struct kvc_plan *pl)
{
	uint32_t i;
	size_t k;
	int err;

	if (pl->off[pl->nseq] > c->d_cap)
		return -E2BIG;
	c->d_off[0] = 0;
	for (i = 0; i < pl->nseq; i++) {
		const uint32_t *map =
		    kvp_block_table_map(c->seqs[c->step_seqs[i]].bt);

		for (k = pl->off[i]; k < pl->off[i + 1]; k++) {
			c->d_pb[k] = map[pl->lb[k]];
			c->d_host[k] =
			    c->base + kvp_kv_layout_offset(&c->l, pl->layer,
							   c->d_pb[k]);
		}
		c->d_off[i + 1] = (uint32_t)pl->off[i + 1];
	}
	err = kvp_devattn_stage(c->da, c->d_next, pl->layer, pl->nseq,
				c->d_off, c->d_pb, c->d_host);
	if (!err) {
		c->d_staged = true;
		c->d_stage = c->d_next++;
		c->d_stage_gl = pl->gl;
	}
	return err;
}

/*
 * While kernel gl runs: the next plan's pin and stage, if its prefetch is
 * done and its blocks can be pinned.  Never waits for a load, nor touches
 * a block that could fault: the load may need the frames this layer holds
 * pinned until its compute ends (a budget of a layer or two).  Such a
 * plan is staged after this layer, in its own compute slot (an overlap
 * miss).  Without prefetch nothing is pinned, and a fault here is what
 * the demand mode pays anyway.
 */
static void stage_ahead(struct kvp_kvcache *c, struct kvc_plan *next)
{
	if (!kvc_plan_done(c, next)) {
		c->d_misses++;
		return;
	}
	if (next->err)
		return; /* step.c reports it at that layer */
	if (c->o.prefetch && next->npb && c->be->pin && !next->pinned) {
		if (kvc_plan_pin(c, next, true)) {
			/* unpinned, a block may be evicted and fault in
			 * again: a fault that may wait for the frames this
			 * layer pins.  Staged in its own slot instead. */
			c->st.pin_failures++;
			c->d_misses++;
			return;
		}
		next->pinned = true;
	}
	if (stage_plan(c, next) == -ENOSPC)
		c->d_misses++;
}

int kvc_dev_compute(struct kvp_kvcache *c, struct kvc_plan *pl,
		    struct kvc_plan *next, const struct kvp_kv_source *src,
		    float *out)
{
	uint32_t layer = pl->layer, G = c->g.block_tokens, i;
	bool sample = kvc_layer_sampled(c, layer), ahead;
	uint64_t stage;
	double t0;
	int err;

	if (!(c->d_staged && c->d_stage_gl == pl->gl)) {
		kvc_dev_abandon(c);
		err = stage_plan(c, pl);
		if (err)
			return err == -ENOSPC ? -E2BIG : err;
	}
	for (i = 0; i < pl->nseq; i++) {
		uint32_t id = c->step_seqs[i];
		struct kvc_seq *s = &c->seqs[id];
		uint32_t rblb = (uint32_t)((s->fill[layer] - 1) / G);

		c->d_roll[i] = s->rb + (size_t)layer * c->stride;
		c->d_rntok[i] = (uint32_t)(s->fill[layer] - (uint64_t)rblb * G);
		err = src->ops->query(src->arg, id, layer, s->fill[layer],
				      c->d_q + (size_t)i * c->qfloats);
		if (err)
			return err;
	}
	t0 = kvc_now_s();
	stage = c->d_stage;
	err = kvp_devattn_launch(c->da, stage, c->d_roll, c->d_rntok, c->d_q);
	if (err)
		return err;
	ahead = next && next->used && next->gl == pl->gl + 1 &&
		next->nseq == pl->nseq;
	c->d_staged = false;
	if (ahead)
		stage_ahead(c, next);
	/* the stage in flight now, if any, is next's */
	err = kvp_devattn_finish(c->da, stage, c->d_out);
	if (err)
		kvp_devattn_abandon(c->da, stage);
	c->cur.t_compute_s += kvc_now_s() - t0;
	if (err)
		return err;
	for (i = 0; i < pl->nseq; i++) {
		uint32_t id = c->step_seqs[i];
		struct kvc_seq *s = &c->seqs[id];
		float *o = out ? out + ((size_t)i * c->g.layers + layer) *
					   c->qfloats
			       : c->obuf;

		memcpy(o, c->d_out + (size_t)i * c->qfloats,
		       sizeof(float) * c->qfloats);
		if (src->ops->attended) {
			err = src->ops->attended(src->arg, id, layer,
						 s->fill[layer], o);
			if (err)
				return err;
		}
		if (sample)
			kvc_sample_record(
			    c, id, layer, s->fill[layer],
			    c->d_q + (size_t)i * c->qfloats, o, pl, i,
			    (uint32_t)((s->fill[layer] - 1) / G));
	}
	return 0;
}

int kvp_kvcache_device_preload(struct kvp_kvcache *c)
{
	uint32_t G, id, layer, off[2];
	size_t per;
	int err = 0;

	if (!c || !c->da)
		return -ENODEV;
	G = c->g.block_tokens;
	per = c->d_cap / c->o.max_seqs;
	kvp_kvcache_drain(c);
	for (id = 0; id < c->o.max_seqs && !err; id++) {
		const struct kvc_seq *s = &c->seqs[id];
		const uint32_t *map;

		if (!s->live)
			continue;
		map = kvp_block_table_map(s->bt);
		for (layer = 0; layer < c->g.layers && !err; layer++) {
			uint64_t full = s->fill[layer] / G, lb = 0;

			while (lb < full && !err) {
				uint32_t k;

				for (k = 0; k < per && lb < full; k++, lb++) {
					c->d_pb[k] = map[lb];
					c->d_host[k] =
					    c->base +
					    kvp_kv_layout_offset(&c->l, layer,
								 map[lb]);
				}
				off[0] = 0;
				off[1] = k;
				err = kvp_devattn_stage(c->da, c->d_next, layer,
							1, off, c->d_pb,
							c->d_host);
				if (!err)
					kvp_devattn_abandon(c->da,
							    c->d_next++);
			}
		}
	}
	return err == -ENOSPC ? -E2BIG : err;
}

int kvp_kvcache_device_probe(const char *device, char *msg, size_t len)
{
	struct kvp_device *d;
	int err;

	if (!device || !strcmp(device, "cpu"))
		return 0;
	err = kvp_device_open(device, &d, msg, len);
	if (!err)
		kvp_device_close(d);
	return err;
}

uint64_t kvp_kvcache_device_pool_min(const struct kvp_kvcache_opts *o,
				     uint64_t tokens)
{
	uint32_t G = o->geo.block_tokens;
	/* full blocks when the last token lands: the block it lands in is
	 * the rolling one, sent apart, never in a plan (plan.c) */
	uint64_t nfull = tokens ? (tokens - 1) / G : 0;
	size_t per = kvp_predictor_opts_max_blocks(
	    &o->pred, G, nfull < UINT32_MAX ? (uint32_t)nfull : UINT32_MAX);

	return (uint64_t)per * o->max_seqs * kvp_kv_block_bytes(&o->geo);
}

int kvp_kvcache_device_stats(const struct kvp_kvcache *c,
			     struct kvp_kvcache_device_stats *out)
{
	struct kvp_devattn_stats st;

	if (!c || !c->da)
		return -ENODEV;
	memset(out, 0, sizeof(*out));
	kvp_device_describe(c->dev, out->name, sizeof(out->name));
	kvp_devattn_stats(c->da, &st);
	out->pool_slots = kvp_devattn_slots(c->da);
	/* a layer's chosen blocks are distinct: at most all of its blocks */
	out->pool_min_bytes =
	    (uint64_t)(c->d_cap < c->l.capacity_blocks ? c->d_cap
						       : c->l.capacity_blocks) *
	    c->bb;
	out->device_bytes = kvp_devattn_device_bytes(c->da);
	out->staging_bytes = kvp_devattn_host_bytes(c->da);
	out->stages = st.stages;
	out->reused = st.reused;
	out->copied = st.copied;
	out->evicted = st.evicted;
	out->rolling = st.rolling;
	out->bytes_to_device = st.bytes_to_dev;
	out->overlap_misses = c->d_misses;
	out->t_stage_s = st.t_stage_s;
	out->t_sync_s = st.t_sync_s;
	return 0;
}
