/*
 * test_model.c - the model: the checkpoint loader against crafted files
 * (one bad field at a time), the math against hand values, a tiny
 * hand-checked network through the KV cache, random weights.
 *
 * Needs no model file: the checkpoints are written here.
 */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/model/model_cache.h"
#include "lib/model/model_i.h"
#include "tests/helpers/helpers.h"

static char dir[] = "/tmp/test_model.XXXXXX";

/* A checkpoint with header h and nfloats floats (f(i) or i * 1e-3). */
static const char *write_ckpt(const char *name, const int32_t h[7],
			      size_t nfloats, const float *f)
{
	static char path[256];
	FILE *fp;
	size_t i;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fp = fopen(path, "wb");
	ck_assert_ptr_nonnull(fp);
	ck_assert_uint_eq(fwrite(h, sizeof(int32_t), 7, fp), 7);
	for (i = 0; i < nfloats; i++) {
		float v = f ? f[i] : (float)(i % 1000) * 1e-3f;

		ck_assert_uint_eq(fwrite(&v, sizeof(v), 1, fp), 1);
	}
	ck_assert_int_eq(fclose(fp), 0);
	return path;
}

/* Floats a header implies (the loader's rule, written out again). */
static size_t floats_of(const int32_t h[7])
{
	size_t dim = h[0], hid = h[1], L = h[2], hd = h[0] / h[3];
	size_t kvd = hd * h[4], V = h[5] < 0 ? -h[5] : h[5], S = h[6];

	return V * dim + L * (2 * dim + 2 * dim * dim + 2 * kvd * dim) +
	       L * 3 * hid * dim + dim + S * hd + (h[5] < 0 ? V * dim : 0);
}

static const int32_t good[7] = { 16, 24, 2, 2, 1, 32, 64 };

START_TEST(loads_and_maps)
{
	struct kvp_model *m;
	char err[256] = "";
	const char *p = write_ckpt("good.bin", good, floats_of(good), NULL);
	const struct kvp_model_config *c;
	struct kvp_kv_geometry g;

	ck_assert_int_eq(kvp_model_load_file(p, &m, err, sizeof(err)), 0);
	c = kvp_model_config(m);
	ck_assert_uint_eq(c->dim, 16);
	ck_assert_uint_eq(c->hidden_dim, 24);
	ck_assert_uint_eq(c->layers, 2);
	ck_assert_uint_eq(c->q_heads, 2);
	ck_assert_uint_eq(c->kv_heads, 1);
	ck_assert_uint_eq(c->head_dim, 8);
	ck_assert_uint_eq(c->vocab, 32);
	ck_assert_uint_eq(c->seq_len, 64);
	ck_assert_uint_eq(c->prefill_window, 0);
	ck_assert(c->shared_classifier);
	/* mapped, not copied: the weights are the file's pages */
	ck_assert_ptr_nonnull(m->map);
	ck_assert_ptr_eq(m->w.embed, (const float *)((char *)m->map + 28));
	ck_assert_ptr_eq(m->w.cls, m->w.embed);
	ck_assert_float_eq(m->w.embed[1], 1e-3f);
	ck_assert_uint_eq(kvp_model_weight_bytes(m), floats_of(good) * 4);
	ck_assert_int_eq(kvp_model_geometry(m, KVP_KV_FP16, 4, &g), 0);
	ck_assert_uint_eq(g.q_heads, 2);
	ck_assert_uint_eq(g.head_dim, 8);
	kvp_model_close(m);
}
END_TEST

START_TEST(untied_classifier)
{
	int32_t h[7] = { 16, 24, 2, 2, 1, -32, 64 };
	size_t n = floats_of(h);
	float *f = calloc(n, sizeof(float));
	struct kvp_model *m;
	char err[256];

	f[n - 32 * 16] = 42; /* the classifier's first weight */
	ck_assert_int_eq(
	    kvp_model_load_file(write_ckpt("untied.bin", h, n, f), &m, err,
				sizeof(err)),
	    0);
	ck_assert(!kvp_model_config(m)->shared_classifier);
	ck_assert_float_eq(m->w.cls[0], 42);
	ck_assert_ptr_ne(m->w.cls, m->w.embed);
	kvp_model_close(m);
	free(f);
}
END_TEST

