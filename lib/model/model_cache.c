/*
 * model_cache.c - a model's prompts through the prefix cache
 * (model_cache.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lib/cache/cache_store.h"
#include "lib/model/model_cache.h"
#include "lib/model/model_i.h"
#include "lib/remote/remote.h"
#include "lib/tunables/tunables.h"

struct kvp_model_cache {
	struct kvp_cache *cache;
	struct kvp_prefix *prefix;
	struct kvp_model_remote *remote; /* below the directory, or NULL */
	struct kvp_model_prefix mp; /* what the sequence calls */
	uint32_t chunk_tokens;
	struct kvp_store *store;    /* kvp_model_cache_store's, or NULL */
	size_t granule;		    /* its granule: a KV block's stride */
	bool write_behind;	    /* hold the writer from attach to
				       kvp_model_cache_first_token */
};

static const char *env_or(const char *v, const char *name)
{
	const char *e;

	if (v)
		return v;
	e = getenv(name);
	return e && *e ? e : NULL;
}

int kvp_model_cache_opts_env(struct kvp_model_cache_opts *o, char *err,
			     size_t errlen)
{
	const char *cap = getenv("KVP_CACHE_CAPACITY"), *wb;

	o->dir = env_or(o->dir, "KVP_CACHE_DIR");
	o->salt = env_or(o->salt, "KVP_CACHE_SALT");
	o->model_id = env_or(o->model_id, "KVP_CACHE_MODEL_ID");
	o->key_file = env_or(o->key_file, "KVP_CACHE_KEY_FILE");
	o->key_hex = env_or(o->key_hex, "KVP_CACHE_KEY");
	o->remote_url = env_or(o->remote_url, "KVP_REMOTE_URL");
	wb = getenv("KVP_CACHE_WRITE_BEHIND");
	if (wb && *wb) {
		if (!strcmp(wb, "0") || !strcasecmp(wb, "off") ||
		    !strcasecmp(wb, "no") || !strcasecmp(wb, "false")) {
			o->store_in_prefill = true;
		} else if (strcmp(wb, "1") && strcasecmp(wb, "on") &&
			   strcasecmp(wb, "yes") && strcasecmp(wb, "true")) {
			snprintf(err, errlen,
				 "KVP_CACHE_WRITE_BEHIND: '%s' is not 0/off/no/"
				 "false or 1/on/yes/true",
				 wb);
			return -EINVAL;
		}
	}
	if (!o->capacity_bytes && cap && *cap &&
	    kvp_parse_bytes(cap, &o->capacity_bytes)) {
		snprintf(err, errlen,
			 "KVP_CACHE_CAPACITY: '%s' is not a size (e.g. 64G)",
			 cap);
		return -EINVAL;
	}
	return 0;
}

/* The model's identity: BLAKE2b-256 of its weights as it has them (the
 * checkpoint file mapped, or the random draw), or of model_id. */
static int model_hash(const struct kvp_model *m, const char *model_id,
		      uint8_t out[32])
{
	if (model_id)
		return kvp_rec_hash(model_id, strlen(model_id), out);
	if (m->map)
		return kvp_rec_hash(m->map, m->map_len, out);
	return kvp_rec_hash(m->alloc, m->bytes, out);
}

/* struct kvp_model_prefix's bind: chunk's file, if the directory has it,
 * becomes the KV cache's store for its blocks; else, with a remote tier,
 * the record that Redis has (kvp_model_remote_bind). */
static int model_cache_bind(void *arg, uint32_t chunk, const uint64_t *offs,
			    size_t n)
{
	struct kvp_model_cache *mc = arg;
	struct kvp_rec_key k;
	int err;

	if (!mc->store)
		return -EOPNOTSUPP;
	err = kvp_prefix_key(mc->prefix, chunk, &k);
	if (err)
		return err;
	/* a miss is counted once, by the get that follows */
	if (!kvp_cache_contains(mc->cache, &k))
		return mc->remote ? kvp_model_remote_bind(mc->remote, chunk,
							  mc->store,
							  n * mc->granule,
							  offs, n)
				  : -ENOENT;
	return kvp_cache_store_bind(mc->store, &k, offs, n);
}

static uint32_t chunk_tokens(const struct kvp_model_cache_opts *o)
{
	return o->chunk_tokens ? o->chunk_tokens : KVP_MODEL_CACHE_CHUNK;
}

