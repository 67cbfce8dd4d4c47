/*
 * devattn.c - decode attention on a device fed from host memory
 * (devattn.h: the stage / launch / finish schedule and why it is safe).
 *
 * Two sides, one per stage parity, each with its own staging buffer,
 * landing area, launch buffer and output; events COPIED(p) and DONE(p).
 * The pool's region slots come first, then two rolling slots per
 * sequence (one per side).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/device/devattn.h"
#include "lib/device/devpool.h"

/* Shares per (sequence, head): at most MAX_SPLITS, and when the table
 * allows, enough that the launch has FILL_BLOCKS thread blocks (one per KV
 * head and share, lib/cuda/attention.cu): a 32K table of one sequence
 * then keeps every multiprocessor of a large GPU busy. */
#define MAX_SPLITS 256
#define FILL_BLOCKS 512
#define ALIGN 256
#define EV_COPIED(p) (p)
#define EV_DONE(p) (2 + (p))

struct side {
	bool staged;	      /* holds a stage not finished */
	bool launched;	      /* its kernel was launched */
	bool copy_pending;    /* COPIED(p) recorded, not yet waited for */
	uint64_t stage;	      /* which */
	uint32_t layer, nseq; /* of the stage */
	uint32_t *off;	      /* max_seqs + 1: into slots */
	uint32_t *slots;      /* the region blocks' slots, per sequence */
	uint32_t ncopy;	      /* blocks copied by the stage */
	char *stg;	      /* host, page-locked: slot list, then blocks */
	char *land;	      /* device: where stg lands */
	char *lh, *ld;	      /* launch buffer: host (locked), device */
	float *hout, *dout;   /* output: host (locked), device */
};

struct kvp_devattn {
	struct kvp_device *d;
	const struct kvp_dev_ops *ops;
	void *h;		      /* ops' handle */
	struct kvp_devattn_opts o;    /* copy, defaults filled */
	struct kvp_devpool *pool;     /* region slots */
	char *dpool;		      /* device: the slots */
	float *scratch;		      /* device: the kernel's partials */
	uint64_t bb;		      /* bytes of one KV block */
	uint32_t qf;		      /* floats of one query */
	uint32_t max_splits;	      /* scratch holds this many shares */
	size_t stg_hdr, stg_bytes;    /* staging: slot list, in all */
	size_t o_off, o_slots, o_ntok, o_rslots, o_q, o_roll, lbytes;
	struct side side[2];
	bool any_staged;	      /* last_stage is valid */
	uint64_t last_stage;	      /* the newest stage staged */
	struct kvp_devattn_stats st;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t up(size_t n)
{
	return (n + ALIGN - 1) / ALIGN * ALIGN;
}

static void free_side(struct kvp_devattn *a, struct side *s)
{
	free(s->off);
	free(s->slots);
	if (s->stg)
		a->ops->host_free(a->h, s->stg);
	if (s->lh)
		a->ops->host_free(a->h, s->lh);
	if (s->hout)
		a->ops->host_free(a->h, s->hout);
	if (s->land)
		a->ops->mem_free(a->h, s->land);
	if (s->ld)
		a->ops->mem_free(a->h, s->ld);
	if (s->dout)
		a->ops->mem_free(a->h, s->dout);
}

static int alloc_side(struct kvp_devattn *a, struct side *s)
{
	const struct kvp_devattn_opts *o = &a->o;
	size_t outb = sizeof(float) * o->max_seqs * a->qf;
	int err;

	s->off = calloc(o->max_seqs + 1, sizeof(uint32_t));
	s->slots = calloc((size_t)o->max_seqs * o->max_entries + 1,
			  sizeof(uint32_t));
	if (!s->off || !s->slots)
		return -ENOMEM;
	err = a->ops->host_alloc(a->h, a->stg_bytes, (void **)&s->stg);
	if (!err)
		err = a->ops->mem_alloc(a->h, a->stg_bytes, (void **)&s->land);
	if (!err)
		err = a->ops->host_alloc(a->h, a->lbytes, (void **)&s->lh);
	if (!err)
		err = a->ops->mem_alloc(a->h, a->lbytes, (void **)&s->ld);
	if (!err)
		err = a->ops->host_alloc(a->h, outb, (void **)&s->hout);
	if (!err)
		err = a->ops->mem_alloc(a->h, outb, (void **)&s->dout);
	return err;
}

int kvp_devattn_create(struct kvp_device *d, const struct kvp_devattn_opts *o,
		       struct kvp_devattn **out)
{
	const struct kvp_paged_shape *sh = &o->shape;
	struct kvp_devattn *a;
	uint64_t entries;
	size_t n;
	int err, p;

