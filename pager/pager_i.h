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

#include "kmod-helpers/mem.h"
#include "kmod-helpers/uffd.h"
#include "pager/pager.h"

/* Block flags (struct kvp_block.flags). */
enum {
	BLK_DIRTY = 1u << 0,	  /* written since last stored */
	BLK_IN_STORE = 1u << 1,	  /* the store holds its data */
	BLK_PREFETCHED = 1u << 2, /* loaded by prefetch, not used yet */
	BLK_REF = 1u << 3,	  /* clock reference bit */
	BLK_COLD = 1u << 4,	  /* a COLD hint came while it was LOADING:
				     taken when it is installed */
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
	BLK_ACTIVE = 1u << 12,	  /* working set: loaded again soon after
				     it was evicted (a refault); the clock
				     takes it only when nothing else goes */
	BLK_PARTIAL = 1u << 13,	  /* resident in part (fault-around): the
				     pages it lacks are in the store, a
				     fault there loads a window more
				     (load.c); dirty only in the windows
				     of dirty_win, or made whole first */
	BLK_PAGES = 1u << 14,	  /* a window went in (fault-around): its
				     range has a page table, so a block
				     moved in whole would be split into
				     pages, and a slot it is moved out to
				     would keep them: it is installed by
				     copy and detached into paged slots;
				     for the region's life */
	BLK_FLUSHING = 1u << 15,  /* a flush (or the zapper, for NOMOVE) is
				     writing it from the region: another
				     flush waits for that write */
	BLK_NOMOVE = 1u << 16,	  /* UFFDIO_MOVE refused its pages (a page
				     the program mlocked or mprotected):
				     it leaves by a zap, written from the
				     region first when dirty (zap.c) */
	BLK_UNREAD = 1u << 17,	  /* with NOMOVE: a page of it did not read
				     (PROT_NONE, and no /proc/self/mem), so
				     no copy of it could be written: stuck
				     (zap.c) */
	BLK_VMAS = 1u << 19,	  /* the program split its mapping (a lock
				     or protection of part of it), seen by a
				     zap or a refused move: dropped a page
				     at a time from then on, for the
				     region's life (zap.c) */
	BLK_ZAPWAIT = 1u << 18,	  /* a drop of part of it read whose zap
				     may not have come yet: once resident,
				     no victim meanwhile (r->zap_waits) */
};

struct kvp_op;

#define KVP_BLOCK_PAGES_MAX 2048u /* pages of the largest block (8 MiB) */

struct kvp_zap_wait {
	uint64_t blk;
	uint64_t until_ns, seen_ns;
	uint64_t pages[KVP_BLOCK_PAGES_MAX / 64];
};

/* One block of a region.  Zero-filled means ABSENT, nothing stored. */
struct kvp_block {
	uint8_t state;	/* enum kvp_block_state */
	uint32_t flags; /* BLK_* */
	uint16_t pins;
	uint8_t holds; /* transient: a flush or peek copying it out */
	uint8_t late; /* transient: faults whose change to its page table
			 comes after p->lock is let go, not made yet: a
			 write fault's unprotect, a hole's zeros.  Until
			 then it is not flushed (the protection must come
			 after), evicted, or loaded again once dropped
			 (the change would land on the next copy) */
	uint16_t present; /* BLK_PARTIAL: pages installed (an upper bound
			     once the program drops some: those make it
			     whole again at once, events.c) */
	/* BLK_PARTIAL, in the region's dirty windows (win_bytes each, bit i
	 * for window i): full_win, those whose every page is installed;
	 * dirty_win, those written since stored (a subset of full_win, and
	 * with BLK_DIRTY set; the others are write-protected and the store
	 * holds their bytes).  0 when whole. */
	uint64_t full_win, dirty_win;
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
	_Atomic uint64_t io_latency_sum_ns;
};
#undef KVP_ASTAT_FIELD

/* One sequential run of faults that read-ahead follows.  Several at once
 * (a region's threads each streaming their own part) each keep their
 * window: one state for the region took their interleaved faults for
 * random ones, and four left eight threads none. */
