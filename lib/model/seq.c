/*
 * seq.c - one sequence of a model through a KV cache: the model as a KV
 * source (see model.h).
 *
 * A decode step of token t at position p:
 *
 *   x = embed[t]                                      kvp_model_step
 *   kvp_kvcache_step, per layer l:
 *     fill(l)    finish layer l-1 from attn[l-1]: x += wo attn; x += FFN;
 *                then q, k, v of layer l (RoPE at p); k, v into the
 *                rolling block; q kept for query(l)
 *     query(l)   the kept q
 *     attention  the cache's, over the predictor's blocks -> attn[l]
 *   finish layer L-1; final norm; logits = cls x       kvp_model_step
 *
 * The cache writes layer l's output into attn[l] before it asks for layer
 * l+1's fill (its per-layer order: fill, wait, compute), which is what
 * lets the source continue the forward pass inside the step.
 *
 * Prefill runs the prompt in chunks of PREFILL_CHUNK tokens, layer by
 * layer over the whole chunk (matrix-matrix products), with the prompt's
 * own causal attention over a history of its K and V in RAM; then
 * kvp_kvcache_prefill takes the chunk's K and V from that history.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>

#include "kmod-helpers/mem.h"
#include "lib/model/model_i.h"

#define PREFILL_CHUNK 256u

enum seq_mode {
	MODE_IDLE = 0,	  /* between calls: fill refuses */
	MODE_PREFILL = 1, /* fill reads the history */
	MODE_STEP = 2,	  /* fill runs the forward pass */
};

struct kvp_model_seq {
	struct kvp_model *m;
	const struct kvp_model_config *cfg; /* &m->cfg */
	struct kvp_kvcache *c;
	uint32_t seq;		   /* the cache's sequence id */
	struct kvp_kv_geometry g;  /* the cache's geometry */
	struct kvp_mpool *pool;	   /* matrix-product workers */
	struct kvp_kv_source src;  /* model_source_ops on this */
	uint32_t qd, kvd;	   /* q_heads * head_dim, kv_heads * head_dim */
	uint64_t pos;		   /* tokens in the sequence */
	enum seq_mode mode;
	uint32_t next_layer;	   /* step: the layer fill expects next */
	float *x, *xb, *xb2;	   /* residual stream and scratch: dim */
	float *spec;		   /* speculative query's norm: dim */
	float *hb, *hb2;	   /* FFN: hidden_dim */
	float *kcur, *vcur;	   /* the step's k, v: kvd */
	float *q;		   /* the step's real queries: layers x qd */
	float *attn;		   /* the cache's output: layers x qd */
	float *logits;		   /* vocab */
	/* prefill: the prompt's K and V, ring of hcap tokens per layer */
	float *hk, *hv;		   /* layers x hcap x kvd */
	uint64_t hcap;
	double compute_s;	   /* the model's own math */
	struct kvp_model_prefill_times pt; /* the last prefill's */
	struct kvp_model_prefix *px; /* the prefix store, or NULL */
	kvp_kvcache_progress_fn progress; /* the prefill's, or NULL */
	void *parg;
	bool later_pending;	     /* px->later_seq is this one: the
					only case it reads px after the
					prefill (px may be gone by then) */
	struct offer_job *job;	     /* kvp_model_seq_offer_async's
					thread, or NULL */
};

/*
 * kvp_model_seq_offer_async's reader: the held-back chunks [from, to)
 * read from a snapshot of their KV blocks (kvp_kvcache_snap: full blocks,
 * never written again) and put, on a thread of its own while the decode
 * goes on.  It touches only the snapshot and px's put, never px's other
 * fields nor the sequence: whatever would change the keys a put stores
 * under, or free the blocks, waits for it first (offer_wait).
 */
