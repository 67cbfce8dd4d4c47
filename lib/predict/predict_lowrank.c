/*
 * predict_lowrank.c - KVSwap-style grouped prediction from low-rank keys.
 *
 * Per layer: P, row x r with orthonormal columns (row = kv_heads *
 * head_dim), the top-r eigenvectors of the sample keys' second moment
 * C = K^T K, found by subspace iteration (Z = C Q, re-orthonormalise,
 * power_iters times, from a seeded Gaussian start).  Per (seq, layer): the
 * projected keys P^T k of every observed token, r int8 per token and one
 * float scale (its largest magnitude / 127): every select streams all of
 * them and is bound by memory, so int8 halves its time against fp16, and
 * halves the RAM they take from a small budget's frames.  A score's error
 * is at most half a step of each key's own scale.
 *
 * A select folds the query per KV head (qbar_j = sum of the group's query
 * heads: then qbar . k = sum over heads of q_h . k_j), projects it, scores
 * each observed token by (P^T qbar) . (P^T k), max-pools the scores per
 * block, and keeps the top blocks; the blocks holding tokens not observed
 * yet, and the last block, are always kept.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cuda/attn_common.h"
#include "lib/predict/predict_i.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVP_HAVE_X86 1
#endif

struct lr_seq {
	int8_t *pk;    /* tokens * r: projected keys, quantised */
	float *ps;     /* tokens: pk[t * r + c] * ps[t] = (P^T k_t)[c] */
	uint64_t n;    /* tokens projected */
	uint64_t cap;  /* tokens room */
	uint64_t next; /* next token expected by observe */
};

struct lr_layer {
	float *P;	/* row * r, row-major: P[i * r + c]; NULL: not fitted */
	float *pend;	/* fit_tokens * row raw keys awaiting the fit */
	uint32_t *pseq; /* their sequences */
	uint32_t npend;
};

struct lowrank {
	uint32_t row, r;
	struct lr_layer *layers; /* [layer] */
	struct lr_seq *seqs;	 /* [seq * layers + layer] */
};

/* ---- C[M x N] = A[M x K] B[K x N], all row-major ---- */

static void gemm_scalar(size_t M, size_t N, size_t K, const float *A,
			size_t lda, const float *B, size_t ldb, float *C,
			size_t ldc)
{
	size_t i, j, k;

	for (i = 0; i < M; i++) {
		for (j = 0; j < N; j++) {
			float s = 0;

			for (k = 0; k < K; k++)
				s += A[i * lda + k] * B[k * ldb + j];
			C[i * ldc + j] = s;
		}
	}
}