#define KVP_RA_STREAMS 16
_Static_assert(KVP_RA_STREAMS <= 256, "kvp_op.ra_slot is a uint8_t");
struct kvp_ra_stream {
	uint64_t last;	 /* block of its last fault */
	uint64_t next;	 /* block after its window */
	uint64_t mark;	 /* the window doubles when the faults reach it */
	uint64_t seen;	 /* ra_tick when it last went on (0: never) */
	unsigned window; /* blocks ahead */
};

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
	uint32_t win_bytes; /* dirty window: a block resident in part is
			       written back in these (block / 64, 4 KiB at
			       least); 0 when the store cannot take writes
			       that small (its alignment) or there is no
			       write protection: then made whole first */
	struct kvp_block *blocks;      /* nblocks, mmap'd NORESERVE */
	size_t blocks_map_len;
	unsigned inflight; /* ops of this region in flight */
	unsigned pf_reqs;  /* prefetch requests not yet run */
	bool dying;
	struct kvp_ra_stream ra[KVP_RA_STREAMS]; /* readahead (events.c) */
	uint64_t ra_tick;   /* readahead: faults seen, for ra[].seen */
	unsigned ra_shrink; /* readahead: its most is readahead_bytes >>
			       ra_shrink; one more per read-ahead block
			       wasted, one less per one used or per
			       sequential run seen while shrunk to none */
	struct kvp_astats st;
	/* Blocks with BLK_ZAPWAIT: the pages dropped, and until when they
	 * may stay (kvp_blk_zap_wait, core.c), one entry a block,
	 * unordered. */
	struct kvp_zap_wait *zap_waits;
	size_t nzap_waits, zap_waits_cap;
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
	uint32_t win_off, win_len; /* the bytes of the block it moves: all
				      of it, or a fault-around window (a
				      load's slot holds only those) */
	size_t held;		   /* eviction: bytes the block held when it
				      began (kvp_blk_charge) */
	void *slot;		   /* frame slot in the arena */
	bool zero;		   /* load: no read, zero-fill the frame */
	bool staged;		   /* load: read, waiting for a fault to be
				      installed (read-ahead), on p->staged */
	uint8_t ra_slot;	   /* load by read-ahead: its stream (ra[]) */
	bool ahead;		   /* load: by read-ahead (LOAD_READAHEAD) */
	struct kvp_service *want_svc; /* load: the thread whose want_frame
					 holds it, or NULL */
	uint32_t placed;	   /* load: pages its installs placed (an
				      install retried counts on) */
	bool dirty;		   /* load: install writable and dirty (a
				      write fault is waiting) */
	bool forced_retry;	   /* load: past the budget and its
				      overdraft, a write-back was retried
				      for it before the back-off said so */
	uint64_t wb_left;	   /* write-back of a block resident in
				      part: dirty windows not yet written
				      (one I/O per run of them) */
	bool part;		   /* write-back: of a block resident in
				      part, its dirty windows only */
	bool gathered;		   /* write-back: the slot is a frame its
				      small pages were copied into
				      (evict.c's gather), kept full after */
	bool rm_any;		   /* load, write-back: the program dropped
				      pages meanwhile (rm_pages), zeroed in
				      the slot before install or the write */
	uint64_t rm_pages[KVP_BLOCK_PAGES_MAX / 64]; /* one bit a page */
	struct kvp_pf_ref *pfs;	   /* prefetch handles waiting on it */
	uint8_t *cover;		   /* zap: REMOVE events seen, per page */
	bool zap_called;	   /* zap: the zapper's call for it began */
	bool zap_pages;		   /* zap: that call drops it a page at a
				      time (zap_ranges) */
	/* zap: the call's walk over the block as its events tell it
	 * (zap_walk). */
	struct kvp_zap_walk {
		uint32_t next;	 /* where it goes on */
		uint32_t end;	 /* how far it has reached */
		uint32_t lo, hi; /* its last event's range */
	} walk;
	bool verifying;		   /* load: the block moved in is read back
				      (a missing fault there is a page the
				      program dropped: zeros) */
	bool summed;		   /* load: sum holds the slot's digest */
	uint64_t sum[2];	   /* load: XXH3-128 of the slot, for a block
				      moved in whole (load.c) */
	bool zapped;		   /* zap: our call dropped all of it */
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
	struct kvp_slot_stack paged[KVP_SIZE_CLASSES]; /* no pages, but a
				     page table: slots that took a block
				     moved out page by page (BLK_PAGES),
				     kept for such blocks only */
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
	struct kvp_op *want_frame; /* loads waiting for a frame: served
				      asked for first, each in order */
	struct kvp_op **want_tail;
	unsigned nwant;		   /* loads on want_frame */
	unsigned nasked;	   /* of them, asked for (load.c) */
	struct uffd_msg *deferred; /* faults read inside an ioctl's retry */
	size_t ndeferred, deferred_cap;
	char *bounce;		   /* a block's read-back (load.c), or NULL */
	struct XXH3_state_s *readback; /* its XXH3 state, or NULL */
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
	/* measured at open, for install_mode auto (region.c) */
	struct kvp_mem_touch_cost touch;
	pthread_mutex_t lock;
	pthread_mutex_t rlock; /* the region list, for foreach; taken
				      before lock */
	pthread_rwlock_t evlock; /* written: one service thread at a time
				    reads the userfaultfd and handles the
				    drops it read (events.c); read: an
				    install, or a copy out, that no drop
				    may be read during (ioctl.c); taken
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
	/* Write-back failures (evict.c): blocks with BLK_WB_FAILED stay
	 * resident and are tried again once wb_retry_ns has passed; each
	 * failure doubles the wait, a success ends it. */
	uint64_t wb_failed_bytes; /* bytes of blocks with BLK_WB_FAILED */
	uint64_t wb_retry_ns;	  /* CLOCK_MONOTONIC: failed ones may be
				     picked again from then on */
	uint64_t wb_backoff_ms;	  /* the wait after the last failure, 0
				     while writes succeed */
	pthread_cond_t idle;	  /* an op finished (destroy waits) */
	struct kvp_service *svc;
	unsigned nsvc;
	unsigned rr;		/* round robin for requests */
	unsigned nwant_all;	/* loads on every thread's want_frame:
				   a new load queues behind them, and
				   write-backs in flight cover them all */
	unsigned nwant_asked;	/* those a fault or a prefetch asked for
				   (not BLK_READAHEAD): they go first */
	unsigned forget_acks;	/* threads done with REQ_FORGET_STORE */
	struct kvp_astats gone; /* totals of destroyed regions */
	/* zap.c: clean eviction by batched MADV_DONTNEED. */
	int pidfd;   /* this process, for process_madvise */
	int maps_fd; /* its /proc/self/maps, for kvp_mem_vma_at */
	int mem_fd;  /* its /proc/self/mem, for the zapper's copies */
	pthread_t zapper;
	bool zapper_running, zap_stop;
	pthread_cond_t zap_cond;  /* work for the zapper */
	struct kvp_op *zap_queue; /* victims waiting for the zapper */
	struct kvp_op *zap_done;  /* zapped: a service thread settles */
	struct kvp_op *clean_queue; /* NOMOVE blocks to write (zap.c) */
	int zap_reader_cpu;	  /* CPU that last read one of our REMOVE
				      events (-1: none yet); the zapper
				      runs there (zap.c) */
	void *zero_page;	  /* a page of zeros, for hole fills */
};