/* One bad field per row: the return and the word the message must have. */
static const struct bad_case {
	int32_t h[7];
	long dfloats; /* floats added to (or, negative, cut from) the right
			 count; LONG_MIN: write only the first 3 ints */
	int rc;
	const char *word;
} bad_cases[] = {
	{ { 0, 24, 2, 2, 1, 32, 64 }, 0, -EINVAL, "field dim " },
	{ { 131072, 24, 2, 2, 1, 32, 64 }, 0, -EINVAL, "field dim " },
	{ { 16, 0, 2, 2, 1, 32, 64 }, 0, -EINVAL, "hidden_dim" },
	{ { 16, -5, 2, 2, 1, 32, 64 }, 0, -EINVAL, "hidden_dim" },
	{ { 16, 24, 0, 2, 1, 32, 64 }, 0, -EINVAL, "n_layers" },
	{ { 16, 24, 5000, 2, 1, 32, 64 }, 0, -EINVAL, "n_layers" },
	{ { 16, 24, 2, 0, 1, 32, 64 }, 0, -EINVAL, "n_heads" },
	{ { 4096, 24, 2, 512, 1, 32, 64 }, 0, -EINVAL, "n_heads" },
	{ { 16, 24, 2, 2, 0, 32, 64 }, 0, -EINVAL, "n_kv_heads" },
	{ { 16, 24, 2, 2, 3, 32, 64 }, 0, -EINVAL, "n_kv_heads" },
	{ { 48, 24, 2, 6, 4, 32, 64 }, 0, -EINVAL, "n_kv_heads 4 does not" },
	{ { 16, 24, 2, 2, 1, 0, 64 }, 0, -EINVAL, "vocab_size" },
	{ { 16, 24, 2, 2, 1, 2000000, 64 }, 0, -EINVAL, "vocab_size" },
	{ { 16, 24, 2, 2, 1, 32, 0 }, 0, -EINVAL, "seq_len" },
	{ { 16, 24, 2, 2, 1, 32, -1 }, 0, -EINVAL, "seq_len" },
	{ { 24, 24, 2, 2, 1, 32, 64 }, 0, -EINVAL, "head size" },
	{ { 16, 24, 2, 2, 1, 32, 64 }, -1, -EFBIG, "truncated" },
	{ { 16, 24, 2, 2, 1, 32, 64 }, 1, -EFBIG, "oversized" },
	{ { 16, 24, 2, 2, 1, 32, 64 }, LONG_MIN, -EFBIG, "truncated" },
	/* untied, sized as if tied: short by the classifier */
	{ { 16, 24, 2, 2, 1, -32, 64 }, -32 * 16, -EFBIG, "truncated" },
};

START_TEST(refuses_bad_field)
{
	const struct bad_case *b = &bad_cases[_i];
	struct kvp_model *m = (struct kvp_model *)0x1;
	char err[256] = "";
	const char *p;
	int rc;

	if (b->dfloats == LONG_MIN) {
		p = write_ckpt("bad.bin", b->h, 0, NULL);
		ck_assert_int_eq(truncate(p, 12), 0);
	} else {
		size_t n = b->h[0] > 0 && b->h[3] > 0 && b->h[1] > 0 &&
				   b->h[0] < 100000 && b->h[3] < 300 &&
				   b->h[2] < 100 && b->h[2] > 0 && b->h[4] > 0 &&
				   b->h[6] > 0 && b->h[5] != 0 &&
				   b->h[5] < 100000 && b->h[5] > -100000
			       ? floats_of(b->h)
			       : 100;
		p = write_ckpt("bad.bin", b->h, n + b->dfloats, NULL);
	}
	rc = kvp_model_load_file(p, &m, err, sizeof(err));
	ck_assert_msg(rc == b->rc, "case %d: rc %d, want %d (%s)", _i, rc,
		      b->rc, err);
	ck_assert_msg(strstr(err, b->word), "case %d: '%s' lacks '%s'", _i,
		      err, b->word);
	ck_assert_ptr_eq(m, (struct kvp_model *)0x1); /* untouched */
}
END_TEST

START_TEST(refuses_missing_and_dirs)
{
	struct kvp_model *m;
	char err[256] = "";

	ck_assert_int_eq(kvp_model_load_file("/nonexistent/x.bin", &m, err,
					     sizeof(err)),
			 -ENOENT);
	ck_assert(strstr(err, "cannot open model '/nonexistent/x.bin'"));
	ck_assert_int_eq(kvp_model_load_file(dir, &m, err, sizeof(err)),
			 -EINVAL);
	ck_assert(strstr(err, "not a regular file"));
	ck_assert_int_eq(kvp_model_open("", NULL, &m, err, sizeof(err)),
			 -EINVAL);
	ck_assert_int_eq(kvp_model_open("random:nope", NULL, &m, err,
					sizeof(err)),
			 -ENOENT);
	ck_assert(strstr(err, "unknown model 'random:nope'"));
}
END_TEST

START_TEST(random_weights)
{
	struct kvp_model_random_opts o;
	struct kvp_model *a, *b, *c;
	char err[256];
	size_t n;

	kvp_model_random_opts_default(&o);
	ck_assert_int_eq(kvp_model_open("random:llama3-8b", &o, &a, err,
					sizeof(err)),
			 0);
	ck_assert_uint_eq(kvp_model_config(a)->layers, 32);
	ck_assert_uint_eq(kvp_model_config(a)->q_heads, 32);
	ck_assert_uint_eq(kvp_model_config(a)->kv_heads, 8);
	ck_assert_uint_eq(kvp_model_config(a)->head_dim, 128);
	ck_assert_uint_eq(kvp_model_config(a)->dim, 32);
	ck_assert_uint_eq(kvp_model_config(a)->prefill_window, 1);
	ck_assert_str_eq(kvp_model_name(a), "random:llama3-8b");
	kvp_model_close(a);
	ck_assert_int_eq(kvp_model_random("tiny", &o, &a, err, sizeof(err)),
			 0);
	ck_assert_int_eq(kvp_model_random("tiny", &o, &b, err, sizeof(err)),
			 0);
	o.seed = 2;
	ck_assert_int_eq(kvp_model_random("tiny", &o, &c, err, sizeof(err)),
			 0);
	n = kvp_model_weight_bytes(a);
	ck_assert(memcmp(a->alloc, b->alloc, n) == 0);
	ck_assert(memcmp(a->alloc, c->alloc, n) != 0);
	ck_assert_float_eq(a->w.att_norm[0], 1.0f);
	ck_assert_float_eq(a->w.final_norm[31], 1.0f);
	kvp_model_close(a);
	kvp_model_close(b);
	kvp_model_close(c);
	o.dim = 4;
	ck_assert_int_eq(kvp_model_random("tiny", &o, &a, err, sizeof(err)),
			 -EINVAL);
	ck_assert(strstr(err, "dim 4"));
}
END_TEST

