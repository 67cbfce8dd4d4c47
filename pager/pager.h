/*
 * pager.h - the paging engine: regions served from stores under a budget.
 *
 * A pager owns one userfaultfd, its service threads, a frame pool sized by
 * the RAM budget and the regions registered with it.  A region is ordinary
 * virtual memory to every thread of the process; its blocks are loaded from
 * its store on first access (or by prefetch), written back when dirty and
 * evicted when the budget is reached.
 *
 * Conventions: every call returns 0 or -errno (never errno), predicates
 * return bool, kvp_strerror() explains the codes.  Unless said otherwise a
 * call is thread-safe and takes the pager's or the region's lock internally;
 * none may be called from a service thread (a policy callback).
 */
#ifndef KVP_PAGER_H
#define KVP_PAGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pager/config.h"
#include "pager/stats.h"
#include "pager/store.h"

struct kvp_pager;
struct kvp_region;
struct kvp_prefetch;

/*
 * kvp_pager_open - start a pager with @cfg (see kvp_config_defaults).
 *
 * Opens a userfaultfd (full mode preferred; user-mode-only with a warning on
 * stderr, in which case kernel-side accesses such as read(2) into a
 * non-resident page fail with EFAULT), does the handshake, reserves and
 * pre-touches the frame pool and starts the service threads.  Returns 0 and
 * *out, or -EINVAL (a bad @cfg), -EPERM (no userfaultfd permission),
 * -ENOMEM; on failure nothing is left behind.
 */
int kvp_pager_open(const struct kvp_config *cfg, struct kvp_pager **out);

/*
 * kvp_pager_close - destroy every region still open, stop the threads and
 * free the pool.  Dirty blocks of regions still open are not written back:
 * destroy a region first to keep its data.  Safe with NULL.
 */
void kvp_pager_close(struct kvp_pager *p);

/*
 * kvp_pager_thread_begin - name the calling thread @name (15 characters
 * at most are kept) and give it the nice value of @p's own threads
 * (service_priority): for a thread that serves @p's loads on another's
 * behalf, as a KV layer's reader of reuse slots does, and block every
 * signal in it (a program's handler run there that touched a region would
 * wait on a fault the thread itself serves).  Never fails: a priority the
 * process may not take is left, with a note on stderr once.
 */
void kvp_pager_thread_begin(struct kvp_pager *p, const char *name);

/* Current configuration; always succeeds. */
void kvp_pager_config(const struct kvp_pager *p, struct kvp_config *out);

/*
 * kvp_pager_reconfigure - apply @cfg to a live pager.  Only tunables marked
 * runtime may differ from the current ones; otherwise -EINVAL and nothing
 * changes (*bad, if not NULL, names the offending tunable).  A smaller
 * budget frees pooled frames at once and wakes the service threads, which
 * evict down to it right away (asynchronously: resident_bytes follows
 * within milliseconds).  -EBUSY: more is pinned than the new budget.
 */
int kvp_pager_reconfigure(struct kvp_pager *p, const struct kvp_config *cfg,
			  const char **bad);

/* Totals over all regions, including regions already destroyed. */
void kvp_pager_stats(const struct kvp_pager *p, struct kvp_stats *out);

/* "full" or "user-mode-only": which faults the pager's userfaultfd sees. */
const char *kvp_pager_uffd_mode(const struct kvp_pager *p);

/* Flags of struct kvp_region_opts. */
#define KVP_REGION_FROM_STORE                                                  \
	(1u << 0) /* the store range holds the initial
					   contents; else the region starts
					   zero-filled and only blocks written
					   back are ever read */

struct kvp_region_opts {
	const char *name;	 /* unique per pager; NULL: "region<N>" */
	size_t size;		 /* bytes, a multiple of block_bytes */
	size_t block_bytes;	 /* power of two, 4 KiB .. 2 MiB (or more) */
	struct kvp_store *store; /* must outlive the region (the pager drops
				    its queues on a store with its last
				    region) */
	uint64_t store_offset;	 /* where block 0 lives in the store */
	unsigned flags;		 /* KVP_REGION_* */
};

/*
 * kvp_region_create - reserve, register and start serving a region.
 *
 * The address is aligned to the block size (to 2 MiB for blocks of 2 MiB and
 * more, and for blocks of 64 KiB and more in regions of 2 MiB and more).
 * The region is not inherited by fork(2) (MADV_DONTFORK): in a child its
 * addresses are unmapped, so an access is SIGSEGV, never a hang.  Each
 * region is one VMA: vm.max_map_count bounds how many a process holds.  Returns 0 and *out, or -EINVAL (bad size, block size, or a store
 * too small or misaligned for it), -EEXIST (name taken), -EBUSY (its store
 * bytes overlap those of a live region on the same store, of this pager or
 * another: each would write its blocks back over the other's), -ENOMEM (address
 * space, or vm.max_map_count reached); nothing is left behind on failure.
 */
int kvp_region_create(struct kvp_pager *p, const struct kvp_region_opts *opts,
		      struct kvp_region **out);

/*
 * kvp_region_destroy - write back the dirty blocks, unregister and unmap.
 * Returns 0, or the first write-back error (the region is destroyed anyway
 * and the error says data was lost).  No thread may access the region
 * during or after the call.
 */
int kvp_region_destroy(struct kvp_region *r);