/*
 * The engine's files, bottom layer first: each calls only files listed
 * before it (none calls back up; ioctl.c reaches the event decoder through
 * the reader a service thread binds), so a fault reads top-down from the
 * service loop to the install.
 *
 *   frames.c stats.c rtab.c          the pool, statistics, region lookup
 *   claims.c                         the store bytes regions hold
 *   core.c                           block states, flags, the clock list
 *   request.c                        handing work to service threads
 *   ioctl.c                          resolving ioctls retried through EAGAIN,
 *                                    the event lock (installs against reads)
 *   prefetch.c zap.c                 prefetch handles, the zapper thread
 *   evict.c                          a block leaving its region
 *   load.c                           a block entering its region
 *   events.c                         decoding userfaultfd messages
 *   service.c                        the service loop
 *   region.c pager.c                 the public calls
 */

/* Test only: the points where a test may hold a service thread, to
 * place a program's access in a race window.  kvp_test_hook is NULL but in
 * tests (tests/test_pager_race.c), which set it before opening a pager;
 * it is called on the service thread with the block's address. */
enum kvp_test_point {
	KVP_TEST_MOVED,	    /* install: moved in, not yet write-protected */
	KVP_TEST_UNPROTECT, /* write fault: marked dirty, not yet unprotected */
	KVP_TEST_READBACK,  /* install: protected, before its read-back */
	KVP_TEST_UNPROTECTED, /* write fault: unprotected, not yet counted
				 done */
	KVP_TEST_HOLE, /* fault on a dropped page: its zeros not yet in
			  (called with the page's address) */
	KVP_TEST_ZAP_CALL, /* the zapper, before its call (its first range) */
	KVP_TEST_CLEANED,  /* the zapper wrote a block it cleans, p->lock
			      not taken again yet (the block's address) */
	KVP_TEST_DROP_READ, /* a REMOVE or UNMAP read, not yet handled
			       (called with its start) */
	KVP_TEST_INSTALL,   /* a load, before it looks at its block's drops
			       and installs */
	KVP_TEST_PUT_BACK,  /* an eviction undone, before it looks at its
			       block's drops and puts the pages back */
	KVP_TEST_WRITE_BACK, /* a whole block's write-back, queued under
				p->lock (called with the buffer written) */
};
/* hidden: not a symbol of libkvpager.so (the tests link the archive) */
extern void (*kvp_test_hook)(enum kvp_test_point at, void *addr)
    __attribute__((visibility("hidden")));

/* Why a load starts. */
enum kvp_load_why { LOAD_FAULT, LOAD_PREFETCH, LOAD_READAHEAD };
/* Why an eviction was undone (kvp_blk_evict_aborted). */
enum kvp_evict_abort {
	ABORT_BUSY,	    /* the kernel would not give the pages up */
	ABORT_WRITE_FAILED, /* its write-back failed: the only copy is ours */
	ABORT_DISCARD,	    /* a discard could not detach it */
};

/* frames.c: the frame pool and the budget.  Under p->lock. */
int kvp_frames_init(struct kvp_pager *p);
void kvp_frames_fini(struct kvp_pager *p);
unsigned kvp_size_class(size_t bytes);
/* A slot for a load, holding pages or not; NULL when the budget is full. */
void *kvp_frame_get(struct kvp_pager *p, size_t bytes);
/* An empty slot to move a block's pages into (eviction): never fails but
 * for address space, NULL then. */
void *kvp_frame_empty_slot(struct kvp_pager *p, size_t bytes);
/* An empty slot for detaching a block with BLK_PAGES, and its return
 * (pages freed): a slot that took pages one by one keeps a page table,
 * and a huge page moved into it later would be split. */