struct offer_job {
	pthread_t th;
	struct kvp_kvcache_snap *snap;
	struct kvp_model_prefix *px;
	uint32_t from, to, C;
	size_t len;
	int err;      /* the first read's error: the rest not offered */
	double s;     /* the thread's time */
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Write K and V (kvd floats each) of one token into slot of a KV block. */
static void put_token(const struct kvp_kv_geometry *g, void *blk,
		      uint32_t slot, const float *k, const float *v)
{
	uint32_t h;

	for (h = 0; h < g->kv_heads; h++) {
		kvp_kv_from_f32(g->dtype, k + (size_t)h * g->head_dim,
				(char *)blk + kvp_kv_k_offset(g, h, slot),
				g->head_dim);
		kvp_kv_from_f32(g->dtype, v + (size_t)h * g->head_dim,
				(char *)blk + kvp_kv_v_offset(g, h, slot),
				g->head_dim);
	}
}

/* q, k, v of layer l from the residual x at position pos. */
static void layer_qkv(struct kvp_model_seq *s, uint32_t l, uint64_t pos,
		      float *q, float *k, float *v)
{
	const struct kvp_model_config *c = s->cfg;
	const struct kvp_model_weights *w = &s->m->w;
	size_t D = c->dim;

	kvp_model_rmsnorm(s->xb, s->x, w->att_norm + l * D, c->dim);
	kvp_model_matmul(s->pool, q, s->xb, w->wq + l * (size_t)s->qd * D, 1,
			 s->qd, c->dim);
	kvp_model_matmul(s->pool, k, s->xb, w->wk + l * (size_t)s->kvd * D, 1,
			 s->kvd, c->dim);
	kvp_model_matmul(s->pool, v, s->xb, w->wv + l * (size_t)s->kvd * D, 1,
			 s->kvd, c->dim);
	kvp_model_rope(q, c->q_heads, c->head_dim, pos);
	kvp_model_rope(k, c->kv_heads, c->head_dim, pos);
}

/*
 * The rest of layer l over ntok tokens of x ([ntok][dim]) given their
 * attention output att ([ntok][qd]): x += wo att; x += FFN(norm(x)).
 * xb, xb2: ntok * dim scratch; hb, hb2: ntok * hidden_dim.
 */
static void layer_finish(struct kvp_model_seq *s, uint32_t l, uint32_t ntok,
			 float *x, const float *att, float *xb, float *xb2,
			 float *hb, float *hb2)
{
	const struct kvp_model_config *c = s->cfg;
	const struct kvp_model_weights *w = &s->m->w;
	size_t D = c->dim, H = c->hidden_dim, i;
	uint32_t t;

	kvp_model_matmul(s->pool, xb2, att, w->wo + l * D * s->qd, ntok,
			 c->dim, s->qd);
	for (i = 0; i < ntok * D; i++)
		x[i] += xb2[i];
	for (t = 0; t < ntok; t++)
		kvp_model_rmsnorm(xb + t * D, x + t * D, w->ffn_norm + l * D,
				  c->dim);
	kvp_model_matmul(s->pool, hb, xb, w->w1 + l * H * D, ntok,
			 c->hidden_dim, c->dim);
	kvp_model_matmul(s->pool, hb2, xb, w->w3 + l * H * D, ntok,
			 c->hidden_dim, c->dim);
	kvp_model_swiglu(hb, hb2, (uint32_t)(ntok * H));
	kvp_model_matmul(s->pool, xb2, hb, w->w2 + l * D * H, ntok, c->dim,
			 c->hidden_dim);
	for (i = 0; i < ntok * D; i++)
		x[i] += xb2[i];
}

static void final_logits(struct kvp_model_seq *s, const float *x)
{
	const struct kvp_model_config *c = s->cfg;

	kvp_model_rmsnorm(s->xb, x, s->m->w.final_norm, c->dim);
	kvp_model_matmul(s->pool, s->logits, s->xb, s->m->w.cls, 1, c->vocab,
			 c->dim);
}

/* ---- the KV source ------------------------------------------------------ */

static float *hist_k(struct kvp_model_seq *s, uint32_t l, uint64_t tok)
{
	return s->hk + ((size_t)l * s->hcap + tok % s->hcap) * s->kvd;
}

static float *hist_v(struct kvp_model_seq *s, uint32_t l, uint64_t tok)
{
	return s->hv + ((size_t)l * s->hcap + tok % s->hcap) * s->kvd;
}

static int src_fill(void *arg, uint32_t seq, uint32_t layer, uint64_t token,
		    uint32_t ntokens, void *kvblock)
{
	struct kvp_model_seq *s = arg;
	uint32_t G = s->g.block_tokens, i;
	double t0;

	if (seq != s->seq || layer >= s->cfg->layers)
		return -EINVAL;
	if (s->mode == MODE_PREFILL) {
		/* read only: the cache calls this from several threads */
		for (i = 0; i < ntokens; i++)
			put_token(&s->g, kvblock, (uint32_t)((token + i) % G),
				  hist_k(s, layer, token + i),
				  hist_v(s, layer, token + i));
		return 0;
	}
	if (s->mode != MODE_STEP || ntokens != 1 || token != s->pos ||
	    layer != s->next_layer)
		return -EINVAL;
	t0 = now_s();
	if (layer)
		layer_finish(s, layer - 1, 1, s->x,
			     s->attn + (size_t)(layer - 1) * s->qd, s->xb,
			     s->xb2, s->hb, s->hb2);
	layer_qkv(s, layer, token, s->q + (size_t)layer * s->qd, s->kcur,
		  s->vcur);
	put_token(&s->g, kvblock, (uint32_t)(token % G), s->kcur, s->vcur);
	s->next_layer++;
	s->compute_s += now_s() - t0;
	return 0;
}

static int src_query(void *arg, uint32_t seq, uint32_t layer, uint64_t pos,
		     float *q)
{
	struct kvp_model_seq *s = arg;
	const struct kvp_model_config *c = s->cfg;
	size_t D = c->dim;

	if (s->mode == MODE_STEP && pos == s->pos + 1 &&
	    layer < s->next_layer) {
		memcpy(q, s->q + (size_t)layer * s->qd, sizeof(float) * s->qd);
		return 0;
	}
	/* ahead of its layer: the latest residual through layer's wq */
	(void)seq;
	kvp_model_rmsnorm(s->spec, s->x, s->m->w.att_norm + layer * D, c->dim);
	kvp_model_matmul(s->pool, q, s->spec,
			 s->m->w.wq + layer * (size_t)s->qd * D, 1, s->qd,
			 c->dim);
	kvp_model_rope(q, c->q_heads, c->head_dim, pos ? pos - 1 : 0);
	return 0;
}

/*
 * The model as a kv_source.h source.  query serves plans too (no
 * plan_query): ahead of its layer it is the speculative query above.
 * Prefill fills only read the history, so fills of several layers may
 * run at once (no KVP_KV_SOURCE_LAYER_ORDER).
 */
static const struct kvp_kv_source_ops model_source_ops = {
	.fill = src_fill,
	.query = src_query,
};

/* ---- lifecycle ---------------------------------------------------------- */

int kvp_model_seq_create(struct kvp_model *m, struct kvp_kvcache *c,
			 uint32_t seq, unsigned nthreads,
			 struct kvp_model_seq **out)
{
	const struct kvp_kv_layout *l = kvp_kvcache_layout(c);
	const struct kvp_model_config *cfg = &m->cfg;
	struct kvp_model_seq *s;
	int err;