/* ---- the math ----------------------------------------------------------- */

START_TEST(math_hand_values)
{
	float x[8] = { 1, -1, 2, 0, 0, 0, 0, 0 }, w[8] = { 1, 2, 1, 1, 1, 1, 1, 1 };
	float o[8], v[16], h1[2] = { 0, 1 }, h3[2] = { 5, 2 };
	double r = 1.0 / sqrt(6.0 / 8 + 1e-5);
	int i;

	kvp_model_rmsnorm(o, x, w, 8);
	ck_assert_float_eq_tol(o[0], r, 1e-6);
	ck_assert_float_eq_tol(o[1], -2 * r, 1e-6);
	ck_assert_float_eq_tol(o[2], 2 * r, 1e-6);
	/* RoPE: pair i turns by pos * 10000^(-i/head_dim); pos 0 is none */
	for (i = 0; i < 16; i++)
		v[i] = i % 2 ? 0 : 1;
	kvp_model_rope(v, 2, 8, 0);
	ck_assert_float_eq(v[0], 1);
	ck_assert_float_eq(v[1], 0);
	kvp_model_rope(v, 2, 8, 3);
	ck_assert_float_eq_tol(v[0], cos(3.0), 1e-6);
	ck_assert_float_eq_tol(v[1], sin(3.0), 1e-6);
	ck_assert_float_eq_tol(v[2], cos(3.0 * pow(10000, -2.0 / 8)), 1e-6);
	ck_assert_float_eq_tol(v[3], sin(3.0 * pow(10000, -2.0 / 8)), 1e-6);
	ck_assert_float_eq_tol(v[8 + 6], cos(3.0 * pow(10000, -6.0 / 8)),
			       1e-6);
	ck_assert_float_eq_tol(v[8 + 7], sin(3.0 * pow(10000, -6.0 / 8)),
			       1e-6);
	/* SwiGLU: silu(0) = 0, silu(1) = 1 / (1 + e^-1) */
	kvp_model_swiglu(h1, h3, 2);
	ck_assert_float_eq(h1[0], 0);
	ck_assert_float_eq_tol(h1[1], 2.0 / (1 + exp(-1.0)), 1e-6);
}
END_TEST

/* Products: the naive sum, and bit-identical with 1, 2 and 3 threads. */
START_TEST(matmul_threads_agree)
{
	uint32_t T = 3, R = 1000, C = 77, t, r, k;
	float *x = malloc(sizeof(float) * T * C), *w = malloc(sizeof(float) * R * C);
	float *o[3];
	unsigned nt;

	for (k = 0; k < T * C; k++)
		x[k] = sinf((float)k);
	for (k = 0; k < R * C; k++)
		w[k] = cosf((float)k * 0.37f);
	for (nt = 1; nt <= 3; nt++) {
		struct kvp_mpool *p;

		o[nt - 1] = malloc(sizeof(float) * T * R);
		ck_assert_int_eq(kvp_mpool_create(nt, &p), 0);
		kvp_model_matmul(p, o[nt - 1], x, w, T, R, C);
		kvp_mpool_destroy(p);
	}
	ck_assert(memcmp(o[0], o[1], sizeof(float) * T * R) == 0);
	ck_assert(memcmp(o[0], o[2], sizeof(float) * T * R) == 0);
	for (t = 0; t < T; t++)
		for (r = 0; r < R; r++) {
			double s = 0;

			for (k = 0; k < C; k++)
				s += (double)w[r * C + k] * x[t * C + k];
			ck_assert_float_eq_tol(o[0][t * R + r], s, 1e-4);
		}
	for (nt = 0; nt < 3; nt++)
		free(o[nt]);
	free(x);
	free(w);
}
END_TEST

/* ---- a tiny network, checked by hand, through the cache ----------------- */

/*
 * dim 8, one layer, one head of 8, vocab 4: embedding e_i = 2 * unit i;
 * wq = wk = 0 (every score 0: attention is the plain mean of the values),
 * wv = wo = identity, the FFN zero, norms 1, tied classifier.  So after
 * tokens t_0 .. t_p, x = e_{t_p} + mean_s n(e_{t_s}) with n(e) = e /
 * sqrt(mean(e^2) + 1e-5), and logits[j] = e_j . n(x).
 */
