/*
 * pager_i.h - the engine's internal structures, shared by the engine's files only.
 *
 * Locking: one mutex per pager (p->lock) guards every block's state and
 * flags, the frame pool, the clock list, the in-flight operations and the
 * region list.  It is never held across a system call that can block on
 * the userfaultfd (an ioctl that resolves a fault, a store I/O, madvise):
 * those run with the block in a transient state (LOADING or EVICTING) that
 * no other thread touches.  Statistics are relaxed atomics.
 */
#ifndef KVP_PAGER_I_H
#define KVP_PAGER_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmod-helpers/uffd.h"
#include "pager/pager.h"

/* Block flags (struct kvp_block.flags). */
enum {
	BLK_DIRTY = 1u << 0,	  /* written since last stored */
	BLK_IN_STORE = 1u << 1,	  /* the store holds its data */
	BLK_PREFETCHED = 1u << 2, /* loaded by prefetch, not used yet */
	BLK_REF = 1u << 3,	  /* clock reference bit */
	BLK_WAITERS = 1u << 5,	  /* a fault waits for the transition */
	BLK_WB_FAILED = 1u << 6,  /* write-back failed: keep resident */
	BLK_DROP = 1u << 7,	  /* contents dropped while LOADING or
				     EVICTING: becomes zeros, no write-back */
	BLK_GONE = 1u << 8,	  /* range unmapped by the program */
	BLK_HOLES = 1u << 9,	  /* resident, some pages dropped by the
				     program: a fault there fills zeros */
	BLK_READAHEAD = 1u << 10, /* loaded by readahead, not used yet */
	BLK_SPLIT = 1u << 11,	  /* part of it was unmapped by the program:
				     never write-protected, written back
				     around the hole */
};

struct kvp_op;

/* One block of a region.  Zero-filled means ABSENT, nothing stored. */
struct kvp_block {
	uint8_t state;	/* enum kvp_block_state */
	uint16_t flags; /* BLK_* */
	uint16_t pins;
	uint8_t holds; /* transient: a flush or peek copying it out */
	uint64_t last_use;
	struct kvp_block *next, *prev; /* clock list, while RESIDENT */
	struct kvp_op *op;	       /* while LOADING or EVICTING */
	struct kvp_region *owner;      /* set when first loaded */
};

/* Statistics as relaxed atomics; snapshot into struct kvp_stats. */
#define KVP_ASTAT_FIELD(name, kind, doc) _Atomic uint64_t name;
struct kvp_astats {
	KVP_STATS(KVP_ASTAT_FIELD)
	_Atomic uint64_t io_latency_us[KVP_LATENCY_BUCKETS];
};
#undef KVP_ASTAT_FIELD

struct kvp_region {
	struct kvp_pager *p;
	char name[64];
	unsigned id;
	char *addr;
	size_t size;
	size_t block_bytes;
	unsigned block_shift;
	uint64_t nblocks;
	struct kvp_store *store;
	uint64_t store_offset;
	unsigned flags;
	enum kvp_install_mode install; /* MOVE or COPY, never AUTO */
	struct kvp_block *blocks;      /* nblocks, mmap'd NORESERVE */
	size_t blocks_map_len;
	unsigned inflight; /* ops of this region in flight */
	unsigned pf_reqs;  /* prefetch requests not yet run */
	bool dying;
	uint64_t ra_next;   /* readahead: block after the window */
	uint64_t ra_last;   /* readahead: block of the last fault */
	unsigned ra_window; /* readahead: blocks ahead */
	struct kvp_astats st;
	struct kvp_region *next; /* pager's list, creation order */
};

/* An operation in flight on one block: a load or a write-back. */
enum kvp_op_kind {
	OP_LOAD,      /* store -> frame -> region */
	OP_WRITEBACK, /* evicted dirty frame -> store */
	OP_ZAP,	      /* clean block dropped by the zapper (zap.c) */
};

struct kvp_pf_ref {
	struct kvp_prefetch *pf;
	struct kvp_pf_ref *next;
};

struct kvp_op {
	struct kvp_io io;
	enum kvp_op_kind kind;
	struct kvp_region *r;
	uint64_t blk;
	void *slot;		   /* frame slot in the arena */
	bool zero;		   /* load: no read, zero-fill the frame */
	bool staged;		   /* load: read, waiting for a fault to be
				      installed (read-ahead), on p->staged */
	bool dirty;		   /* load: install writable and dirty (a
				      write fault is waiting) */
	uint32_t rm_start, rm_end; /* load, write-back: bytes the program
				      dropped meanwhile, zeroed in the slot
				      before install or before the write */
	struct kvp_pf_ref *pfs;	   /* prefetch handles waiting on it */
	uint8_t *cover;		   /* zap: REMOVE events seen, per page */
	uint32_t uncovered;	   /* zap: pages no event has covered yet */
	bool zapped;		   /* zap: our call dropped all of it */
	bool parked;		   /* zap: call done, our events not all
				      handled yet (zap.c) */
	struct kvp_op *next;	   /* queue links */
};

