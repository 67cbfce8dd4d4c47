/*
 * attention.c - CPU decode attention over paged KV blocks.
 *
 * One call splits its block list into contiguous ranges, one per pool
 * thread (the caller takes range 0).  Each thread keeps an online-softmax
 * partial (m, l, acc) per query head over its range, reading each KV block
 * once (all KV heads of it before the next block: a block is contiguous);
 * the caller then merges the partials in thread order and finishes.  The
 * math is lib/cuda/attn_common.h; the AVX2/F16C path is the same algorithm
 * with the per-block loops vectorised, and skips the rescale when a block
 * does not raise the running max (the common case after a few blocks).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/kv/attention.h"
#include "lib/cuda/attn_common.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVP_HAVE_X86 1
#endif

/* Below this many KV bytes a call runs in the caller alone: a wake-up of
 * the pool (about 10-20 us here) costs more than it saves. */
#define KVP_ATTN_PARALLEL_MIN_BYTES (256u << 10)

enum job_kind { JOB_DECODE, JOB_MASS };

struct job {
	enum job_kind kind;
	const struct kvp_kv_geometry *g;
	const struct kvp_attn_blocks *b;
	const float *qs; /* q * 1/sqrt(dim) */
	bool scalar;	 /* force the portable path */
	unsigned nparts; /* ranges */
	float *part;	 /* nparts * (2 * qh + qh * dim): m, l, acc */
	float *bml;	 /* JOB_MASS: n * qh * 2: per block m, l */
};

struct kvp_attn_pool {
	unsigned nthreads;    /* counting the caller */
	pthread_t *tids;      /* nthreads - 1 workers */
	pthread_mutex_t call; /* one call at a time */
	pthread_mutex_t lock; /* protects the fields below */
	pthread_cond_t go;    /* gen changed or stop */
	pthread_cond_t done;  /* pending reached 0 */
	uint64_t gen;	      /* bumped per job */
	unsigned pending;     /* workers still running the job */
	bool stop;
	struct job *job;
	unsigned nworkers_job; /* workers taking part in this job */
};

static size_t part_floats(const struct kvp_kv_geometry *g)
{
	return 2 * (size_t)g->q_heads + (size_t)g->q_heads * g->head_dim;
}

const char *kvp_attn_simd_name(void)
{
	return kvp_cpu_simd() ? "avx2+f16c" : "scalar";
}

/* ---- scalar path: the shared code, one query head at a time ---- */

static void block_scalar(const struct kvp_kv_geometry *g, const void *blk,
			 uint32_t ntok, const float *qs, float *m, float *l,
			 float *acc)
{
	uint32_t grp = kvp_kv_group(g), h;

	for (h = 0; h < g->q_heads; h++) {
		uint32_t j = h / grp;
		const char *k = (const char *)blk + kvp_kv_k_offset(g, j, 0);
		const char *v = (const char *)blk + kvp_kv_v_offset(g, j, 0);

		kvp_attn_block_head((int)g->dtype, k, v, ntok, g->head_dim,
				    qs + (size_t)h * g->head_dim, &m[h], &l[h],
				    acc + (size_t)h * g->head_dim);
	}
}

static void scores_scalar(const struct kvp_kv_geometry *g, const void *blk,
			  uint32_t ntok, const float *qs, float *bml)
{
	uint32_t grp = kvp_kv_group(g), h, t;
	size_t es = kvp_kv_dtype_size(g->dtype);

	for (h = 0; h < g->q_heads; h++) {
		const char *k =
		    (const char *)blk + kvp_kv_k_offset(g, h / grp, 0);
		float s[KVP_KV_MAX_BLOCK_TOKENS], mx = KVP_ATTN_NEG_INF,
						  sum = 0;

		for (t = 0; t < ntok; t++) {
			s[t] = kvp_attn_dot(
			    (int)g->dtype, qs + (size_t)h * g->head_dim,
			    k + (size_t)t * g->head_dim * es, g->head_dim);
			mx = s[t] > mx ? s[t] : mx;
		}
		for (t = 0; t < ntok; t++)
			sum += kvp_attn_weight(s[t], mx);
		bml[2 * h] = mx;
		bml[2 * h + 1] = sum;
	}
}

/* ---- AVX2 + F16C path ---- */