void *kvp_region_addr(const struct kvp_region *r);
size_t kvp_region_size(const struct kvp_region *r);
size_t kvp_region_block_bytes(const struct kvp_region *r);
const char *kvp_region_name(const struct kvp_region *r);
struct kvp_store *kvp_region_store(const struct kvp_region *r);
/* The install mode in use: "move" or "copy". */
const char *kvp_region_install_mode(const struct kvp_region *r);

/*
 * kvp_install_auto_moves - does install_mode auto move blocks of
 * @block_bytes in (else it copies them), on a machine where the first
 * read of a newly mapped 4 KiB page costs @first_touch_us and copying a
 * page @copy_us (kmod-helpers' kvp_mem_touch_cost, which the pager
 * measures at open)?
 */
bool kvp_install_auto_moves(size_t block_bytes, double first_touch_us,
			    double copy_us);
void kvp_region_stats(const struct kvp_region *r, struct kvp_stats *out);

/* Write back every dirty block (blocks stay resident), and wait for those
 * an eviction or another flush is writing out: once it returns 0, the
 * store holds every byte written before the call.  0 or the first error;
 * -EIO also where a block whose read failed (poisoned) holds writes to
 * the pages it kept, which are never stored. */
int kvp_region_flush(struct kvp_region *r);

/*
 * Hints to the eviction policy over blocks [first, first+n).  A pinned
 * block is never evicted (pins nest); pinning more than the budget fails
 * with -ENOSPC and pins nothing.  COLD makes blocks the next victims;
 * DISCARD drops their contents without write-back: they read back as zeros,
 * like MADV_DONTNEED on ordinary memory.  Returns 0; -EINVAL (a range past
 * the region, an unknown advice); for DISCARD, -EBUSY when some block was
 * pinned, being copied out (a flush, a peek), or resident with a fault's
 * change still landing on it (a write fault's unprotect, a dropped page's
 * zeros, on another service thread): the other blocks are dropped, that
 * one is not; call again.
 */
enum kvp_advice { KVP_ADVICE_COLD, KVP_ADVICE_DISCARD };
int kvp_region_pin(struct kvp_region *r, uint64_t first, uint64_t n);
int kvp_region_unpin(struct kvp_region *r, uint64_t first, uint64_t n);
int kvp_region_advise(struct kvp_region *r, uint64_t first, uint64_t n,
		      enum kvp_advice advice);

/*
 * Prefetch: asynchronous prefault of named blocks.  Reads are submitted in
 * batches, each block is installed as its read completes, and the program
 * takes no fault on it afterwards.  Blocks already resident or loading are
 * not read again.  @out may be NULL (fire and forget).  Statistics: a
 * prefetched block is a hit when the pager sees it used (a pin, a write, a
 * COLD hint, a fault on one of its pages), late when the program faulted
 * on it before it was installed, wasted when it is evicted or dropped with
 * no such sign (a block that is only read leaves none).
 */
int kvp_prefetch_submit(struct kvp_region *r, const uint64_t *blocks, size_t n,
			struct kvp_prefetch **out);
/* Wait until every block is installed, failed, cancelled or given up (no
 * frame within the budget for it, or the program dropped or unmapped it:
 * the block is then left to the program's faults, as without the
 * prefetch); @timeout_ms < 0 waits for ever.  Returns 0, -ETIMEDOUT, or
 * -EIO if some block failed. */
int kvp_prefetch_wait(struct kvp_prefetch *pf, int timeout_ms);
bool kvp_prefetch_done(const struct kvp_prefetch *pf);
/* Drop the blocks not yet submitted; those in flight still complete. */
int kvp_prefetch_cancel(struct kvp_prefetch *pf);
/* Release the handle (cancels first if not done). */
void kvp_prefetch_release(struct kvp_prefetch *pf);

/* Introspection, for the debug view: never faults a block in. */
enum kvp_block_state {
	KVP_BLOCK_ABSENT,
	KVP_BLOCK_LOADING,
	KVP_BLOCK_RESIDENT,
	KVP_BLOCK_EVICTING,
	KVP_BLOCK_POISONED,
};
struct kvp_block_info {
	enum kvp_block_state state;
	bool dirty;	   /* written since it was last stored */
	bool in_store;	   /* the store holds data for it */
	bool staged;	   /* LOADING: read ahead and read, kept in its frame
			      until a fault or a prefetch asks for it */
	unsigned pins;	   /* pin count */
	uint64_t last_use; /* pager clock tick of the last access seen, or
			      of its eviction when absent */
};
const char *kvp_block_state_name(enum kvp_block_state s);
int kvp_region_block_info(struct kvp_region *r, uint64_t block,
			  struct kvp_block_info *out);
/* Copy block @block's bytes from its frame or its store (zeros if neither
 * holds it) into @buf of block_bytes, without changing its state. */
int kvp_region_peek(struct kvp_region *r, uint64_t block, void *buf);

/* Call @fn on each region in creation order, under the pager's region list
 * lock (so @fn must not create or destroy regions); stops at and returns
 * the first non-zero return of @fn. */
int kvp_pager_foreach_region(struct kvp_pager *p,
			     int (*fn)(struct kvp_region *r, void *arg),
			     void *arg);

/* kvp_strerror - what a kvpager return code means, with the remedy. */
const char *kvp_strerror(int err);

#endif /* KVP_PAGER_H */