#ifdef KVP_HAVE_X86
__attribute__((target("avx2,fma"))) static void
gemm_avx2(size_t M, size_t N, size_t K, const float *A, size_t lda,
	  const float *B, size_t ldb, float *C, size_t ldc)
{
	size_t i, j, k, Mb = M / 4 * 4, Nb = N / 16 * 16;

	/* columns outer: a 16-column strip of B stays in L2 over all rows */
	for (j = 0; j < Nb; j += 16) {
		for (i = 0; i < Mb; i += 4) {
			__m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00,
			       c11 = c00, c20 = c00, c21 = c00, c30 = c00,
			       c31 = c00;
			const float *a0 = A + i * lda, *a1 = a0 + lda,
				    *a2 = a1 + lda, *a3 = a2 + lda;

			for (k = 0; k < K; k++) {
				__m256 b0 = _mm256_loadu_ps(B + k * ldb + j);
				__m256 b1 =
				    _mm256_loadu_ps(B + k * ldb + j + 8);
				__m256 x;

				x = _mm256_broadcast_ss(a0 + k);
				c00 = _mm256_fmadd_ps(x, b0, c00);
				c01 = _mm256_fmadd_ps(x, b1, c01);
				x = _mm256_broadcast_ss(a1 + k);
				c10 = _mm256_fmadd_ps(x, b0, c10);
				c11 = _mm256_fmadd_ps(x, b1, c11);
				x = _mm256_broadcast_ss(a2 + k);
				c20 = _mm256_fmadd_ps(x, b0, c20);
				c21 = _mm256_fmadd_ps(x, b1, c21);
				x = _mm256_broadcast_ss(a3 + k);
				c30 = _mm256_fmadd_ps(x, b0, c30);
				c31 = _mm256_fmadd_ps(x, b1, c31);
			}
			_mm256_storeu_ps(C + i * ldc + j, c00);
			_mm256_storeu_ps(C + i * ldc + j + 8, c01);
			_mm256_storeu_ps(C + (i + 1) * ldc + j, c10);
			_mm256_storeu_ps(C + (i + 1) * ldc + j + 8, c11);
			_mm256_storeu_ps(C + (i + 2) * ldc + j, c20);
			_mm256_storeu_ps(C + (i + 2) * ldc + j + 8, c21);
			_mm256_storeu_ps(C + (i + 3) * ldc + j, c30);
			_mm256_storeu_ps(C + (i + 3) * ldc + j + 8, c31);
		}
	}
	/* the edges: rows past Mb (all columns), columns past Nb */
	for (i = 0; i < M; i++) {
		for (j = i < Mb ? Nb : 0; j < N; j++) {
			float s = 0;

			for (k = 0; k < K; k++)
				s += A[i * lda + k] * B[k * ldb + j];
			C[i * ldc + j] = s;
		}
	}
}
#endif

static void gemm(size_t M, size_t N, size_t K, const float *A, size_t lda,
		 const float *B, size_t ldb, float *C, size_t ldc)
{
#ifdef KVP_HAVE_X86
	if (kvp_cpu_simd()) {
		gemm_avx2(M, N, K, A, lda, B, ldb, C, ldc);
		return;
	}
#endif
	gemm_scalar(M, N, K, A, lda, B, ldb, C, ldc);
}

/* ---- fitting ---- */

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static float gauss(uint64_t *st)
{
	uint64_t a = mix((*st)++), b = mix((*st)++);
	double u1 = ((a >> 11) + 1.0) / 9007199254740993.0;
	double u2 = (b >> 11) / 9007199254740992.0;

	return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static float dot_scalar(const float *a, const float *b, uint32_t n)
{
	float s = 0;
	uint32_t i;

	for (i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

#ifdef KVP_HAVE_X86
/* n a multiple of 8 */
__attribute__((target("avx2,fma"))) static float
dot_avx2(const float *a, const float *b, uint32_t n)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = s0;
	__m128 lo;
	uint32_t i;

	for (i = 0; i + 16 <= n; i += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i),
				     _mm256_loadu_ps(b + i), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8),
				     _mm256_loadu_ps(b + i + 8), s1);
	}
	for (; i < n; i += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i),
				     _mm256_loadu_ps(b + i), s0);
	s0 = _mm256_add_ps(s0, s1);
	lo = _mm_add_ps(_mm256_castps256_ps128(s0),
			_mm256_extractf128_ps(s0, 1));
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo);
}
#endif

static float dotf(const float *a, const float *b, uint32_t n)
{
#ifdef KVP_HAVE_X86
	if (kvp_cpu_simd() && n % 8 == 0)
		return dot_avx2(a, b, n);
#endif
	return dot_scalar(a, b, n);
}

/*
 * Orthonormalise the r rows (length n) of V in place: modified
 * Gram-Schmidt, one pass (the iteration repeats it; the last call makes
 * two); a row that vanishes is replaced by a random one and redone.
 */