#ifdef KVP_HAVE_X86
#define SIMD __attribute__((target("avx2,f16c,fma")))
#define MAXG 16 /* query heads per KV head handled in registers at once */

SIMD static inline __m256 load8(int t, const void *base, size_t i)
{
	if (t == KVP_ATTN_FP32)
		return _mm256_loadu_ps((const float *)base + i);
	if (t == KVP_ATTN_FP16)
		return _mm256_cvtph_ps(_mm_loadu_si128(
		    (const __m128i *)((const uint16_t *)base + i)));
	return _mm256_castsi256_ps(_mm256_slli_epi32(
	    _mm256_cvtepu16_epi32(
		_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i))),
	    16));
}

SIMD static inline float hsum8(__m256 v)
{
	__m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);

	lo = _mm_add_ps(lo, hi);
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo);
}

/*
 * Scores of ntok tokens of one KV head for nh query heads (nh <= 4):
 * s[h * ntok + t] = qs_h . k_t.
 */
SIMD static inline void scores4(int t, const char *k, uint32_t ntok,
				uint32_t dim, const float *qs, uint32_t nh,
				float *s)
{
	size_t es = kvp_attn_esize(t);
	uint32_t tok, d;

	for (tok = 0; tok < ntok; tok++) {
		const char *kr = k + (size_t)tok * dim * es;
		__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;

		for (d = 0; d < dim; d += 8) {
			__m256 kv = load8(t, kr, d);

			a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qs + d), kv, a0);
			if (nh > 1)
				a1 = _mm256_fmadd_ps(
				    _mm256_loadu_ps(qs + dim + d), kv, a1);
			if (nh > 2)
				a2 = _mm256_fmadd_ps(
				    _mm256_loadu_ps(qs + 2 * dim + d), kv, a2);
			if (nh > 3)
				a3 = _mm256_fmadd_ps(
				    _mm256_loadu_ps(qs + 3 * dim + d), kv, a3);
		}
		s[tok] = hsum8(a0);
		if (nh > 1)
			s[ntok + tok] = hsum8(a1);
		if (nh > 2)
			s[2 * ntok + tok] = hsum8(a2);
		if (nh > 3)
			s[3 * ntok + tok] = hsum8(a3);
	}
}