static int check_dir_chunk(const struct kvp_model_cache_opts *o, char *err,
			   size_t errlen)
{
	uint32_t C = chunk_tokens(o);

	if (o->dir && C <= 256 && !(C & (C - 1)))
		return 0;
	snprintf(err, errlen, "cache: %s",
		 o->dir ? "chunk tokens must be a power of two up to 256"
			: "no cache directory given");
	return -EINVAL;
}

/* The cipher key of o, from its file or hex, into *cipher: 0 (*has
 * false: none given) or the error, with err. */
static int load_cipher(const struct kvp_model_cache_opts *o,
		       struct kvp_rec_cipher *cipher, bool *has, char *err,
		       size_t errlen)
{
	char why[256];
	int e = 0;

	*has = false;
	if (o->key_file) {
		e = kvp_cache_cipher_load(o->key_file, cipher, err, errlen);
	} else if (o->key_hex) {
		e = kvp_cache_cipher_parse(o->key_hex, strlen(o->key_hex),
					   cipher, err, errlen);
		if (e) {
			/* name where it came from: the environment */
			snprintf(why, sizeof(why), "%s", err);
			snprintf(err, errlen, "KVP_CACHE_KEY: %s", why);
		}
	} else {
		return 0;
	}
	*has = !e;
	return e;
}

int kvp_model_cache_opts_check(const struct kvp_model_cache_opts *o,
			       char *err, size_t errlen)
{
	struct kvp_rec_cipher cipher;
	struct kvp_remote_url url;
	bool has;
	int e = check_dir_chunk(o, err, errlen);

	if (!e)
		e = load_cipher(o, &cipher, &has, err, errlen);
	explicit_bzero(&cipher, sizeof(cipher)); /* kept, unlike a memset */
	if (!e && o->remote_url) {
		e = kvp_remote_url_parse(&url, o->remote_url, err, errlen);
		if (!e)
			e = kvp_remote_url_password(&url, err, errlen);
		explicit_bzero(&url, sizeof(url)); /* a password */
	}
	return e;
}

int kvp_model_cache_open(const struct kvp_model_cache_opts *o,
			 const struct kvp_model *m,
			 const struct kvp_kv_geometry *g,
			 struct kvp_model_cache **out, char *err,
			 size_t errlen, char *warn, size_t warnlen)
{
	struct kvp_cache_opts co = { .capacity_bytes = o->capacity_bytes };
	struct kvp_prefix_opts po = { 0 };
	struct kvp_rec_cipher cipher;
	struct kvp_model_cache *mc;
	uint32_t C = chunk_tokens(o);
	bool has_cipher;
	int e = check_dir_chunk(o, err, errlen);

	if (!e)
		e = load_cipher(o, &cipher, &has_cipher, err, errlen);
	if (e)
		return e;
	if (has_cipher)
		co.cipher = &cipher;
	mc = calloc(1, sizeof(*mc));
	if (!mc)
		return -ENOMEM;
	mc->chunk_tokens = C;
	mc->write_behind = !o->store_in_prefill;
	e = kvp_cache_open(o->dir, &co, &mc->cache, err, errlen, warn,
			   warnlen);
	if (e)
		goto fail;
	po.cache = mc->cache;
	e = model_hash(m, o->model_id, po.ctx.model);
	if (!e && o->salt)
		e = kvp_rec_hash(o->salt, strlen(o->salt), po.ctx.salt);
	kvp_model_chunk_keygeo(g, C, m->cfg.prefill_window, po.ctx.geo);
	if (!e)
		e = kvp_prefix_create(&po, &mc->prefix);
	if (e) {
		snprintf(err, errlen, "cache: cannot start: %s", strerror(-e));
		goto fail;
	}
	mc->mp.chunk_tokens = C;
	mc->mp.get = kvp_prefix_get;
	mc->mp.put = kvp_prefix_put;
	mc->mp.arg = mc->prefix;
	mc->mp.bind = model_cache_bind;
	mc->mp.bind_arg = mc;
	/* write behind: the computed chunks are read back from the KV
	 * cache after the first token, not copied before it */
	mc->mp.put_later = mc->write_behind;
	/* as many as the writer's queue takes, counted as it counts them
	 * (whole huge pages): a long prefill offers the earlier ones as it
	 * computes them, so that the read-back's puts do not wait for the
	 * writer */
	mc->mp.later_max =
	    kvp_prefix_queue_fits(mc->prefix, kvp_model_chunk_bytes(g, C));
	if (o->remote_url) {
		struct kvp_model_remote_opts ro = { .url = o->remote_url,
						    .prefix = mc->prefix,
						    .ctx = &po.ctx,
						    .cipher = co.cipher };

		e = kvp_model_remote_open(&ro, &mc->remote, err, errlen);
		if (e)
			goto fail;
		mc->mp.get = kvp_model_remote_get;
		mc->mp.put = kvp_model_remote_put;
		mc->mp.arg = mc->remote;
	}
	memset(&cipher, 0, sizeof(cipher));
	*out = mc;
	return 0;
fail:
	memset(&cipher, 0, sizeof(cipher));
	kvp_model_cache_close(mc);
	return e;
}