static void orthonormalise(float *V, uint32_t r, uint32_t n, uint64_t *st,
			   uint32_t passes)
{
	uint32_t i, j, d, pass, tries;

	for (i = 0; i < r; i++) {
		float *v = V + (size_t)i * n;

		for (tries = 0; tries < 4; tries++) {
			float nn, before = dotf(v, v, n);

			for (pass = 0; pass < passes; pass++) {
				for (j = 0; j < i; j++) {
					const float *u = V + (size_t)j * n;
					float dot = dotf(v, u, n);

					for (d = 0; d < n; d++)
						v[d] -= dot * u[d];
				}
			}
			nn = dotf(v, v, n);
			if (nn > 1e-10f * (before > 0 ? before : 1) && nn > 0) {
				nn = 1.0f / sqrtf(nn);
				for (d = 0; d < n; d++)
					v[d] *= nn;
				break;
			}
			for (d = 0; d < n; d++)
				v[d] = gauss(st);
		}
	}
}

/* P (row x r) from keys K (n x row): top-r eigenvectors of K^T K. */
static int fit_from(struct kvp_predictor *p, struct lr_layer *L, const float *K,
		    uint32_t n)
{
	struct lowrank *lr = p->priv;
	uint32_t row = lr->row, r = lr->r, i, j, it;
	float *Kt, *C, *Q, *Z, *P;
	uint64_t st = mix(p->o.seed ^ ((uint64_t)(L - lr->layers) << 32));
	int err = -ENOMEM;

	Kt = malloc(sizeof(float) * (size_t)row * n);
	C = malloc(sizeof(float) * (size_t)row * row);
	Q = malloc(sizeof(float) * (size_t)r * row); /* Q^T: r x row */
	Z = malloc(sizeof(float) * (size_t)row * r);
	P = malloc(sizeof(float) * (size_t)row * r);
	if (!Kt || !C || !Q || !Z || !P)
		goto out;
	for (i = 0; i < n; i++)
		for (j = 0; j < row; j++)
			Kt[(size_t)j * n + i] = K[(size_t)i * row + j];
	gemm(row, row, n, Kt, n, K, row, C, row);
	for (i = 0; i < r * row; i++)
		Q[i] = gauss(&st);
	orthonormalise(Q, r, row, &st, 1);
	for (it = 0; it < p->o.power_iters; it++) {
		/* Z^T = Q^T C (C is symmetric): r x row */
		gemm(r, row, row, Q, row, C, row, Z, row);
		memcpy(Q, Z, sizeof(float) * (size_t)r * row);
		orthonormalise(Q, r, row, &st,
			       it + 1 == p->o.power_iters ? 2 : 1);
	}
	for (i = 0; i < row; i++)
		for (j = 0; j < r; j++)
			P[(size_t)i * r + j] = Q[(size_t)j * row + i];
	free(L->P);
	L->P = P;
	P = NULL;
	err = 0;
out:
	free(Kt);
	free(C);
	free(Q);
	free(Z);
	free(P);
	return err;
}

/* The key row (all KV heads) of slot `slot` of a KV block, as fp32. */
static void key_row(const struct kvp_kv_geometry *g, const void *blk,
		    uint32_t slot, float *out)
{
	uint32_t j;

	for (j = 0; j < g->kv_heads; j++)
		kvp_kv_to_f32(g->dtype,
			      (const char *)blk + kvp_kv_k_offset(g, j, slot),
			      out + (size_t)j * g->head_dim, g->head_dim);
}

/* n rows of r floats to int8 with one scale per row; NaN becomes 0. */
static void quantise(const float *y, uint32_t n, uint32_t r, int8_t *q,
		     float *scale)
{
	uint32_t t, c;

	for (t = 0; t < n; t++) {
		const float *row = y + (size_t)t * r;
		float amax = 0, inv;

		for (c = 0; c < r; c++)
			if (fabsf(row[c]) > amax)
				amax = fabsf(row[c]);
		inv = amax > 0 && isfinite(amax) ? 127.0f / amax : 0;
		scale[t] = inv ? amax / 127.0f : 0;
		for (c = 0; c < r; c++) {
			float v = row[c] * inv;

			if (!(v == v))
				v = 0;
			q[(size_t)t * r + c] =
			    (int8_t)lrintf(v > 127 ? 127 : v < -127 ? -127 : v);
		}
	}
}