static const char *tiny_ckpt(void)
{
	int32_t h[7] = { 8, 8, 1, 1, 1, 4, 16 };
	size_t n = floats_of(h), i;
	float *f = calloc(n, sizeof(float)), *p = f;
	const char *path;

	for (i = 0; i < 4; i++)
		p[i * 8 + i] = 2; /* embed */
	p += 32;
	for (i = 0; i < 8; i++)
		p[i] = 1; /* att_norm */
	p += 8 + 64 + 64; /* wq, wk zero */
	for (i = 0; i < 8; i++)
		p[i * 8 + i] = 1; /* wv */
	p += 64;
	for (i = 0; i < 8; i++)
		p[i * 8 + i] = 1; /* wo */
	p += 64;
	for (i = 0; i < 8; i++)
		p[i] = 1; /* ffn_norm */
	p += 8 + 3 * 64;
	for (i = 0; i < 8; i++)
		p[i] = 1; /* final_norm */
	path = write_ckpt("tiny.bin", h, n, f);
	free(f);
	return path;
}

static void tiny_expect(const uint32_t *toks, uint32_t n, double *logits)
{
	double x[8] = { 0 }, ss = 0;
	uint32_t s, d;

	for (s = 0; s < n; s++) /* mean of the normed values */
		x[toks[s]] += 2.0 / sqrt(4.0 / 8 + 1e-5) / n;
	x[toks[n - 1]] += 2;
	for (d = 0; d < 8; d++)
		ss += x[d] * x[d];
	ss = 1.0 / sqrt(ss / 8 + 1e-5);
	for (d = 0; d < 4; d++)
		logits[d] = 2 * x[d] * ss;
}

/* The tiny model and an empty sequence of a cache for it. */
static struct kvp_model *tiny_cache(enum kvp_kvcache_backend be,
				    uint64_t capacity, struct kvp_kvcache **c,
				    uint32_t *id)
{
	struct kvp_kv_geometry g;
	struct kvp_kvcache_opts o;
	struct kvp_model *m;
	char err[256];

	ck_assert_int_eq(kvp_model_load_file(tiny_ckpt(), &m, err, sizeof(err)),
			 0);
	ck_assert_int_eq(kvp_model_geometry(m, KVP_KV_FP32, 4, &g), 0);
	kvp_kvcache_opts_default(&o, &g);
	o.backend = be;
	o.capacity_tokens = capacity;
	ck_assert_int_eq(kvp_kvcache_create(&o, c), 0);
	ck_assert_int_eq(kvp_kvcache_seq_create(*c, id), 0);
	return m;
}

/* window: the model's prefill_window (random models' 1) */
static void tiny_run(enum kvp_kvcache_backend be, uint32_t window)
{
	struct kvp_kvcache *c;
	struct kvp_model_seq *s;
	uint32_t toks[6] = { 0, 1, 3, 3, 2, 0 }, id, i, j;
	struct kvp_model *m = tiny_cache(be, 16, &c, &id);
	double want[4];

	m->cfg.prefill_window = window;
	ck_assert_int_eq(kvp_model_seq_create(m, c, id, 2, &s), 0);
	ck_assert_int_eq(kvp_model_prefill(s, toks, 2), 0);
	for (i = 2; i <= 6; i++) {
		/* a prompt token attending to itself alone: only its own
		 * value; one layer, so the values are the same either way
		 * and the decode steps that follow agree */
		if (i == 2 && window == 1)
			tiny_expect(toks + 1, 1, want);
		else
			tiny_expect(toks, i, want);
		for (j = 0; j < 4; j++)
			ck_assert_msg(fabs(kvp_model_logits(s)[j] - want[j]) <
					  1e-5,
				      "after %u tokens: logit %u is %g, want %g",
				      i, j, kvp_model_logits(s)[j], want[j]);
		if (i < 6)
			ck_assert_int_eq(kvp_model_step(s, toks[i], NULL), 0);
	}
	ck_assert_uint_eq(kvp_model_seq_tokens(s), 6);
	/* bad input changes nothing */
	ck_assert_int_eq(kvp_model_step(s, 4, NULL), -EINVAL);
	ck_assert_uint_eq(kvp_kvcache_seq_tokens(c, id), 6);
	kvp_model_seq_destroy(s);
	kvp_kvcache_destroy(c);
	kvp_model_close(m);
}

START_TEST(tiny_by_hand_ram)
{
	tiny_run(KVP_KVCACHE_RAM, 0);
}
END_TEST

START_TEST(tiny_by_hand_prefill_window)
{
	tiny_run(KVP_KVCACHE_RAM, 1);
}
END_TEST

START_TEST(tiny_by_hand_pager)
{
	tiny_run(KVP_KVCACHE_PAGER, 0);
}
END_TEST

