/*
 * seq.c - the KV cache's sequences, rolling buffers and prefill
 * (kvcache.h: THE ROLLING BUFFER; kvcache_i.h).
 *
 * A sequence is a block table (shared prefixes by reference), per layer
 * the count of tokens written (fill) and the rolling block: the newest,
 * partly filled KV block, in RAM until it is full (kvc_rb_append), then
 * written once through the backend (kvc_rb_flush).  Prefill writes runs of
 * whole blocks the same way, a few layers at a time on helper threads.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kmod-helpers/mem.h"
#include "lib/kv/kvcache_i.h"

bool kvc_source_ok(const struct kvp_kv_source *src)
{
	return src && src->ops && src->ops->fill && src->ops->query;
}

/* The prefill's staging area: its blocks go to the store by O_DIRECT
 * writes of up to 16 MiB, so it is kvp_mem_io_alloc's (huge pages). */
static int stage_reserve(struct kvp_kvcache *c, size_t bytes)
{
	void *p;

	if (bytes <= c->stage_cap)
		return 0;
	kvp_mem_io_free(c->stage, c->stage_cap);
	c->stage = NULL;
	c->stage_cap = 0;
	p = kvp_mem_io_alloc(bytes);
	if (!p)
		return -ENOMEM;
	bytes = kvp_mem_io_bytes(bytes);
	c->stage = p;
	c->stage_cap = bytes;
	return 0;
}

/* ---- reading and writing KV blocks ------------------------------------- */

/* Physical blocks [p, p + n) of layer from data (n * stride bytes). */
static int write_blocks(struct kvp_kvcache *c, uint32_t layer, uint32_t p,
			uint32_t n, const char *data, bool flush)
{
	uint64_t off = kvp_kv_layout_offset(&c->l, layer, p);
	size_t len = (size_t)n * c->stride, pbb = c->l.pager_block_bytes;

	kvc_slots_forget(c, off / pbb, (off + len + pbb - 1) / pbb - off / pbb);
	return c->be->write(c, off, data, len, flush);
}

/* Logical block lb of seq in layer as it is now (rolling or backing). */
int kvc_read_logical(struct kvp_kvcache *c, struct kvc_seq *s, uint32_t layer,
		     uint32_t lb, char *dst)
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

/* The physical blocks of tokens [first, first + ntokens) of seq, whole
 * blocks the backing holds (none of them the rolling one), into a new
 * *out: 0, -EINVAL, -ENOMEM. */
static int range_phys(struct kvp_kvcache *c, uint32_t seq, uint64_t first,
		      uint64_t ntokens, uint32_t **out)
{
	uint32_t G = c->g.block_tokens, layer, *phys;
	uint64_t nb = ntokens / G, i;
	struct kvc_seq *s;

	if (!kvc_seq_ok(c, seq) || !ntokens || first % G || ntokens % G)
		return -EINVAL;
	s = &c->seqs[seq];
	for (layer = 0; layer < c->g.layers; layer++)
		if (first + ntokens > s->fill[layer])
			return -EINVAL;
	phys = malloc(sizeof(*phys) * nb);
	if (!phys)
		return -ENOMEM;
	for (i = 0; i < nb; i++) {
		phys[i] = kvp_block_table_physical(s->bt,
						   (uint32_t)(first / G + i));
		if (phys[i] == KVP_BLOCK_NONE) {
			free(phys);
			return -EINVAL;
		}
	}
	*out = phys;
	return 0;
}

int kvp_kvcache_read_blocks(struct kvp_kvcache *c, uint32_t seq,
			    uint64_t first, uint64_t ntokens, void *dst)
{
	uint64_t nb = ntokens / c->g.block_tokens;
	uint32_t layer, *phys;
	int err;

	if ((uintptr_t)dst & 4095)
		return -EINVAL;
	err = range_phys(c, seq, first, ntokens, &phys);
	if (err)
		return err;
	for (layer = 0; layer < c->g.layers && !err; layer++)
		err = c->be->read(c, layer, phys, nb,
				  (char *)dst + layer * nb * c->stride);
	free(phys);
	return err;
}

struct kvp_kvcache_snap {
	struct kvp_kvcache *c;
	uint64_t first, nb; /* the range: its first token, its blocks */
	uint32_t *phys;	    /* nb */
	char *pbbuf;	    /* a pager block: the reader's own scratch */
};