/* Append projections of n key rows to s. */
static int project_append(struct kvp_predictor *p, struct lr_layer *L,
			  struct lr_seq *s, const float *K, uint32_t n)
{
	struct lowrank *lr = p->priv;
	uint32_t r = lr->r;
	uint32_t done, m;
	float *y;

	if (s->n + n > s->cap) {
		uint64_t cap = s->cap ? s->cap : 1024;
		int8_t *pk;
		float *ps;

		while (cap < s->n + n)
			cap *= 2;
		pk = realloc(s->pk, (size_t)r * cap);
		if (!pk)
			return -ENOMEM;
		s->pk = pk; /* grown; cap moves only once both have */
		ps = realloc(s->ps, sizeof(float) * cap);
		if (!ps)
			return -ENOMEM;
		s->ps = ps;
		s->cap = cap;
	}
	y = malloc(sizeof(float) * 64 * r);
	if (!y)
		return -ENOMEM;
	for (done = 0; done < n; done += m) {
		m = n - done < 64 ? n - done : 64;
		gemm(m, r, lr->row, K + (size_t)done * lr->row, lr->row, L->P,
		     r, y, r);
		quantise(y, m, r, s->pk + (size_t)(s->n + done) * r,
			 s->ps + s->n + done);
	}
	free(y);
	s->n += n;
	return 0;
}

/* Fit L from what is pending (or from K if given), then project pending. */
static int fit_and_flush(struct kvp_predictor *p, uint32_t layer,
			 const float *K, uint32_t n)
{
	struct lowrank *lr = p->priv;
	struct lr_layer *L = &lr->layers[layer];
	uint32_t i;
	int err;

	err = fit_from(p, L, K ? K : L->pend, K ? n : L->npend);
	if (err)
		return err;
	for (i = 0; i < L->npend; i++) {
		struct lr_seq *s =
		    &lr->seqs[(size_t)L->pseq[i] * p->g.layers + layer];

		err = project_append(p, L, s, L->pend + (size_t)i * lr->row, 1);
		if (err)
			return err;
	}
	free(L->pend);
	free(L->pseq);
	L->pend = NULL;
	L->pseq = NULL;
	L->npend = 0;
	return 0;
}

/* ---- ops ---- */

static int lr_init(struct kvp_predictor *p)
{
	struct lowrank *lr = calloc(1, sizeof(*lr));

	if (!lr)
		return -ENOMEM;
	lr->row = p->g.kv_heads * p->g.head_dim;
	lr->r = p->o.rank;
	lr->layers = calloc(p->g.layers, sizeof(*lr->layers));
	lr->seqs =
	    calloc((size_t)p->o.max_seqs * p->g.layers, sizeof(*lr->seqs));
	if (!lr->layers || !lr->seqs) {
		free(lr->layers);
		free(lr->seqs);
		free(lr);
		return -ENOMEM;
	}
	p->priv = lr;
	return 0;
}

static void lr_fini(struct kvp_predictor *p)
{
	struct lowrank *lr = p->priv;
	size_t i;

	for (i = 0; i < p->g.layers; i++) {
		free(lr->layers[i].P);
		free(lr->layers[i].pend);
		free(lr->layers[i].pseq);
	}
	for (i = 0; i < (size_t)p->o.max_seqs * p->g.layers; i++) {
		free(lr->seqs[i].pk);
		free(lr->seqs[i].ps);
	}
	free(lr->layers);
	free(lr->seqs);
	free(lr);
}

static int cmp_fdesc(const void *x, const void *y)
{
	float a = *(const float *)x, b = *(const float *)y;

	return a < b ? 1 : a > b ? -1 : 0;
}

/*
 * Fit from a sample.  Up to fit_tokens tokens are used as they are; from a
 * larger sample, the fit_tokens / 4 keys of largest norm (the rare, strong
 * directions: sinks, heavy hitters, which a uniform subsample misses) plus
 * evenly spaced others.
 */