SIMD static inline void block_simd_t(int t, const struct kvp_kv_geometry *g,
				     const void *blk, uint32_t ntok,
				     const float *qs, float *m, float *l,
				     float *acc)
{
	uint32_t grp = kvp_kv_group(g), dim = g->head_dim, j, h0, h, tok, d;
	size_t es = kvp_attn_esize(t);
	float s[4 * KVP_KV_MAX_BLOCK_TOKENS];

	for (j = 0; j < g->kv_heads; j++) {
		const char *k = (const char *)blk + kvp_kv_k_offset(g, j, 0);
		const char *v = (const char *)blk + kvp_kv_v_offset(g, j, 0);

		for (h0 = j * grp; h0 < (j + 1) * grp; h0 += 4) {
			uint32_t nh =
			    (j + 1) * grp - h0 < 4 ? (j + 1) * grp - h0 : 4;
			float w[4 * KVP_KV_MAX_BLOCK_TOKENS];

			scores4(t, k, ntok, dim, qs + (size_t)h0 * dim, nh, s);
			for (h = 0; h < nh; h++) {
				float *sh = s + (size_t)h * ntok;
				float mx = m[h0 + h];

				for (tok = 0; tok < ntok; tok++)
					mx = sh[tok] > mx ? sh[tok] : mx;
				if (mx > m[h0 + h]) {
					float f =
					    kvp_attn_rescale(&m[h0 + h], mx);
					__m256 fv = _mm256_set1_ps(f);
					float *a = acc + (size_t)(h0 + h) * dim;

					l[h0 + h] *= f;
					for (d = 0; d < dim; d += 8)
						_mm256_storeu_ps(
						    a + d,
						    _mm256_mul_ps(
							_mm256_loadu_ps(a + d),
							fv));
				}
				for (tok = 0; tok < ntok; tok++) {
					w[h * ntok + tok] =
					    kvp_attn_weight(sh[tok], mx);
					l[h0 + h] += w[h * ntok + tok];
				}
			}
			/* acc_h += sum_t w_ht v_t, dims outer so that acc
			 * stays in registers over the block's tokens */
			if (nh == 4) {
				float *a0p = acc + (size_t)h0 * dim;

				for (d = 0; d < dim; d += 8) {
					__m256 a0 = _mm256_loadu_ps(a0p + d);
					__m256 a1 =
					    _mm256_loadu_ps(a0p + dim + d);
					__m256 a2 =
					    _mm256_loadu_ps(a0p + 2 * dim + d);
					__m256 a3 =
					    _mm256_loadu_ps(a0p + 3 * dim + d);

					for (tok = 0; tok < ntok; tok++) {
						__m256 vv = load8(
						    t,
						    v + (size_t)tok * dim * es,
						    d);

						a0 = _mm256_fmadd_ps(
						    _mm256_broadcast_ss(
							&w[tok]),
						    vv, a0);
						a1 = _mm256_fmadd_ps(
						    _mm256_broadcast_ss(
							&w[ntok + tok]),
						    vv, a1);
						a2 = _mm256_fmadd_ps(
						    _mm256_broadcast_ss(
							&w[2 * ntok + tok]),
						    vv, a2);
						a3 = _mm256_fmadd_ps(
						    _mm256_broadcast_ss(
							&w[3 * ntok + tok]),
						    vv, a3);
					}
					_mm256_storeu_ps(a0p + d, a0);
					_mm256_storeu_ps(a0p + dim + d, a1);
					_mm256_storeu_ps(a0p + 2 * dim + d, a2);
					_mm256_storeu_ps(a0p + 3 * dim + d, a3);
				}
				continue;
			}
			for (d = 0; d < dim; d += 8) {
				__m256 a[4];

				for (h = 0; h < nh; h++)
					a[h] = _mm256_loadu_ps(
					    acc + (size_t)(h0 + h) * dim + d);
				for (tok = 0; tok < ntok; tok++) {
					__m256 vv = load8(
					    t, v + (size_t)tok * dim * es, d);

					for (h = 0; h < nh; h++)
						a[h] = _mm256_fmadd_ps(
						    _mm256_set1_ps(
							w[h * ntok + tok]),
						    vv, a[h]);
				}
				for (h = 0; h < nh; h++)
					_mm256_storeu_ps(
					    acc + (size_t)(h0 + h) * dim + d,
					    a[h]);
			}
		}
	}
}

SIMD static void block_simd_f16(const struct kvp_kv_geometry *g,
				const void *blk, uint32_t ntok, const float *qs,
				float *m, float *l, float *acc)
{
	block_simd_t(KVP_ATTN_FP16, g, blk, ntok, qs, m, l, acc);
}

SIMD static void block_simd_bf16(const struct kvp_kv_geometry *g,
				 const void *blk, uint32_t ntok,
				 const float *qs, float *m, float *l,
				 float *acc)
{
	block_simd_t(KVP_ATTN_BF16, g, blk, ntok, qs, m, l, acc);
}

SIMD static void block_simd_f32(const struct kvp_kv_geometry *g,
				const void *blk, uint32_t ntok, const float *qs,
				float *m, float *l, float *acc)
{
	block_simd_t(KVP_ATTN_FP32, g, blk, ntok, qs, m, l, acc);
}

SIMD static void scores_simd(const struct kvp_kv_geometry *g, const void *blk,
			     uint32_t ntok, const float *qs, float *bml)
{
	uint32_t grp = kvp_kv_group(g), dim = g->head_dim, j, h0, h, tok;
	float s[4 * KVP_KV_MAX_BLOCK_TOKENS];
	int t = (int)g->dtype;

	for (j = 0; j < g->kv_heads; j++) {
		const char *k = (const char *)blk + kvp_kv_k_offset(g, j, 0);

		for (h0 = j * grp; h0 < (j + 1) * grp; h0 += 4) {
			uint32_t nh =
			    (j + 1) * grp - h0 < 4 ? (j + 1) * grp - h0 : 4;

			if (t == KVP_ATTN_FP16)
				scores4(KVP_ATTN_FP16, k, ntok, dim,
					qs + (size_t)h0 * dim, nh, s);
			else if (t == KVP_ATTN_BF16)
				scores4(KVP_ATTN_BF16, k, ntok, dim,
					qs + (size_t)h0 * dim, nh, s);
			else
				scores4(KVP_ATTN_FP32, k, ntok, dim,
					qs + (size_t)h0 * dim, nh, s);
			for (h = 0; h < nh; h++) {
				float mx = KVP_ATTN_NEG_INF, sum = 0;

				for (tok = 0; tok < ntok; tok++)
					mx = s[h * ntok + tok] > mx
						 ? s[h * ntok + tok]
						 : mx;
				for (tok = 0; tok < ntok; tok++)
					sum += kvp_attn_weight(
					    s[h * ntok + tok], mx);
				bml[2 * (h0 + h)] = mx;
				bml[2 * (h0 + h) + 1] = sum;
			}
		}
	}
}
#endif /* KVP_HAVE_X86 */