void *kvp_frame_paged_slot(struct kvp_pager *p, size_t bytes);
void kvp_frame_put_paged(struct kvp_pager *p, void *slot, size_t bytes);
/* Give back a slot: @full if pages are present in it. */
void kvp_frame_put(struct kvp_pager *p, void *slot, size_t bytes, bool full);
/* Give back a slot whose pages must not become a frame: an eviction
 * undone (copied back, or there before: the move stopped on them), or a
 * copy-mode block's small pages once written (evict.c).  They are freed,
 * so that an empty slot never holds a page. */
void kvp_frame_put_undone(struct kvp_pager *p, void *slot, size_t bytes);
/* A block gave up its frame's bytes (evicted, dropped, forgotten). */
void kvp_frame_unuse(struct kvp_pager *p, size_t bytes);
/* kvp_frame_get past the budget, by at most kvp_overdraft_cap: for a
 * fault when every resident block is unwritable. */
void *kvp_frame_get_overdraft(struct kvp_pager *p, size_t bytes);
/* kvp_frame_get past the budget by at most this one block: a frame that
 * stands in for a block's pages, which are freed as soon as it holds
 * their bytes (evict.c's gather). */
void *kvp_frame_get_stand_in(struct kvp_pager *p, size_t bytes);
uint64_t kvp_overdraft_cap(const struct kvp_pager *p);
/* The frame arena's address space for a budget (frames.c says why). */
uint64_t kvp_arena_bytes(uint64_t budget);
/* Drop free pages down to @target bytes charged (returns bytes freed). */
uint64_t kvp_frames_shrink(struct kvp_pager *p, uint64_t target);
uint64_t kvp_budget(const struct kvp_pager *p);

/* stats.c */
uint64_t kvp_now_ns(void); /* CLOCK_MONOTONIC */
/* @ms from now on CLOCK_MONOTONIC, for pthread_cond_timedwait (the
 * pager's conditions use that clock). */
struct timespec kvp_deadline_ms(long ms);
void kvp_stats_snapshot(const struct kvp_astats *a, struct kvp_stats *out);
void kvp_stats_add(struct kvp_stats *sum, const struct kvp_stats *s);
void kvp_astats_fold(struct kvp_astats *into, const struct kvp_astats *a);

/* claims.c: a region's store range, held across pagers; -EBUSY where a
 * live region holds any of it.  Unclaim forgets @owner's claim. */
int kvp_store_claim(const struct kvp_store *st, uint64_t off, uint64_t len,
		    const void *owner);
void kvp_store_unclaim(const void *owner);

/* rtab.c, under p->lock. */
struct kvp_region *kvp_region_find(struct kvp_pager *p, uintptr_t addr);
int kvp_rtab_rebuild(struct kvp_pager *p);

/* core.c: block state and flag transitions (each one asserted), under
 * p->lock; the diagram at the top of core.c names them. */
uint64_t kvp_blk_index(const struct kvp_region *r, const struct kvp_block *b);
char *kvp_blk_addr(const struct kvp_region *r, uint64_t blk);
uint64_t kvp_blk_store_off(const struct kvp_region *r, uint64_t blk);
bool kvp_blk_sane(const struct kvp_region *r, const struct kvp_block *b);
struct kvp_op *kvp_op_new(enum kvp_op_kind kind, struct kvp_region *r,
			  uint64_t blk);
void kvp_op_free(struct kvp_op *op);
/* Set the bits of the pages [lo, hi) touches in @pages. */
void kvp_pages_set(uint64_t *pages, uint32_t lo, uint32_t hi);
/* The program dropped bytes [lo, hi) of @op's block while @op moves it
 * (under p->lock): remember them for kvp_op_zero_dropped. */
void kvp_op_note_drop(struct kvp_op *op, uint32_t lo, uint32_t hi);
/* Zero in @op's slot the bytes noted dropped and forget them; true if there
 * were any.  The slot must hold the block's pages (p->lock held, or the
 * caller owns the op) in bytes [@from, @to) of the op's window: those
 * outside are in the region (an install or a put-back under way, a move
 * stopped short), and their notes stay. */
bool kvp_op_zero_dropped(struct kvp_op *op, size_t from, size_t to);
/* The same for an install or a put-back under kvp_install_guard, which
 * let a reader in (kvp_uffd_unblock): what the program dropped of the
 * block meanwhile, noted or all of it (BLK_DROP), is zeroed in bytes
 * [@from, @to) of the slot before they go in.  Takes p->lock. */
void kvp_op_apply_drops(struct kvp_pager *p, struct kvp_op *op, size_t from,
			size_t to);
/* The clock list of RESIDENT blocks: add behind the hand, remove, and
 * put before the hand (a COLD hint: the next victim). */
void kvp_clock_add(struct kvp_pager *p, struct kvp_block *b);
void kvp_clock_del(struct kvp_pager *p, struct kvp_block *b);
void kvp_clock_cold(struct kvp_pager *p, struct kvp_block *b);
/* A new region's block: its data in the store, or nowhere yet. */
void kvp_blk_init(struct kvp_block *b, bool in_store);
/* Use marks: referenced now (clock bit, last_use); reference bit cleared
 * by the clock hand; a prefetched or read-ahead block used (a hit); a
 * fault joining a load in flight (true: it was read-ahead). */