static int lr_fit(struct kvp_predictor *p, uint32_t layer,
		  const struct kvp_attn_blocks *sample)
{
	struct lowrank *lr = p->priv;
	const struct kvp_kv_geometry *g = &p->g;
	size_t i, tok = 0, total = 0, want, k1, kept = 0, row = lr->row;
	float *K, *norms = NULL, *sorted = NULL, thr = 0;
	uint32_t s, d;
	int err = -ENOMEM;

	for (i = 0; i < (size_t)p->o.max_seqs; i++)
		if (lr->seqs[i * g->layers + layer].n)
			return -EBUSY;
	for (i = 0; i < sample->n; i++)
		total += sample->ntokens ? sample->ntokens[i] : g->block_tokens;
	want = total < p->o.fit_tokens ? total : p->o.fit_tokens;
	k1 = total > want ? want / 4 : 0;
	K = malloc(sizeof(float) * (want + 1) * row);
	if (!K)
		return -ENOMEM;
	if (k1) {
		norms = malloc(sizeof(float) * total);
		sorted = malloc(sizeof(float) * total);
		if (!norms || !sorted)
			goto out;
		for (i = 0; i < sample->n; i++) {
			uint32_t nt = sample->ntokens ? sample->ntokens[i]
						      : g->block_tokens;

			for (s = 0; s < nt; s++, tok++) {
				float nn = 0;

				key_row(g, sample->ptrs[i], s, K);
				for (d = 0; d < row; d++)
					nn += K[d] * K[d];
				norms[tok] = sorted[tok] = nn;
			}
		}
		qsort(sorted, total, sizeof(float), cmp_fdesc);
		thr = sorted[k1 - 1];
	}
	tok = 0;
	for (i = 0; i < sample->n && kept < want; i++) {
		uint32_t nt =
		    sample->ntokens ? sample->ntokens[i] : g->block_tokens;

		for (s = 0; s < nt && kept < want; s++, tok++) {
			bool take = !k1;

			if (k1 && norms[tok] >= thr && k1) {
				take = true;
			} else if (k1) {
				/* evenly spaced: about want - k1 of total */
				size_t a = tok * (want - k1) / total;
				size_t b = (tok + 1) * (want - k1) / total;

				take = b > a;
			}
			if (take)
				key_row(g, sample->ptrs[i], s,
					K + kept++ * row);
		}
	}
	err = fit_and_flush(p, layer, K, (uint32_t)kept);
out:
	free(norms);
	free(sorted);
	free(K);
	return err;
}

static int lr_observe(struct kvp_predictor *p, uint32_t seq, uint32_t layer,
		      uint64_t token, uint32_t ntokens, const void *kvblock)
{
	struct lowrank *lr = p->priv;
	struct lr_layer *L = &lr->layers[layer];
	struct lr_seq *s = &lr->seqs[(size_t)seq * p->g.layers + layer];
	uint32_t G = p->g.block_tokens, i = 0;
	float *K;
	int err = 0;

	if (token != s->next)
		return -EINVAL;
	/* not fitted: buffer; fit once fit_tokens arrived */
	while (!L->P && i < ntokens) {
		if (!L->pend) {
			L->pend = malloc(sizeof(float) * lr->row *
					 (size_t)p->o.fit_tokens);
			L->pseq = malloc(sizeof(uint32_t) * p->o.fit_tokens);
			if (!L->pend || !L->pseq) {
				free(L->pend);
				free(L->pseq);
				L->pend = NULL;
				L->pseq = NULL;
				return -ENOMEM;
			}
		}
		key_row(&p->g, kvblock, (uint32_t)((token + i) % G),
			L->pend + (size_t)L->npend * lr->row);
		L->pseq[L->npend++] = seq;
		s->next++;
		i++;
		if (L->npend == p->o.fit_tokens) {
			err = fit_and_flush(p, layer, NULL, 0);
			if (err)
				return err;
		}
	}
	if (i == ntokens)
		return 0;
	K = malloc(sizeof(float) * lr->row * (ntokens - i));
	if (!K)
		return -ENOMEM;
	for (uint32_t t = i; t < ntokens; t++)
		key_row(&p->g, kvblock, (uint32_t)((token + t) % G),
			K + (size_t)(t - i) * lr->row);
	err = project_append(p, L, s, K, ntokens - i);
	if (!err)
		s->next += ntokens - i;
	free(K);
	return err;
}

