/*
 * model_cache.h - a model's prompts through the prefix cache: the glue
 * between a kvp_model_seq (model.h's struct kvp_model_prefix) and a cache
 * directory (lib/cache/cache_dir.h, prefix.h).  What `kvpager run --model
 * M --cache-dir DIR` does, for any program.
 *
 *     struct kvp_model_cache_opts o = { .dir = "/var/cache/kvp" };
 *     kvp_model_cache_opts_env(&o);            // KVP_CACHE_* fill the rest
 *     kvp_model_cache_open(&o, model, &geo, &mc, err, sizeof(err),
 *                          warn, sizeof(warn));
 *     kvp_model_cache_attach(mc, seq, prompt, n);  // before the prefill
 *     kvp_model_prefill(seq, prompt, n);       // reads, computes
 *     kvp_model_cache_first_token(mc);         // offer and store them
 *     ...
 *     kvp_model_cache_close(mc);               // waits for the writes
 *
 * With kvp_model_cache_store's store under the KV cache, a prefill maps
 * the chunks it finds (their files become the cache's store for those
 * blocks, verified in the background or when first read) instead of
 * reading and copying them.
 *
 * WRITE BEHIND: from attach to kvp_model_cache_first_token the directory's
 * writer stores only what makes room in its queue (prefix.h), so that
 * neither the chunks a prefill computes nor those it takes from the
 * remote tier are checksummed, written and synced before the first token;
 * they are after it, while the decode runs, and close waits for the last.
 * The computed ones are not even copied before it: first_token has a
 * thread read them back from the KV cache (struct kvp_model_prefix's
 * put_later) while the decode runs.
 *
 * KEYS bind the model's identity (BLAKE2b-256 of its weights: the whole
 * checkpoint file, or the random weights as drawn; or model_id when given),
 * the KV geometry and dtype, the tokens per KV block and per chunk, the
 * prefill window, and the namespace salt: a prompt is found again only
 * under all of them.
 */
#ifndef KVP_MODEL_CACHE_H
#define KVP_MODEL_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/cache/cache_dir.h"
#include "lib/cache/prefix.h"
#include "lib/model/model.h"
#include "lib/model/model_remote.h"

#define KVP_MODEL_CACHE_CHUNK 64u /* tokens per stored chunk, default */

struct kvp_model_cache_opts {
	const char *dir;	 /* the cache directory (KVP_CACHE_DIR) */
	const char *salt;	 /* namespace (KVP_CACHE_SALT); NULL: none */
	const char *key_file;	 /* cipher key file (KVP_CACHE_KEY_FILE) */
	const char *key_hex;	 /* cipher key, 64 hex (KVP_CACHE_KEY) */
	uint64_t capacity_bytes; /* 0: no limit (KVP_CACHE_CAPACITY) */
	uint32_t chunk_tokens;	 /* 0: KVP_MODEL_CACHE_CHUNK */
	const char *model_id;	 /* a name for the model instead of its
				    weights' hash (KVP_CACHE_MODEL_ID);
				    NULL: the hash */
	const char *remote_url;	 /* the remote tier below the directory
				    (KVP_REMOTE_URL; model_remote.h);
				    NULL: none */
	bool store_in_prefill;	 /* store chunks while the prefill runs, not
				    behind its first token
				    (KVP_CACHE_WRITE_BEHIND=0) */
};

/*
 * kvp_model_cache_opts_env - fill the fields still unset (NULL or 0) from
 * KVP_CACHE_DIR, KVP_CACHE_SALT, KVP_CACHE_MODEL_ID, KVP_CACHE_KEY_FILE,
 * KVP_CACHE_KEY, KVP_REMOTE_URL, KVP_CACHE_CAPACITY (a size: 64G) and
 * KVP_CACHE_WRITE_BEHIND (0/off/no/false: store_in_prefill).  Returns
 * 0, or -EINVAL with err naming the variable (a bad capacity or
 * KVP_CACHE_WRITE_BEHIND).
 */
int kvp_model_cache_opts_env(struct kvp_model_cache_opts *o, char *err,
			     size_t errlen);

/*
 * kvp_model_cache_opts_check - the values of o that need no directory,
 * checked before any work: the chunk tokens, the cipher key (its file
 * read: -errno where it cannot be, -EACCES where others may read it;
 * -EINVAL for a malformed key), the remote URL (-EINVAL) and its
 * password file (kvp_remote_url_password).  Returns 0 or the error,
 * with err (one line, the remedy named; never the key nor password).
 * kvp_model_cache_open checks them too; a caller that tells a refused
 * value from a failed open (kvpager: exit 2 or 1) calls this first.
 */