/* ---- one range of a job ---- */

static uint32_t ntok_of(const struct kvp_attn_blocks *b,
			const struct kvp_kv_geometry *g, size_t i)
{
	return b->ntokens ? b->ntokens[i] : g->block_tokens;
}

static void run_range(struct job *jb, unsigned idx)
{
	const struct kvp_kv_geometry *g = jb->g;
	const struct kvp_attn_blocks *b = jb->b;
	size_t lo = b->n * idx / jb->nparts, hi = b->n * (idx + 1) / jb->nparts;
	size_t i;
	uint32_t qh = g->q_heads;

	if (jb->kind == JOB_MASS) {
		for (i = lo; i < hi; i++) {
			float *bml = jb->bml + i * 2 * qh;
#ifdef KVP_HAVE_X86
			if (!jb->scalar && kvp_cpu_simd()) {
				scores_simd(g, b->ptrs[i], ntok_of(b, g, i),
					    jb->qs, bml);
				continue;
			}
#endif
			scores_scalar(g, b->ptrs[i], ntok_of(b, g, i), jb->qs,
				      bml);
		}
		return;
	}

	float *m = jb->part + idx * part_floats(g), *l = m + qh, *acc = l + qh;
	void (*fn)(const struct kvp_kv_geometry *, const void *, uint32_t,
		   const float *, float *, float *, float *) = block_scalar;
	uint32_t h;

	for (h = 0; h < qh; h++) {
		m[h] = KVP_ATTN_NEG_INF;
		l[h] = 0;
	}
	memset(acc, 0, sizeof(float) * qh * g->head_dim);
#ifdef KVP_HAVE_X86
	if (!jb->scalar && kvp_cpu_simd())
		fn = g->dtype == KVP_KV_FP16   ? block_simd_f16
		     : g->dtype == KVP_KV_BF16 ? block_simd_bf16
					       : block_simd_f32;
#endif
	for (i = lo; i < hi; i++)
		fn(g, b->ptrs[i], ntok_of(b, g, i), jb->qs, m, l, acc);
}

/* ---- the pool ---- */

static void *worker(void *arg)
{
	struct kvp_attn_pool *p = arg;
	uint64_t seen = 0;
	unsigned idx;

	pthread_mutex_lock(&p->lock);
	idx = (unsigned)(p->pending++); /* set-up: hand out indices */
	pthread_cond_signal(&p->done);
	for (;;) {
		while (!p->stop && p->gen == seen)
			pthread_cond_wait(&p->go, &p->lock);
		if (p->stop)
			break;
		seen = p->gen;
		if (idx < p->nworkers_job) {
			struct job *jb = p->job;

			pthread_mutex_unlock(&p->lock);
			run_range(jb, idx + 1);
			pthread_mutex_lock(&p->lock);
			if (--p->pending == 0)
				pthread_cond_signal(&p->done);
		}
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int kvp_attn_pool_create(unsigned nthreads, struct kvp_attn_pool **out)
{
	struct kvp_attn_pool *p;
	unsigned i;
	int err;

	if (nthreads == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		nthreads = n > 0 ? (unsigned)(n > 256 ? 256 : n) : 1;
	}
	if (nthreads > 256)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->tids = calloc(nthreads, sizeof(*p->tids));
	if (!p->tids) {
		free(p);
		return -ENOMEM;
	}
	pthread_mutex_init(&p->call, NULL);
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->go, NULL);
	pthread_cond_init(&p->done, NULL);
	p->nthreads = 1;
	for (i = 0; i + 1 < nthreads; i++) {
		err = -pthread_create(&p->tids[i], NULL, worker, p);
		if (err) {
			kvp_attn_pool_destroy(p);
			return err == -EAGAIN ? -EAGAIN : err;
		}
		p->nthreads++;
	}
	/* wait until every worker took its index */
	pthread_mutex_lock(&p->lock);
	while (p->pending != p->nthreads - 1)
		pthread_cond_wait(&p->done, &p->lock);
	p->pending = 0;
	pthread_mutex_unlock(&p->lock);
	*out = p;
	return 0;
}

void kvp_attn_pool_destroy(struct kvp_attn_pool *p)
{
	unsigned i;

	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->lock);
	for (i = 0; i + 1 < p->nthreads; i++)
		pthread_join(p->tids[i], NULL);
	pthread_cond_destroy(&p->go);
	pthread_cond_destroy(&p->done);
	pthread_mutex_destroy(&p->lock);
	pthread_mutex_destroy(&p->call);
	free(p->tids);
	free(p);
}