/* A prefix store that records what it is offered, and when. */
struct rec_px {
	struct kvp_model_prefix px;
	uint32_t n, chunk[8];
	bool after[8];	      /* offered after the prefill */
	bool prefilled;
	unsigned char *payload[8];
	/* gate: the first put waits for go (up to a minute: timed_out) */
	bool gate, go, timed_out;
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

static int rec_get(void *arg, uint32_t chunk, void *buf, size_t len)
{
	(void)arg, (void)chunk, (void)buf, (void)len;
	return -ENOENT;
}

static void rec_put(void *arg, uint32_t chunk, const void *payload,
		    size_t len)
{
	struct rec_px *r = arg;

	if (r->gate && !r->n) {
		struct timespec ts;
		int e = 0;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 60;
		pthread_mutex_lock(&r->mu);
		while (!r->go && e != ETIMEDOUT)
			e = pthread_cond_timedwait(&r->cv, &r->mu, &ts);
		r->timed_out = !r->go;
		pthread_mutex_unlock(&r->mu);
	}
	ck_assert_uint_lt(r->n, 8);
	r->chunk[r->n] = chunk;
	r->after[r->n] = r->prefilled;
	r->payload[r->n] = malloc(len);
	ck_assert_ptr_nonnull(r->payload[r->n]);
	memcpy(r->payload[r->n++], payload, len);
}

/* A random model's 300-token prompt through the pager with px r, its
 * chunks of 64 tokens held back (put_later) up to later_max; async: offered
 * by kvp_model_seq_offer_async, whose first put waits until 40 decode
 * steps are done (they must not wait for it). */
static void offer_run(struct kvp_model *m, struct rec_px *r, bool later,
		      uint32_t later_max, bool async)
{
	struct kvp_kv_geometry g;
	struct kvp_kvcache_opts o;
	struct kvp_kvcache *c;
	struct kvp_model_seq *s;
	uint32_t toks[300], id, i;

	for (i = 0; i < 300; i++)
		toks[i] = (i * 7919 + 5) % m->cfg.vocab;
	ck_assert_int_eq(kvp_model_geometry(m, KVP_KV_FP16, 4, &g), 0);
	kvp_kvcache_opts_default(&o, &g);
	o.backend = KVP_KVCACHE_PAGER;
	o.capacity_tokens = 4096;
	o.budget_bytes = 2u << 20; /* the pager's least */
	o.prefetch_depth = 1;
	ck_assert_int_eq(kvp_kvcache_create(&o, &c), 0);
	ck_assert_int_eq(kvp_kvcache_seq_create(c, &id), 0);
	ck_assert_int_eq(kvp_model_seq_create(m, c, id, 2, &s), 0);
	memset(r, 0, sizeof(*r));
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	r->gate = async;
	r->px.chunk_tokens = 64;
	r->px.get = rec_get;
	r->px.put = rec_put;
	r->px.arg = r;
	r->px.put_later = later;
	r->px.later_max = later_max;
	ck_assert_int_eq(kvp_model_seq_set_prefix(s, &r->px), 0);
	ck_assert_int_eq(kvp_model_prefill(s, toks, 300), 0);
	r->prefilled = true;
	if (async) {
		ck_assert_int_eq(kvp_model_seq_offer_async(s), 0);
		/* the decode appends meanwhile (rolling blocks flushed into
		 * the pager blocks of the held-back ones, evictions under the
		 * 2 MiB budget) while the offer is held in its first put */
		for (i = 0; i < 40; i++)
			ck_assert_int_eq(kvp_model_step(s, toks[i], NULL), 0);
		pthread_mutex_lock(&r->mu);
		r->go = true;
		pthread_cond_signal(&r->cv);
		pthread_mutex_unlock(&r->mu);
	}
	ck_assert_int_eq(kvp_model_seq_offer(s), 0); /* waits for it */
	ck_assert_int_eq(kvp_model_seq_offer(s), 0); /* offered once */
	ck_assert(!r->timed_out); /* the steps did not wait for the put */
	kvp_model_seq_destroy(s);
	kvp_kvcache_destroy(c);
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
}

/*
 * put_later: the chunks a prefill computes are offered after it, read
 * back from the KV cache, and are the bytes offered during a prefill, bit
 * for bit; later_max holds back only the last ones.  Read back on a
 * thread of their own while the decode goes on: the same bytes.
 */
START_TEST(prefix_put_later)
{
	static struct rec_px now, later, part, behind;
	struct kvp_model *m;
	char err[256];
	size_t len;
	uint32_t i;

	ck_assert_int_eq(kvp_model_random("tiny", NULL, &m, err, sizeof(err)),
			 0);
	offer_run(m, &now, false, 0, false);
	offer_run(m, &later, true, 0, false);
	offer_run(m, &part, true, 3, false);
	offer_run(m, &behind, true, 0, true);
	{
		struct kvp_kv_geometry g;

		ck_assert_int_eq(kvp_model_geometry(m, KVP_KV_FP16, 4, &g), 0);
		len = kvp_model_chunk_bytes(&g, 64);
	}
	ck_assert_uint_eq(now.n, 4);
	ck_assert_uint_eq(later.n, 4);
	ck_assert_uint_eq(part.n, 4);
	ck_assert_uint_eq(behind.n, 4);
	for (i = 0; i < 4; i++) {
		ck_assert_uint_eq(behind.chunk[i], i);
		ck_assert(behind.after[i]);
		ck_assert_msg(!memcmp(behind.payload[i], now.payload[i], len),
			      "chunk %u read back behind the decode differs",
			      i);
		free(behind.payload[i]);
		ck_assert_uint_eq(now.chunk[i], i);
		ck_assert_uint_eq(later.chunk[i], i);
		ck_assert_uint_eq(part.chunk[i], i);
		ck_assert(!now.after[i]);
		ck_assert(later.after[i]);
		ck_assert(part.after[i] == (i > 0));
		ck_assert_msg(!memcmp(later.payload[i], now.payload[i], len),
			      "chunk %u read back differs", i);
		ck_assert(!memcmp(part.payload[i], now.payload[i], len));
		free(now.payload[i]);
		free(later.payload[i]);
		free(part.payload[i]);
	}
	kvp_model_close(m);
}
END_TEST

/* A KV cache on the pager for m (geometry into g). */
static struct kvp_kvcache *pager_cache(struct kvp_model *m,
				     struct kvp_kv_geometry *g)
{
	struct kvp_kvcache_opts o;
	struct kvp_kvcache *c;