	if (l->geo.layers != cfg->layers || l->geo.q_heads != cfg->q_heads ||
	    l->geo.kv_heads != cfg->kv_heads ||
	    l->geo.head_dim != cfg->head_dim ||
	    kvp_kvcache_seq_tokens(c, seq) != 0)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->m = m;
	s->cfg = cfg;
	s->c = c;
	s->seq = seq;
	s->g = l->geo;
	s->qd = cfg->q_heads * cfg->head_dim;
	s->kvd = cfg->kv_heads * cfg->head_dim;
	s->src.ops = &model_source_ops;
	s->src.arg = s;
	s->x = calloc(cfg->dim, sizeof(float));
	s->xb = calloc(cfg->dim, sizeof(float));
	s->xb2 = calloc(cfg->dim, sizeof(float));
	s->spec = calloc(cfg->dim, sizeof(float));
	s->hb = calloc(cfg->hidden_dim, sizeof(float));
	s->hb2 = calloc(cfg->hidden_dim, sizeof(float));
	s->kcur = calloc(s->kvd, sizeof(float));
	s->vcur = calloc(s->kvd, sizeof(float));
	s->q = calloc((size_t)cfg->layers * s->qd, sizeof(float));
	s->attn = calloc((size_t)cfg->layers * s->qd, sizeof(float));
	s->logits = calloc(cfg->vocab, sizeof(float));
	err = -ENOMEM;
	if (!s->x || !s->xb || !s->xb2 || !s->spec || !s->hb || !s->hb2 ||
	    !s->kcur || !s->vcur || !s->q || !s->attn || !s->logits)
		goto fail;
	err = kvp_mpool_create(nthreads, &s->pool);
	if (err)
		goto fail;
	*out = s;
	return 0;
fail:
	kvp_model_seq_destroy(s);
	return err;
}

static int offer_wait(struct kvp_model_seq *s);

void kvp_model_prefix_drop_later(struct kvp_model_prefix *px)
{
	if (px && px->later_seq) {
		/* an offer in flight completes: its keys are still right */
		(void)offer_wait(px->later_seq);
		px->later_seq->later_pending = false;
		px->later_seq = NULL;
		px->later_from = px->later_to = 0;
	}
}

/* Forget the chunks s holds back on its prefix, if any. */
static void later_drop(struct kvp_model_seq *s)
{
	if (s->later_pending)
		kvp_model_prefix_drop_later(s->px);
}

void kvp_model_seq_destroy(struct kvp_model_seq *s)
{
	if (!s)
		return;
	later_drop(s);
	kvp_mpool_destroy(s->pool);
	free(s->x);
	free(s->xb);
	free(s->xb2);
	free(s->spec);
	free(s->hb);
	free(s->hb2);
	free(s->kcur);
	free(s->vcur);
	free(s->q);
	free(s->attn);
	free(s->logits);
	free(s->hk);
	free(s->hv);
	free(s);
}

const float *kvp_model_logits(const struct kvp_model_seq *s)
{
	return s->logits;
}

uint64_t kvp_model_seq_tokens(const struct kvp_model_seq *s)
{
	return s->pos;
}

double kvp_model_seq_compute_s(const struct kvp_model_seq *s)
{
	return s->compute_s;
}

void kvp_model_seq_prefill_times(const struct kvp_model_seq *s,
				 struct kvp_model_prefill_times *out)
{
	*out = s->pt;
}

static bool past_context(const struct kvp_model_seq *s, uint64_t n)
{
	return s->cfg->seq_len && n > s->cfg->seq_len;
}

/* ---- the prefix store ------------------------------------------------------ */

bool kvp_model_chunk_in_blocks(const struct kvp_kv_geometry *g,
			       uint32_t chunk_tokens)
{
	/* whole KV blocks: a store may serve the payload as the region's
	 * own bytes (model.h) */
	return g->block_tokens && chunk_tokens % g->block_tokens == 0;
}

size_t kvp_model_chunk_bytes(const struct kvp_kv_geometry *g,
			     uint32_t chunk_tokens)
{
	if (kvp_model_chunk_in_blocks(g, chunk_tokens))
		return (size_t)g->layers * (chunk_tokens / g->block_tokens) *
		       kvp_kv_block_stride(g);
	return (size_t)g->layers * chunk_tokens * 2 * g->kv_heads *
	       g->head_dim * kvp_kv_dtype_size(g->dtype);
}

void kvp_model_chunk_keygeo(const struct kvp_kv_geometry *g,
			    uint32_t chunk_tokens, uint32_t prefill_window,
			    uint32_t geo[8])
{
	geo[0] = g->layers;
	geo[1] = g->q_heads;
	geo[2] = g->kv_heads;
	geo[3] = g->head_dim;
	geo[4] = (uint32_t)g->dtype;
	geo[5] = g->block_tokens;
	geo[6] = chunk_tokens | (kvp_model_chunk_in_blocks(g, chunk_tokens)
					 ? KVP_MODEL_CHUNK_BLOCKS
					 : 0);
	geo[7] = prefill_window;
}

static bool prefix_in_blocks(const struct kvp_model_seq *s, uint32_t C)
{
	return kvp_model_chunk_in_blocks(&s->g, C);
}

size_t kvp_model_prefix_bytes(const struct kvp_model_seq *s,
			      uint32_t chunk_tokens)
{
	return kvp_model_chunk_bytes(&s->g, chunk_tokens);
}

void kvp_model_seq_set_progress(struct kvp_model_seq *s,
				kvp_kvcache_progress_fn fn, void *arg)
{
	s->progress = fn;
	s->parg = arg;
}

int kvp_model_seq_set_prefix(struct kvp_model_seq *s,
			     struct kvp_model_prefix *px)
{
	if (px && (!px->get || !px->chunk_tokens || px->chunk_tokens > 256 ||
		   (px->chunk_tokens & (px->chunk_tokens - 1))))
		return -EINVAL;
	later_drop(s); /* the prefix's keys are another prompt's now */
	s->px = px;
	return 0;
}

/* K and V of one token from slot of a KV block into k, v (kvd floats). */
static void take_token(const struct kvp_kv_geometry *g, const void *blk,
		       uint32_t slot, float *k, float *v)
{
	uint32_t h;

	for (h = 0; h < g->kv_heads; h++) {
		kvp_kv_to_f32(g->dtype,
			      (const char *)blk + kvp_kv_k_offset(g, h, slot),
			      k + (size_t)h * g->head_dim, g->head_dim);
		kvp_kv_to_f32(g->dtype,
			      (const char *)blk + kvp_kv_v_offset(g, h, slot),
			      v + (size_t)h * g->head_dim, g->head_dim);
	}
}

/* Tokens [first, first + n) of every layer between the history and a
 * chunk's payload p (see struct kvp_model_prefix): in when to_hist.
 * first is a multiple of n. */
static void prefix_copy(struct kvp_model_seq *s, uint64_t first, uint32_t n,
			void *p, bool to_hist)
{
	size_t step = s->kvd * kvp_kv_dtype_size(s->g.dtype);
	size_t stride = kvp_kv_block_stride(&s->g);
	uint32_t G = s->g.block_tokens, l, t;
	char *b = p;

	if (prefix_in_blocks(s, n)) {
		size_t bb = kvp_kv_block_bytes(&s->g), i;

		/* the padding of each block, if any: put_token fills the rest
		 * (a memset of the whole chunk was 8 MiB a chunk for nothing) */
		for (i = 0; !to_hist && bb < stride &&
		     i < (size_t)s->cfg->layers * (n / G); i++)
			memset(b + i * stride + bb, 0, stride - bb);
		for (l = 0; l < s->cfg->layers; l++)
			for (t = 0; t < n; t++) {
				char *blk = b + ((size_t)l * (n / G) + t / G) *
						    stride;
				float *k = hist_k(s, l, first + t);
				float *v = hist_v(s, l, first + t);

				if (to_hist)
					take_token(&s->g, blk, t % G, k, v);
				else
					put_token(&s->g, blk, t % G, k, v);
			}
		return;
	}
	for (l = 0; l < s->cfg->layers; l++)
		for (t = 0; t < n; t++) {
			float *k = hist_k(s, l, first + t);
			float *v = hist_v(s, l, first + t);

			if (to_hist) {
				kvp_kv_to_f32(s->g.dtype, b, k, s->kvd);
				kvp_kv_to_f32(s->g.dtype, b + step, v, s->kvd);
			} else {
				kvp_kv_from_f32(s->g.dtype, k, b, s->kvd);
				kvp_kv_from_f32(s->g.dtype, v, b + step,
						s->kvd);
			}
			b += 2 * step;
		}
}

struct bind_chunk {
	struct kvp_model_prefix *px;
	uint32_t chunk;
};

static int bind_chunk(void *arg, const uint64_t *offs, size_t n)
{
	const struct bind_chunk *b = arg;

	return b->px->bind(b->px->bind_arg, b->chunk, offs, n);
}

/* Chunk i mapped as the KV cache's store (no copy): 0 or -errno. */
static int prefix_map(struct kvp_model_seq *s, uint32_t i)
{
	struct bind_chunk b = { s->px, i };
	uint32_t C = s->px->chunk_tokens;
	int err = kvp_kvcache_prefill_stored(s->c, s->seq, C, bind_chunk, &b);

	if (!err) {
		s->pos += C;
		s->px->mapped_tokens += C;
	}
	return err;
}

/*
 * Read the prompt's leading chunks from the store while it has them,
 * never the chunk of the last token (its logits are computed), and put
 * each into the KV cache as if computed: mapped (px->bind: the store's
 * file becomes the cache's store for its blocks, nothing is read now),
 * else read (px->get) and written through kvp_kvcache_prefill.  A prompt
 * whose later tokens attend to earlier ones (prefill_window not 1) reads
 * every chunk into the history, mapped or not.  *hit gets the tokens
 * taken.  buf: one chunk's payload.  0 or the cache's error.
 */
static int prefix_restore(struct kvp_model_seq *s, uint32_t n, void *buf,
			  uint32_t *hit)
{
	struct kvp_model_prefix *px = s->px;
	uint32_t C = px->chunk_tokens, i, max = (n - 1) / C;
	size_t len = kvp_model_prefix_bytes(s, C);
	bool hist = s->cfg->prefill_window != 1;
	bool map = px->bind && prefix_in_blocks(s, C);
	int err = 0;

	px->mapped_tokens = 0;
	for (i = 0; i < max; i++) {
		if (map && !hist) {
			if (!prefix_map(s, i))
				continue;
			map = false; /* read from here on */
		}
		if (px->get(px->arg, i, buf, len))
			break;
		prefix_copy(s, (uint64_t)i * C, C, buf, true);
		if (map && hist) {
			if (!prefix_map(s, i))
				continue;
			map = false;
		}
		s->mode = MODE_PREFILL;
		err = kvp_kvcache_prefill(s->c, s->seq, C, &s->src, NULL,
					  NULL);
		s->mode = MODE_IDLE;
		if (err)
			break;
		s->pos += C;
	}
	*hit = i * C;
	px->hit_tokens = *hit;
	return err;
}

/* Offer the store the full chunks of the computed tokens [a, a + nt),
 * those before chunk end. */
static void prefix_offer(struct kvp_model_seq *s, uint32_t a, uint32_t nt,
			 uint32_t end, void *buf)
{
	struct kvp_model_prefix *px = s->px;
	uint32_t C = px->chunk_tokens, i;

	for (i = (a + C - 1) / C;
	     i < end && (uint64_t)(i + 1) * C <= (uint64_t)a + nt; i++) {
		prefix_copy(s, (uint64_t)i * C, C, buf, false);
		px->put(px->arg, i, buf, kvp_model_prefix_bytes(s, C));
	}
}

/* Hold the computed chunks back for kvp_model_seq_offer?  Only whole KV
 * blocks: the cache gives its blocks back in the payload's format. */
static bool prefix_later(const struct kvp_model_seq *s)
{
	return s->px && s->px->put && s->px->put_later &&
	       prefix_in_blocks(s, s->px->chunk_tokens);
}

/* Its buffer, one for all its chunks (the put copies each into the
 * store's queue), is kvp_mem_io_alloc's: huge pages where the kernel
 * grants them, since one fresh 8 MiB buffer in 4 KiB pages costs tens of
 * ms of first touches on a loaded VM. */
static void *offer_run(void *arg)
{
	struct offer_job *j = arg;
	double t0 = now_s();
	void *buf = kvp_mem_io_alloc(j->len);
	uint32_t i;

	(void)pthread_setname_np(pthread_self(), "kvp-offer");
	/* the decode's CPU first: this takes what it leaves idle (raising
	 * its own nice value needs no privilege; per thread on Linux) */
	(void)!setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
	j->err = buf ? 0 : -ENOMEM;
	for (i = j->from; i < j->to && !j->err; i++) {
		j->err = kvp_kvcache_snap_read(j->snap, (uint64_t)i * j->C,
					       j->C, buf);
		if (!j->err)
			j->px->put(j->px->arg, i, buf, j->len);
	}
	kvp_mem_io_free(buf, j->len);
	j->s = now_s() - t0;
	return NULL;
}

/* Wait for s's offer thread, if any: its error, or 0.  The chunks it had
 * are offered (or failed): nothing is held back any more. */
static int offer_wait(struct kvp_model_seq *s)
{
	struct offer_job *j = s->job;
	int err;

	if (!j)
		return 0;
	pthread_join(j->th, NULL);
	s->job = NULL;
	s->pt.offer_after_s += j->s;
	err = j->err;
	kvp_kvcache_snap_free(j->snap);
	free(j);
	s->px->later_from = s->px->later_to; /* offered once */
	return err;
}

int kvp_model_seq_offer(struct kvp_model_seq *s)
{
	struct kvp_model_prefix *px = s->px;
	uint32_t C, i;
	size_t len;
	double t0;
	void *buf;
	int err = 0;

	if (s->job) {
		err = offer_wait(s);
		later_drop(s);
		return err;
	}
	t0 = now_s();
	if (!px || !px->put || px->later_seq != s ||
	    px->later_from >= px->later_to)
		return 0;
	C = px->chunk_tokens;
	len = kvp_model_prefix_bytes(s, C);
	buf = kvp_mem_io_alloc(len);
	if (!buf)
		return -ENOMEM;
	for (i = px->later_from; i < px->later_to && !err; i++) {
		err = kvp_kvcache_read_blocks(s->c, s->seq, (uint64_t)i * C, C,
					      buf);
		if (!err)
			px->put(px->arg, i, buf, len);
	}
	later_drop(s); /* offered once, or never */
	kvp_mem_io_free(buf, len);
	s->pt.offer_after_s += now_s() - t0;
	return err;
}

int kvp_model_seq_offer_async(struct kvp_model_seq *s)
{
	struct kvp_model_prefix *px = s->px;
	struct offer_job *j;
	int err;

	if (s->job || !px || !px->put || px->later_seq != s ||
	    px->later_from >= px->later_to)
		return 0;
	j = calloc(1, sizeof(*j));
	if (!j)
		return kvp_model_seq_offer(s);
	j->px = px;
	j->C = px->chunk_tokens;
	j->from = px->later_from;
	j->to = px->later_to;
	j->len = kvp_model_prefix_bytes(s, j->C);
	err = kvp_kvcache_snap(s->c, s->seq, (uint64_t)j->from * j->C,
			       (uint64_t)(j->to - j->from) * j->C, &j->snap);
	if (!err && pthread_create(&j->th, NULL, offer_run, j))
		err = -EAGAIN;
	if (err) {
		kvp_kvcache_snap_free(j->snap);
		free(j);
		/* a backend not to be read beside its driver, or no
		 * thread: read here, as before */
		if (err == -EOPNOTSUPP || err == -EAGAIN || err == -ENOMEM)
			return kvp_model_seq_offer(s);
		later_drop(s);
		return err;
	}
	s->job = j;
	return 0;
}

void kvp_model_prefix_offer_wait(struct kvp_model_prefix *px)
{
	if (px && px->later_seq && px->later_seq->job)
		kvp_model_prefix_drop_later(px); /* waits, then forgets */
}

/* ---- prefill ------------------------------------------------------------ */

struct prompt_attn {
	struct kvp_model_seq *s;
	uint32_t layer;
	uint64_t first;	   /* position of the chunk's first token */
	const float *q;	   /* [ntok][qd] */
	float *out;	   /* [ntok][qd] */
	float *scores;	   /* per head-token job: hcap floats */
	uint32_t ntok;
};

/* Causal attention of jobs [lo, hi) = (token, head) pairs over the
 * history, in fp32 (a numerically plain softmax: max, exp, sum). */
static void prompt_attn_run(void *arg, uint32_t lo, uint32_t hi)
{
	const struct prompt_attn *a = arg;
	struct kvp_model_seq *s = a->s;
	const struct kvp_model_config *c = s->cfg;
	uint32_t hd = c->head_dim, grp = c->q_heads / c->kv_heads, j, d;
	float scale = 1.0f / sqrtf((float)hd);
	float *sc = a->scores + (size_t)lo * s->hcap;

	for (j = lo; j < hi; j++, sc += s->hcap) {
		uint32_t t = j / c->q_heads, h = j % c->q_heads;
		uint64_t pos = a->first + t, u, from = 0;
		const float *q = a->q + (size_t)t * s->qd + (size_t)h * hd;
		float *o = a->out + (size_t)t * s->qd + (size_t)h * hd;
		size_t kh = (size_t)(h / grp) * hd;
		float mx = -INFINITY, sum = 0;

		if (c->prefill_window && pos + 1 > c->prefill_window)
			from = pos + 1 - c->prefill_window;
		for (u = from; u <= pos; u++) {
			const float *k = hist_k(s, a->layer, u) + kh;
			float v = 0;

			for (d = 0; d < hd; d++)
				v += q[d] * k[d];
			sc[u - from] = v * scale;
			if (sc[u - from] > mx)
				mx = sc[u - from];
		}
		for (u = from; u <= pos; u++) {
			sc[u - from] = expf(sc[u - from] - mx);
			sum += sc[u - from];
		}
		memset(o, 0, sizeof(float) * hd);
		for (u = from; u <= pos; u++) {
			const float *v = hist_v(s, a->layer, u) + kh;
			float p = sc[u - from] / sum;

			for (d = 0; d < hd; d++)
				o[d] += p * v[d];
		}
	}
}

/* Attention of ntok tokens over themselves alone: each query head gets
 * its KV head's V. */
static void own_values(const struct kvp_model_seq *s, const float *V,
		       float *att, uint32_t ntok)
{
	const struct kvp_model_config *c = s->cfg;
	uint32_t grp = c->q_heads / c->kv_heads, t, h;

	for (t = 0; t < ntok; t++)
		for (h = 0; h < c->q_heads; h++)
			memcpy(att + (size_t)t * s->qd + (size_t)h * c->head_dim,
			       V + (size_t)t * s->kvd +
				   (size_t)(h / grp) * c->head_dim,
			       sizeof(float) * c->head_dim);
}

int kvp_model_prefill(struct kvp_model_seq *s, const uint32_t *tokens,
		      uint32_t n)
{
	const struct kvp_model_config *c = s->cfg;
	const struct kvp_model_weights *w = &s->m->w;
	size_t D = c->dim, H = c->hidden_dim, i;
	uint32_t T = n < PREFILL_CHUNK ? n : PREFILL_CHUNK, l, t, a;
	float *X = NULL, *XB = NULL, *XB2 = NULL, *H1 = NULL, *H3 = NULL;
	float *Q = NULL, *K = NULL, *V = NULL, *ATT = NULL, *SC = NULL;
	void *PX = NULL; /* one chunk of the prefix store */
	uint32_t hit = 0;
	double t0 = now_s(), t1, t2;
	int err = -EINVAL;

	/* whatever is held back on this prefix was for a prompt before this
	 * one (or this one's refused prefill): never offered now */
	kvp_model_prefix_drop_later(s->px);
	if (!n || s->pos || past_context(s, n))
		return -EINVAL;
	for (i = 0; i < n; i++)
		if (tokens[i] >= c->vocab)
			return -EINVAL;
	err = -ENOMEM;
	free(s->hk);
	free(s->hv);
	/* the ring holds the window behind the chunk and the chunk */
	s->hcap = c->prefill_window && c->prefill_window + T < n
			  ? c->prefill_window + T
			  : n;
	s->hk = malloc(sizeof(float) * c->layers * s->hcap * s->kvd);
	s->hv = malloc(sizeof(float) * c->layers * s->hcap * s->kvd);
	X = malloc(sizeof(float) * T * D);
	XB = malloc(sizeof(float) * T * D);
	XB2 = malloc(sizeof(float) * T * D);
	H1 = malloc(sizeof(float) * T * H);
	H3 = malloc(sizeof(float) * T * H);
	Q = malloc(sizeof(float) * T * s->qd);
	K = malloc(sizeof(float) * T * s->kvd);
	V = malloc(sizeof(float) * T * s->kvd);
	ATT = malloc(sizeof(float) * T * s->qd);
	SC = malloc(sizeof(float) * (size_t)T * c->q_heads * s->hcap);
	if (s->px)
		PX = malloc(kvp_model_prefix_bytes(s, s->px->chunk_tokens));
	if (!s->hk || !s->hv || !X || !XB || !XB2 || !H1 || !H3 || !Q || !K ||
	    !V || !ATT || !SC || (s->px && !PX))
		goto out;
	memset(&s->pt, 0, sizeof(s->pt));
	if (s->px) {
		err = prefix_restore(s, n, PX, &hit);
		s->pt.restore_s = now_s() - t0;
		s->pt.restored_tokens = hit;
		t0 = now_s(); /* reading is not the model's math */
		if (err)
			goto out;
		if (hit && s->progress)
			s->progress(s->parg, hit, n);
	}
	s->pt.computed_tokens = n - hit;
	if (prefix_later(s)) { /* the last full chunks to compute */
		struct kvp_model_prefix *px = s->px;
		uint32_t C = px->chunk_tokens, max = px->later_max;

		px->later_seq = s;
		s->later_pending = true;
		px->later_to = n / C;
		px->later_from = hit / C;
		if (max && px->later_to - px->later_from > max)
			px->later_from = px->later_to - max;
	}
	/* pieces start at hit, a multiple of the chunk, which divides T
	 * (or T is all that is left): a store's chunk is never split */
	for (a = hit; a < n; a += T) {
		uint32_t nt = n - a < T ? n - a : T;
		struct prompt_attn pa = { s, 0, a, Q, ATT, SC, nt };

		for (t = 0; t < nt; t++)
			memcpy(X + t * D, w->embed + (size_t)tokens[a + t] * D,
			       sizeof(float) * D);
		for (l = 0; l < c->layers; l++) {
			for (t = 0; t < nt; t++)
				kvp_model_rmsnorm(XB + t * D, X + t * D,
						  w->att_norm + l * D, c->dim);
			/* attending to itself alone, a token's output is
			 * its own V whatever its query: no wq needed */
			if (c->prefill_window != 1)
				kvp_model_matmul(s->pool, Q, XB,
						 w->wq + l * (size_t)s->qd * D,
						 nt, s->qd, c->dim);
			kvp_model_matmul(s->pool, K, XB,
					 w->wk + l * (size_t)s->kvd * D, nt,
					 s->kvd, c->dim);
			kvp_model_matmul(s->pool, V, XB,
					 w->wv + l * (size_t)s->kvd * D, nt,
					 s->kvd, c->dim);
			for (t = 0; t < nt; t++) {
				if (c->prefill_window != 1)
					kvp_model_rope(Q + (size_t)t * s->qd,
						       c->q_heads, c->head_dim,
						       a + t);
				kvp_model_rope(K + (size_t)t * s->kvd,
					       c->kv_heads, c->head_dim, a + t);
				memcpy(hist_k(s, l, a + t),
				       K + (size_t)t * s->kvd,
				       sizeof(float) * s->kvd);
				memcpy(hist_v(s, l, a + t),
				       V + (size_t)t * s->kvd,
				       sizeof(float) * s->kvd);
			}
			pa.layer = l;
			if (c->prefill_window == 1)
				own_values(s, V, ATT, nt);
			else
				kvp_mpool_run(s->pool, nt * c->q_heads,
					      (uint64_t)nt * c->q_heads *
						  (a + nt) * c->head_dim * 2,
					      prompt_attn_run, &pa);
			layer_finish(s, l, nt, X, ATT, XB, XB2, H1, H3);
		}
		if (a + nt == n)
			final_logits(s, X + (size_t)(nt - 1) * D);
		t1 = now_s();
		s->pt.math_s += t1 - t0;
		if (s->px && s->px->put)
			prefix_offer(s, a, nt,
				     prefix_later(s) ? s->px->later_from
						     : UINT32_MAX,
				     PX);
		t2 = now_s();
		s->pt.offer_s += t2 - t1;
		s->compute_s += t2 - t0;
		s->mode = MODE_PREFILL;
		err = kvp_kvcache_prefill(s->c, s->seq, nt, &s->src, NULL,
					  NULL);
		s->mode = MODE_IDLE;
		t0 = now_s();
		s->pt.kv_s += t0 - t2;
		if (err)
			goto out;
		s->pos += nt;
		if (s->progress)
			s->progress(s->parg, a + nt, n);
	}
	err = 0;
out:
	if (err) /* nothing held back is offered */
		later_drop(s);
	s->compute_s += now_s() - t0;
	free(s->hk);
	free(s->hv);
	s->hk = s->hv = NULL;
	free(X);
	free(XB);
	free(XB2);
	free(H1);
	free(H3);
	free(Q);
	free(K);
	free(V);
	free(ATT);
	free(SC);
	free(PX);
	return err;
}

/* ---- decode ------------------------------------------------------------- */

int kvp_model_step(struct kvp_model_seq *s, uint32_t token,
		   struct kvp_kvcache_step_stats *st)
{
	const struct kvp_model_config *c = s->cfg;
	double t0;
	int err;