void kvp_blk_touch(struct kvp_pager *p, struct kvp_block *b);
void kvp_blk_unref(struct kvp_block *b);
void kvp_blk_used(struct kvp_region *r, struct kvp_block *b);
bool kvp_blk_joined(struct kvp_region *r, struct kvp_block *b);
/* A prefetch joins a read-ahead load in flight: asked for now, so it is
 * installed once read, not staged (the prefetch would wait until a fault
 * or a drop). */
void kvp_blk_prefetch_joined(struct kvp_region *r, struct kvp_block *b);
/* Dirty bit: the first write to a resident block (a WP fault); written
 * while being evicted; dirty data given up (the pager closes). */
void kvp_blk_written(struct kvp_region *r, struct kvp_block *b);
/* A write to dirty window @win of a block resident in part, every page
 * of that window installed (full_win): that window dirty. */
void kvp_blk_written_window(struct kvp_region *r, struct kvp_block *b,
			    unsigned win);
/* Is a block resident in part dirtied window by window?  Not where the
 * region has no windows, nor once it is dirty beyond them (pages put back
 * writable, or dropped into): it is made whole before a write then. */
bool kvp_blk_keeps_windows(const struct kvp_region *r,
			   const struct kvp_block *b);
/* Writes a block resident in part back by its dirty windows (true), or
 * whole (false: whole, or dirty where no window says, made whole first). */
bool kvp_blk_dirty_windows(const struct kvp_block *b);
/* The next run of set bits in *@mask (cleared there): its first bit in
 * *first, its length returned; 0 when none is left. */
unsigned kvp_win_next_run(uint64_t *mask, unsigned *first);
/* A fault changes @b's page table after p->lock is let go (a write
 * fault lifts its protection, a hole's zeros go in): begun (counted in
 * the block and in its region's inflight, so that a flush and destroy
 * wait), done (true: none left). */
void kvp_blk_late_begin(struct kvp_region *r, struct kvp_block *b);
bool kvp_blk_late_done(struct kvp_region *r, struct kvp_block *b);
void kvp_blk_redirty(struct kvp_block *b);
void kvp_blk_abandon_dirty(struct kvp_block *b);
/* A fault waits for the block's transition; the waiters, taken once. */
void kvp_blk_wait(struct kvp_block *b);
/* A COLD hint: a resident block, unless pinned or held, goes first; a
 * LOADING one keeps it until it is installed. */
void kvp_blk_cold(struct kvp_pager *p, struct kvp_block *b);
bool kvp_blk_take_waiters(struct kvp_block *b);
/* The program's drops: all of a LOADING or EVICTING block (zeros when it
 * arrives or leaves); part of a RESIDENT one; unmapped (whole: forgotten;
 * part: never write-protected again); the data nowhere any more. */
void kvp_blk_drop_pending(struct kvp_block *b);
void kvp_blk_holes(struct kvp_block *b, bool unmapped);
/* The program dropped the @pages (one bit a page) of @b (resident, or on
 * its way), and their zap may not have come (a REMOVE just read): once
 * resident, no victim while they are still there (kvp_blk_zap_waits). */
void kvp_blk_zap_wait(struct kvp_region *r, struct kvp_block *b,
		      const uint64_t *pages);
/* Does @b still wait for the zap of what the program dropped of it (a
 * page of it still there, within kvp_zap_wait_ns)?  The pages gone wait no
 * more; once none does, BLK_ZAPWAIT goes. */
bool kvp_blk_zap_waits(struct kvp_region *r, struct kvp_block *b);
/* Bytes [@off, @off + @len) of @b filled but for the pages set in @kept
 * (NULL: none): those were missing, zapped if dropped, and wait no more. */
void kvp_blk_zap_filled(struct kvp_region *r, struct kvp_block *b,
			uint32_t off, uint32_t len, const uint64_t *kept);
/* The pages of @b waiting for their zap now, one bit each, into @pages
 * (KVP_BLOCK_PAGES_MAX bits; none: all clear). */
void kvp_blk_zap_waiting(struct kvp_region *r, const struct kvp_block *b,
			 uint64_t *pages);
/* How long a dropped page still there may be the zap's to come (1 s; a
 * test sets it). */
extern uint64_t kvp_zap_wait_ns __attribute__((visibility("hidden")));
void kvp_blk_unmapped(struct kvp_block *b, bool whole);
void kvp_blk_contents_gone(struct kvp_block *b);
/* Part of a LOADING block dropped: the load must finish, so that its zeros
 * reach the region; it is no read-ahead that may be given up any more. */
void kvp_blk_load_keep(struct kvp_block *b);
/* State changes. */
void kvp_blk_begin_load(struct kvp_region *r, struct kvp_block *b,
			struct kvp_op *op, enum kvp_load_why why);
/* A RESIDENT block gets more pages (fault-around, or made whole before a
 * write or a drop): LOADING again, its pages still mapped. */