	ck_assert_int_eq(kvp_model_geometry(m, KVP_KV_FP16, 4, g), 0);
	kvp_kvcache_opts_default(&o, g);
	o.backend = KVP_KVCACHE_PAGER;
	o.budget_bytes = 2u << 20;
	o.prefetch_depth = 1;
	o.capacity_tokens = 4096;
	ck_assert_int_eq(kvp_kvcache_create(&o, &c), 0);
	return c;
}

/* Chunk 0 (64 tokens) of prompt p as the KV cache holds it after a
 * prefill of 300 tokens, with mc attached (hit tokens into *hit) or not. */
static void *chunk0(struct kvp_model *m, struct kvp_model_cache *mc,
		    const uint32_t *p, uint64_t *hit)
{
	struct kvp_kv_geometry g;
	struct kvp_kvcache *c = pager_cache(m, &g);
	struct kvp_model_seq *s;
	size_t len = kvp_model_chunk_bytes(&g, 64);
	void *buf = aligned_alloc(4096, (len + 4095) / 4096 * 4096);
	uint32_t id;

	ck_assert_int_eq(kvp_kvcache_seq_create(c, &id), 0);
	ck_assert_int_eq(kvp_model_seq_create(m, c, id, 1, &s), 0);
	if (mc)
		ck_assert_int_eq(kvp_model_cache_attach(mc, s, p, 300), 0);
	ck_assert_int_eq(kvp_model_prefill(s, p, 300), 0);
	if (mc) {
		*hit = kvp_model_cache_hit_tokens(mc);
		kvp_model_cache_first_token(mc);
	}
	ck_assert_int_eq(kvp_kvcache_read_blocks(c, id, 0, 64, buf), 0);
	kvp_model_seq_destroy(s);
	kvp_kvcache_destroy(c);
	return buf;
}

/* A sequence on a fresh KV cache (into *c), attached to mc for the 300
 * tokens of p and prefilled: its last chunks held back. */
static struct kvp_model_seq *held_back(struct kvp_model *m,
				       struct kvp_model_cache *mc,
				       const uint32_t *p,
				       struct kvp_kvcache **c)
{
	struct kvp_kv_geometry g;
	struct kvp_model_seq *s;
	uint32_t id;