static void lr_forget(struct kvp_predictor *p, uint32_t seq)
{
	struct lowrank *lr = p->priv;
	uint32_t l;

	for (l = 0; l < p->g.layers; l++) {
		struct lr_seq *s = &lr->seqs[(size_t)seq * p->g.layers + l];

		free(s->pk);
		free(s->ps);
		memset(s, 0, sizeof(*s));
	}
}

/* scores[t] = (pq . pk[t]) * ps[t] over n tokens of r int8 values */
static void score_scalar(const float *pq, const int8_t *pk, const float *ps,
			 uint64_t n, uint32_t r, float *scores)
{
	uint64_t t;
	uint32_t c;

	for (t = 0; t < n; t++) {
		float s = 0;

		for (c = 0; c < r; c++)
			s += pq[c] * (float)pk[t * r + c];
		scores[t] = s * ps[t];
	}
}

#ifdef KVP_HAVE_X86
__attribute__((target("avx2,f16c,fma"))) static void
score_simd(const float *pq, const int8_t *pk, const float *ps, uint64_t n,
	   uint32_t r, float *scores)
{
	uint64_t t;
	uint32_t c, rb = r / 8 * 8;

	for (t = 0; t < n; t++) {
		const int8_t *row = pk + t * r;
		__m256 a = _mm256_setzero_ps();
		__m128 lo, hi;
		float s;

		for (c = 0; c < rb; c += 8)
			a = _mm256_fmadd_ps(
			    _mm256_loadu_ps(pq + c),
			    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
				_mm_loadl_epi64((const __m128i *)(row + c)))),
			    a);
		lo = _mm256_castps256_ps128(a);
		hi = _mm256_extractf128_ps(a, 1);
		lo = _mm_add_ps(lo, hi);
		lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
		lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
		s = _mm_cvtss_f32(lo);
		for (; c < r; c++)
			s += pq[c] * (float)row[c];
		scores[t] = s * ps[t];
	}
}
#endif

/* Min-heap of (score, block) of size k: keeps the k largest. */
struct cand {
	float s;
	uint32_t b;
};