void kvp_blk_begin_fill(struct kvp_region *r, struct kvp_block *b,
			struct kvp_op *op);
/* Bytes of frames a block's pages hold: the block, or the pages of a
 * BLK_PARTIAL one (also while a fill loads more). */
size_t kvp_blk_charge(const struct kvp_region *r, const struct kvp_block *b);
/* Installed: @whole, or @placed pages of a window; *grew receives the
 * bytes its charge grew by.  Returns true when the block was dropped while
 * loading: the caller discards it at once. */
bool kvp_blk_installed(struct kvp_region *r, struct kvp_block *b, bool dirty,
		       bool split, bool whole, uint32_t placed, size_t *grew);
void kvp_blk_load_failed(struct kvp_region *r, struct kvp_block *b);
void kvp_blk_load_dropped(struct kvp_region *r, struct kvp_block *b);
void kvp_blk_load_unmapped(struct kvp_region *r, struct kvp_block *b);
/* A fill (BLK_PARTIAL) of a block with dirty windows given up without
 * its install: RESIDENT again with the pages it had, dirty as it was (its
 * region is dying: destroy writes those windows). */
void kvp_blk_fill_undone(struct kvp_region *r, struct kvp_block *b);
void kvp_blk_begin_evict(struct kvp_region *r, struct kvp_block *b,
			 struct kvp_op *op);
void kvp_blk_evicted(struct kvp_region *r, struct kvp_block *b, bool stored);
void kvp_blk_evict_aborted(struct kvp_region *r, struct kvp_block *b,
			   enum kvp_evict_abort why);
/* A flush writes a held RESIDENT block from the region: clean before the
 * write (a write meanwhile dirties it again), then done (@err: -errno). */
void kvp_blk_write_begin(struct kvp_block *b);
void kvp_blk_write_done(struct kvp_region *r, struct kvp_block *b, int err);
/* The same for a block resident in part written by its dirty windows:
 * returns them (now clean); done puts @wins back on failure. */
uint64_t kvp_blk_write_windows_begin(struct kvp_block *b);
void kvp_blk_write_windows_done(struct kvp_region *r, struct kvp_block *b,
				uint64_t wins, int err);
/* Its write-back failed before; the store takes writes again: an ordinary
 * dirty block once more. */
void kvp_blk_write_retry(struct kvp_region *r, struct kvp_block *b);
void kvp_blk_forget(struct kvp_region *r, struct kvp_block *b);

/* request.c: a pager thread's start (kvp_pager_thread_begin's contract);
 * on the thread itself, no lock.  It blocks every signal. */
void kvp_thread_begin(struct kvp_pager *p, const char *name);
/* request.c: pthread_create of a pager thread, every signal blocked in it
 * from the start; a positive errno as pthread_create's. */
int kvp_thread_create(pthread_t *t, void *(*fn)(void *), void *arg);
/* request.c: work for the service threads.  Under p->lock. */
void kvp_service_request(struct kvp_pager *p, struct kvp_req *req);
/* Every service thread drops its queue on @store (its last region is
 * gone, the caller may destroy it next); waits for them. */
void kvp_service_forget_store(struct kvp_pager *p, struct kvp_store *store);
/* Wake a service thread (its eventfd); any lock or none. */
void kvp_service_poke(struct kvp_service *s);

/* ioctl.c: resolving ioctls on p->uffd, retried through EAGAIN. */
/*
 * An ioctl on p->uffd said EAGAIN with nothing done: the kernel refuses
 * the resolving ioctls while an event (REMOVE, UNMAP) waits to be read,
 * and the reader may be this very thread.  On a service thread, run the
 * reader it bound (the drops are handled now, the faults kept for the
 * loop); elsewhere, yield to the service threads.  Call it in the retry
 * loop.
 */
void kvp_uffd_unblock(struct kvp_pager *p);
/* p->evlock's write side for a read of events (@try: only if free);
 * false if not taken.  Not for a read nested in the retry of an ioctl
 * of the reader (kvp_evlock_nested): that goes on under the outer. */
bool kvp_evlock_read_events(struct kvp_pager *p, bool try);
void kvp_evlock_read_done(struct kvp_pager *p);
/* This thread holds the write side (it reads events). */
bool kvp_evlock_nested(void);
/* p->evlock's read side, around an install into a region from the look
 * at its block's noted drops (under p->lock, after this) to its last
 * ioctl; nests.  kvp_uffd_unblock lets go of it meanwhile: after each,
 * the drops are looked at again.  Never with p->lock held, and nothing
 * under it may fault on a region. */
void kvp_install_guard(struct kvp_pager *p);
void kvp_install_unguard(struct kvp_pager *p);
/* Bind this thread's reader for kvp_uffd_unblock (a service thread at
 * start): it reads and handles events, returns how many it read. */
void kvp_uffd_bind_reader(struct kvp_service *s,
			  size_t (*reader)(struct kvp_service *s));
/* UFFDIO_WRITEPROTECT (clearing wakes). */
int kvp_uffd_protect(struct kvp_pager *p, void *addr, size_t len, bool wp);
/* Clear write protection waking nobody: the caller wakes the waiters
 * once the block's state says what they will find. */
