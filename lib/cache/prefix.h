/*
 * prefix.h - a prompt's prefix in a cache directory: the chain of chunk
 * keys of one prompt, lookups, and a writer thread that stores computed
 * chunks behind the caller.
 *
 * A prefix object serves one prompt at a time (kvp_prefix_set_prompt):
 * chunk i (tokens [i * C, (i + 1) * C)) has the key of block_record.h
 * with key i - 1 as its parent, so chunk i is found only under the same
 * model, geometry, salt, cipher key (or none: kvp_cache_keyctx binds the
 * cache's) and every token before it.  kvp_prefix_get and
 * kvp_prefix_put have the shape of struct kvp_model_prefix's get and put
 * (lib/model/model.h), which is how `kvpager run --model --cache-dir`
 * uses them; any caller with chunks of bytes may.
 *
 * READING AHEAD: from the first kvp_prefix_get of a prompt on, a reader
 * thread reads the next chunks (up to 4, in order, never the chunk of the
 * prompt's last token) while the caller uses the one it got; a miss stops
 * it there.  A get of a chunk read ahead copies it out; any other is read
 * then and there.
 *
 * PUBLISHING DOES NOT WAIT FOR THE DISK: kvp_prefix_put copies the chunk
 * into a queue and returns; the writer thread stores it (kvp_cache_put,
 * with its syncs).  Only when the queue holds queue_bytes does put wait
 * for room (counted in queue_waits).  kvp_prefix_drain waits until all
 * queued chunks are stored or failed.  Up to 8 buffers of stored chunks
 * are kept for the next puts (a fresh buffer's pages are first touched
 * by the copy, in the putting thread: the prefill's; a buffer of 2 MiB
 * or more asks for huge pages, madvise(MADV_HUGEPAGE), which make those
 * touches some 40 times cheaper where the kernel grants them).
 *
 * WRITE BEHIND: between kvp_prefix_hold and kvp_prefix_release (a run
 * holds from its prompt to its first token) the writer stores only while
 * the queue holds more than three quarters of queue_bytes or a put waits
 * for room (the queue's memory stays within queue_bytes, and a long
 * prefill's puts wait no more than without a hold); the rest is stored
 * after the release, counted in `behind` (chunks stored, not failed), as
 * are the chunks put after the release until the next hold (a run
 * offers the chunks it computed at its first token: lib/model/
 * model_cache.h), and behind_s runs to the last of them stored.  A
 * new hold holds only the chunks queued under it: those of an earlier,
 * released one are stored at once.  put_fd jobs take no queue memory but
 * a descriptor each: past a quarter of RLIMIT_NOFILE's soft limit (16 to
 * 4096) a held writer stores them, and past twice that put_fd waits.
 * Nothing
 * queued is dropped by a hold: destroy and drain store every chunk.  A
 * process killed before that loses the chunks not yet stored, never the
 * directory's consistency (each store is a kvp_cache_put: committed or
 * absent).
 *
 * Locking: the prompt (set_prompt) and get come from one thread; put may
 * come from any; the queue and the read-ahead share one lock, the cache
 * has its own (taken by the reader and writer threads for their I/O).
 * A chunk queued takes its recency then (kvp_cache_use_now, under the
 * queue's lock: a chunk stored behind keeps its prompt's place), from a
 * lock of the cache's that no I/O holds, so put never waits for the disk.
 */
#ifndef KVP_PREFIX_H
#define KVP_PREFIX_H

#include <stddef.h>
#include <stdint.h>

#include "lib/cache/block_record.h"
#include "lib/cache/cache_dir.h"

#define KVP_PREFIX_QUEUE_BYTES (256ull << 20) /* the queue's default */

struct kvp_prefix_opts {
	struct kvp_cache *cache;   /* used, not owned */
	struct kvp_rec_keyctx ctx; /* model, geometry words, salt */
	uint64_t queue_bytes;	   /* 0: KVP_PREFIX_QUEUE_BYTES */
};

struct kvp_prefix_stats {
	uint64_t lookups;      /* gets */
	uint64_t hit_chunks;   /* gets served */
	uint64_t queued;       /* chunks put */
	uint64_t stored;       /* of those, committed (or already there) */
	uint64_t failed;       /* of those, not stored (the cache said why) */
	uint64_t queue_waits;  /* puts that waited for room */
	uint64_t behind;       /* queued while held or after the release
				  (until the next hold), stored after it */
	double behind_s;       /* the last release to its last such store
				  (0: nothing was left to store) */
};

struct kvp_prefix;