/* Frame pool: slots of one size class carved from the arena. */
#define KVP_SIZE_CLASSES 12 /* 4 KiB .. 8 MiB */
struct kvp_slot_stack {
	void **v;
	size_t n, cap;
};

struct kvp_frames {
	struct kvp_uffd land; /* second userfaultfd: the arena is
				     registered with it (WP mode only), so
				     that UFFDIO_MOVE may land pages there */
	char *arena;
	size_t arena_len;
	size_t bump;	     /* next never-used byte past the pre-touched
				part */
	size_t pre_bump;     /* next uncarved pre-touched byte */
	size_t prefault_end; /* end of the pre-touched part */
	struct kvp_slot_stack full[KVP_SIZE_CLASSES];  /* pages present */
	struct kvp_slot_stack empty[KVP_SIZE_CLASSES]; /* no pages */
	uint64_t charged; /* bytes of frames holding pages: in use
				     by blocks or free in the pool */
	uint64_t in_use;  /* bytes held by LOADING, RESIDENT and
				     EVICTING blocks */
};

/* A request handed to a service thread by another thread. */
enum kvp_req_kind { REQ_PREFETCH, REQ_FORGET_STORE, REQ_STOP };
struct kvp_req {
	enum kvp_req_kind kind;
	struct kvp_prefetch *pf;
	struct kvp_store *store; /* REQ_FORGET_STORE: drop its queue */
	struct kvp_req *next;
};

struct kvp_squeue {
	struct kvp_store *store;
	struct kvp_store_queue *q;
	unsigned inflight;
};

/* One service thread. */
struct kvp_service {
	struct kvp_pager *p;
	pthread_t thread;
	int wake_fd;		   /* eventfd: requests queued */
	struct kvp_req *reqs;	   /* under p->lock */
	struct kvp_squeue *queues; /* one per store this thread used */
	unsigned nqueues;
	struct kvp_op *to_submit;  /* ops waiting for a store queue slot */
	struct kvp_op *ready;	   /* loads to install now */
	struct kvp_op *want_frame; /* loads waiting for a frame (FIFO) */
	struct kvp_op **want_tail;
	unsigned nwant; /* loads on want_frame */
	struct uffd_msg *deferred; /* faults read inside an ioctl's retry */
	size_t ndeferred, deferred_cap;
	bool stopping;
};

struct kvp_prefetch {
	struct kvp_region *r;
	uint64_t *blocks;
	size_t n;
	size_t next;	/* first block not yet started */
	size_t pending; /* started, not finished */
	bool cancelled;
	bool failed;
	bool released; /* the caller let go; free when finished */
	pthread_cond_t cond;
};

struct kvp_pager {
	struct kvp_config cfg;
	struct kvp_uffd uffd;
	bool have_wp; /* dirty tracking by write-protect */
	bool have_poison;
	pthread_mutex_t lock;
	pthread_mutex_t rlock; /* the region list, for foreach; taken
				      before lock */
	struct kvp_frames frames;
	struct kvp_block *clock; /* clock hand (a resident block) */
	uint64_t tick;		 /* pager clock, for last_use */
	struct kvp_region *regions;
	unsigned nregions;
	unsigned next_region_id;
	struct kvp_region **rtab; /* regions sorted by address */
	unsigned leaving;	  /* evictions under way (a write-back or
				     a zap queued or in flight): each
				     frees a frame when done */
	uint64_t leaving_bytes;	  /* their bytes */
	struct kvp_op *staged;	  /* read-ahead blocks read, not installed
				      (newest first) */
	uint64_t pinned_bytes;	  /* bytes of blocks with pins > 0 */
	pthread_cond_t idle;	  /* an op finished (destroy waits) */
	struct kvp_service *svc;
	unsigned nsvc;
	unsigned rr;		/* round robin for requests */
	unsigned forget_acks;	/* threads done with REQ_FORGET_STORE */
	struct kvp_astats gone; /* totals of destroyed regions */
	/* zap.c: clean eviction by batched MADV_DONTNEED. */
	int pidfd;		/* this process, for process_madvise */
	pthread_t zapper;
	bool zapper_running, zap_stop;
	pthread_cond_t zap_cond;   /* work for the zapper */
	struct kvp_op *zap_queue;  /* victims waiting for the zapper */
	struct kvp_op *zap_done;   /* zapped: a service thread settles */
	int zap_reader_cpu;	   /* CPU that last read one of our REMOVE
				      events (-1: none yet); the zapper
				      runs there (zap.c) */
	void *zero_page;	/* a page of zeros, for hole fills */
};

