/*
 * kv_backend_i.h - private: what a KV cache backend implements (the
 * memory the cache's region of KV blocks lives in; backend_*.c).
 *
 * The cache (kvcache_i.h) sees its KV as one range of c->l.region_bytes
 * at c->base, cut into pager blocks of c->l.pager_block_bytes (the unit
 * of residency, of prefetch and of pinning).  Attention reads it through
 * c->base; everything else that differs between backends goes through
 * these ops, so no other file asks which backend runs:
 *
 *   kvpager (backend_pager.c)  a pager region over a store: the product
 *   ram     (backend_ram.c)    anonymous memory, all resident: the
 *                              compute bound and the bit-for-bit reference
 *   mmap    (backend_mmap.c)   the kernel's MAP_SHARED mapping of a file,
 *                              under a RAM budget it emulates (an LRU of
 *                              pager blocks): kvpbench's baselines
 *
 * All ops are called from the cache's driving thread, except read, which
 * kvp_kvcache_quality and fork also call from there, and nothing runs
 * them concurrently; read_shared alone runs beside them.  They return 0
 * or -errno where they return int.
 * Ops marked optional may be NULL: the cache then skips that step.
 */
#ifndef KVP_KV_BACKEND_I_H
#define KVP_KV_BACKEND_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_kvcache;
struct kvp_kvcache_step_stats;
struct kvc_plan;

struct kvc_backend_ops {
	const char *name; /* kvp_kvcache_backend_name */
	/*
	 * Make the memory: set c->base (c->l.region_bytes), c->budget (the
	 * budget in force), and for kvpager c->region and c->pager.  On
	 * failure close is still called, and must free what open made.
	 */
	int (*open)(struct kvp_kvcache *c);
	void (*close)(struct kvp_kvcache *c); /* NULL-safe on what is unset */
	/*
	 * Bytes [off, off + len) of the region from data, without reading
	 * what is there (see THE ROLLING BUFFER in kvcache.h); flush: a full
	 * rolling block (counted in flush_store / flush_region).
	 */
	int (*write)(struct kvp_kvcache *c, uint64_t off, const char *data,
		     size_t len, bool flush);
	/* Physical KV blocks phys[0..n) of layer into dst (n * stride bytes)
	 * without faulting anything in or changing residency. */
	int (*read)(struct kvp_kvcache *c, uint32_t layer, const uint32_t *phys,
		    size_t n, char *dst);
	/*
	 * Optional: read from any thread, while the driver runs the other
	 * ops, blocks that nothing writes or frees meanwhile and whose
	 * writes are done (kvp_kvcache_snap_read); pbbuf: a pager block of
	 * the caller's scratch.  NULL: only read, on the driver.
	 */
	int (*read_shared)(struct kvp_kvcache *c, uint32_t layer,
			   const uint32_t *phys, size_t n, char *dst,
			   char *pbbuf);
	/* Is pager block pb resident now (a plan's reuse count)? */
	bool (*resident)(struct kvp_kvcache *c, uint64_t pb);
	/* Optional: is pager block pb absent and clean, so that its next
	 * use reads the store (kvp_kvcache_prefill_stored)? */
	bool (*in_store)(struct kvp_kvcache *c, uint64_t pb);
	/*
	 * Optional: start reading the plan's pager blocks pl->pb[0..npb)
	 * (pl->res: resident at plan time).  A backend that reads
	 * asynchronously sets pl->pf, which the waiter thread waits for
	 * (plan.c); async_prefetch says it may.
	 */
	int (*prefetch)(struct kvp_kvcache *c, struct kvc_plan *pl);
	bool async_prefetch;
	/*
	 * Optional: pin pager blocks [pb, pb + n) resident (-ENOSPC: the
	 * budget cannot hold them) / unpin them, and advise them cold
	 * (evicted first).  Only a backend that evicts has them.
	 */
	int (*pin)(struct kvp_kvcache *c, uint64_t pb, uint64_t n);
	void (*unpin)(struct kvp_kvcache *c, uint64_t pb, uint64_t n);
	void (*advise_cold)(struct kvp_kvcache *c, uint64_t pb, uint64_t n);
	/* Optional: pager block pb holds no live KV any more: drop it
	 * without writing it back.  0 if it was dropped. */
	int (*discard)(struct kvp_kvcache *c, uint64_t pb);
	/* Optional: a prefill ended (mmap: make the file cold). */
	void (*prefilled)(struct kvp_kvcache *c);
	/* Optional: a step starts (snapshot the counters step_end diffs). */
	void (*step_begin)(struct kvp_kvcache *c);
	/* Optional: a layer's plan computed; its blocks were read. */
	void (*layer_done)(struct kvp_kvcache *c, const struct kvc_plan *pl);
	/*
	 * Optional: a step ends, completed (every layer computed) or not:
	 * add to st's bytes_read and bytes_written; fill demand_faults and
	 * prefetch_hit / late / wasted since step_begin.
	 */
	void (*step_end)(struct kvp_kvcache *c,
			 struct kvp_kvcache_step_stats *st, bool completed);
	/* Optional: writes still in flight to pager blocks pb[0..n)
	 * (ascending; NULL: any) are done.  0, or the error of a write that
	 * failed (kept: every later call returns it). */
	int (*write_wait)(struct kvp_kvcache *c, const uint64_t *pb, size_t n);
	/* Optional: the store that holds absent, clean blocks (in_store),
	 * which reuse slots read (slots.c). */
	struct kvp_store *(*store)(struct kvp_kvcache *c);
	/* Where pager block pb is, for the block table text: a word. */
	const char *(*where)(struct kvp_kvcache *c, uint64_t pb);
};

extern const struct kvc_backend_ops kvc_backend_pager;
extern const struct kvc_backend_ops kvc_backend_ram;
extern const struct kvc_backend_ops kvc_backend_mmap;

#endif /* KVP_KV_BACKEND_I_H */
