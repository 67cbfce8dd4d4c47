/*
 * model_remote.h - a model's prompts through the remote tier (Redis),
 * below the prefix cache directory: what `kvpager run --model M
 * --cache-dir DIR --remote URL` does (kvp_model_cache_open opens it when
 * its options name a URL).
 *
 * As a struct kvp_model_prefix (model.h) in front of the directory's
 * (lib/cache/prefix.h):
 *
 *   bind chunk i, when the directory lacks it, from Redis on the mapped
 *        path (kvp_model_remote_bind below).
 *   get  chunk i from the directory; on a miss, from Redis under the same
 *        key (the chunk's record, block_record.h, verified by kvp_rec_open
 *        against the key and the cache's cipher: a foreign, torn or
 *        damaged value is a counted miss, never served; only sealed
 *        records stand against a writer to the Redis, whose plain ones
 *        carry an unkeyed checksum); a chunk fetched
 *        is served and stored in the directory for next time.  Fetches
 *        read ahead: the window of the next chunks is fetched on the
 *        tier's thread while the prefill takes this one.
 *   put  chunk i to the directory (its writer thread), which hands it to
 *        Redis once stored (kvp_prefix_on_stored: the copy for the
 *        publish queue is made there, behind the first token when the
 *        run holds the writer; the tier's publisher thread seals the
 *        record): the prefill waits on neither a disk nor the network; a
 *        full publish queue skips, counted.
 *
 * Redis keys are the chunk keys under a namespace tag that is a hash of
 * the key context (model, geometry, salt): instances that share a model
 * and a salt share their prompts' chunks, and no other.
 *
 * Thread safety: get from the prefilling thread; put from any.
 */
#ifndef KVP_MODEL_REMOTE_H
#define KVP_MODEL_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "lib/cache/block_record.h"
#include "lib/cache/prefix.h"
#include "lib/remote/remote.h"
#include "pager/store.h"

#define KVP_MODEL_REMOTE_WINDOW 4u	/* chunks read ahead, default */
#define KVP_MODEL_REMOTE_MAX_WINDOW 16u

struct kvp_model_remote_opts {
	const char *url;		     /* redis://... (remote.h) */
	struct kvp_prefix *prefix;	     /* the directory's; not owned */
	const struct kvp_rec_keyctx *ctx;    /* the keys' context */
	const struct kvp_rec_cipher *cipher; /* NULL: plain records (copied) */
	uint32_t window;		     /* 0: KVP_MODEL_REMOTE_WINDOW */
};

/* What the glue did, beside the tier's own statistics. */
struct kvp_model_remote_stats {
	uint64_t chunks_fetched;   /* served from Redis (and stored locally) */
	uint64_t chunks_missed;    /* asked of Redis, not served */
	uint64_t chunks_published; /* offered to Redis (queued) */
	uint64_t publish_skipped;  /* not queued: the queue was full */
	uint64_t chunks_mapped;	   /* of chunks_fetched, bound as the KV
				      cache's store, not copied into it */
	uint64_t dir_skipped;	   /* of chunks_mapped, not queued for
				      the directory (out of memory or
				      descriptors) */
};

struct kvp_model_remote;

/*
 * kvp_model_remote_open - the remote tier of @o->url for the prompts of
 * @o->prefix.  A server that is absent is not an error (remote.h: the
 * tier tries again, counting).  Returns 0 and @*out; -EINVAL (a bad URL),
 * the password file's error, -ENOMEM, with @err (never the password).
 */
int kvp_model_remote_open(const struct kvp_model_remote_opts *o,
			  struct kvp_model_remote **out, char *err,
			  size_t errlen);

/*
 * kvp_model_remote_close - wait up to @flush_ms for the publishes still
 * queued (instance A's chunks are what B will read), then close.  NULL
 * is fine.
 */
void kvp_model_remote_close(struct kvp_model_remote *mr, unsigned flush_ms);

/* struct kvp_model_prefix's get and put (arg: the kvp_model_remote). */
int kvp_model_remote_get(void *arg, uint32_t chunk, void *buf, size_t len);
void kvp_model_remote_put(void *arg, uint32_t chunk, const void *payload,
			  size_t len);

/*
 * kvp_model_remote_bind - what a local miss does on the mapped path
 * (struct kvp_model_prefix's bind, model_cache.c): chunk's record from
 * Redis, taken from the read-ahead window (fetched on the tier's thread
 * while the prefill binds the chunks before it) and verified there, is
 * bound as @store's (lib/cache/cache_store.h) @n granules at @offs from
 * a memfd, so that the prefill neither copies it into the KV cache nor
 * waits for a disk; the memfd's record is also queued for the directory
 * (kvp_prefix_put_fd: a local hit next time, written behind the first
 * token when the run holds the writer; not queued, counted in
 * dir_skipped, only when that fails).  @len: the chunk's payload bytes.  Returns 0, or an error
 * and nothing bound: -ENOENT (Redis has no good record: the get that
 * follows counts the miss), -EOPNOTSUPP (the cache encrypts: the get
 * reads it), memfd's and the store's errors.  From the prefilling
 * thread, as get.
 */
int kvp_model_remote_bind(struct kvp_model_remote *mr, uint32_t chunk,
			  struct kvp_store *store, size_t len,
			  const uint64_t *offs, size_t n);

/* The glue's counters and (if @rs) the tier's. */
void kvp_model_remote_stats(struct kvp_model_remote *mr,
			    struct kvp_model_remote_stats *ms,
			    struct kvp_remote_stats *rs);

/* The tier itself (for a view: kvp_view_set_remote). */
struct kvp_remote *kvp_model_remote_tier(struct kvp_model_remote *mr);

/* The URL without its password, for reports. */
const char *kvp_model_remote_url(const struct kvp_model_remote *mr);

#endif /* KVP_MODEL_REMOTE_H */
