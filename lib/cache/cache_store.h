/*
 * cache_store.h - a pager store (pager/store.h) that reads some of its
 * ranges from the prefix cache's block files: what lets a cache hit map a
 * block into a KV region instead of copying it there.
 *
 * It stands in front of an inner store (the region's own backing file)
 * and forwards every I/O to it, but for the ranges bound to a block file
 * (kvp_cache_store_bind).  A read of a bound range is served from the
 * file: the first read of any part of a record reads the record whole and
 * verifies it (kvp_rec_open); later reads take only the bytes asked for.
 * A record that fails is dropped from the cache (kvp_cache_reject) and
 * the read fails with -EBADMSG, so the pager poisons that block: a wrong
 * block is never served.  A read error (EIO) fails that read alone, as a
 * get's would: the record is not judged by it, and its block stays.  A write or a discard over a bound range unbinds
 * it (a part of a bound granule that the write leaves is first copied to
 * the inner store): from then on the inner store holds those bytes.
 *
 * Ranges are bound in granules (the KV block stride): granule i of a
 * record's payload at a store offset that is a multiple of the granule.
 *
 * STATES OF A GRANULE (a store offset / granule):
 *
 *   inner --bind [kvp_cache_store_bind]--> bound (record unverified)
 *   bound --first read of its record [read_range], or the verifier
 *           [verifier_main]--> bound (verified)
 *   bound --record fails [verify_record]--> bound, its reads -EBADMSG
 *   bound --write or discard over it [unbind_range]--> inner
 *
 * A read of a bound range is ordinary pread(2) of the file (the page
 * cache: payloads start at byte 128 of a record, not aligned for
 * O_DIRECT): through a queue, one of 256 KiB or more (a pager block) goes
 * to one of 2 reader threads, started at the first, so that the thread
 * that submits (the pager's service thread) goes on while it is copied; a
 * smaller one (a sparse decode's KV block) is read at submit, and a
 * synchronous kvp_store_pread reads in the caller.  Other I/O goes to the
 * inner store's queue as it came.  With
 * kvp_cache_store_verify_ahead, a thread at the lowest CPU priority
 * verifies the bound records before any read asks for them, so that the
 * first reads (a decode's first step, which reads every record at its
 * first layer) find them verified.  Records stay open while any of
 * their granules is bound or a read uses them.  Up to 2 buffers of a
 * record's size are kept for the next verifications (a fresh buffer's
 * pages each cost a first touch), outside the pager's budget, until
 * destroy.
 *
 * Locking: one mutex guards the bindings; I/O runs outside it.  Every
 * call may come from any thread.
 */
#ifndef KVP_CACHE_STORE_H
#define KVP_CACHE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/cache/cache_dir.h"
#include "pager/store.h"

struct kvp_cache_store_stats {
	uint64_t records;	 /* records bound, since create */
	uint64_t bound_granules; /* granules bound now */
	uint64_t bound_reads;	 /* reads served (partly) from records */
	uint64_t reads_handed;	 /* queue reads done by reader threads */
	uint64_t bound_bytes;	 /* bytes of those reads from records */
	uint64_t verified;	 /* records read whole and verified */
	uint64_t verified_ahead; /* of those, by the verifier thread */
	uint64_t rejected;	 /* records that failed: reads -EBADMSG */
	uint64_t unbound;	 /* granules unbound by writes, discards */
};

/*
 * kvp_cache_store_create - a store in front of inner (owned from then on:
 * destroyed with it, also on failure) whose bindings name blocks of cache
 * (used, not owned: it must outlive the store) in granules of granule
 * bytes.  Its I/O must keep inner's alignment, as the pager's does (whole
 * pager blocks).  Returns 0 and *out, -EINVAL, -ENOMEM.
 */
int kvp_cache_store_create(struct kvp_store *inner, struct kvp_cache *cache,
			   size_t granule, struct kvp_store **out);

/*
 * kvp_cache_store_bind - bind granule i of key's payload (exactly n
 * granules long) at store offset offs[i], for i < n: later reads of those
 * ranges come from the record.  Opens the block (kvp_cache_open_block:
 * a hit, or its miss).  The caller must make sure that nothing of those
 * ranges is resident or dirty above the store (the pager reads them
 * later, or never).  Returns 0; -EINVAL (an offset not a multiple of the
 * granule or past the store); -EMSGSIZE (the payload is not n granules:
 * nothing bound); kvp_cache_open_block's errors (-ENOENT, -EOPNOTSUPP,
 * -EBADMSG ...); -ENOMEM.  On failure nothing is bound.
 */
int kvp_cache_store_bind(struct kvp_store *s, const struct kvp_rec_key *key,
			 const uint64_t *offs, size_t n);

/*
 * kvp_cache_store_bind_fd - kvp_cache_store_bind for a record that is not
 * (yet) a block file of the directory: fd holds it from offset 0, laid
 * out as a block file is (kvp_rec_size(len) bytes for a payload of len:
 * a memfd with a record fetched from the remote tier, say).  The store
 * owns fd from then on, also on failure.  verified: the caller opened
 * this very record with kvp_rec_open against key (not read again when
 * first read); else it is verified then, as a block file is, but a
 * failure is not reported to the directory.  Returns 0, -EINVAL,
 * -EMSGSIZE, -ENOMEM; on failure nothing is bound.
 */
int kvp_cache_store_bind_fd(struct kvp_store *s, const struct kvp_rec_key *key,
			    int fd, uint64_t len, bool verified,
			    const uint64_t *offs, size_t n);

/*
 * kvp_cache_store_verify_ahead - start the verifier: a thread (nice 19,
 * "kvp-verify") that verifies every record bound and not yet verified,
 * now and as later binds come, the last bound first, until destroy; a
 * read of a record it has not reached yet verifies it as before, and a
 * record that fails is refused just the same.  Idempotent.  Returns 0,
 * -EINVAL (not a cache store), or pthread_create's -errno (-EAGAIN).
 */
int kvp_cache_store_verify_ahead(struct kvp_store *s);

/* Is s a cache store (made by kvp_cache_store_create)? */
bool kvp_cache_store_is(const struct kvp_store *s);

void kvp_cache_store_stats(struct kvp_store *s,
			   struct kvp_cache_store_stats *out);

#endif /* KVP_CACHE_STORE_H */