/* core.c: block state transitions (each one asserted). */
uint64_t kvp_blk_index(const struct kvp_region *r, const struct kvp_block *b);
char *kvp_blk_addr(const struct kvp_region *r, uint64_t blk);
uint64_t kvp_blk_store_off(const struct kvp_region *r, uint64_t blk);
void kvp_blk_begin_load(struct kvp_region *r, struct kvp_block *b,
			struct kvp_op *op);
void kvp_blk_installed(struct kvp_region *r, struct kvp_block *b, bool dirty);
void kvp_blk_load_failed(struct kvp_region *r, struct kvp_block *b);
void kvp_blk_load_dropped(struct kvp_region *r, struct kvp_block *b);
void kvp_blk_begin_evict(struct kvp_region *r, struct kvp_block *b,
			 struct kvp_op *op);
void kvp_blk_evicted(struct kvp_region *r, struct kvp_block *b, bool stored);
void kvp_blk_evict_aborted(struct kvp_region *r, struct kvp_block *b);
void kvp_blk_forget(struct kvp_region *r, struct kvp_block *b);
bool kvp_blk_sane(const struct kvp_region *r, const struct kvp_block *b);
void kvp_blk_touch(struct kvp_pager *p, struct kvp_block *b);

/* frames.c: the frame pool and the budget.  Under p->lock. */
int kvp_frames_init(struct kvp_pager *p);
void kvp_frames_fini(struct kvp_pager *p);
unsigned kvp_size_class(size_t bytes);
/* A slot for a load, holding pages or not; NULL when the budget is full. */
void *kvp_frame_get(struct kvp_pager *p, size_t bytes);
/* An empty slot to move a block's pages into (eviction): never fails but
 * for address space, NULL then. */
void *kvp_frame_empty_slot(struct kvp_pager *p, size_t bytes);
/* Give back a slot: @full if pages are present in it. */
void kvp_frame_put(struct kvp_pager *p, void *slot, size_t bytes, bool full);
/* Give back the slot of an eviction undone, which may still hold pages
 * (copied back, or there before: the move stopped on them): they are
 * freed, so that an empty slot never holds a page. */
void kvp_frame_put_undone(struct kvp_pager *p, void *slot, size_t bytes);
/* A block gave up its frame's bytes (evicted, dropped, forgotten). */
void kvp_frame_unuse(struct kvp_pager *p, size_t bytes);
/* Drop free pages down to @target bytes charged (returns bytes freed). */
uint64_t kvp_frames_shrink(struct kvp_pager *p, uint64_t target);
uint64_t kvp_budget(const struct kvp_pager *p);

/* evict.c: the clock policy and eviction.  Under p->lock unless said. */
void kvp_clock_add(struct kvp_pager *p, struct kvp_block *b);
void kvp_clock_del(struct kvp_pager *p, struct kvp_block *b);
void kvp_clock_cold(struct kvp_pager *p, struct kvp_block *b);
/* @take_prefetched: may take a prefetched, unused block when nothing
 * else is left (a load needs the frame); background eviction may not. */
struct kvp_block *kvp_clock_victim(struct kvp_pager *p, struct kvp_region **r,
				   bool take_prefetched);
/* Evict one block (takes and drops p->lock itself; called unlocked).
 * Returns 0, -EAGAIN if nothing could be evicted, or -errno. */
int kvp_evict_one(struct kvp_service *s, bool take_prefetched);
/* Detach a resident block's pages into an empty slot (p->lock not held,
 * block in EVICTING); returns 0 or -errno; *slot receives the slot. */
int kvp_detach(struct kvp_pager *p, struct kvp_region *r, uint64_t blk,
	       void **slot);
/* Move a slot's pages back to the region at @addr (an eviction undone),
 * retried through EAGAIN, a page the kernel will not move copied; the
 * waiters are not woken.  False when a page could be neither (out of
 * memory): its data is then only in the slot, which must be kept. */
bool kvp_put_back(struct kvp_pager *p, char *addr, void *slot, size_t len);
/* Evict an EVICTING block by moving its pages out (called unlocked; @op
 * is its op, a write-back or a zap the zapper could not do). */
int kvp_evict_move(struct kvp_service *s, struct kvp_op *op);

/* zap.c: the zapper thread. */
int kvp_zap_start(struct kvp_pager *p); /* 0, or -errno; none if no zap */
void kvp_zap_stop(struct kvp_pager *p);
/* Under p->lock: may this EVICTING-to-be block leave by a zap? */
bool kvp_zap_eligible(const struct kvp_pager *p, const struct kvp_region *r,
		      const struct kvp_block *b, bool dirty);