/* A prefix over o->cache with its writer and reader threads, its keys
 * under o->ctx bound to the cache's cipher key (kvp_cache_keyctx).  0,
 * -ENOMEM, -EAGAIN, -ENOSYS. */
int kvp_prefix_create(const struct kvp_prefix_opts *o, struct kvp_prefix **out);

/* Drain, stop the writer, free.  NULL is a no-op. */
void kvp_prefix_destroy(struct kvp_prefix *p);

/*
 * kvp_prefix_set_prompt - the prompt whose chunks of chunk_tokens tokens
 * the next gets and puts name: the keys of its n / chunk_tokens full
 * chunks.  Chunks already queued keep their keys.  Begins a lookup of
 * the cache (kvp_cache_new_lookup: the prompt's first chunk its newest,
 * its last evicted first).  0, -EINVAL (chunk_tokens 0), -ENOMEM.
 */
int kvp_prefix_set_prompt(struct kvp_prefix *p, const uint32_t *tokens,
			  uint32_t n, uint32_t chunk_tokens);

/* The key of the prompt's chunk i into out: 0, or -ENOENT (past the
 * prompt's full chunks).  For a lower tier that stores chunks by key. */
int kvp_prefix_key(struct kvp_prefix *p, uint32_t chunk,
		   struct kvp_rec_key *out);

/* Chunk i's payload into buf, exactly len bytes: 0; -ENOENT (no such
 * chunk, or a miss), -EBADMSG (dropped by the cache: see its stats),
 * -EMSGSIZE (another length: a miss).  arg: the prefix. */
int kvp_prefix_get(void *arg, uint32_t chunk, void *buf, size_t len);

/* Queue chunk i's payload (copied) to be stored; waits only for room in
 * the queue.  A chunk past the prompt's or a failed copy is counted as
 * failed.  arg: the prefix. */
void kvp_prefix_put(void *arg, uint32_t chunk, const void *payload,
		    size_t len);

/* kvp_prefix_put that never waits: 0 queued; -EAGAIN when the queue holds
 * queue_bytes (nothing queued or counted: the caller counts its skips);
 * -ENOENT (no such chunk) and -ENOMEM, counted as failed. */
int kvp_prefix_try_put(struct kvp_prefix *p, uint32_t chunk,
		       const void *payload, size_t len);

/*
 * kvp_prefix_put_fd - queue chunk i's RECORD, already made and verified
 * by the caller against the chunk's key (a remote tier's value), which
 * fd holds at offset 0 (kvp_rec_size(len) bytes, len of payload): stored
 * as it is (kvp_cache_put_fd) from a duplicate of fd, neither copied nor
 * checksummed again, so it takes no queue memory and never waits; fd
 * must not change until stored.  0; -ENOENT (no such chunk), -ENOMEM,
 * dup's error: counted as failed.
 */
int kvp_prefix_put_fd(struct kvp_prefix *p, uint32_t chunk, int fd,
		      size_t len);

/*
 * kvp_prefix_on_stored - fn is called on the writer thread with each
 * chunk of kvp_prefix_put and _try_put once the directory stored it (or
 * failed to), its payload valid for the call: a lower tier publishes it
 * there, behind the first token as the directory stores it, and not on
 * the putting thread.  Not for kvp_prefix_put_local nor put_fd chunks.
 * NULL: none.  Waits for a call in progress; drain first to have every
 * queued chunk go to the old hook.
 */
typedef void (*kvp_prefix_stored_fn)(void *arg, const struct kvp_rec_key *key,
				     const void *payload, size_t len);
void kvp_prefix_on_stored(struct kvp_prefix *p, kvp_prefix_stored_fn fn,
			  void *arg);

/* kvp_prefix_put without the stored hook (a chunk that came from the
 * tier the hook feeds): 0 queued, or -ENOENT (no such chunk) and -ENOMEM,
 * counted as failed. */
int kvp_prefix_put_local(struct kvp_prefix *p, uint32_t chunk,
			 const void *payload, size_t len);

/* How many payloads of len bytes the queue holds at once, as it counts
 * them (a buffer of 2 MiB or more in whole huge pages); at least 1. */
uint32_t kvp_prefix_queue_fits(const struct kvp_prefix *p, size_t len);

/* Hold the writer (write behind, above) until kvp_prefix_release. */
void kvp_prefix_hold(struct kvp_prefix *p);
void kvp_prefix_release(struct kvp_prefix *p);

/* Release any hold and wait until every queued chunk is stored or
 * failed. */
void kvp_prefix_drain(struct kvp_prefix *p);

void kvp_prefix_stats(struct kvp_prefix *p, struct kvp_prefix_stats *out);

#endif /* KVP_PREFIX_H */