unsigned kvp_attn_pool_threads(const struct kvp_attn_pool *p)
{
	return p ? p->nthreads : 1;
}

/* Run jb over nparts ranges: the caller takes 0, workers the rest. */
static void run_job(struct kvp_attn_pool *p, struct job *jb)
{
	if (!p || jb->nparts == 1) {
		run_range(jb, 0);
		return;
	}
	pthread_mutex_lock(&p->call);
	pthread_mutex_lock(&p->lock);
	p->job = jb;
	p->nworkers_job = jb->nparts - 1;
	p->pending = jb->nparts - 1;
	p->gen++;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->lock);
	run_range(jb, 0);
	pthread_mutex_lock(&p->lock);
	while (p->pending)
		pthread_cond_wait(&p->done, &p->lock);
	p->job = NULL;
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_unlock(&p->call);
}

static unsigned parts_for(const struct kvp_kv_geometry *g,
			  const struct kvp_attn_blocks *b,
			  const struct kvp_attn_pool *p)
{
	unsigned n = kvp_attn_pool_threads(p);

	if ((uint64_t)b->n * kvp_kv_block_bytes(g) <
	    KVP_ATTN_PARALLEL_MIN_BYTES)
		return 1;
	if (n > b->n)
		n = (unsigned)b->n;
	return n ? n : 1;
}

static int check_blocks(const struct kvp_kv_geometry *g,
			const struct kvp_attn_blocks *b)
{
	size_t i;

	if (!b || b->n == 0 || !b->ptrs)
		return -EINVAL;
	for (i = 0; b->ntokens && i < b->n; i++)
		if (b->ntokens[i] == 0 || b->ntokens[i] > g->block_tokens)
			return -EINVAL;
	return 0;
}

static void scale_q(const struct kvp_kv_geometry *g, const float *q, float *qs)
{
	float sc = 1.0f / sqrtf((float)g->head_dim);
	size_t i, n = (size_t)g->q_heads * g->head_dim;

	for (i = 0; i < n; i++)
		qs[i] = q[i] * sc;
}

static int decode(const struct kvp_kv_geometry *g,
		  const struct kvp_attn_blocks *b, const float *q, float *out,
		  struct kvp_attn_pool *p, bool scalar)
{
	size_t qn = (size_t)g->q_heads * g->head_dim, pf = part_floats(g);
	struct job jb = { 0 };
	float *buf, *m0, *l0, *acc0;
	unsigned i;
	uint32_t h;
	int err = check_blocks(g, b);

	if (err)
		return err;
	jb.kind = JOB_DECODE;
	jb.g = g;
	jb.b = b;
	jb.scalar = scalar;
	jb.nparts = parts_for(g, b, p);
	buf = malloc(sizeof(float) * (qn + jb.nparts * pf));
	if (!buf)
		return -ENOMEM;
	scale_q(g, q, buf);
	jb.qs = buf;
	jb.part = buf + qn;
	run_job(p, &jb);
	m0 = jb.part;
	l0 = m0 + g->q_heads;
	acc0 = l0 + g->q_heads;
	for (i = 1; i < jb.nparts; i++) {
		float *m = jb.part + i * pf, *l = m + g->q_heads,
		      *acc = l + g->q_heads;

		for (h = 0; h < g->q_heads; h++)
			kvp_attn_merge(&m0[h], &l0[h],
				       acc0 + (size_t)h * g->head_dim, m[h],
				       l[h], acc + (size_t)h * g->head_dim,
				       g->head_dim);
	}
	for (h = 0; h < g->q_heads; h++)
		kvp_attn_finish(l0[h], acc0 + (size_t)h * g->head_dim,
				out + (size_t)h * g->head_dim, g->head_dim);
	free(buf);
	return 0;
}