	if (token >= c->vocab || past_context(s, s->pos + 1))
		return -EINVAL;
	memcpy(s->x, s->m->w.embed + (size_t)token * c->dim,
	       sizeof(float) * c->dim);
	s->mode = MODE_STEP;
	s->next_layer = 0;
	err = kvp_kvcache_step(s->c, &s->seq, 1, &s->src, s->attn, st);
	s->mode = MODE_IDLE;
	if (err)
		return err;
	if (s->next_layer != c->layers)
		return -EIO;
	t0 = now_s();
	layer_finish(s, c->layers - 1, 1, s->x,
		     s->attn + (size_t)(c->layers - 1) * s->qd, s->xb, s->xb2,
		     s->hb, s->hb2);
	final_logits(s, s->x);
	s->compute_s += now_s() - t0;
	s->pos++;
	return 0;
}

uint32_t kvp_model_sample(const float *logits, uint32_t vocab,
			  float temperature, uint64_t *rng)
{
	uint32_t i, best = 0;
	double sum = 0, r, mx;

	for (i = 1; i < vocab; i++)
		if (logits[i] > logits[best])
			best = i;
	if (temperature <= 0 || !rng)
		return best;
	mx = logits[best];
	for (i = 0; i < vocab; i++)
		sum += exp((logits[i] - mx) / temperature);
	*rng ^= *rng << 13;
	*rng ^= *rng >> 7;
	*rng ^= *rng << 17;
	r = (double)(*rng >> 11) / 9007199254740992.0 * sum;
	for (i = 0; i < vocab; i++) {
		r -= exp((logits[i] - mx) / temperature);
		if (r < 0)
			return i;
	}
	return best;
}

int kvp_model_text(struct kvp_model *m, uint32_t n, float temperature,
		   uint64_t seed, uint32_t *out)
{
	struct kvp_kv_geometry g;
	struct kvp_kvcache_opts o;
	struct kvp_kvcache *c = NULL;
	struct kvp_model_seq *s = NULL;
	uint64_t rng = seed ? seed : 1;
	uint32_t id, i;
	int err;

	if (!n || (m->cfg.seq_len && n > m->cfg.seq_len))
		return -EINVAL;
	err = kvp_model_geometry(m, KVP_KV_FP32, 4, &g);
	if (err)
		return err;
	kvp_kvcache_opts_default(&o, &g);
	o.backend = KVP_KVCACHE_RAM;
	o.capacity_tokens = n;
	err = kvp_kvcache_create(&o, &c);
	if (!err)
		err = kvp_kvcache_seq_create(c, &id);
	if (!err)
		err = kvp_model_seq_create(m, c, id, 0, &s);
	out[0] = 1;
	if (!err)
		err = kvp_model_prefill(s, out, 1);
	for (i = 1; i < n && !err; i++) {
		out[i] = kvp_model_sample(s->logits, m->cfg.vocab, temperature,
					  &rng);
		if (i + 1 < n)
			err = kvp_model_step(s, out[i], NULL);
	}
	kvp_model_seq_destroy(s);
	kvp_kvcache_destroy(c);
	return err;
}
