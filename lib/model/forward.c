/*
 * forward.c - the model's math: matrix products on a small pool, RMSNorm,
 * rotary embeddings, SwiGLU (see model_i.h).
 *
 * Every output element is one thread's sum in a fixed order (eight
 * interleaved partial sums, then added in a fixed tree), so results do not
 * depend on the thread count or on which thread ran which rows.  AVX2 FMA
 * when the CPU has it, chosen once per process.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "lib/kv/kv_geometry.h"
#include "lib/model/model_i.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVP_HAVE_X86 1
#endif

/* Below this many multiply-adds a product runs in the calling thread: a
 * wake-up costs more. */
#define PARALLEL_MIN_WORK 32768u

struct mworker {
	struct kvp_mpool *p;
	pthread_t th;
	unsigned idx; /* 1 .. nthreads-1; the caller is 0 */
};

struct kvp_mpool {
	unsigned nthreads;	 /* workers counting the caller */
	struct mworker *w;	 /* nthreads - 1 */
	pthread_mutex_t mu;
	pthread_cond_t go;	 /* a new job (gen changed) or stop */
	pthread_cond_t done;	 /* pending reached 0 */
	uint64_t gen;		 /* job number */
	unsigned pending;	 /* workers still on the job */
	bool stop;
	kvp_mpool_fn fn;	 /* the job */
	void *arg;
	uint32_t n;		 /* its index range [0, n) */
};

static void range_of(uint32_t n, unsigned k, unsigned parts, uint32_t *lo,
		     uint32_t *hi)
{
	*lo = (uint32_t)((uint64_t)n * k / parts);
	*hi = (uint32_t)((uint64_t)n * (k + 1) / parts);
}

static void *mworker_main(void *arg)
{
	struct mworker *w = arg;
	struct kvp_mpool *p = w->p;
	uint64_t seen = 0;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		uint32_t lo, hi;

		while (!p->stop && p->gen == seen)
			pthread_cond_wait(&p->go, &p->mu);
		if (p->stop)
			break;
		seen = p->gen;
		range_of(p->n, w->idx, p->nthreads, &lo, &hi);
		pthread_mutex_unlock(&p->mu);
		if (lo < hi)
			p->fn(p->arg, lo, hi);
		pthread_mutex_lock(&p->mu);
		if (--p->pending == 0)
			pthread_cond_signal(&p->done);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int kvp_mpool_create(unsigned nthreads, struct kvp_mpool **out)
{
	struct kvp_mpool *p;
	unsigned i;

	if (!nthreads) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		nthreads = n > 0 ? (unsigned)n : 1;
	}
	if (nthreads > 64)
		nthreads = 64;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->w = calloc(nthreads, sizeof(*p->w));
	if (!p->w) {
		free(p);
		return -ENOMEM;
	}
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->go, NULL);
	pthread_cond_init(&p->done, NULL);
	p->nthreads = 1;
	for (i = 1; i < nthreads; i++) {
		p->w[i - 1].p = p;
		p->w[i - 1].idx = i;
		if (pthread_create(&p->w[i - 1].th, NULL, mworker_main,
				   &p->w[i - 1])) {
			kvp_mpool_destroy(p);
			return -EAGAIN;
		}
		p->nthreads = i + 1;
	}
	*out = p;
	return 0;
}

void kvp_mpool_destroy(struct kvp_mpool *p)
{
	unsigned i;

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	for (i = 1; i < p->nthreads; i++)
		pthread_join(p->w[i - 1].th, NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->go);
	pthread_cond_destroy(&p->done);
	free(p->w);
	free(p);
}

void kvp_mpool_run(struct kvp_mpool *p, uint32_t n, uint64_t work,
		   kvp_mpool_fn fn, void *arg)
{
	uint32_t lo, hi;

	if (!n)
		return;
	if (!p || p->nthreads == 1 || work < PARALLEL_MIN_WORK ||
	    n < p->nthreads) {
		fn(arg, 0, n);
		return;
	}
	pthread_mutex_lock(&p->mu);
	p->fn = fn;
	p->arg = arg;
	p->n = n;
	p->pending = p->nthreads - 1;
	p->gen++;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	range_of(n, 0, p->nthreads, &lo, &hi);
	fn(arg, lo, hi);
	pthread_mutex_lock(&p->mu);
	while (p->pending)
		pthread_cond_wait(&p->done, &p->mu);
	pthread_mutex_unlock(&p->mu);
}