int kvp_attn_decode(const struct kvp_kv_geometry *g,
		    const struct kvp_attn_blocks *b, const float *q, float *out,
		    struct kvp_attn_pool *p)
{
	return decode(g, b, q, out, p, false);
}

int kvp_attn_decode_scalar(const struct kvp_kv_geometry *g,
			   const struct kvp_attn_blocks *b, const float *q,
			   float *out, struct kvp_attn_pool *p)
{
	return decode(g, b, q, out, p, true);
}

int kvp_attn_blocks_from_table(const struct kvp_kv_layout *l, const void *base,
			       const struct kvp_block_table *bt, uint32_t layer,
			       const uint32_t *lblocks, size_t n,
			       const void **ptrs, uint32_t *ntok,
			       struct kvp_attn_blocks *out)
{
	uint32_t nb = kvp_block_table_blocks(bt);
	const uint32_t *map = kvp_block_table_map(bt);
	size_t i;

	if (layer >= l->geo.layers)
		return -EINVAL;
	if (!lblocks)
		n = nb;
	for (i = 0; lblocks && i < n; i++)
		if (lblocks[i] >= nb)
			return -EINVAL;
	for (i = 0; i < n; i++) {
		uint32_t lb = lblocks ? lblocks[i] : (uint32_t)i;

		ptrs[i] = (const char *)base +
			  kvp_kv_layout_offset(l, layer, map[lb]);
		ntok[i] = kvp_block_table_valid(bt, lb);
	}
	out->ptrs = ptrs;
	out->ntokens = ntok;
	out->n = n;
	return 0;
}

int kvp_attn_decode_table(const struct kvp_kv_layout *l, const void *base,
			  const struct kvp_block_table *bt, uint32_t layer,
			  const uint32_t *lblocks, size_t n, const float *q,
			  float *out, struct kvp_attn_pool *p)
{
	size_t cnt = lblocks ? n : kvp_block_table_blocks(bt);
	struct kvp_attn_blocks b;
	const void **ptrs;
	uint32_t *ntok;
	int err;

	if (cnt == 0)
		return -EINVAL;
	ptrs = malloc(cnt * (sizeof(*ptrs) + sizeof(*ntok)));
	if (!ptrs)
		return -ENOMEM;
	ntok = (uint32_t *)(ptrs + cnt);
	err = kvp_attn_blocks_from_table(l, base, bt, layer, lblocks, n, ptrs,
					 ntok, &b);
	if (!err)
		err = kvp_attn_decode(&l->geo, &b, q, out, p);
	free(ptrs);
	return err;
}

int kvp_attn_dense_ref(const struct kvp_kv_geometry *g, const float *K,
		       const float *V, size_t ntok, const float *q, float *out)
{
	uint32_t grp, dim, h, d;
	double *s, *o;
	size_t t, row;

	if (kvp_kv_geometry_check(g) || ntok == 0)
		return -EINVAL;
	grp = kvp_kv_group(g);
	dim = g->head_dim;
	row = (size_t)g->kv_heads * dim;
	s = malloc(sizeof(double) * (ntok + dim));
	if (!s)
		return -ENOMEM;
	o = s + ntok;
	for (h = 0; h < g->q_heads; h++) {
		const float *qh = q + (size_t)h * dim;
		size_t off = (size_t)(h / grp) * dim;
		double mx = -INFINITY, sum = 0;

		for (t = 0; t < ntok; t++) {
			double x = 0;

			for (d = 0; d < dim; d++)
				x += (double)qh[d] * K[t * row + off + d];
			s[t] = x / sqrt((double)dim);
			mx = s[t] > mx ? s[t] : mx;
		}
		for (d = 0; d < dim; d++)
			o[d] = 0;
		for (t = 0; t < ntok; t++) {
			double w = exp(s[t] - mx);

			sum += w;
			for (d = 0; d < dim; d++)
				o[d] += w * V[t * row + off + d];
		}
		for (d = 0; d < dim; d++)
			out[(size_t)h * dim + d] = (float)(o[d] / sum);
	}
	free(s);
	return 0;
}