int kvp_model_cache_opts_check(const struct kvp_model_cache_opts *o,
			       char *err, size_t errlen);

struct kvp_model_cache;

/*
 * kvp_model_cache_open - open o->dir (kvp_cache_open), load the cipher key
 * if any, and make the key context of model m with KV geometry g.
 * Returns 0 and *out; or the cache's or key's error with err (one line,
 * the remedy named; never the key); warn as kvp_cache_open's.
 */
int kvp_model_cache_open(const struct kvp_model_cache_opts *o,
			 const struct kvp_model *m,
			 const struct kvp_kv_geometry *g,
			 struct kvp_model_cache **out, char *err,
			 size_t errlen, char *warn, size_t warnlen);

/*
 * kvp_model_cache_attach - the next prefill of s, of prompt[0..n), reads
 * its stored leading chunks and offers the ones it computes (the last
 * ones at kvp_model_cache_first_token).  Chunks the previous prompt's
 * prefill still holds back are offered first, under that prompt's keys.
 * mc must outlive that prefill.  0, -EINVAL, -ENOMEM.
 */
int kvp_model_cache_attach(struct kvp_model_cache *mc,
			   struct kvp_model_seq *s, const uint32_t *prompt,
			   uint32_t n);

/*
 * kvp_model_cache_first_token - the first token is out: the writer stores
 * what the prefill queued (write behind), and the chunks the attached
 * sequence computed are read back from its KV cache and queued by a
 * thread of their own while the decode goes on
 * (kvp_model_seq_offer_async; its tokens must not be freed from its KV
 * cache before the sequence's destroy, drain, close or the next attach,
 * which wait for that thread).  Without this call the queued ones are
 * stored at drain or close, and the computed ones are offered at the
 * next attach or never.  0, or kvp_model_seq_offer_async's error (the
 * chunks not offered are misses next time; nothing stored is wrong).
 */
int kvp_model_cache_first_token(struct kvp_model_cache *mc);

/* Tokens the last attached prefill read from the cache. */
uint64_t kvp_model_cache_hit_tokens(const struct kvp_model_cache *mc);

/* Of those, the tokens mapped (their chunk files serve the KV cache's
 * store), not read and copied. */
uint64_t kvp_model_cache_mapped_tokens(const struct kvp_model_cache *mc);

/*
 * kvp_model_cache_store - a store in front of inner (lib/cache/
 * cache_store.h; inner is owned by it from then on, also on failure) for
 * the KV cache that the attached sequences use (kvp_kvcache_opts.store),
 * in granules of the cache's KV block stride (kvp_kvcache_layout_for):
 * with it, a prefill maps the chunks it finds instead of copying them,
 * and its verifier thread (kvp_cache_store_verify_ahead) checks them
 * while the prefill computes the rest.  The caller destroys *out
 * (kvp_store_destroy) after the KV cache and before
 * kvp_model_cache_close.  One per mc: 0, -EBUSY, -EINVAL, -ENOMEM.
 */
int kvp_model_cache_store(struct kvp_model_cache *mc, struct kvp_store *inner,
			  size_t granule, struct kvp_store **out);

/* Wait for the computed chunks being read back, then for the chunks
 * being written (kvp_prefix_drain). */
void kvp_model_cache_drain(struct kvp_model_cache *mc);

void kvp_model_cache_stats(struct kvp_model_cache *mc,
			   struct kvp_cache_stats *cache,
			   struct kvp_prefix_stats *prefix);

/* The remote tier below the directory, or NULL (no remote_url). */
struct kvp_model_remote *kvp_model_cache_remote(struct kvp_model_cache *mc);

/* The cache directory it uses (for a view: kvp_view_set_cache). */
struct kvp_cache *kvp_model_cache_dir(struct kvp_model_cache *mc);

/* Drain and close (the remote tier's publishes get up to 30 s).  NULL is
 * a no-op.  A sequence attached to mc may outlive it only to be stepped
 * or destroyed: it keeps a pointer into mc, so attach, prefill or offer
 * on it afterwards read freed memory.  Destroy the sequences first where
 * you can: the destroy of one whose held-back chunks are being read back
 * (kvp_model_cache_first_token) waits for that read, which needs its KV
 * cache alive. */
void kvp_model_cache_close(struct kvp_model_cache *mc);

#endif /* KVP_MODEL_CACHE_H */
