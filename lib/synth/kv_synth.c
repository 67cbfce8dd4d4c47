/*
 * kv_synth.c - synthetic KV with planted structure (see kv_synth.h).
 *
 * Per layer and KV head, unit directions (random Gaussian, normalised per
 * head): one per topic cluster, one for sinks, one for heavy hitters.  The
 * key row of a token (all KV heads) is
 *
 *   topic_logit * U[topic] (+ sink_logit * U[sink]) (+ heavy_logit * U[heavy])
 *   + sigma * noise window + positional coordinates
 *
 * and a query of head h (KV head j) is sqrt(dim) * (U_j[sink] + U_j[heavy] +
 * U_j[topic*]) + positional coordinates + a little noise, so that
 * q.k/sqrt(dim) is about the component's *_logit.  The positional part
 * lives in coordinates 0 .. 2F-1 of each head: key (a cos wt, a sin wt),
 * query sqrt(dim) (cos wT, sin wT) for F = 3 incommensurate frequencies, so
 * the score adds (recent_logit / F) sum_f cos(w_f (T - t)), highest for
 * the last tokens.  Noise comes from a table of Gaussian numbers read at a
 * hashed offset: one multiply-add per element.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/synth/kv_synth.h"

#define NOISE_BITS  16
#define NOISE_LEN   (1u << NOISE_BITS)
#define NFREQ	    3
#define QUERY_NOISE 0.5f

struct kvp_kv_synth {
	struct kvp_kv_geometry g;
	struct kvp_kv_synth_opts o;
	uint32_t row;	    /* kv_heads * head_dim */
	uint32_t ndir;	    /* clusters + 2: topics, sink, heavy */
	float *uk;	    /* layers * ndir * row: key directions */
	float *uv;	    /* layers * ndir * row: value vectors */
	float *noise;	    /* NOISE_LEN + row Gaussian numbers */
	float sigma;	    /* key noise per element */
	float omega[NFREQ]; /* positional frequencies */
};

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static uint64_t hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
	return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}