int kvp_uffd_unprotect_quiet(struct kvp_pager *p, void *addr, size_t len);
/* UFFDIO_POISON over the range's missing pages. */
void kvp_uffd_poison_range(struct kvp_pager *p, void *addr, size_t len);
/* A page of zeros into a hole of a resident block (or a wake-up, if a
 * page is there already). */
void kvp_uffd_fill_zeros(struct kvp_pager *p, char *page);

/* prefetch.c: prefetch handles, under p->lock. */
/* One block of @pf installed, failed (@failed) or dropped. */
void kvp_prefetch_block_done(struct kvp_pager *p, struct kvp_prefetch *pf,
			     bool failed);
/* Every block of @pf has been started (or skipped). */
void kvp_prefetch_all_started(struct kvp_prefetch *pf);

/* zap.c: the zapper thread. */
int kvp_zap_start(struct kvp_pager *p); /* 0, or -errno; none if no zap */
void kvp_zap_stop(struct kvp_pager *p);
/* Under p->lock: may this EVICTING-to-be block leave by a zap? */
bool kvp_zap_eligible(const struct kvp_pager *p, const struct kvp_region *r,
		      const struct kvp_block *b, bool dirty);
/* Does block @blk span several VMAs now, or lack one at its start
 * (PROCMAP_QUERY; false without it)?  The program split it. */
bool kvp_zap_split_now(const struct kvp_pager *p, const struct kvp_region *r,
		       uint64_t blk);
/* Under p->lock: a block the move refuses that no zap can take either
 * (holes, unmapped in part, no write protection): no victim. */
bool kvp_zap_stuck(const struct kvp_pager *p, const struct kvp_block *b);
/* Under p->lock: victim @b is dirty and refuses the move (BLK_NOMOVE):
 * true when the zapper takes it to write from the region (it stays
 * resident, held, and leaves by a zap once clean). */
bool kvp_zap_clean_first(struct kvp_pager *p, struct kvp_region *r,
			 struct kvp_block *b);
/* Under p->lock: victim @b, zap-eligible, leaves by a zap with @op (its
 * kind becomes OP_ZAP); false, nothing changed, when out of memory. */
bool kvp_zap_begin(struct kvp_pager *p, struct kvp_region *r,
		   struct kvp_block *b, struct kvp_op *op);
/* Under p->lock: queue a victim (already EVICTING, op->kind OP_ZAP). */
void kvp_zap_queue(struct kvp_pager *p, struct kvp_op *op);
/* Under p->lock: a REMOVE event covered [lo, hi) of a zapping block. */
void kvp_zap_seen(struct kvp_pager *p, struct kvp_op *op, uint32_t lo,
		  uint32_t hi);

/* evict.c: a block leaving.  Under p->lock unless said. */
/* The next victim (its region in *r), the hand moved past it, or NULL.
 * @take_prefetched: may take a prefetched, unused block when nothing
 * else is left (a load needs the frame); background eviction may not. */
struct kvp_block *kvp_clock_victim(struct kvp_pager *p, struct kvp_region **r,
				   bool take_prefetched);
/* Evict one block (takes and drops p->lock itself; called unlocked).
 * Returns 0, -EAGAIN if nothing could be evicted, or -errno. */
int kvp_evict_one(struct kvp_service *s, bool take_prefetched);
/* Evict an EVICTING block by moving its pages out (called unlocked; @op
 * is its op, a write-back or a zap the zapper could not do). */
int kvp_evict_move(struct kvp_service *s, struct kvp_op *op);
/* A write-back completed (called unlocked). */
void kvp_writeback_done(struct kvp_service *s, struct kvp_op *op);
/* Under p->lock: a write-back to @r's store ended with @err (0 or
 * -errno): starts, lengthens or ends the back-off, and says so on stderr
 * when writes start or stop failing. */
void kvp_writeback_result(struct kvp_region *r, int err);
/* Under p->lock: may blocks whose write-back failed be tried again now? */
bool kvp_writeback_retry_due(const struct kvp_pager *p);
/* Called unlocked: store runs of @unit bytes of block @blk (a bit of @wins
 * each: its dirty windows, or bit 0 for all of it) straight from the
 * region, each run one write; pages set in @drops (one bit a page, or
 * NULL) were dropped by the program and are written as zeros, never read.
 * Every other page of those runs must be mapped.  Counted in the region's
 * statistics; 0 or -errno. */
/* Copy @len bytes of our own memory from @from to @to through the kernel
 * (process_vm_readv): a page unmapped reads as zeros, never a SIGSEGV. */
void kvp_copy_own(char *to, const char *from, size_t len);
/* The same, all or nothing: false when a page did not read (unmapped,
 * or made inaccessible: PROT_NONE), the rest of @to then undefined. */
bool kvp_copy_own_all(char *to, const char *from, size_t len);
int kvp_store_windows(struct kvp_region *r, uint64_t blk, uint64_t wins,
		      uint32_t unit, const uint64_t *drops);
/* Under p->lock (dropped and retaken inside): drop a resident, unpinned
 * block's contents, its pages back to the pool. */