/* a . b over n, in a fixed order: eight lanes, then a fixed tree. */
static float dot_portable(const float *a, const float *b, uint32_t n)
{
	float s[8] = { 0 };
	uint32_t i = 0, k;

	for (; i + 8 <= n; i += 8)
		for (k = 0; k < 8; k++)
			s[k] += a[i + k] * b[i + k];
	for (k = 0; i < n; i++, k++)
		s[k] += a[i] * b[i];
	return ((s[0] + s[4]) + (s[1] + s[5])) +
	       ((s[2] + s[6]) + (s[3] + s[7]));
}

#ifdef KVP_HAVE_X86
/* The same order with AVX2 FMA lanes (fused rounding: other bits than
 * the portable code, the same on every run of one machine). */
__attribute__((target("avx2,fma"))) static float
dot_avx2(const float *a, const float *b, uint32_t n)
{
	__m256 acc = _mm256_setzero_ps();
	float s[8];
	uint32_t i = 0, k;

	for (; i + 8 <= n; i += 8)
		acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i),
				      _mm256_loadu_ps(b + i), acc);
	_mm256_storeu_ps(s, acc);
	for (k = 0; i < n; i++, k++)
		s[k] += a[i] * b[i];
	return ((s[0] + s[4]) + (s[1] + s[5])) +
	       ((s[2] + s[6]) + (s[3] + s[7]));
}
#endif

static float (*dot)(const float *, const float *, uint32_t);

/* kvp_cpu_simd: the one CPU test of the library (attention's too). */
static void dot_choose(void)
{
	dot = dot_portable;
#ifdef KVP_HAVE_X86
	if (kvp_cpu_simd())
		dot = dot_avx2;
#endif
}

struct matmul_job {
	float *out;
	const float *x, *w;
	uint32_t ntok, rows, cols;
};

static void matmul_rows(void *arg, uint32_t lo, uint32_t hi)
{
	const struct matmul_job *j = arg;
	uint32_t r, t;

	for (r = lo; r < hi; r++) {
		const float *wr = j->w + (size_t)r * j->cols;

		for (t = 0; t < j->ntok; t++)
			j->out[(size_t)t * j->rows + r] =
			    dot(wr, j->x + (size_t)t * j->cols, j->cols);
	}
}

void kvp_model_matmul(struct kvp_mpool *p, float *out, const float *x,
		      const float *w, uint32_t ntok, uint32_t rows,
		      uint32_t cols)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	struct matmul_job j = { out, x, w, ntok, rows, cols };

	pthread_once(&once, dot_choose);

	kvp_mpool_run(p, rows, (uint64_t)ntok * rows * cols, matmul_rows, &j);
}

void kvp_model_rmsnorm(float *out, const float *x, const float *w, uint32_t n)
{
	float ss = 0;
	uint32_t i;

	for (i = 0; i < n; i++)
		ss += x[i] * x[i];
	ss = 1.0f / sqrtf(ss / (float)n + 1e-5f);
	for (i = 0; i < n; i++)
		out[i] = w[i] * (ss * x[i]);
}

void kvp_model_rope(float *v, uint32_t nheads, uint32_t head_dim,
		    uint64_t pos)
{
	uint32_t h, i;

	for (i = 0; i < head_dim; i += 2) {
		float freq = 1.0f / powf(10000.0f, (float)i / (float)head_dim);
		float val = (float)pos * freq;
		float fcr = cosf(val), fci = sinf(val);

		for (h = 0; h < nheads; h++) {
			float *e = v + (size_t)h * head_dim + i;
			float v0 = e[0], v1 = e[1];

			e[0] = v0 * fcr - v1 * fci;
			e[1] = v0 * fci + v1 * fcr;
		}
	}
}

void kvp_model_swiglu(float *h1, const float *h3, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++) {
		float v = h1[i];

		h1[i] = v * (1.0f / (1.0f + expf(-v))) * h3[i];
	}
}