	if (!d || !o->nslots || !o->max_seqs || !o->max_entries ||
	    !sh->kv_heads || !sh->q_heads || sh->q_heads % sh->kv_heads ||
	    !sh->head_dim || sh->head_dim % 8 ||
	    sh->head_dim > KVP_DEV_MAX_DIM || !sh->block_tokens ||
	    sh->dtype < KVP_ATTN_FP16 || sh->dtype > KVP_ATTN_FP32 ||
	    o->splits > MAX_SPLITS)
		return -EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->d = d;
	a->ops = kvp_device_ops(d);
	a->h = kvp_device_handle(d);
	a->o = *o;
	a->bb = kvp_paged_block_bytes(sh);
	if (!a->o.shape.slot_bytes)
		a->o.shape.slot_bytes = a->bb;
	if (a->o.shape.slot_bytes < a->bb) {
		free(a);
		return -EINVAL;
	}
	entries = (uint64_t)o->max_seqs * o->max_entries;
	/* a table has at most max_entries + 1 (the rolling block) entries */
	a->max_splits = o->max_entries + 1 < MAX_SPLITS ? o->max_entries + 1
							: MAX_SPLITS;
	if (o->splits > a->max_splits)
		a->max_splits = o->splits;
	if (!a->o.max_copies)
		a->o.max_copies =
		    (uint32_t)(entries < o->nslots ? entries : o->nslots);
	a->qf = sh->q_heads * sh->head_dim;
	a->stg_hdr = up(sizeof(uint32_t) * a->o.max_copies);
	a->stg_bytes = a->stg_hdr + a->o.max_copies * a->bb;
	n = 0;
	a->o_off = n;
	n = up(n + sizeof(uint32_t) * (o->max_seqs + 1));
	a->o_slots = n;
	n = up(n + sizeof(uint32_t) * (entries + o->max_seqs));
	a->o_ntok = n;
	n = up(n + sizeof(uint32_t) * (entries + o->max_seqs));
	a->o_rslots = n;
	n = up(n + sizeof(uint32_t) * o->max_seqs);
	a->o_q = n;
	n = up(n + sizeof(float) * o->max_seqs * a->qf);
	a->o_roll = n;
	a->lbytes = n + o->max_seqs * a->bb;
	err = kvp_devpool_create(o->nslots, &a->pool);
	if (!err)
		err = a->ops->mem_alloc(
		    a->h,
		    (size_t)(o->nslots + 2 * o->max_seqs) *
			a->o.shape.slot_bytes,
		    (void **)&a->dpool);
	if (!err)
		err = a->ops->mem_alloc(
		    a->h,
		    sizeof(float) * kvp_dev_scratch_floats(o->max_seqs,
							   sh->q_heads,
							   sh->head_dim,
							   a->max_splits),
		    (void **)&a->scratch);
	for (p = 0; p < 2 && !err; p++)
		err = alloc_side(a, &a->side[p]);
	if (err) {
		kvp_devattn_destroy(a);
		return err;
	}
	*out = a;
	return 0;
}

void kvp_devattn_destroy(struct kvp_devattn *a)
{
	int p;

	if (!a)
		return;
	/* nothing may still read or write what is freed */
	for (p = 0; p < 2; p++) {
		a->ops->event_sync(a->h, EV_COPIED(p));
		a->ops->event_sync(a->h, EV_DONE(p));
	}
	for (p = 0; p < 2; p++)
		free_side(a, &a->side[p]);
	if (a->dpool)
		a->ops->mem_free(a->h, a->dpool);
	if (a->scratch)
		a->ops->mem_free(a->h, a->scratch);
	kvp_devpool_destroy(a->pool);
	free(a);
}

/* Undo the slots stage took so far (a refused stage changes nothing). */
static void unassign(struct kvp_devattn *a, struct side *s, uint32_t ncopy)
{
	const uint32_t *list = (const uint32_t *)s->stg;
	uint32_t k;

	for (k = 0; k < ncopy; k++)
		kvp_devpool_unassign(a->pool, list[k]);
}

int kvp_devattn_stage(struct kvp_devattn *a, uint64_t stage, uint32_t layer,
		      uint32_t nseq, const uint32_t *off,
		      const uint32_t *pblocks, const void *const *host)
{
	struct side *s = &a->side[stage % 2];
	const struct side *other = &a->side[1 - stage % 2];
	struct kvp_devpool_stats ps0, ps1;
	uint32_t *list, ncopy = 0, i, e;
	double t0;
	int err;

	if (!nseq || nseq > a->o.max_seqs || off[0] != 0 ||
	    (a->any_staged && stage <= a->last_stage))
		return -EINVAL;
	if (s->staged)
		return -EBUSY;
	for (i = 0; i < nseq; i++)
		if (off[i + 1] < off[i] || off[i + 1] - off[i] > a->o.max_entries)
			return off[i + 1] < off[i] ? -EINVAL : -E2BIG;
	/* the staging buffer's last copy must have run before we refill it */
	if (s->copy_pending) {
		err = a->ops->event_sync(a->h, EV_COPIED(stage % 2));
		if (err)
			return err;
		s->copy_pending = false;
	}
	list = (uint32_t *)s->stg;
	kvp_devpool_stats(a->pool, &ps0);
	for (e = 0; e < off[nseq]; e++) {
		uint32_t slot;

		err = kvp_devpool_assign(a->pool, layer, pblocks[e], stage,
					 &slot);
		if (err == 1 && ncopy == a->o.max_copies) {
			kvp_devpool_unassign(a->pool, slot);
			err = -E2BIG;
		}
		if (err < 0) {
			unassign(a, s, ncopy);
			/* full with nothing else in flight: it never fits */
			if (err == -ENOSPC && !other->staged)
				err = -E2BIG;
			if (err == -ENOSPC)
				a->st.retries++;
			return err;
		}
		if (err == 1)
			list[ncopy++] = slot;
		s->slots[e] = slot;
	}
	/* the host's copy: frames to staging (a fault here if not resident) */
	t0 = now_s();
	for (e = 0, i = 0; e < off[nseq]; e++) {
		if (i < ncopy && list[i] == s->slots[e]) {
			memcpy(s->stg + a->stg_hdr + (size_t)i * a->bb,
			       host[e], a->bb);
			i++;
		}
	}
	a->st.t_stage_s += now_s() - t0;
	if (ncopy) {
		struct kvp_dev_scatter sc = {
			.dst = a->dpool,
			.src = s->land + a->stg_hdr,
			.slots = (const uint32_t *)s->land,
			.count = ncopy,
			.bytes = a->bb,
			.stride = a->o.shape.slot_bytes,
		};
		size_t bytes = a->stg_hdr + (size_t)ncopy * a->bb;

		err = a->ops->copy(a->h, s->land, s->stg, bytes, 1,
				   KVP_DEV_STREAM_COPY);
		if (!err)
			err = a->ops->scatter(a->h, &sc, KVP_DEV_STREAM_COPY);
		if (err) {
			unassign(a, s, ncopy);
			return err;
		}
		a->st.bytes_to_dev += bytes;
	}
	err = a->ops->record(a->h, EV_COPIED(stage % 2), KVP_DEV_STREAM_COPY);
	if (err)
		return err; /* the copies are queued: the slots stay taken */
	s->copy_pending = true;
	kvp_devpool_stats(a->pool, &ps1);
	a->st.reused += ps1.reused - ps0.reused;
	a->st.copied += ps1.copied - ps0.copied;
	a->st.evicted += ps1.evicted - ps0.evicted;
	memcpy(s->off, off, sizeof(uint32_t) * (nseq + 1));
	s->ncopy = ncopy;
	s->nseq = nseq;
	s->layer = layer;
	s->stage = stage;
	s->staged = true;
	s->launched = false;
	a->any_staged = true;
	a->last_stage = stage;
	return 0;
}

int kvp_devattn_launch(struct kvp_devattn *a, uint64_t stage,
		       const void *const *rolling, const uint32_t *rolling_ntok,
		       const float *q)
{
	uint32_t p = stage % 2, G = a->o.shape.block_tokens;
	struct side *s = &a->side[p];
	uint32_t *off = (uint32_t *)(s->lh + a->o_off);
	uint32_t *slots = (uint32_t *)(s->lh + a->o_slots);
	uint32_t *ntok = (uint32_t *)(s->lh + a->o_ntok);
	uint32_t *rslots = (uint32_t *)(s->lh + a->o_rslots);
	uint32_t i, n = 0, nroll = 0, maxn = 0, splits;
	struct kvp_dev_attn at;
	int err;

	if (!s->staged || s->launched || s->stage != stage)
		return -EINVAL;
	for (i = 0; i < s->nseq; i++) {
		uint32_t k = s->off[i + 1] - s->off[i];

		if (!k && !(rolling && rolling[i]))
			return -EINVAL;
		if (rolling && rolling[i] &&
		    (!rolling_ntok[i] || rolling_ntok[i] > G))
			return -EINVAL;
	}
	/* the tables: region blocks, then the rolling block */
	for (i = 0; i < s->nseq; i++) {
		uint32_t k = s->off[i + 1] - s->off[i], j;

		off[i] = n;
		for (j = 0; j < k; j++) {
			slots[n] = s->slots[s->off[i] + j];
			ntok[n++] = G;
		}
		if (rolling && rolling[i]) {
			rslots[nroll] = a->o.nslots + 2 * i + p;
			memcpy(s->lh + a->o_roll + (size_t)nroll * a->bb,
			       rolling[i], a->bb);
			slots[n] = rslots[nroll++];
			ntok[n++] = rolling_ntok[i];
		}
		if (n - off[i] > maxn)
			maxn = n - off[i];
	}
	off[s->nseq] = n;
	memcpy(s->lh + a->o_q, q, sizeof(float) * s->nseq * a->qf);
	splits = a->o.splits;
	if (!splits) {
		/* 8 entries a share, or fewer (2 at least) to fill the GPU */
		uint32_t fill = FILL_BLOCKS / (a->o.shape.kv_heads * s->nseq);

		splits = (maxn + 7) / 8;
		if (splits < fill)
			splits = fill < (maxn + 1) / 2 ? fill : (maxn + 1) / 2;
	}
	if (splits > a->max_splits)
		splits = a->max_splits;
	if (splits > maxn)
		splits = maxn;
	if (!splits)
		splits = 1;
	at.shape = a->o.shape;
	at.pool = a->dpool;
	at.off = (const uint32_t *)(s->ld + a->o_off);
	at.slots = (const uint32_t *)(s->ld + a->o_slots);
	at.ntok = (const uint32_t *)(s->ld + a->o_ntok);
	at.nseq = s->nseq;
	at.q = (const float *)(s->ld + a->o_q);
	at.out = s->dout;
	at.scratch = a->scratch;
	at.splits = splits;
	err = a->ops->copy(a->h, s->ld, s->lh, a->o_roll + nroll * a->bb, 1,
			   KVP_DEV_STREAM_COMPUTE);
	if (!err)
		err = a->ops->stream_wait(a->h, KVP_DEV_STREAM_COMPUTE,
					  EV_COPIED(p));
	if (!err && nroll) {
		struct kvp_dev_scatter sc = {
			.dst = a->dpool,
			.src = s->ld + a->o_roll,
			.slots = (const uint32_t *)(s->ld + a->o_rslots),
			.count = nroll,
			.bytes = a->bb,
			.stride = a->o.shape.slot_bytes,
		};

		err = a->ops->scatter(a->h, &sc, KVP_DEV_STREAM_COMPUTE);
	}
	if (!err)
		err = a->ops->attend(a->h, &at, KVP_DEV_STREAM_COMPUTE);
	if (!err)
		err = a->ops->copy(a->h, s->hout, s->dout,
				   sizeof(float) * s->nseq * a->qf, 0,
				   KVP_DEV_STREAM_COMPUTE);
	if (!err)
		err = a->ops->record(a->h, EV_DONE(p), KVP_DEV_STREAM_COMPUTE);
	if (err)
		return err;
	s->launched = true;
	a->st.stages++;
	a->st.rolling += nroll;
	a->st.bytes_to_dev += a->o_roll + nroll * a->bb;
	return 0;
}

int kvp_devattn_finish(struct kvp_devattn *a, uint64_t stage, float *out)
{
	struct side *s = &a->side[stage % 2];
	double t0 = now_s();
	int err;

	if (!s->staged || !s->launched || s->stage != stage)
		return -EINVAL;
	err = a->ops->event_sync(a->h, EV_DONE(stage % 2));
	a->st.t_sync_s += now_s() - t0;
	if (err)
		return err;
	memcpy(out, s->hout, sizeof(float) * s->nseq * a->qf);
	kvp_devpool_release(a->pool, stage);
	s->staged = s->launched = false;
	return 0;
}

void kvp_devattn_abandon(struct kvp_devattn *a, uint64_t stage)
{
	struct side *s = &a->side[stage % 2];

	if (!s->staged || s->stage != stage)
		return;
	a->ops->event_sync(a->h, EV_COPIED(stage % 2));
	s->copy_pending = false;
	if (s->launched)
		a->ops->event_sync(a->h, EV_DONE(stage % 2));
	kvp_devpool_release(a->pool, stage);
	s->staged = s->launched = false;
}

void kvp_devattn_forget_all(struct kvp_devattn *a)
{
	kvp_devpool_forget_all(a->pool);
}

int kvp_devattn_forget(struct kvp_devattn *a, uint32_t layer, uint32_t pblock)
{
	return kvp_devpool_forget(a->pool, layer, pblock) ? 0 : -EBUSY;
}

uint32_t kvp_devattn_slot(const struct kvp_devattn *a, uint32_t layer,
			  uint32_t pblock)
{
	return kvp_devpool_lookup(a->pool, layer, pblock);
}

const uint32_t *kvp_devattn_table(const struct kvp_devattn *a, uint32_t i,
				  uint32_t *n)
{
	const struct side *s = &a->side[a->last_stage % 2];

	if (!a->any_staged || i >= s->nseq) {
		*n = 0;
		return NULL;
	}
	*n = s->off[i + 1] - s->off[i];
	return s->slots + s->off[i];
}

void kvp_devattn_stats(const struct kvp_devattn *a,
		       struct kvp_devattn_stats *out)
{
	*out = a->st;
}

uint32_t kvp_devattn_slots(const struct kvp_devattn *a)
{
	return a->o.nslots;
}

uint64_t kvp_devattn_device_bytes(const struct kvp_devattn *a)
{
	return (uint64_t)(a->o.nslots + 2 * a->o.max_seqs) *
		   a->o.shape.slot_bytes +
	       2 * (a->stg_bytes + a->lbytes +
		    sizeof(float) * a->o.max_seqs * a->qf) +
	       sizeof(float) * kvp_dev_scratch_floats(a->o.max_seqs,
						      a->o.shape.q_heads,
						      a->o.shape.head_dim,
						      a->max_splits);
}

uint64_t kvp_devattn_host_bytes(const struct kvp_devattn *a)
{
	return 2 * (a->stg_bytes + a->lbytes +
		    sizeof(float) * a->o.max_seqs * a->qf);
}