/* A standard normal number from a counter (Box-Muller). */
static float gauss(uint64_t *state)
{
	uint64_t a = mix((*state)++), b = mix((*state)++);
	double u1 = ((a >> 11) + 1.0) / 9007199254740993.0;
	double u2 = (b >> 11) / 9007199254740992.0;

	return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void kvp_kv_synth_opts_default(struct kvp_kv_synth_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->seed = 1;
	o->sink_tokens = 4;
	o->clusters = 32;
	o->topic_run_tokens = 256;
	o->heavy_every = 2048;
	o->recent_tokens = 32;
	o->sink_logit = 10;
	o->heavy_logit = 9;
	o->topic_logit = 6;
	o->recent_logit = 3;
	o->noise = 1;
}

int kvp_kv_synth_create(const struct kvp_kv_geometry *g,
			const struct kvp_kv_synth_opts *o,
			struct kvp_kv_synth **out)
{
	struct kvp_kv_synth *s;
	uint64_t st;
	size_t n, i, l, d, j;
	uint32_t dim;

	if (kvp_kv_geometry_check(g) || !o || o->clusters == 0 ||
	    o->topic_run_tokens == 0 || o->heavy_every == 0 ||
	    g->head_dim < 2 * NFREQ)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->g = *g;
	s->o = *o;
	dim = g->head_dim;
	s->row = g->kv_heads * dim;
	s->ndir = o->clusters + 2;
	n = (size_t)g->layers * s->ndir * s->row;
	s->uk = malloc(n * sizeof(float));
	s->uv = malloc(n * sizeof(float));
	s->noise = malloc((NOISE_LEN + s->row) * sizeof(float));
	if (!s->uk || !s->uv || !s->noise) {
		kvp_kv_synth_destroy(s);
		return -ENOMEM;
	}
	st = mix(o->seed ^ 0x5eedULL);
	for (i = 0; i < n; i++) {
		s->uk[i] = gauss(&st);
		s->uv[i] = gauss(&st);
	}
	/* normalise each direction per head */
	for (l = 0; l < (size_t)g->layers * s->ndir; l++) {
		for (j = 0; j < g->kv_heads; j++) {
			float *u = s->uk + l * s->row + j * dim;
			double nn = 0;

			for (d = 0; d < dim; d++)
				nn += (double)u[d] * u[d];
			nn = 1.0 / sqrt(nn);
			for (d = 0; d < dim; d++)
				u[d] = (float)(u[d] * nn);
		}
	}
	for (i = 0; i < NOISE_LEN + s->row; i++)
		s->noise[i] = gauss(&st);
	s->sigma = o->noise / sqrtf(3.0f + NFREQ + QUERY_NOISE * QUERY_NOISE);
	for (i = 0; i < NFREQ; i++) {
		static const float c[NFREQ] = { 1.0f, 1.618034f, 2.414214f };
		uint32_t w = o->recent_tokens ? o->recent_tokens : 1;

		s->omega[i] = 1.5707964f * c[i] / (float)w;
	}
	*out = s;
	return 0;
}

void kvp_kv_synth_destroy(struct kvp_kv_synth *s)
{
	if (!s)
		return;
	free(s->uk);
	free(s->uv);
	free(s->noise);
	free(s);
}

bool kvp_kv_synth_is_heavy(const struct kvp_kv_synth *s, uint32_t seq,
			   uint64_t token)
{
	if (token < s->o.sink_tokens)
		return false;
	return hash4(s->o.seed, 0x4ea7, seq, token) % s->o.heavy_every == 0;
}

uint32_t kvp_kv_synth_topic(const struct kvp_kv_synth *s, uint32_t seq,
			    uint32_t layer, uint64_t token)
{
	uint64_t run = token / s->o.topic_run_tokens;

	(void)
	    layer; /* a token's topic is its content: the same in all layers */
	return (uint32_t)(hash4(s->o.seed, 0x7091c, seq, run) % s->o.clusters);
}

uint32_t kvp_kv_synth_query_topic(const struct kvp_kv_synth *s, uint32_t seq,
				  uint32_t layer, uint64_t pos)
{
	uint64_t t =
	    pos ? hash4(s->o.seed, 0x9e7, (uint64_t)seq << 32 | layer, pos) %
		      pos
		: 0;

	return kvp_kv_synth_topic(s, seq, layer, t);
}

/*
 * dst = a * u + sig * nz (+ b * w when w): one row.  Two copies of the
 * same loop, one compiled for AVX2 (picked at run time; not an ifunc, whose
 * resolver runs before sanitizer runtimes are up).
 */
#define COMPOSE_ARGS                                                           \
	float *restrict dst, const float *restrict u, float a,                 \
	    const float *restrict w, float b, const float *restrict nz,        \
	    float sig, uint32_t n

static void compose_generic(COMPOSE_ARGS)
{
	uint32_t i;

	if (w) {
		for (i = 0; i < n; i++)
			dst[i] = a * u[i] + b * w[i] + sig * nz[i];
	} else {
		for (i = 0; i < n; i++)
			dst[i] = a * u[i] + sig * nz[i];
	}
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2,fma"), optimize("tree-vectorize"))) static void
compose_avx2(COMPOSE_ARGS)
{
	uint32_t i;

	if (w) {
		for (i = 0; i < n; i++)
			dst[i] = a * u[i] + b * w[i] + sig * nz[i];
	} else {
		for (i = 0; i < n; i++)
			dst[i] = a * u[i] + sig * nz[i];
	}
}
#endif

static void compose(COMPOSE_ARGS)
{
#if defined(__x86_64__) || defined(__i386__)
	if (kvp_cpu_simd()) {
		compose_avx2(dst, u, a, w, b, nz, sig, n);
		return;
	}
#endif
	compose_generic(dst, u, a, w, b, nz, sig, n);
}

int kvp_kv_synth_fill(const struct kvp_kv_synth *s, uint32_t seq,
		      uint32_t layer, uint64_t token, uint32_t ntokens,
		      void *kvblock)
{
	const struct kvp_kv_geometry *g = &s->g;
	uint32_t dim = g->head_dim, G = g->block_tokens, row = s->row;
	float stack[2 * 8192], *kr = stack, *vr = stack + 8192, *heap = NULL;
	const float *uk, *uv;
	uint64_t t;
	uint32_t j, f;

	if (layer >= g->layers || ntokens == 0 || token % G + ntokens > G)
		return -EINVAL;
	if (row > 8192) {
		heap = malloc(2 * sizeof(float) * row);
		if (!heap)
			return -ENOMEM;
		kr = heap;
		vr = heap + row;
	}
	uk = s->uk + (size_t)layer * s->ndir * row;
	uv = s->uv + (size_t)layer * s->ndir * row;
	for (t = token; t < token + ntokens; t++) {
		uint32_t z = kvp_kv_synth_topic(s, seq, layer, t);
		uint64_t h = hash4(s->o.seed, seq, layer, t);
		const float *nk = s->noise + (h & (NOISE_LEN - 1));
		const float *nv = s->noise + ((h >> 20) & (NOISE_LEN - 1));
		const float *extra_k = NULL, *extra_v = NULL;
		float ek = 0;
		uint32_t slot = (uint32_t)(t % G);

		if (t < s->o.sink_tokens) {
			extra_k = uk + (size_t)s->o.clusters * row;
			extra_v = uv + (size_t)s->o.clusters * row;
			ek = s->o.sink_logit;
		} else if (kvp_kv_synth_is_heavy(s, seq, t)) {
			extra_k = uk + (size_t)(s->o.clusters + 1) * row;
			extra_v = uv + (size_t)(s->o.clusters + 1) * row;
			ek = s->o.heavy_logit;
		}
		compose(kr, uk + (size_t)z * row, s->o.topic_logit, extra_k, ek,
			nk, s->sigma, row);
		compose(vr, uv + (size_t)z * row, 1.0f, extra_v, 1.0f, nv, 0.5f,
			row);
		for (f = 0; f < NFREQ; f++) {
			float a = s->o.recent_logit / NFREQ;
			float c = a * cosf(s->omega[f] * (float)t);
			float sn = a * sinf(s->omega[f] * (float)t);

			for (j = 0; j < g->kv_heads; j++) {
				kr[j * dim + 2 * f] += c;
				kr[j * dim + 2 * f + 1] += sn;
			}
		}
		for (j = 0; j < g->kv_heads; j++) {
			kvp_kv_from_f32(
			    g->dtype, kr + j * dim,
			    (char *)kvblock + kvp_kv_k_offset(g, j, slot), dim);
			kvp_kv_from_f32(
			    g->dtype, vr + j * dim,
			    (char *)kvblock + kvp_kv_v_offset(g, j, slot), dim);
		}
	}
	free(heap);
	return 0;
}

void kvp_kv_synth_query(const struct kvp_kv_synth *s, uint32_t seq,
			uint32_t layer, uint64_t pos, float *q)
{
	const struct kvp_kv_geometry *g = &s->g;
	uint32_t dim = g->head_dim, grp = kvp_kv_group(g), row = s->row;
	const float *uk = s->uk + (size_t)layer * s->ndir * row;
	uint32_t z = kvp_kv_synth_query_topic(s, seq, layer, pos);
	float sd = sqrtf((float)dim);
	uint32_t h, d, f;

	for (h = 0; h < g->q_heads; h++) {
		uint32_t j = h / grp;
		const float *ut = uk + (size_t)z * row + j * dim;
		const float *us = uk + (size_t)s->o.clusters * row + j * dim;
		const float *uh =
		    uk + (size_t)(s->o.clusters + 1) * row + j * dim;
		uint64_t hh = hash4(s->o.seed ^ 0xa11, seq,
				    (uint64_t)layer << 16 | h, pos);
		const float *nz = s->noise + (hh & (NOISE_LEN - 1));
		float *qh = q + (size_t)h * dim;

		for (d = 0; d < dim; d++)
			qh[d] =
			    sd * (ut[d] + us[d] + uh[d]) + QUERY_NOISE * nz[d];
		for (f = 0; f < NFREQ; f++) {
			qh[2 * f] += sd * cosf(s->omega[f] * (float)pos);
			qh[2 * f + 1] += sd * sinf(s->omega[f] * (float)pos);
		}
	}
}