/* Under p->lock: queue a victim (already EVICTING, op->kind OP_ZAP). */
void kvp_zap_queue(struct kvp_pager *p, struct kvp_op *op);
/* Under p->lock: a REMOVE event covered [lo, hi) of a zapping block; true
 * when that was the last event a parked zap waited for. */
bool kvp_zap_seen(struct kvp_pager *p, struct kvp_op *op, uint32_t lo,
		  uint32_t hi);
/* Under p->lock: send a parked zap to be settled. */
void kvp_zap_unpark(struct kvp_pager *p, struct kvp_op *op);

/* service.c: the fault service threads. */
int kvp_service_start(struct kvp_pager *p);
void kvp_service_stop(struct kvp_pager *p);
void kvp_service_request(struct kvp_pager *p, struct kvp_req *req);
/* Under p->lock: every service thread drops its queue on @store (its last
 * region is gone, the caller may destroy it next); waits for them. */
void kvp_service_forget_store(struct kvp_pager *p, struct kvp_store *store);
/*
 * An ioctl on p->uffd said EAGAIN with nothing done: the kernel refuses
 * the resolving ioctls while an event (REMOVE, UNMAP) waits to be read,
 * and the reader may be this very thread.  On a service thread, read and
 * handle the events now (faults are kept for the main loop); elsewhere,
 * yield to the service threads.  Call it in the retry loop.
 */
void kvp_uffd_unblock(struct kvp_pager *p);
/* UFFDIO_WRITEPROTECT (clearing wakes), retried through EAGAIN. */
int kvp_uffd_protect(struct kvp_pager *p, void *addr, size_t len, bool wp);
/* UFFDIO_POISON over the range's missing pages, retried through EAGAIN. */
void kvp_uffd_poison_range(struct kvp_pager *p, void *addr, size_t len);
/* Wake a service thread (its eventfd). */
void kvp_service_poke(struct kvp_service *s);
struct kvp_op *kvp_op_new(enum kvp_op_kind kind, struct kvp_region *r,
			  uint64_t blk);
/* The program dropped bytes [lo, hi) of @op's block while @op moves it
 * (under p->lock): remember them for kvp_op_zero_dropped. */
void kvp_op_note_drop(struct kvp_op *op, uint32_t lo, uint32_t hi);
/* Zero in @op's slot the bytes noted dropped and forget them; true if there
 * were any.  The slot must hold the block's pages (p->lock held, or the
 * caller owns the op). */
bool kvp_op_zero_dropped(struct kvp_op *op);
/* Why a load starts. */
enum kvp_load_why { LOAD_FAULT, LOAD_PREFETCH, LOAD_READAHEAD };
/* Start loading ABSENT block @blk (under p->lock); 0 or -ENOMEM. */
int kvp_load_start(struct kvp_service *s, struct kvp_region *r, uint64_t blk,
		   enum kvp_load_why why, struct kvp_prefetch *pf, bool write);
void kvp_op_free(struct kvp_op *op);

/* region.c, under p->lock (dropped and retaken inside): drop a resident,
 * unpinned block's contents, its pages back to the pool. */
void kvp_discard_resident(struct kvp_region *r, uint64_t blk);

/* Under p->lock: a staged read-ahead block is wanted now / dropped. */
void kvp_stage_release(struct kvp_service *s, struct kvp_op *op);
void kvp_stage_drop(struct kvp_pager *p, struct kvp_op *op);

/* prefetch.c (under p->lock) */
void kvp_prefetch_run(struct kvp_service *s, struct kvp_prefetch *pf);
void kvp_prefetch_block_done(struct kvp_pager *p, struct kvp_prefetch *pf,
			     bool failed);

/* region.c */
struct kvp_region *kvp_region_find(struct kvp_pager *p, uintptr_t addr);
int kvp_rtab_rebuild(struct kvp_pager *p);
void kvp_stats_snapshot(const struct kvp_astats *a, struct kvp_stats *out);
void kvp_stats_add(struct kvp_stats *sum, const struct kvp_stats *s);
void kvp_astats_fold(struct kvp_astats *into, const struct kvp_astats *a);

#define KVP_PAGE_BYTES 4096u

#define KVP_STAT_ADD(r, field, v)                                              \
	atomic_fetch_add_explicit(&(r)->st.field, (v), memory_order_relaxed)
#define KVP_STAT_SUB(r, field, v)                                              \
	atomic_fetch_sub_explicit(&(r)->st.field, (v), memory_order_relaxed)

#endif /* KVP_PAGER_I_H */