	*c = pager_cache(m, &g);
	ck_assert_int_eq(kvp_kvcache_seq_create(*c, &id), 0);
	ck_assert_int_eq(kvp_model_seq_create(m, *c, id, 1, &s), 0);
	ck_assert_int_eq(kvp_model_cache_attach(mc, s, p, 300), 0);
	ck_assert_int_eq(kvp_model_prefill(s, p, 300), 0);
	return s;
}

/* Two 300-token prompts, a random tiny model (*m, its fp16 geometry g)
 * and a model cache in dir/name over it. */
static struct kvp_model_cache *two_prompts(const char *name,
					   struct kvp_model **m,
					   struct kvp_kv_geometry *g,
					   uint32_t p1[300], uint32_t p2[300])
{
	char cdir[300], err[256], warn[256];
	struct kvp_model_cache_opts co = { .dir = cdir };
	struct kvp_model_cache *mc;
	uint32_t i;

	snprintf(cdir, sizeof(cdir), "%s/%s", dir, name);
	for (i = 0; i < 300; i++) {
		p1[i] = (i * 7919 + 5) % 500 + 1;
		p2[i] = (i * 104729 + 11) % 500 + 1;
	}
	ck_assert_int_eq(kvp_model_random("tiny", NULL, m, err, sizeof(err)),
			 0);
	ck_assert_int_eq(kvp_model_geometry(*m, KVP_KV_FP16, 4, g), 0);
	ck_assert_int_eq(kvp_model_cache_open(&co, *m, g, &mc, err,
					      sizeof(err), warn, sizeof(warn)),
			 0);
	return mc;
}

/* Prompt p's chunk 0 served through mc is the one computed without it,
 * and mc had want_hit tokens of p. */
static void served_as_computed(struct kvp_model *m,
			       struct kvp_model_cache *mc,
			       const struct kvp_kv_geometry *g,
			       const uint32_t *p, uint64_t want_hit)
{
	uint64_t hit = 0;
	void *served = chunk0(m, mc, p, &hit), *cold = chunk0(m, NULL, p, NULL);

	ck_assert_msg(!memcmp(served, cold, kvp_model_chunk_bytes(g, 64)),
		      "chunk 0 served from the cache (hit %lu tokens) is not "
		      "the prompt's KV",
		      (unsigned long)hit);
	ck_assert_uint_eq(hit, want_hit);
	free(served);
	free(cold);
}

/*
 * A sequence attached again (a new prompt) whose prefill is refused must
 * not offer the last prefill's held-back chunks under the new prompt's
 * keys: a later run of the new prompt was served the old prompt's KV.
 */
START_TEST(reattach_offers_nothing_wrong)
{
	struct kvp_kv_geometry g;
	struct kvp_kvcache *c;
	struct kvp_model_seq *s;
	struct kvp_model *m;
	uint32_t p1[300], p2[300];
	struct kvp_model_cache *mc = two_prompts("cache", &m, &g, p1, p2);

	/* request 1: prefilled, its chunks held back for the first token */
	s = held_back(m, mc, p1, &c);
	/* the same seq attached to request 2 (say a retry), whose prefill
	 * is refused (the seq is not empty): nothing was computed for p2 */
	ck_assert_int_eq(kvp_model_cache_attach(mc, s, p2, 300), 0);
	ck_assert_int_eq(kvp_model_prefill(s, p2, 300), -EINVAL);
	/* the caller releases the writer as tools/kvpager.c does on error */
	kvp_model_cache_first_token(mc);
	kvp_model_cache_drain(mc);
	kvp_model_seq_destroy(s);
	kvp_kvcache_destroy(c);

	/* request 3: p2 for real, from the cache, which has nothing of p2 */
	served_as_computed(m, mc, &g, p2, 0);
	/* p1's held-back chunks went at the second attach, under p1's keys
	 * (request 3 computed p2, whose chunks 0..3 were offered too) */
	kvp_model_cache_drain(mc);
	served_as_computed(m, mc, &g, p1, 256);
	/* a sequence destroyed before the first token takes its held-back
	 * chunks with it: first_token offers nothing (no use after free) */
	s = held_back(m, mc, p2, &c);
	kvp_model_seq_destroy(s);
	ck_assert_int_eq(kvp_model_cache_first_token(mc), 0);
	kvp_kvcache_destroy(c);
	/* mc closed before the sequence (as kvpager run does), with chunks
	 * held back: the sequence's destroy must not reach into mc */
	s = held_back(m, mc, p1, &c);
	kvp_model_cache_close(mc);
	kvp_model_seq_destroy(s);
	kvp_kvcache_destroy(c);
	kvp_model_close(m);
}
END_TEST

/*
 * The held-back chunks read back behind the decode (first_token's
 * thread): stored as computed, under their own prompt's keys, while the
 * sequence decodes, when the next prompt is attached, the sequence
 * destroyed or the model cache closed with the read-back in flight.
 */
START_TEST(offer_behind_decode)
{
	struct kvp_kv_geometry g;
	struct kvp_kvcache *c, *c2;
	struct kvp_model_seq *s, *s2;
	struct kvp_model *m;
	uint32_t p1[300], p2[300], i;
	struct kvp_model_cache *mc = two_prompts("cache-behind", &m, &g, p1,
						 p2);

	/* p1: read back while its sequence decodes, then destroyed */
	s = held_back(m, mc, p1, &c);
	ck_assert_int_eq(kvp_model_cache_first_token(mc), 0);
	for (i = 0; i < 20; i++)
		ck_assert_int_eq(kvp_model_step(s, p2[i], NULL), 0);
	kvp_model_seq_destroy(s);
	kvp_kvcache_destroy(c);
	/* p2: the next prompt attached at once, on another sequence */
	s = held_back(m, mc, p2, &c);
	ck_assert_int_eq(kvp_model_cache_first_token(mc), 0);
	c2 = pager_cache(m, &g);
	ck_assert_int_eq(kvp_kvcache_seq_create(c2, &i), 0);
	ck_assert_int_eq(kvp_model_seq_create(m, c2, i, 1, &s2), 0);
	ck_assert_int_eq(kvp_model_cache_attach(mc, s2, p1, 300), 0);
	kvp_model_seq_destroy(s2);
	kvp_kvcache_destroy(c2);
	kvp_model_seq_destroy(s);
	kvp_kvcache_destroy(c);
	kvp_model_cache_drain(mc);
	served_as_computed(m, mc, &g, p1, 256);
	served_as_computed(m, mc, &g, p2, 256);
	/* the model cache closed with a read-back in flight (kvpager run
	 * closes it before the sequence): close waits for it */
	s = held_back(m, mc, p1, &c);
	ck_assert_int_eq(kvp_model_cache_first_token(mc), 0);
	kvp_model_cache_close(mc);
	ck_assert_int_eq(kvp_model_step(s, 1, NULL), 0);
	kvp_model_seq_destroy(s);
	kvp_kvcache_destroy(c);
	kvp_model_close(m);
}
END_TEST

START_TEST(refuses_bad_use)
{
	struct kvp_kvcache *c;
	struct kvp_model_seq *s;
	uint32_t id, toks[17] = { 0 }, bad = 9;
	struct kvp_model *m = tiny_cache(KVP_KVCACHE_RAM, 32, &c, &id), *r;
	char err[256];

	ck_assert_int_eq(kvp_model_random("tiny", NULL, &r, err, sizeof(err)),
			 0);
	/* another model's shape */
	ck_assert_int_eq(kvp_model_seq_create(r, c, id, 1, &s), -EINVAL);
	ck_assert_int_eq(kvp_model_seq_create(m, c, id, 1, &s), 0);
	ck_assert_int_eq(kvp_model_prefill(s, &bad, 1), -EINVAL);
	ck_assert_int_eq(kvp_model_prefill(s, toks, 0), -EINVAL);
	/* past the trained context of 16 */
	ck_assert_int_eq(kvp_model_prefill(s, toks, 17), -EINVAL);
	ck_assert_uint_eq(kvp_kvcache_seq_tokens(c, id), 0);
	ck_assert_int_eq(kvp_model_prefill(s, toks, 16), 0);
	ck_assert_int_eq(kvp_model_step(s, 0, NULL), -EINVAL);
	ck_assert_uint_eq(kvp_kvcache_seq_tokens(c, id), 16);
	kvp_model_seq_destroy(s);
	kvp_kvcache_destroy(c);
	kvp_model_close(m);
	kvp_model_close(r);
}
END_TEST

START_TEST(sample)
{
	float l[4] = { 1, 3, 3, -1 };
	uint64_t rng = 7;
	int hits[4] = { 0 }, i;

	ck_assert_uint_eq(kvp_model_sample(l, 4, 0, NULL), 1);
	for (i = 0; i < 4000; i++)
		hits[kvp_model_sample(l, 4, 1.0f, &rng)]++;
	/* e^3 / (e + 2 e^3 + e^-1) = 0.47 each for 1 and 2 */
	ck_assert_int_gt(hits[1], 1600);
	ck_assert_int_gt(hits[2], 1600);
	ck_assert_int_lt(hits[3], 100);
}
END_TEST

/* A tokenizer.bin of 4 tokens; cut: bytes to drop from the end. */
static const char *write_tok(long cut)
{
	static char path[256];
	const char *pieces[4] = { "<unk>", "<s>", " Hello", "<0x41>" };
	int32_t maxlen = 8, len;
	float score = 0;
	FILE *fp;
	int i;

	snprintf(path, sizeof(path), "%s/tok.bin", dir);
	fp = fopen(path, "wb");
	ck_assert_ptr_nonnull(fp);
	fwrite(&maxlen, 4, 1, fp);
	for (i = 0; i < 4; i++) {
		len = (int32_t)strlen(pieces[i]);
		fwrite(&score, 4, 1, fp);
		fwrite(&len, 4, 1, fp);
		fwrite(pieces[i], 1, (size_t)len, fp);
	}
	ck_assert_int_eq(fclose(fp), 0);
	if (cut) {
		struct stat st;

		ck_assert_int_eq(stat(path, &st), 0);
		ck_assert_int_eq(truncate(path, st.st_size - cut), 0);
	}
	return path;
}

START_TEST(tokenizer)
{
	struct kvp_tokenizer *t;
	char err[256] = "";

	ck_assert_int_eq(kvp_tokenizer_load(write_tok(0), 4, &t, err,
					    sizeof(err)),
			 0);
	ck_assert_str_eq(kvp_tokenizer_piece(t, 1, 2), "Hello");
	ck_assert_str_eq(kvp_tokenizer_piece(t, 2, 2), " Hello");
	ck_assert_str_eq(kvp_tokenizer_piece(t, 0, 3), "A");
	ck_assert_str_eq(kvp_tokenizer_piece(t, 0, 9), "");
	kvp_tokenizer_free(t);
	ck_assert_int_eq(kvp_tokenizer_load(write_tok(3), 4, &t, err,
					    sizeof(err)),
			 -EINVAL);
	ck_assert_msg(strstr(err, "inside token 3"), "%s", err);
	/* a model with more tokens than the file has */
	ck_assert_int_eq(kvp_tokenizer_load(write_tok(0), 5, &t, err,
					    sizeof(err)),
			 -EINVAL);
	ck_assert_msg(strstr(err, "token 4"), "%s", err);
}
END_TEST

static void setup(void)
{
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
	char cmd[300];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd))
		perror("rm");
	strcpy(dir, "/tmp/test_model.XXXXXX");
}

int main(void)
{
	Suite *s = suite_create("model");
	TCase *tc = kvp_test_tcase(s, "core", 120);

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, loads_and_maps);
	tcase_add_test(tc, untied_classifier);
	tcase_add_loop_test(tc, refuses_bad_field, 0,
			    sizeof(bad_cases) / sizeof(bad_cases[0]));
	tcase_add_test(tc, refuses_missing_and_dirs);
	tcase_add_test(tc, random_weights);
	tcase_add_test(tc, math_hand_values);
	tcase_add_test(tc, matmul_threads_agree);
	tcase_add_test(tc, tiny_by_hand_ram);
	tcase_add_test(tc, tiny_by_hand_pager);
	tcase_add_test(tc, tiny_by_hand_prefill_window);
	tcase_add_test(tc, refuses_bad_use);
	tcase_add_test(tc, prefix_put_later);
	tcase_add_test(tc, reattach_offers_nothing_wrong);
	tcase_add_test(tc, offer_behind_decode);
	tcase_add_test(tc, sample);
	tcase_add_test(tc, tokenizer);
	return kvp_test_run(s);
}