static void heap_down(struct cand *h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, m = i;
		struct cand t;

		if (l < n && h[l].s < h[m].s)
			m = l;
		if (l + 1 < n && h[l + 1].s < h[m].s)
			m = l + 1;
		if (m == i)
			return;
		t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

static int lr_select(struct kvp_predictor *p, uint32_t seq, uint32_t layer,
		     const struct kvp_block_table *bt, const float *q,
		     uint32_t *lblocks, size_t *n)
{
	struct lowrank *lr = p->priv;
	struct lr_layer *L = &lr->layers[layer];
	struct lr_seq *s = &lr->seqs[(size_t)seq * p->g.layers + layer];
	const struct kvp_kv_geometry *g = &p->g;
	uint32_t nb = kvp_block_table_blocks(bt), G = g->block_tokens;
	uint32_t budget = kvp_predict_budget_blocks(p), grp = kvp_kv_group(g);
	uint32_t scored, i, j, d, k = 0, want;
	uint64_t ntok;
	float *qbar, *pq, *scores;
	struct cand *heap;
	size_t nheap = 0;
	int err;

	if (!L->P && L->npend) {
		err = fit_and_flush(p, layer, NULL, 0);
		if (err)
			return err;
	}
	ntok = s->n < kvp_block_table_tokens(bt) ? s->n
						 : kvp_block_table_tokens(bt);
	scored = (uint32_t)(ntok / G); /* whole blocks fully observed */
	if (nb <= budget) {
		for (i = 0; i < nb; i++)
			lblocks[i] = i;
		*n = nb;
		return 0;
	}
	/* forced: blocks not wholly observed, and the last block */
	if (scored >= nb)
		scored = nb - 1;
	if (nb - scored >= budget || scored == 0 || !L->P) {
		/* nothing to score: the newest blocks within the budget */
		k = 0;
		for (i = nb - (budget > nb ? nb : budget); i < nb; i++)
			lblocks[k++] = i;
		*n = k;
		return 0;
	}
	for (i = scored; i < nb; i++)
		lblocks[k++] = i;
	want = budget - k;
	qbar = malloc(sizeof(float) * (lr->row + lr->r + (size_t)scored * G));
	heap = malloc(sizeof(*heap) * want);
	if (!qbar || !heap) {
		free(qbar);
		free(heap);
		return -ENOMEM;
	}
	pq = qbar + lr->row;
	scores = pq + lr->r;
	for (j = 0; j < g->kv_heads; j++) {
		for (d = 0; d < g->head_dim; d++) {
			float a = 0;

			for (i = 0; i < grp; i++)
				a += q[(size_t)(j * grp + i) * g->head_dim + d];
			qbar[(size_t)j * g->head_dim + d] = a;
		}
	}
	gemm(1, lr->r, lr->row, qbar, lr->row, L->P, lr->r, pq, lr->r);
#ifdef KVP_HAVE_X86
	if (kvp_cpu_simd())
		score_simd(pq, s->pk, s->ps, (uint64_t)scored * G, lr->r,
			   scores);
	else
#endif
		score_scalar(pq, s->pk, s->ps, (uint64_t)scored * G, lr->r,
			     scores);
	for (i = 0; i < scored; i++) {
		float mx = scores[(size_t)i * G];

		for (j = 1; j < G; j++)
			if (scores[(size_t)i * G + j] > mx)
				mx = scores[(size_t)i * G + j];
		if (nheap < want) {
			size_t c = nheap++;

			heap[c].s = mx;
			heap[c].b = i;
			/* sift up */
			while (c && heap[(c - 1) / 2].s > heap[c].s) {
				struct cand t = heap[c];

				heap[c] = heap[(c - 1) / 2];
				heap[(c - 1) / 2] = t;
				c = (c - 1) / 2;
			}
		} else if (mx > heap[0].s) {
			heap[0].s = mx;
			heap[0].b = i;
			heap_down(heap, nheap, 0);
		}
	}
	for (i = 0; i < nheap; i++)
		lblocks[k++] = heap[i].b;
	free(qbar);
	free(heap);
	*n = k;
	return 0;
}

/* What a sequence's projected keys hold: its capacity, not its count
 * (project_append grows it by doubling, and all of it is malloc'd). */
static size_t lr_seq_bytes(const struct lowrank *lr, uint64_t cap)
{
	return (lr->r + sizeof(float)) * cap;
}

static size_t lr_metadata_bytes(const struct kvp_predictor *p)
{
	const struct lowrank *lr = p->priv;
	size_t b = 0, i;

	for (i = 0; i < p->g.layers; i++) {
		if (lr->layers[i].P)
			b += sizeof(float) * lr->row * lr->r;
		if (lr->layers[i].pend) /* the keys and their sequences */
			b += (sizeof(float) * lr->row + sizeof(uint32_t)) *
			     (size_t)p->o.fit_tokens;
	}
	for (i = 0; i < (size_t)p->o.max_seqs * p->g.layers; i++)
		b += lr_seq_bytes(lr, lr->seqs[i].cap);
	return b;
}

/* The capacity lr_reserve gives s for @more tokens to come: room for all
 * it observed and those, exactly; a sequence with none to come (and none
 * pending) keeps what it has. */
static uint64_t lr_reserved_cap(const struct lr_seq *s, uint64_t more)
{
	uint64_t need = s->next + more;

	if (need < s->next)
		need = UINT64_MAX; /* saturates: refused as too large */
	return more || need > s->cap ? need : s->cap;
}

static size_t sat_add(size_t a, size_t b)
{
	return a + b < a ? SIZE_MAX : a + b;
}

static size_t sat_mul(size_t a, uint64_t b)
{
	size_t r;

	return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

/* The scratch fit_from allocates besides P, from at most fit_tokens keys:
 * their transpose, the row x row covariance, Q and Z. */
static size_t lr_fit_scratch(const struct kvp_predictor *p)
{
	const struct lowrank *lr = p->priv;

	return sizeof(float) * lr->row *
	       ((size_t)p->o.fit_tokens + lr->row + 2 * (size_t)lr->r);
}

/*
 * After lr_reserve(@more): every sequence's projected keys have room for
 * what it observed and @more[seq] tokens, so the decode grows nothing;
 * a layer not fitted yet holds, while its fit flushes the buffered keys,
 * its projection, the buffer and every sequence's room at once, and
 * while it is fitted, the fit's scratch too (one layer at a time: the
 * selects that fit them run one after another).
 */
static size_t lr_metadata_peak(const struct kvp_predictor *p,
			       const uint64_t *more)
{
	const struct lowrank *lr = p->priv;
	size_t b = 0, i, s;
	bool fits = false;

	for (i = 0; i < p->g.layers; i++) {
		const struct lr_layer *L = &lr->layers[i];
		bool coming = L->P || L->pend;

		for (s = 0; s < p->o.max_seqs; s++) {
			const struct lr_seq *q =
			    &lr->seqs[s * p->g.layers + i];
			uint64_t m = more ? more[s] : 0;

			coming |= m > 0;
			b = sat_add(b, sat_mul(lr->r + sizeof(float),
					       lr_reserved_cap(q, m)));
		}
		if (coming)
			b = sat_add(b, sizeof(float) * lr->row * lr->r);
		if (!L->P && coming) {
			b = sat_add(b, (sizeof(float) * lr->row +
					sizeof(uint32_t)) *
					   (size_t)p->o.fit_tokens);
			fits = true;
		}
	}
	return fits ? sat_add(b, lr_fit_scratch(p)) : b;
}

/* Each sequence's projected keys sized as lr_metadata_peak counts them,
 * in every layer: grown (or trimmed) to exactly what it observed and
 * @more[seq] tokens. */
static int lr_reserve(struct kvp_predictor *p, const uint64_t *more)
{
	struct lowrank *lr = p->priv;
	size_t i;

	for (i = 0; i < (size_t)p->o.max_seqs * p->g.layers; i++) {
		struct lr_seq *s = &lr->seqs[i];
		uint64_t cap =
		    lr_reserved_cap(s, more ? more[i / p->g.layers] : 0);
		int8_t *pk;
		float *ps;

		if (cap == s->cap)
			continue;
		if (cap > SIZE_MAX / (lr->r + sizeof(float)))
			return -ENOMEM;
		pk = realloc(s->pk, (size_t)lr->r * cap);
		if (!pk)
			return -ENOMEM;
		s->pk = pk; /* cap moves only once both have */
		ps = realloc(s->ps, sizeof(float) * cap);
		if (!ps) {
			/* both hold the smaller of the two capacities */
			if (cap < s->cap)
				s->cap = cap;
			return -ENOMEM;
		}
		s->ps = ps;
		s->cap = cap;
	}
	return 0;
}

const struct kvp_predict_ops kvp_predict_lowrank_ops = {
	.name = "lowrank",
	.init = lr_init,
	.fini = lr_fini,
	.fit = lr_fit,
	.observe = lr_observe,
	.forget = lr_forget,
	.select = lr_select,
	.metadata_bytes = lr_metadata_bytes,
	.metadata_peak = lr_metadata_peak,
	.reserve = lr_reserve,
};