void kvp_discard_resident(struct kvp_region *r, uint64_t blk);

/* load.c: a block entering.  Under p->lock unless said. */
/* Start loading ABSENT block @blk; 0 or -ENOMEM. */
int kvp_load_start(struct kvp_service *s, struct kvp_region *r, uint64_t blk,
		   enum kvp_load_why why, struct kvp_prefetch *pf, bool write);
/* Fault-around: may a read fault on @b (ABSENT, or RESIDENT in part) load
 * a window of it rather than all of it? */
bool kvp_fault_around(const struct kvp_region *r, const struct kvp_block *b);
/* A read fault at byte @off of block @blk that kvp_fault_around allows:
 * load a window around it (sequential faults double the window); 0 or
 * -ENOMEM. */
int kvp_load_window(struct kvp_service *s, struct kvp_region *r, uint64_t blk,
		    uint32_t off);
/* Make RESIDENT block @blk whole: load what it lacks (a write to a block
 * resident in part, a drop in one); @dirty installs it writable and
 * dirty; @drops (or NULL): pages dropped, one bit each, to zero. */
int kvp_load_complete(struct kvp_service *s, struct kvp_region *r,
		      uint64_t blk, bool dirty, const uint64_t *drops);
/* The load on @s's want_frame to serve next: the first asked for, or
 * else the first (read-ahead), in the order they came. */
struct kvp_op *kvp_want_frame_next(const struct kvp_service *s);
/* Under p->lock: read-ahead on a want_frame was asked for (joined): it
 * now goes first. */
void kvp_want_frame_asked(struct kvp_op *op);
/* Under p->lock: take @op off @s's want_frame, wherever it is. */
void kvp_want_frame_remove(struct kvp_service *s, struct kvp_op *op);
/* Give a load its frame and queue its read (or zero fill). */
void kvp_load_arm(struct kvp_service *s, struct kvp_op *op, void *slot);
/* Give up a load that holds no frame (its region dying, its range
 * dropped): releases p->lock, wakes its waiters, frees @op. */
void kvp_load_abandon(struct kvp_service *s, struct kvp_op *op);
/* Under p->lock, which it releases: the load want_frame serves next,
 * which no eviction can serve (every resident block unwritable).  A
 * fault's load takes a frame from the overdraft; with the overdraft spent
 * too, it stays queued while one write-back is retried at once, and when
 * it still finds no frame its block is poisoned (SIGBUS).  A prefetch is
 * given up (read-ahead never comes here). */
void kvp_load_past_budget(struct kvp_service *s, struct kvp_op *op);
/* Its read is done (called unlocked): install, stage or poison. */
void kvp_load_done(struct kvp_service *s, struct kvp_op *op);
/* Install a loaded block and make it RESIDENT (called unlocked). */
void kvp_load_install(struct kvp_service *s, struct kvp_op *op);
/* A staged read-ahead block is wanted now (to s->ready) / dropped. */
void kvp_stage_release(struct kvp_service *s, struct kvp_op *op);
void kvp_stage_drop(struct kvp_pager *p, struct kvp_op *op);
/* Drop the staged block its stream needs last (false: none is staged, or
 * with @passed_only none its stream's faults have passed). */
bool kvp_stage_drop_farthest(struct kvp_pager *p, bool passed_only);
/* Drop the staged blocks the faults of their region have run past (below
 * its last fault): skipped, so wasted. */
void kvp_stage_drop_passed(struct kvp_pager *p);
/* Under p->lock: the bytes of staged read-ahead (dropped first when a
 * frame is needed: as good as free). */
uint64_t kvp_stage_bytes(const struct kvp_pager *p);

/* events.c: userfaultfd messages, read on a service thread. */
#define KVP_EVENT_BATCH 32 /* messages per read */
/* Read one batch and handle it (drops at once; faults too, unless
 * @defer_faults: then they wait in s->deferred, see kvp_uffd_unblock).
 * Returns the number of messages read. */
size_t kvp_events_read(struct kvp_service *s, bool defer_faults);
/* Read and handle until empty, deferring faults (the bound reader). */
size_t kvp_events_read_all_deferring(struct kvp_service *s);
/* Handle the faults deferred while an ioctl waited. */
void kvp_events_run_deferred(struct kvp_service *s);

/* service.c: the service threads. */
int kvp_service_start(struct kvp_pager *p);
void kvp_service_stop(struct kvp_pager *p);

/* Queue @op's I/O (or zero fill) for @s's submit stage.  Under p->lock. */
static inline void kvp_io_queue(struct kvp_service *s, struct kvp_op *op)
{
	op->next = s->to_submit;
	s->to_submit = op;
}

#define KVP_PAGE_BYTES 4096u

#define KVP_STAT_ADD(r, field, v)                                              \
	atomic_fetch_add_explicit(&(r)->st.field, (v), memory_order_relaxed)
#define KVP_STAT_SUB(r, field, v)                                              \
	atomic_fetch_sub_explicit(&(r)->st.field, (v), memory_order_relaxed)

#endif /* KVP_PAGER_I_H */