size_t kvp_attn_gather(const struct kvp_kv_geometry *g,
		       const struct kvp_attn_blocks *b, float *K, float *V)
{
	size_t i, tok = 0, row = (size_t)g->kv_heads * g->head_dim;
	uint32_t j, t;

	for (i = 0; i < b->n; i++) {
		uint32_t n = ntok_of(b, g, i);

		for (t = 0; t < n; t++, tok++) {
			for (j = 0; j < g->kv_heads; j++) {
				const char *blk = b->ptrs[i];

				kvp_kv_to_f32(
				    g->dtype, blk + kvp_kv_k_offset(g, j, t),
				    K + tok * row + (size_t)j * g->head_dim,
				    g->head_dim);
				kvp_kv_to_f32(
				    g->dtype, blk + kvp_kv_v_offset(g, j, t),
				    V + tok * row + (size_t)j * g->head_dim,
				    g->head_dim);
			}
		}
	}
	return tok;
}

int kvp_attn_block_mass(const struct kvp_kv_geometry *g,
			const struct kvp_attn_blocks *b, const float *q,
			float *mass, struct kvp_attn_pool *p)
{
	size_t qn = (size_t)g->q_heads * g->head_dim, i;
	uint32_t qh = g->q_heads, h;
	struct job jb = { 0 };
	float *buf, *M, *L;
	int err = check_blocks(g, b);

	if (err)
		return err;
	buf = malloc(sizeof(float) * (qn + b->n * 2 * qh + 2 * qh));
	if (!buf)
		return -ENOMEM;
	scale_q(g, q, buf);
	jb.kind = JOB_MASS;
	jb.g = g;
	jb.b = b;
	jb.qs = buf;
	jb.bml = buf + qn;
	jb.nparts = parts_for(g, b, p);
	run_job(p, &jb);
	M = jb.bml + b->n * 2 * qh;
	L = M + qh;
	for (h = 0; h < qh; h++) {
		M[h] = KVP_ATTN_NEG_INF;
		L[h] = 0;
		for (i = 0; i < b->n; i++)
			if (jb.bml[(i * qh + h) * 2] > M[h])
				M[h] = jb.bml[(i * qh + h) * 2];
		for (i = 0; i < b->n; i++)
			L[h] += jb.bml[(i * qh + h) * 2 + 1] *
				expf(jb.bml[(i * qh + h) * 2] - M[h]);
	}
	for (i = 0; i < b->n; i++) {
		double s = 0;

		for (h = 0; h < qh; h++)
			s += jb.bml[(i * qh + h) * 2 + 1] *
			     expf(jb.bml[(i * qh + h) * 2] - M[h]) / L[h];
		mass[i] = (float)(s / qh);
	}
	free(buf);
	return 0;
}

static int cmp_desc(const void *x, const void *y)
{
	float a = *(const float *)x, b = *(const float *)y;

	return a < b ? 1 : a > b ? -1 : 0;
}

double kvp_attn_recall(const float *mass, size_t n, const uint32_t *chosen,
		       size_t k, double *abs_mass)
{
	double got = 0, best = 0;
	float *sorted;
	size_t i;

	for (i = 0; i < k; i++)
		if (chosen[i] < n)
			got += mass[chosen[i]];
	if (abs_mass)
		*abs_mass = got;
	if (k == 0 || n == 0)
		return 0;
	sorted = malloc(n * sizeof(*sorted));
	if (!sorted)
		return 0;
	memcpy(sorted, mass, n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), cmp_desc);
	for (i = 0; i < k && i < n; i++)
		best += sorted[i];
	free(sorted);
	return best > 0 ? (got / best > 1 ? 1 : got / best) : 0;
}

double kvp_attn_rel_error(const float *approx, const float *exact, size_t n)
{
	double num = 0, den = 0;
	size_t i;

	for (i = 0; i < n; i++) {
		double d = (double)approx[i] - exact[i];

		num += d * d;
		den += (double)exact[i] * exact[i];
	}
	if (den == 0)
		return num == 0 ? 0 : INFINITY;
	return sqrt(num / den);
}
