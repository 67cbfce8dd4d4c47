/*
 * quality.c - quality sampling of the KV cache (kvp_kvcache_quality).
 *
 * A sampled step records, for each sequence and sampled layer, the query,
 * the output and the logical blocks it read (kvc_sample_record).  Scoring
 * later reads those blocks as they are (the backend's read: no faults, no
 * change of residency), computes exact attention and each block's mass,
 * and compares: recall of the chosen blocks' mass, relative error of the
 * output.  Samples are taken every sample_every steps from sample_layers
 * layers spread over the depth (kvc_layer_sampled).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "lib/kv/kvcache_i.h"

void kvc_sample_record(struct kvp_kvcache *c, uint32_t id, uint32_t layer,
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

bool kvc_layer_sampled(struct kvp_kvcache *c, uint32_t layer)
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
			err = kvc_read_logical(c, s, sm->layer, i,
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

void kvc_samples_free(struct kvp_kvcache *c)
{
	uint32_t i;

	for (i = 0; i < c->nsamples; i++) {
		free(c->samples[i].q);
		free(c->samples[i].out);
		free(c->samples[i].lb);
	}
	free(c->samples);
	c->samples = NULL;
	c->nsamples = 0;
}