int kvp_model_cache_attach(struct kvp_model_cache *mc,
			   struct kvp_model_seq *s, const uint32_t *prompt,
			   uint32_t n)
{
	int err;

	/* chunks still held back from the last prompt go now, while the
	 * keys are still theirs (a miss next time if that fails) */
	if (mc->mp.later_seq)
		(void)kvp_model_seq_offer(mc->mp.later_seq);
	err = kvp_prefix_set_prompt(mc->prefix, prompt, n, mc->chunk_tokens);
	if (!err)
		err = kvp_model_seq_set_prefix(s, &mc->mp);
	if (!err && mc->write_behind)
		kvp_prefix_hold(mc->prefix);
	return err;
}

int kvp_model_cache_first_token(struct kvp_model_cache *mc)
{
	int err = 0;

	/* released first: the writer stores each chunk as it is offered */
	kvp_prefix_release(mc->prefix);
	/* read back on a thread: the second token does not wait for it
	 * (0.68-1.04 s of 16K tokens' hit with 1664 new, 26 chunks) */
	if (mc->mp.later_seq)
		err = kvp_model_seq_offer_async(mc->mp.later_seq);
	return err;
}

uint64_t kvp_model_cache_hit_tokens(const struct kvp_model_cache *mc)
{
	return mc->mp.hit_tokens;
}

uint64_t kvp_model_cache_mapped_tokens(const struct kvp_model_cache *mc)
{
	return mc->mp.mapped_tokens;
}

int kvp_model_cache_store(struct kvp_model_cache *mc, struct kvp_store *inner,
			  size_t granule, struct kvp_store **out)
{
	int err;

	if (mc->store) {
		kvp_store_destroy(inner);
		return -EBUSY;
	}
	err = kvp_cache_store_create(inner, mc->cache, granule, out);
	if (!err) {
		mc->store = *out;
		mc->granule = granule;
		/* the chunks a hit maps are verified while the prefill
		 * computes the rest, not at the decode's first step; without
		 * the thread (-EAGAIN) each is verified at its first read */
		(void)kvp_cache_store_verify_ahead(*out);
	}
	return err;
}

void kvp_model_cache_drain(struct kvp_model_cache *mc)
{
	kvp_model_prefix_offer_wait(&mc->mp); /* its puts, then their writes */
	kvp_prefix_drain(mc->prefix);
}

void kvp_model_cache_stats(struct kvp_model_cache *mc,
			   struct kvp_cache_stats *cache,
			   struct kvp_prefix_stats *prefix)
{
	if (cache)
		kvp_cache_stats(mc->cache, cache);
	if (prefix)
		kvp_prefix_stats(mc->prefix, prefix);
}

struct kvp_model_remote *kvp_model_cache_remote(struct kvp_model_cache *mc)
{
	return mc->remote;
}

struct kvp_cache *kvp_model_cache_dir(struct kvp_model_cache *mc)
{
	return mc->cache;
}

void kvp_model_cache_close(struct kvp_model_cache *mc)
{
	if (!mc)
		return;
	/* a sequence that outlives mc must not reach back into mc->mp */
	kvp_model_prefix_drop_later(&mc->mp);
	/* first: its gets and puts go through the prefix */
	kvp_model_remote_close(mc->remote, 30000);
	kvp_prefix_destroy(mc->prefix);
	kvp_cache_close(mc->cache);
	free(mc);
}