int kvp_kvcache_snap(struct kvp_kvcache *c, uint32_t seq, uint64_t first,
		     uint64_t ntokens, struct kvp_kvcache_snap **out)
{
	struct kvp_kvcache_snap *sn;
	int err;

	if (!c->be->read_shared)
		return -EOPNOTSUPP;
	sn = calloc(1, sizeof(*sn));
	if (!sn)
		return -ENOMEM;
	sn->c = c;
	sn->first = first;
	sn->nb = ntokens / c->g.block_tokens;
	sn->pbbuf = aligned_alloc(4096, c->l.pager_block_bytes);
	err = sn->pbbuf ? range_phys(c, seq, first, ntokens, &sn->phys)
			: -ENOMEM;
	/* the reader reads the store: what was written must be there */
	if (!err && c->be->write_wait)
		err = c->be->write_wait(c, NULL, 0);
	if (err) {
		kvp_kvcache_snap_free(sn);
		return err;
	}
	*out = sn;
	return 0;
}

int kvp_kvcache_snap_read(struct kvp_kvcache_snap *sn, uint64_t first,
			  uint64_t ntokens, void *dst)
{
	struct kvp_kvcache *c = sn->c;
	uint32_t G = c->g.block_tokens, layer;
	uint64_t b, nb = ntokens / G;
	int err = 0;

	if (!ntokens || first % G || ntokens % G || first < sn->first ||
	    (first - sn->first) / G + nb > sn->nb || ((uintptr_t)dst & 4095))
		return -EINVAL;
	b = (first - sn->first) / G;
	for (layer = 0; layer < c->g.layers && !err; layer++)
		err = c->be->read_shared(c, layer, sn->phys + b, nb,
					 (char *)dst + layer * nb * c->stride,
					 sn->pbbuf);
	return err;
}

void kvp_kvcache_snap_free(struct kvp_kvcache_snap *sn)
{
	if (!sn)
		return;
	free(sn->phys);
	free(sn->pbbuf);
	free(sn);
}

/* ---- sequences -------------------------------------------------------- */

/* Free what seq_init allocated for a slot that did not become live. */
static void seq_slot_free(struct kvc_seq *s)
{
	free(s->fill);
	free(s->rb);
	free(s->rbpin);
	s->fill = NULL;
	s->rb = NULL;
	s->rbpin = NULL;
}

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
		seq_slot_free(&c->seqs[i]);
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
		seq_slot_free(&c->seqs[*id]);
		return err;
	}
	pthread_mutex_lock(&c->tlock);
	c->seqs[*id].live = true;
	pthread_mutex_unlock(&c->tlock);
	return 0;
}

bool kvc_seq_ok(const struct kvp_kvcache *c, uint32_t id)
{
	return c && id < c->o.max_seqs && c->seqs[id].live;
}

int kvp_kvcache_seq_fork(struct kvp_kvcache *c, uint32_t parent,
			 uint64_t ntokens, uint32_t *id)
{
	struct kvc_seq *ps, *cs;
	uint32_t layer, G, lb, nb;
	int err;

	if (!kvc_seq_ok(c, parent) || !id)
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
		seq_slot_free(cs);
		return err;
	}
	G = c->g.block_tokens;
	nb = (uint32_t)((ntokens + G - 1) / G);
	for (layer = 0; layer < c->g.layers; layer++) {
		char *rbl = cs->rb + (size_t)layer * c->stride;

		cs->fill[layer] = ntokens;
		/* the shared part of the last block into the rolling buffer */
		if (ntokens % G) {
			err = kvc_read_logical(c, ps, layer, nb - 1, rbl);
			if (err)
				goto fail;
		}
		if (!kvp_predictor_needs_keys(c->pred))
			continue;
		for (lb = 0; lb < nb; lb++) {
			uint64_t t0 = (uint64_t)lb * G;
			uint32_t n =
			    (uint32_t)(ntokens - t0 < G ? ntokens - t0 : G);

			err = kvc_read_logical(c, cs, layer, lb, c->pbbuf);
			if (!err)
				err = kvp_predictor_observe(c->pred, *id, layer,
							    t0, n, c->pbbuf);
			if (err)
				goto fail;
		}
	}
	return 0;
fail:
	kvc_seq_drop(c, *id, true);
	return err;
}

