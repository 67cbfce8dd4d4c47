/*
 * llama2.c - the model's weights: llama2.c checkpoints and random ones
 * (see model.h).
 *
 * A checkpoint is mapped read only and its weights are used in place: the
 * header is 28 bytes, so every float is 4-byte aligned.  Before anything
 * is mapped, every header field is checked on its own (so that the message
 * names it), then the size the fields imply is computed in 64 bits and
 * compared with the file's: the weights' count must match exactly.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/model/model_i.h"

#define HEADER_BYTES 28 /* seven int32 */

static void say(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void say(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* One header field against its range; the message names it. */
static int field_ok(const char *path, const char *name, int64_t v, int64_t lo,
		    int64_t hi, char *err, size_t errlen)
{
	if (v >= lo && v <= hi)
		return 0;
	say(err, errlen,
	    "model '%s': header field %s is %lld, outside %lld .. %lld "
	    "(not a llama2.c checkpoint, or a damaged one)",
	    path, name, (long long)v, (long long)lo, (long long)hi);
	return -EINVAL;
}

/*
 * The shape the header asks for, checked field by field; the float count
 * of the weights in *nfloats.
 */
static int header_check(const char *path, const int32_t h[7],
			struct kvp_model_config *c, uint64_t *nfloats,
			char *err, size_t errlen)
{
	int64_t vocab = h[5] < 0 ? -(int64_t)h[5] : h[5];
	uint64_t dim, hid, L, kvd, V, S, n;
	int err_;

	if ((err_ = field_ok(path, "dim", h[0], 8, KVP_MODEL_MAX_DIM, err,
			     errlen)) ||
	    (err_ = field_ok(path, "hidden_dim", h[1], 1, KVP_MODEL_MAX_HIDDEN,
			     err, errlen)) ||
	    (err_ = field_ok(path, "n_layers", h[2], 1, KVP_MODEL_MAX_LAYERS,
			     err, errlen)) ||
	    (err_ = field_ok(path, "n_heads", h[3], 1, KVP_KV_MAX_Q_HEADS, err,
			     errlen)) ||
	    (err_ = field_ok(path, "n_kv_heads", h[4], 1, h[3], err, errlen)) ||
	    (err_ = field_ok(path, "vocab_size", vocab, 1, KVP_MODEL_MAX_VOCAB,
			     err, errlen)) ||
	    (err_ = field_ok(path, "seq_len", h[6], 1, KVP_MODEL_MAX_SEQ_LEN,
			     err, errlen)))
		return err_;
	if (h[3] % h[4]) {
		say(err, errlen,
		    "model '%s': header field n_kv_heads %d does not divide "
		    "n_heads %d",
		    path, h[4], h[3]);
		return -EINVAL;
	}
	if (h[0] % h[3] || (h[0] / h[3]) % 8 ||
	    h[0] / h[3] > (int32_t)KVP_KV_MAX_HEAD_DIM) {
		say(err, errlen,
		    "model '%s': header field dim %d over n_heads %d is not a "
		    "head size kvpager can page (a multiple of 8, 8 .. %u)",
		    path, h[0], h[3], KVP_KV_MAX_HEAD_DIM);
		return -EINVAL;
	}
	memset(c, 0, sizeof(*c));
	c->dim = (uint32_t)h[0];
	c->hidden_dim = (uint32_t)h[1];
	c->layers = (uint32_t)h[2];
	c->q_heads = (uint32_t)h[3];
	c->kv_heads = (uint32_t)h[4];
	c->head_dim = c->dim / c->q_heads;
	c->vocab = (uint32_t)vocab;
	c->seq_len = (uint32_t)h[6];
	c->shared_classifier = h[5] > 0;
	/* every factor is bounded above, so these cannot overflow 64 bits */
	dim = c->dim;
	hid = c->hidden_dim;
	L = c->layers;
	kvd = (uint64_t)c->kv_heads * c->head_dim;
	V = c->vocab;
	S = c->seq_len;
	n = V * dim;					/* embedding */
	n += L * (2 * dim + 2 * dim * dim + 2 * kvd * dim); /* norms, attn */
	n += L * 3 * hid * dim;				/* FFN */
	n += dim + S * (c->head_dim / 2) * 2;		/* final, RoPE */
	if (!c->shared_classifier)
		n += V * dim;
	*nfloats = n;
	return 0;
}

/* Lay the weights out from p in the checkpoint's order. */
static void weights_place(struct kvp_model *m, const float *p)
{
	const struct kvp_model_config *c = &m->cfg;
	uint64_t dim = c->dim, L = c->layers, hid = c->hidden_dim;
	uint64_t qd = (uint64_t)c->q_heads * c->head_dim;
	uint64_t kvd = (uint64_t)c->kv_heads * c->head_dim;
	struct kvp_model_weights *w = &m->w;

	w->embed = p;
	p += (uint64_t)c->vocab * dim;
	w->att_norm = p;
	p += L * dim;
	w->wq = p;
	p += L * qd * dim;
	w->wk = p;
	p += L * kvd * dim;
	w->wv = p;
	p += L * kvd * dim;
	w->wo = p;
	p += L * dim * qd;
	w->ffn_norm = p;
	p += L * dim;
	w->w1 = p;
	p += L * hid * dim;
	w->w2 = p;
	p += L * dim * hid;
	w->w3 = p;
	p += L * hid * dim;
	w->final_norm = p;
	p += dim;
	if (m->map) /* the checkpoint's two legacy RoPE tables: unused */
		p += (uint64_t)c->seq_len * (c->head_dim / 2) * 2;
	w->cls = c->shared_classifier ? w->embed : p;
}

int kvp_model_load_file(const char *path, struct kvp_model **out, char *err,
			size_t errlen)
{
	struct kvp_model *m = NULL;
	int32_t h[7];
	struct stat st;
	uint64_t nfloats, want;
	ssize_t got;
	int fd, rc;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		say(err, errlen, "cannot open model '%s': %s", path,
		    strerror(errno));
		return rc;
	}
	rc = -errno;
	if (fstat(fd, &st)) {
		say(err, errlen, "cannot stat model '%s': %s", path,
		    strerror(-rc));
		goto fail;
	}
	rc = -EINVAL;
	if (!S_ISREG(st.st_mode)) {
		say(err, errlen, "model '%s' is not a regular file", path);
		goto fail;
	}
	got = pread(fd, h, sizeof(h), 0);
	if (got != (ssize_t)sizeof(h)) {
		rc = got < 0 ? -errno : -EFBIG;
		say(err, errlen,
		    "model '%s' is truncated: %lld bytes, under the %d of a "
		    "llama2.c header",
		    path, (long long)st.st_size, HEADER_BYTES);
		goto fail;
	}
	rc = -ENOMEM;
	m = calloc(1, sizeof(*m));
	if (!m || !(m->name = strdup(path))) {
		say(err, errlen, "out of memory loading model '%s'", path);
		goto fail;
	}
	rc = header_check(path, h, &m->cfg, &nfloats, err, errlen);
	if (rc)
		goto fail;
	want = HEADER_BYTES + nfloats * sizeof(float);
	if ((uint64_t)st.st_size != want) {
		rc = -EFBIG;
		say(err, errlen,
		    "model '%s' is %s: %lld bytes, the header implies %llu "
		    "(dim %u, hidden_dim %u, n_layers %u, vocab_size %u, "
		    "seq_len %u)",
		    path,
		    (uint64_t)st.st_size < want ? "truncated" : "oversized",
		    (long long)st.st_size, (unsigned long long)want,
		    m->cfg.dim, m->cfg.hidden_dim, m->cfg.layers, m->cfg.vocab,
		    m->cfg.seq_len);
		goto fail;
	}
	m->map = mmap(NULL, (size_t)want, PROT_READ, MAP_PRIVATE, fd, 0);
	if (m->map == MAP_FAILED) {
		rc = -errno;
		m->map = NULL;
		say(err, errlen, "cannot map model '%s': %s", path,
		    strerror(-rc));
		goto fail;
	}
	m->map_len = (size_t)want;
	m->bytes = (size_t)(nfloats * sizeof(float));
	weights_place(m, (const float *)((const char *)m->map + HEADER_BYTES));
	close(fd);
	*out = m;
	return 0;
fail:
	kvp_model_close(m);
	close(fd);
	return rc;
}

void kvp_model_random_opts_default(struct kvp_model_random_opts *o)
{
	o->seed = 1;
	o->dim = 32;
	o->hidden_dim = 64;
	o->vocab = 512;
}

static uint64_t splitmix(uint64_t *s)
{
	uint64_t x = (*s += 0x9e3779b97f4a7c15ULL);

	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* n uniform numbers of variance 1 / fan_in. */
static float *fill_uniform(float *p, uint64_t n, uint32_t fan_in, uint64_t *s)
{
	float a = sqrtf(3.0f / (float)fan_in);
	uint64_t i;

	for (i = 0; i < n; i++)
		p[i] = a * (float)((int64_t)(splitmix(s) >> 11) -
				   (1LL << 52)) /
		       (float)(1LL << 52);
	return p + n;
}

int kvp_model_random(const char *preset, const struct kvp_model_random_opts *o,
		     struct kvp_model **out, char *err, size_t errlen)
{
	struct kvp_model_random_opts def;
	struct kvp_kv_geometry g;
	struct kvp_model *m;
	struct kvp_model_config *c;
	uint64_t dim, L, hid, qd, kvd, n, s, i;
	float *p;
	int rc;

	if (!o) {
		kvp_model_random_opts_default(&def);
		o = &def;
	}
	rc = kvp_kv_geometry_preset(preset, &g);
	if (rc) {
		say(err, errlen,
		    "unknown model 'random:%s': the presets are those of "
		    "--preset (llama3-8b, qwen3-8b, tiny)",
		    preset);
		return rc;
	}
	if (o->dim < 8 || o->dim > 4096 || o->hidden_dim < 1 ||
	    o->hidden_dim > 16384 || o->vocab < 2 ||
	    o->vocab > KVP_MODEL_MAX_VOCAB) {
		say(err, errlen,
		    "random model: dim %u, hidden_dim %u or vocab %u out of "
		    "range (8 .. 4096, 1 .. 16384, 2 .. %u)",
		    o->dim, o->hidden_dim, o->vocab, KVP_MODEL_MAX_VOCAB);
		return -EINVAL;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		goto nomem;
	m->name = malloc(strlen(preset) + 8);
	if (!m->name)
		goto nomem;
	sprintf(m->name, "random:%s", preset);
	c = &m->cfg;
	c->dim = o->dim;
	c->hidden_dim = o->hidden_dim;
	c->layers = g.layers;
	c->q_heads = g.q_heads;
	c->kv_heads = g.kv_heads;
	c->head_dim = g.head_dim;
	c->vocab = o->vocab;
	c->seq_len = 0;
	c->prefill_window = 1;
	c->shared_classifier = true;
	dim = c->dim;
	L = c->layers;
	hid = c->hidden_dim;
	qd = (uint64_t)c->q_heads * c->head_dim;
	kvd = (uint64_t)c->kv_heads * c->head_dim;
	n = c->vocab * dim + L * (2 * dim + 2 * qd * dim + 2 * kvd * dim) +
	    L * 3 * hid * dim + dim;
	m->alloc = malloc(n * sizeof(float));
	if (!m->alloc)
		goto nomem;
	m->bytes = n * sizeof(float);
	weights_place(m, m->alloc);
	/* drawn in the checkpoint's order, norms set to 1 afterwards */
	s = o->seed;
	p = fill_uniform(m->alloc, c->vocab * dim, 1, &s);
	for (i = 0; i < L * dim; i++)
		*p++ = 1.0f;
	p = fill_uniform(p, L * qd * dim, c->dim, &s);
	p = fill_uniform(p, 2 * L * kvd * dim, c->dim, &s);
	p = fill_uniform(p, L * dim * qd, (uint32_t)qd, &s);
	for (i = 0; i < L * dim; i++)
		*p++ = 1.0f;
	p = fill_uniform(p, L * hid * dim, c->dim, &s);
	p = fill_uniform(p, L * dim * hid, c->hidden_dim, &s);
	p = fill_uniform(p, L * hid * dim, c->dim, &s);
	for (i = 0; i < dim; i++)
		*p++ = 1.0f;
	*out = m;
	return 0;
nomem:
	kvp_model_close(m);
	say(err, errlen, "out of memory making model 'random:%s'", preset);
	return -ENOMEM;
}

int kvp_model_open(const char *spec, const struct kvp_model_random_opts *o,
		   struct kvp_model **out, char *err, size_t errlen)
{
	if (!spec || !*spec) {
		say(err, errlen, "no model given: a llama2.c checkpoint or "
				 "random:PRESET");
		return -EINVAL;
	}
	if (!strncmp(spec, "random:", 7))
		return kvp_model_random(spec + 7, o, out, err, errlen);
	return kvp_model_load_file(spec, out, err, errlen);
}

void kvp_model_close(struct kvp_model *m)
{
	if (!m)
		return;
	if (m->map)
		munmap(m->map, m->map_len);
	free(m->alloc);
	free(m->name);
	free(m);
}

const struct kvp_model_config *kvp_model_config(const struct kvp_model *m)
{
	return &m->cfg;
}

const char *kvp_model_name(const struct kvp_model *m)
{
	return m->name;
}

size_t kvp_model_weight_bytes(const struct kvp_model *m)
{
	return m->bytes;
}

int kvp_model_geometry(const struct kvp_model *m, enum kvp_kv_dtype dtype,
		       uint32_t block_tokens, struct kvp_kv_geometry *out)
{
	struct kvp_kv_geometry g = {
		m->cfg.layers,	 m->cfg.q_heads, m->cfg.kv_heads,
		m->cfg.head_dim, dtype,		 block_tokens,
	};

	if (kvp_kv_geometry_check(&g))
		return -EINVAL;
	*out = g;
	return 0;
}