void kvc_seq_drop(struct kvp_kvcache *c, uint32_t id, bool discard)
{
	struct kvc_seq *s = &c->seqs[id];
	uint32_t nb = kvp_block_table_blocks(s->bt), *freed = NULL,
		 *spans = NULL, layer;
	size_t nfreed = 0, nspans, i;

	for (layer = 0; s->rbpin && layer < c->g.layers; layer++)
		if (s->rbpin[layer] != UINT64_MAX)
			c->be->unpin(c, s->rbpin[layer], 1);
	if (nb && ((discard && c->be->discard) || c->da))
		freed = malloc(sizeof(uint32_t) * nb);
	if (discard && nb && c->be->discard)
		spans = malloc(sizeof(uint32_t) * nb);
	pthread_mutex_lock(&c->tlock);
	s->live = false;
	kvp_block_table_destroy(s->bt, freed, &nfreed);
	pthread_mutex_unlock(&c->tlock);
	/* a freed block is rewritten by its next owner: no stale device copy */
	if (c->da && nb)
		kvc_dev_forget(c, freed, nfreed);
	if (freed && spans) {
		nspans = kvp_block_alloc_free_spans(c->alloc,
						    c->l.blocks_per_pager_block,
						    freed, nfreed, spans);
		for (i = 0; i < nspans; i++) {
			for (layer = 0; layer < c->g.layers; layer++) {
				uint64_t pb = kvp_kv_layout_pager_block(
				    &c->l, layer, spans[i]);

				kvc_slots_forget(c, pb, 1);
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
	if (!kvc_seq_ok(c, id))
		return -EINVAL;
	kvp_kvcache_drain(c);
	kvc_seq_drop(c, id, true);
	return 0;
}

uint64_t kvp_kvcache_seq_tokens(const struct kvp_kvcache *c, uint32_t id)
{
	return kvc_seq_ok(c, id) ? kvp_block_table_tokens(c->seqs[id].bt) : 0;
}

const struct kvp_block_table *kvp_kvcache_seq_table(const struct kvp_kvcache *c,
						    uint32_t id)
{
	return kvc_seq_ok(c, id) ? c->seqs[id].bt : NULL;
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
int kvc_rb_append(struct kvp_kvcache *c, uint32_t id, uint32_t layer,
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
int kvc_rb_flush(struct kvp_kvcache *c, uint32_t id, uint32_t layer)
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
		err = kvc_rb_append(c, id, layer + k, src, (uint32_t)head);
		if (!err)
			err = kvc_rb_flush(c, id, layer + k);
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
		err = kvc_rb_append(c, id, layer + k, src,
				    (uint32_t)((t0tok + ntokens) % G));
		if (err)
			return err;
	}
	return 0;
}

int kvp_kvcache_prefill_stored(struct kvp_kvcache *c, uint32_t id,
			       uint64_t ntokens,
			       int (*bind)(void *arg, const uint64_t *offs,
					   size_t n),
			       void *arg)
{
	struct kvc_seq *s;
	const uint32_t *map;
	uint64_t t0tok, *offs = NULL;
	uint32_t G, nb, first, l, b;
	int err;

	if (!kvc_seq_ok(c, id) || !bind)
		return -EINVAL;
	if (!ntokens)
		return 0;
	s = &c->seqs[id];
	G = c->g.block_tokens;
	t0tok = kvp_block_table_tokens(s->bt);
	if (!c->be->in_store || t0tok % G || ntokens % G ||
	    ntokens / G > UINT32_MAX / c->g.layers ||
	    kvp_predictor_needs_keys(c->pred))
		return -EOPNOTSUPP;
	kvp_kvcache_drain(c);
	nb = (uint32_t)(ntokens / G);
	first = (uint32_t)(t0tok / G);
	offs = malloc(sizeof(*offs) * nb * c->g.layers);
	if (!offs)
		return -ENOMEM;
	pthread_mutex_lock(&c->tlock);
	err = kvp_block_table_append(s->bt, (uint32_t)ntokens, NULL, NULL);
	pthread_mutex_unlock(&c->tlock);
	if (err)
		goto out;
	map = kvp_block_table_map(s->bt);
	for (l = 0; l < c->g.layers; l++)
		for (b = 0; b < nb; b++) {
			uint64_t off = kvp_kv_layout_offset(&c->l, l,
							    map[first + b]);

			if (!c->be->in_store(c, off / c->l.pager_block_bytes))
				err = -EOPNOTSUPP;
			offs[(size_t)l * nb + b] = c->o.store_offset + off;
		}
	if (!err && c->be->write_wait)
		err = c->be->write_wait(c, NULL, 0); /* the store is bound */
	for (l = 0; l < c->g.layers && !err; l++)
		for (b = 0; b < nb; b++)
			kvc_slots_forget(c,
					 (offs[(size_t)l * nb + b] -
					  c->o.store_offset) /
					     c->l.pager_block_bytes,
					 1);
	if (!err)
		err = bind(arg, offs, (size_t)nb * c->g.layers);
	if (err) {
		pthread_mutex_lock(&c->tlock);
		kvp_block_table_truncate(s->bt, t0tok); /* cannot fail */
		pthread_mutex_unlock(&c->tlock);
		goto out;
	}
	for (l = 0; l < c->g.layers; l++) {
		s->fill[l] = t0tok + ntokens;
		rb_repin(c, s, l);
	}
	c->st.prefill_tokens += ntokens;
out:
	free(offs);
	return err;
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

	if (!kvc_seq_ok(c, id) || !kvc_source_ok(src))
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
