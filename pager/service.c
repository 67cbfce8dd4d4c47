/*
 * service.c - the fault service threads.
 *
 * Each service thread polls the pager's userfaultfd, its request eventfd
 * and the completion descriptors of its store queues.  It reads faults in
 * batches (non-blocking: POLLIN may be stale once another thread took the
 * message), decides under p->lock what each one needs, submits every read
 * it gathered in one go, and installs blocks as their reads complete.  A
 * fault on a block already loading joins that load (one read for any
 * number of faults); the install wakes every thread waiting on the block.
 *
 * A thread owns the I/O it submits: its own queue per store, so no ring is
 * shared.  Loads that find the budget full wait in want_frame until an
 * eviction frees a frame; evictions run on the same thread, never waiting
 * on another.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "pager/pager_i.h"

#define MSG_BATCH  32
#define REAP_BATCH 64

/* The service thread running on this thread, if any (kvp_uffd_unblock). */
static _Thread_local struct kvp_service *this_service;

static size_t read_events(struct kvp_service *s, bool defer_faults);
static void submit_stage(struct kvp_service *s);

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct kvp_op *kvp_op_new(enum kvp_op_kind kind, struct kvp_region *r,
			  uint64_t blk)
{
	struct kvp_op *op = calloc(1, sizeof(*op));

	if (!op)
		return NULL;
	op->kind = kind;
	op->r = r;
	op->blk = blk;
	op->io.cookie = op;
	return op;
}

void kvp_op_note_drop(struct kvp_op *op, uint32_t lo, uint32_t hi)
{
	if (op->rm_end == 0) {
		op->rm_start = lo;
		op->rm_end = hi;
		return;
	}
	/* A second partial drop: zero the span of both (rare). */
	if (lo < op->rm_start)
		op->rm_start = lo;
	if (hi > op->rm_end)
		op->rm_end = hi;
}

bool kvp_op_zero_dropped(struct kvp_op *op)
{
	if (op->rm_end <= op->rm_start)
		return false;
	memset((char *)op->slot + op->rm_start, 0, op->rm_end - op->rm_start);
	op->rm_start = op->rm_end = 0;
	return true;
}

void kvp_op_free(struct kvp_op *op)
{
	if (!op)
		return;
	free(op->cover);
	while (op->pfs) {
		struct kvp_pf_ref *n = op->pfs->next;

		free(op->pfs);
		op->pfs = n;
	}
	free(op);
}

static void want_frame_push(struct kvp_service *s, struct kvp_op *op)
{
	op->next = NULL;
	*s->want_tail = op;
	s->want_tail = &op->next;
	s->nwant++;
}

/* Take the oldest load waiting for a frame off the queue. */
static struct kvp_op *want_frame_pop(struct kvp_service *s)
{
	struct kvp_op *op = s->want_frame;

	s->want_frame = op->next;
	if (!s->want_frame)
		s->want_tail = &s->want_frame;
	s->nwant--;
	return op;
}

/* Queue @op's I/O (or its zero fill) for the submit stage. */
static void queue_submit(struct kvp_service *s, struct kvp_op *op)
{
	op->next = s->to_submit;
	s->to_submit = op;
}

/* Under p->lock: give a load its frame and queue it, or park it. */
static void load_arm(struct kvp_service *s, struct kvp_op *op, void *slot)
{
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];

	op->slot = slot;
	op->zero = !(b->flags & BLK_IN_STORE);
	if (!op->zero) {
		op->io.op = KVP_IO_READ;
		op->io.buf = slot;
		op->io.len = r->block_bytes;
		op->io.off = kvp_blk_store_off(r, op->blk);
	}
	queue_submit(s, op);
}

int kvp_load_start(struct kvp_service *s, struct kvp_region *r, uint64_t blk,
		   enum kvp_load_why why, struct kvp_prefetch *pf, bool write)
{
	struct kvp_pager *p = r->p;
	struct kvp_block *b = &r->blocks[blk];
	struct kvp_op *op = kvp_op_new(OP_LOAD, r, blk);
	void *slot;

	if (!op)
		return -ENOMEM;
	if (pf) {
		op->pfs = malloc(sizeof(*op->pfs));
		if (!op->pfs) {
			free(op);
			return -ENOMEM;
		}
		op->pfs->pf = pf;
		op->pfs->next = NULL;
		pf->pending++;
	}
	op->dirty = write;
	b->owner = r;
	kvp_blk_begin_load(r, b, op);
	if (why == LOAD_PREFETCH)
		b->flags |= BLK_PREFETCHED;
	else if (why == LOAD_READAHEAD)
		b->flags |= BLK_READAHEAD;
	if (why == LOAD_FAULT)
		KVP_STAT_ADD(r, demand_faults_total, 1);
	else if (why == LOAD_PREFETCH)
		KVP_STAT_ADD(r, prefetch_issued_total, 1);
	else
		KVP_STAT_ADD(r, readahead_blocks_total, 1);
	if (!(b->flags & BLK_IN_STORE) && why == LOAD_FAULT)
		KVP_STAT_ADD(r, zero_fills_total, 1);
	slot = s->want_frame ? NULL : kvp_frame_get(p, r->block_bytes);
	if (slot)
		load_arm(s, op, slot);
	else
		want_frame_push(s, op);
	return 0;
}

/* Under p->lock: load ahead of a sequential run of faults at @blk. */
static void readahead(struct kvp_service *s, struct kvp_region *r, uint64_t blk,
		      bool sequential)
{
	struct kvp_pager *p = r->p;
	uint64_t max = p->cfg.readahead_bytes >> r->block_shift;
	uint64_t cap = (kvp_budget(p) / 4) >> r->block_shift;

	if (max > cap)
		max = cap;
	/* Sequential: the fault is past the last one and no further than
	 * the block after the window read ahead (a read-ahead block that
	 * was installed before it was touched takes no fault). */
	if (!sequential && !(blk > r->ra_last && blk <= r->ra_next)) {
		r->ra_window = 0;
		r->ra_last = blk;
		r->ra_next = blk + 1;
		return;
	}
	r->ra_last = blk;
	r->ra_next = blk + 1;
	if (max == 0)
		return;
	r->ra_window = r->ra_window ? r->ra_window * 2 : 2;
	if (r->ra_window > max)
		r->ra_window = (unsigned)max;
	for (uint64_t i = blk + 1; i <= blk + r->ra_window && i < r->nblocks;
	     i++) {
		struct kvp_block *b = &r->blocks[i];

		if (b->state != KVP_BLOCK_ABSENT ||
		    !(b->flags & BLK_IN_STORE) || b->pins)
			continue;
		if (kvp_load_start(s, r, i, LOAD_READAHEAD, NULL, false))
			break;
	}
	r->ra_next = blk + 1 + r->ra_window;
}

/* Mark a prefetched or read-ahead block used. */
static void mark_used(struct kvp_region *r, struct kvp_block *b)
{
	if (b->flags & BLK_PREFETCHED)
		KVP_STAT_ADD(r, prefetch_hit_total, 1);
	b->flags &= ~(BLK_PREFETCHED | BLK_READAHEAD);
}

static void fill_hole(struct kvp_pager *p, char *page)
{
	size_t done;
	int err;

	while ((err = kvp_uffd_copy(&p->uffd, page, p->zero_page,
				    KVP_PAGE_BYTES, false, false, &done)) ==
	       -EAGAIN)
		kvp_uffd_unblock(p);
	if (err == -EEXIST)
		(void)kvp_uffd_wake(&p->uffd, page, KVP_PAGE_BYTES);
}

static void handle_fault(struct kvp_service *s, const struct uffd_msg *m)
{
	struct kvp_pager *p = s->p;
	uint64_t flags = m->arg.pagefault.flags;
	char *page = (char *)(uintptr_t)(m->arg.pagefault.address &
					 ~(uint64_t)(KVP_PAGE_BYTES - 1));
	enum { NOTHING, WAKE_PAGE, UNPROTECT, HOLE, POISON } act = NOTHING;
	struct kvp_region *r;
	struct kvp_block *b;
	char *baddr = NULL;
	uint64_t blk;

	pthread_mutex_lock(&p->lock);
	r = kvp_region_find(p, (uintptr_t)page);
	if (!r || r->dying) {
		pthread_mutex_unlock(&p->lock);
		return;
	}
	blk = (uint64_t)(page - r->addr) >> r->block_shift;
	b = &r->blocks[blk];
	baddr = kvp_blk_addr(r, blk);

	if (flags & UFFD_PAGEFAULT_FLAG_WP) {
		switch (b->state) {
		case KVP_BLOCK_RESIDENT:
			if (!(b->flags & BLK_DIRTY))
				KVP_STAT_ADD(r, wp_faults_total, 1);
			b->flags |= BLK_DIRTY;
			mark_used(r, b);
			kvp_blk_touch(p, b);
			act = UNPROTECT;
			break;
		case KVP_BLOCK_EVICTING:
			b->flags |= BLK_WAITERS; /* woken when detached */
			break;
		default:
			act = WAKE_PAGE;
		}
		goto out;
	}

	switch (b->state) {
	case KVP_BLOCK_ABSENT:
		if (b->flags & BLK_GONE)
			break;
		if (kvp_load_start(s, r, blk, LOAD_FAULT, NULL,
				   flags & UFFD_PAGEFAULT_FLAG_WRITE))
			break; /* no memory: the fault is retried on wake */
		if (b->flags & BLK_IN_STORE)
			readahead(s, r, blk, false);
		break;
	case KVP_BLOCK_LOADING: {
		bool ra = b->flags & BLK_READAHEAD;

		KVP_STAT_ADD(r, coalesced_faults_total, 1);
		if (b->flags & BLK_PREFETCHED)
			KVP_STAT_ADD(r, prefetch_late_total, 1);
		b->flags &= ~(BLK_PREFETCHED | BLK_READAHEAD);
		if (flags & UFFD_PAGEFAULT_FLAG_WRITE)
			b->op->dirty = true;
		if (b->op->staged)
			kvp_stage_release(s, b->op);
		if (ra)
			readahead(s, r, blk, true);
		break;
	}
	case KVP_BLOCK_RESIDENT:
		mark_used(r, b);
		kvp_blk_touch(p, b);
		act = (b->flags & BLK_HOLES) ? HOLE : WAKE_PAGE;
		break;
	case KVP_BLOCK_EVICTING:
		b->flags |= BLK_WAITERS;
		break;
	case KVP_BLOCK_POISONED:
		act = POISON;
		break;
	}
out:
	pthread_mutex_unlock(&p->lock);
	switch (act) {
	case NOTHING:
		break;
	case WAKE_PAGE:
		(void)kvp_uffd_wake(&p->uffd, page, KVP_PAGE_BYTES);
		break;
	case UNPROTECT:
		(void)kvp_uffd_protect(p, baddr, r->block_bytes, false);
		break;
	case HOLE:
		fill_hole(p, page);
		break;
	case POISON:
		kvp_uffd_poison_range(p, page, KVP_PAGE_BYTES);
		break;
	}
}

/*
 * The program dropped [start, end): MADV_DONTNEED (REMOVE) or munmap
 * (UNMAP, @gone).  Dropped bytes read back as zeros and are never loaded
 * from the store again; unmapped blocks are forgotten.
 */
static void handle_drop(struct kvp_service *s, uint64_t start, uint64_t end,
			bool gone)
{
	struct kvp_pager *p = s->p;

	pthread_mutex_lock(&p->lock);
	for (struct kvp_region *r = p->regions; r; r = r->next) {
		uint64_t rs = (uintptr_t)r->addr, re = rs + r->size;
		uint64_t a = start > rs ? start : rs, e = end < re ? end : re;

		if (a >= e || r->dying)
			continue;
		for (uint64_t blk = (a - rs) >> r->block_shift;
		     blk < r->nblocks && (blk << r->block_shift) + rs < e;
		     blk++) {
			struct kvp_block *b = &r->blocks[blk];
			uint64_t bs = rs + (blk << r->block_shift);
			uint64_t be = bs + r->block_bytes;
			bool whole = a <= bs && e >= be;
			uint32_t lo = (uint32_t)((a > bs ? a : bs) - bs);
			uint32_t hi = (uint32_t)((e < be ? e : be) - bs);

			if (b->state != KVP_BLOCK_EVICTING ||
			    b->op->kind != OP_ZAP || gone)
				KVP_STAT_ADD(r, removed_bytes_total, hi - lo);
			switch (b->state) {
			case KVP_BLOCK_RESIDENT:
				if (whole) {
					if (b->flags & BLK_PREFETCHED)
						KVP_STAT_ADD(
						    r, prefetch_wasted_total,
						    1);
					kvp_blk_forget(r, b);
					kvp_frame_unuse(p, r->block_bytes);
				} else {
					b->flags |= BLK_DIRTY | BLK_HOLES;
					if (gone)
						b->flags |= BLK_SPLIT;
				}
				break;
			case KVP_BLOCK_LOADING:
				if (whole && b->op->staged) {
					kvp_stage_drop(p, b->op);
					b->flags &= ~BLK_IN_STORE;
				} else if (whole) {
					b->flags |= BLK_DROP;
				} else {
					kvp_op_note_drop(b->op, lo, hi);
				}
				if (!whole)
					b->op->dirty = true;
				break;
			case KVP_BLOCK_EVICTING:
				if (b->op->kind == OP_ZAP && !gone) {
					/* Ours, or the program's too: counted
					 * page by page (zap.c). */
					if (kvp_zap_seen(p, b->op, lo, hi))
						kvp_zap_unpark(p, b->op);
					continue;
				}
				/* Its pages are on their way to the store
				 * (in the slot, or about to be): the
				 * dropped part is zeroed there, and the
				 * block written (again) with it. */
				if (whole)
					b->flags |= BLK_DROP;
				else
					kvp_op_note_drop(b->op, lo, hi);
				break;
			case KVP_BLOCK_ABSENT:
			case KVP_BLOCK_POISONED:
				if (whole) {
					kvp_blk_forget(r, b);
				} else if (b->state == KVP_BLOCK_ABSENT &&
					   (b->flags & BLK_IN_STORE) && !gone) {
					/* Load it now, the dropped part
					 * zeroed, so that the rest keeps
					 * its data. */
					if (kvp_load_start(s, r, blk,
							   LOAD_FAULT, NULL,
							   true) == 0) {
						b->op->rm_start = lo;
						b->op->rm_end = hi;
					}
				}
				break;
			}
			if (gone && whole)
				b->flags |= BLK_GONE;
			else if (gone)
				b->flags |= BLK_SPLIT;
		}
	}
	pthread_mutex_unlock(&p->lock);
}

/* Keep a fault for later; false (handle it now) when out of memory. */
static bool defer_fault(struct kvp_service *s, const struct uffd_msg *m)
{
	if (s->ndeferred == s->deferred_cap) {
		size_t cap = s->deferred_cap ? 2 * s->deferred_cap : 64;
		struct uffd_msg *v = realloc(s->deferred, cap * sizeof(*v));

		if (!v)
			return false;
		s->deferred = v;
		s->deferred_cap = cap;
	}
	s->deferred[s->ndeferred++] = *m;
	return true;
}

/*
 * Read the userfaultfd until it is empty.  Drops are handled at once.
 * Faults are handled too, unless @defer_faults: then they wait in
 * s->deferred for the main loop (we are inside an ioctl's retry, see
 * kvp_uffd_unblock, and handling a fault may issue ioctls of its own).
 * Returns the number of messages read.
 */
static size_t read_events(struct kvp_service *s, bool defer_faults)
{
	struct kvp_pager *p = s->p;
	struct uffd_msg msgs[MSG_BATCH];
	size_t got = 0, total = 0;

	while (kvp_uffd_read(&p->uffd, msgs, MSG_BATCH, &got) == 0 && got) {
		total += got;
		for (size_t i = 0; i < got; i++) {
			const struct uffd_msg *m = &msgs[i];

			if (m->event == UFFD_EVENT_PAGEFAULT && defer_faults &&
			    defer_fault(s, m))
				continue;
			if (m->event == UFFD_EVENT_PAGEFAULT)
				handle_fault(s, m);
			else if (m->event == UFFD_EVENT_REMOVE)
				handle_drop(s, m->arg.remove.start,
					    m->arg.remove.end, false);
			else if (m->event == UFFD_EVENT_UNMAP)
				handle_drop(s, m->arg.remove.start,
					    m->arg.remove.end, true);
		}
		if (!defer_faults)
			submit_stage(s);
		if (got < MSG_BATCH)
			break;
	}
	return total;
}

/* Handle the faults read while an ioctl waited (see read_events). */
static void deferred_stage(struct kvp_service *s)
{
	struct uffd_msg *list = s->deferred;
	size_t n = s->ndeferred;

	if (!n)
		return;
	s->deferred = NULL;
	s->ndeferred = s->deferred_cap = 0;
	for (size_t i = 0; i < n; i++)
		handle_fault(s, &list[i]);
	free(list);
}

void kvp_uffd_unblock(struct kvp_pager *p)
{
	struct kvp_service *s = this_service;

	if (s && s->p == p && read_events(s, true))
		return;
	sched_yield(); /* another thread holds the event: let it run */
}

int kvp_uffd_protect(struct kvp_pager *p, void *addr, size_t len, bool wp)
{
	int err;

	while ((err = kvp_uffd_writeprotect(&p->uffd, addr, len, wp, false)) ==
	       -EAGAIN)
		kvp_uffd_unblock(p);
	return err;
}

void kvp_uffd_poison_range(struct kvp_pager *p, void *addr, size_t len)
{
	size_t off = 0;

	while (off < len) {
		size_t done = 0;
		int err = kvp_uffd_poison(&p->uffd, (char *)addr + off,
					  len - off, false, &done);

		off += done;
		if (err == -EEXIST || err == -ENOENT)
			off += KVP_PAGE_BYTES; /* mapped or unmapped: skip */
		else if (err == -EAGAIN && done == 0)
			kvp_uffd_unblock(p);
		else if (err && err != -EAGAIN)
			break;
	}
}

static struct kvp_squeue *queue_for(struct kvp_service *s,
				    struct kvp_store *store)
{
	struct kvp_squeue *q;

	for (unsigned i = 0; i < s->nqueues; i++)
		if (s->queues[i].store == store)
			return &s->queues[i];
	q = realloc(s->queues, (s->nqueues + 1) * sizeof(*q));
	if (!q)
		return NULL;
	s->queues = q;
	q = &s->queues[s->nqueues];
	q->store = store;
	q->inflight = 0;
	if (store->ops->queue_create(store, (unsigned)s->p->cfg.io_depth,
				     &q->q))
		return NULL;
	s->nqueues++;
	return q;
}

/*
 * Move a block's frame into its region.  Returns 0, or -ENOENT when none of
 * it is mapped any more.  A block the program unmapped in part (the range
 * crosses a hole, which the ioctls refuse as a whole) is installed page by
 * page, skipping the hole, and *split is set: its write protection cannot
 * be set over the hole, so the caller counts it dirty.
 */
static int install(struct kvp_pager *p, struct kvp_region *r, uint64_t blk,
		   void *slot, bool wp, bool *slot_full, bool *split)
{
	char *addr = kvp_blk_addr(r, blk);
	size_t len = r->block_bytes, off = 0, mapped = 0;
	bool skipped = false, pagewise = false;
	bool move = r->install == KVP_INSTALL_MOVE, copied = !move;
	int err = 0;

	*split = false;
	while (off < len) {
		size_t done = 0, n = pagewise ? KVP_PAGE_BYTES : len - off;

		if (move)
			err = kvp_uffd_move(&p->uffd, addr + off,
					    (char *)slot + off, n,
					    UFFDIO_MOVE_MODE_DONTWAKE, &done);
		else
			err = kvp_uffd_copy(&p->uffd, addr + off,
					    (char *)slot + off, n, wp, true,
					    &done);
		off += done;
		mapped += done;
		if (err == -EEXIST) {
			/* A page already there (a hole refilled): keep it. */
			off += KVP_PAGE_BYTES;
			mapped += KVP_PAGE_BYTES;
			skipped = true;
		} else if (err == -ENOENT && !pagewise) {
			pagewise = true;
		} else if (err == -ENOENT) {
			off += KVP_PAGE_BYTES; /* unmapped: nothing to fill */
			skipped = true;
			*split = true;
		} else if (err == -EAGAIN && done == 0) {
			kvp_uffd_unblock(p); /* an event to read first */
		} else if (err && err != -EAGAIN && move) {
			/* The kernel would not move these pages (a THP shared
			 * with a slot under I/O cannot be split: EBUSY):
			 * copy the rest, which always works. */
			move = false;
			copied = true;
		} else if (err && err != -EAGAIN) {
			return err; /* the block stays LOADING: retried */
		}
		if (!err && !pagewise)
			break;
		err = 0;
	}
	if (*split && mapped == 0)
		return -ENOENT;
	if (r->install == KVP_INSTALL_MOVE) {
		KVP_STAT_ADD(r, installs_move_total, 1);
		/* Moved pages arrive writable (and, after a fallback to
		 * copy, the part moved first). */
		if (wp && !*split)
			(void)kvp_uffd_protect(p, addr, len, true);
	} else {
		KVP_STAT_ADD(r, installs_copy_total, 1);
	}
	/* Pages left in the slot (skipped, or copied): not an empty slot.
	 * The caller wakes the waiters once the block is RESIDENT. */
	*slot_full = skipped || copied;
	return 0;
}

static void latency(struct kvp_region *r, uint64_t submit_ns)
{
	uint64_t us = (now_ns() - submit_ns) / 1000;
	unsigned i = 0;

	while (us > 1 && i < KVP_LATENCY_BUCKETS - 1) {
		us >>= 1;
		i++;
	}
	atomic_fetch_add_explicit(&r->st.io_latency_us[i], 1,
				  memory_order_relaxed);
}

static void finish_pfs(struct kvp_pager *p, struct kvp_op *op, bool failed)
{
	for (struct kvp_pf_ref *ref = op->pfs; ref; ref = ref->next)
		kvp_prefetch_block_done(p, ref->pf, failed);
}

/* Under p->lock: take a staged op off the pager's list. */
static void unstage(struct kvp_pager *p, struct kvp_op *op)
{
	for (struct kvp_op **t = &p->staged; *t; t = &(*t)->next)
		if (*t == op) {
			*t = op->next;
			break;
		}
	op->staged = false;
	op->next = NULL;
}

/* Under p->lock: hand a staged read-ahead block to a thread to install. */
void kvp_stage_release(struct kvp_service *s, struct kvp_op *op)
{
	unstage(s->p, op);
	op->r->blocks[op->blk].flags &= ~BLK_READAHEAD;
	op->next = s->ready;
	s->ready = op;
}

/* Under p->lock: forget a staged block, its frame back to the pool. */
void kvp_stage_drop(struct kvp_pager *p, struct kvp_op *op)
{
	struct kvp_region *r = op->r;

	unstage(p, op);
	if (r->blocks[op->blk].flags & BLK_READAHEAD)
		KVP_STAT_ADD(r, readahead_wasted_total, 1);
	kvp_blk_load_dropped(r, &r->blocks[op->blk]);
	finish_pfs(p, op, false);
	kvp_frame_unuse(p, r->block_bytes);
	kvp_frame_put(p, op->slot, r->block_bytes, true);
	pthread_cond_broadcast(&p->idle);
	kvp_op_free(op);
}

/* Install a loaded block and make it RESIDENT (p->lock not held). */
static void install_finish(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];
	size_t len = r->block_bytes;
	bool drop, dirty, full = true, split;
	int err;

	pthread_mutex_lock(&p->lock);
	drop = b->flags & BLK_DROP;
	if (drop)
		b->flags &= ~BLK_IN_STORE;
	dirty = op->dirty || !p->have_wp;
	pthread_mutex_unlock(&p->lock);

	if (op->zero || drop)
		memset(op->slot, 0, len);
	else
		(void)kvp_op_zero_dropped(op);
	err = install(p, r, op->blk, op->slot, !dirty, &full, &split);

	if (err && err != -ENOENT) {
		/* Could not map it (out of memory): keep it loading and try
		 * again on the next turn; the faulting threads still wait. */
		pthread_mutex_lock(&p->lock);
		op->next = s->ready;
		s->ready = op;
		pthread_mutex_unlock(&p->lock);
		return;
	}
	pthread_mutex_lock(&p->lock);
	if (split) {
		dirty = true;
		b->flags |= BLK_SPLIT;
	}
	if (err == -ENOENT) {
		b->flags |= BLK_GONE;
		kvp_blk_load_dropped(r, b);
		kvp_frame_unuse(p, len);
		full = true;
	} else {
		kvp_blk_installed(r, b, dirty);
	}
	finish_pfs(p, op, false);
	kvp_frame_put(p, op->slot, len, full);
	if (err == 0 && (b->flags & BLK_DROP)) {
		/* Discarded while it was being installed: drop it now.  The
		 * waiters are woken by the discard (they read zeros). */
		b->flags &= ~BLK_DROP;
		if (!b->pins && !b->holds)
			kvp_discard_resident(r, op->blk);
	}
	pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
	/* Only now: a woken thread finds the block RESIDENT. */
	(void)kvp_uffd_wake(&p->uffd, kvp_blk_addr(r, op->blk), len);
	kvp_op_free(op);
}

/*
 * A read (or zero fill) is done.  A read-ahead block nobody has asked for
 * yet is staged, not installed: it is installed when the program faults on
 * it (a fault with no I/O to wait for), so that the faulting thread is held
 * while the block becomes visible and write-protected.  Installing it while
 * the program runs would let a write slip in between UFFDIO_MOVE and
 * UFFDIO_WRITEPROTECT unseen.
 */
static void complete_load(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];
	size_t len = r->block_bytes;
	bool ok = op->zero || op->io.result == (int64_t)len;

	if (!op->zero) {
		latency(r, op->io.submit_ns);
		if (op->io.result > 0)
			KVP_STAT_ADD(r, bytes_read_total,
				     (uint64_t)op->io.result);
	}
	pthread_mutex_lock(&p->lock);
	if (r->dying || (b->flags & BLK_GONE)) {
		kvp_blk_load_dropped(r, b);
		finish_pfs(p, op, false);
		kvp_frame_unuse(p, len);
		kvp_frame_put(p, op->slot, len, true);
		pthread_cond_broadcast(&p->idle);
		pthread_mutex_unlock(&p->lock);
		(void)kvp_uffd_wake(&p->uffd, kvp_blk_addr(r, op->blk), len);
		kvp_op_free(op);
		return;
	}
	if (!ok && !(b->flags & BLK_DROP)) {
		KVP_STAT_ADD(r, read_errors_total, 1);
		kvp_blk_load_failed(r, b);
		finish_pfs(p, op, true);
		kvp_frame_unuse(p, len);
		kvp_frame_put(p, op->slot, len, true);
		pthread_cond_broadcast(&p->idle);
		pthread_mutex_unlock(&p->lock);
		/* SIGBUS for every access, now and later: never a hang. */
		if (p->have_poison)
			kvp_uffd_poison_range(p, kvp_blk_addr(r, op->blk),
					      len);
		kvp_op_free(op);
		return;
	}
	if ((b->flags & BLK_READAHEAD) && !(b->flags & BLK_DROP) &&
	    r->install == KVP_INSTALL_MOVE && p->have_wp) {
		op->staged = true;
		op->next = p->staged;
		p->staged = op;
		pthread_mutex_unlock(&p->lock);
		return;
	}
	pthread_mutex_unlock(&p->lock);
	install_finish(s, op);
}

/* Install the blocks handed over by faults and prefetches. */
static void ready_stage(struct kvp_service *s)
{
	struct kvp_pager *p = s->p;
	struct kvp_op *list;

	pthread_mutex_lock(&p->lock);
	list = s->ready;
	s->ready = NULL;
	pthread_mutex_unlock(&p->lock);
	while (list) {
		struct kvp_op *n = list->next;

		install_finish(s, list);
		list = n;
	}
}

static void complete_writeback(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];
	size_t len = r->block_bytes;
	bool ok = op->io.result == (int64_t)len, waiters;

	pthread_mutex_lock(&p->lock);
	if (!(b->flags & BLK_DROP) && kvp_op_zero_dropped(op) && ok) {
		/* The program dropped part of it while it was written: the
		 * store has the old bytes there.  Write it again, zeroed. */
		op->next = s->to_submit;
		s->to_submit = op;
		pthread_mutex_unlock(&p->lock);
		return;
	}
	p->leaving--;
	p->leaving_bytes -= len;
	if (!ok && !(b->flags & BLK_DROP)) {
		/* Keep the only copy: put the pages back, dirty, and never
		 * pick the block again until a flush succeeds. */
		KVP_STAT_ADD(r, write_errors_total, 1);
		pthread_mutex_unlock(&p->lock);
		bool back = kvp_put_back(p, kvp_blk_addr(r, op->blk),
					 op->slot, len);

		pthread_mutex_lock(&p->lock);
		b->flags |= BLK_WB_FAILED | BLK_DIRTY;
		kvp_blk_evict_aborted(r, b);
		if (back) /* else the data lives in the slot: keep it */
			kvp_frame_put_undone(p, op->slot, len);
		waiters = true;
	} else {
		if (ok) {
			KVP_STAT_ADD(r, bytes_written_total, len);
			KVP_STAT_ADD(r, evictions_dirty_total, 1);
		}
		waiters = b->flags & BLK_WAITERS;
		b->flags &= ~BLK_WAITERS;
		kvp_blk_evicted(r, b, ok);
		kvp_frame_unuse(p, len);
		kvp_frame_put(p, op->slot, len, true);
	}
	pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
	if (waiters)
		(void)kvp_uffd_wake(&p->uffd, kvp_blk_addr(r, op->blk), len);
	kvp_op_free(op);
}

/* Submit everything queued; zero fills complete here. */
static void submit_stage(struct kvp_service *s)
{
	struct kvp_pager *p = s->p;
	struct kvp_op *list, *keep = NULL, *zeros = NULL;

	pthread_mutex_lock(&p->lock);
	list = s->to_submit;
	s->to_submit = NULL;
	pthread_mutex_unlock(&p->lock);

	/* Oldest first: the list was built by pushing. */
	struct kvp_op *rev = NULL;

	while (list) {
		struct kvp_op *n = list->next;

		list->next = rev;
		rev = list;
		list = n;
	}
	while (rev) {
		struct kvp_op *op = rev, *batch[64];
		struct kvp_squeue *q;
		unsigned n = 0, max = (unsigned)p->cfg.io_batch;

		rev = rev->next;
		if (op->kind == OP_LOAD && op->zero) {
			op->next = zeros;
			zeros = op;
			continue;
		}
		q = queue_for(s, op->r->store);
		if (!q) {
			op->io.result = -ENOMEM;
			if (op->kind == OP_LOAD)
				complete_load(s, op);
			else
				complete_writeback(s, op);
			continue;
		}
		if (max > 64)
			max = 64;
		batch[n++] = op;
		/* Gather the next ones for the same store into one submit. */
		while (rev && n < max && rev->r->store == q->store &&
		       !(rev->kind == OP_LOAD && rev->zero)) {
			batch[n++] = rev;
			rev = rev->next;
		}
		struct kvp_io *ios[64];

		for (unsigned i = 0; i < n; i++)
			ios[i] = &batch[i]->io;
		int got = q->store->ops->submit(q->q, ios, n);

		if (got < 0)
			got = 0;
		q->inflight += (unsigned)got;
		for (unsigned i = (unsigned)got; i < n; i++) {
			/* The ring is full: retry after completions. */
			batch[i]->next = keep;
			keep = batch[i];
		}
	}
	if (keep) {
		pthread_mutex_lock(&p->lock);
		struct kvp_op **t = &keep;

		while (*t)
			t = &(*t)->next;
		*t = s->to_submit;
		s->to_submit = keep;
		pthread_mutex_unlock(&p->lock);
	}
	while (zeros) {
		struct kvp_op *n = zeros->next;

		complete_load(s, zeros);
		zeros = n;
	}
}

static unsigned reap_stage(struct kvp_service *s)
{
	unsigned total = 0;

	for (unsigned i = 0; i < s->nqueues; i++) {
		struct kvp_squeue *q = &s->queues[i];
		struct kvp_io *done[REAP_BATCH];
		int n;

		while (q->inflight &&
		       (n = q->store->ops->reap(q->q, done, REAP_BATCH,
						false)) > 0) {
			q->inflight -= (unsigned)n;
			total += (unsigned)n;
			for (int k = 0; k < n; k++) {
				struct kvp_op *op = done[k]->cookie;

				if (op->kind == OP_LOAD)
					complete_load(s, op);
				else
					complete_writeback(s, op);
			}
		}
	}
	return total;
}

/* Give waiting loads their frames, evicting as needed. */
static void frame_stage(struct kvp_service *s)
{
	struct kvp_pager *p = s->p;
	unsigned tries = 0;

	for (;;) {
		struct kvp_op *op;
		void *slot;

		pthread_mutex_lock(&p->lock);
		op = s->want_frame;
		if (!op) {
			pthread_mutex_unlock(&p->lock);
			return;
		}
		if (op->r->dying ||
		    (op->r->blocks[op->blk].flags & (BLK_GONE | BLK_DROP))) {
			want_frame_pop(s);
			kvp_blk_load_dropped(op->r, &op->r->blocks[op->blk]);
			finish_pfs(p, op, false);
			pthread_cond_broadcast(&p->idle);
			pthread_mutex_unlock(&p->lock);
			/* A fault that waited on it faults again (zeros). */
			(void)kvp_uffd_wake(&p->uffd,
					    kvp_blk_addr(op->r, op->blk),
					    op->r->block_bytes);
			kvp_op_free(op);
			continue;
		}
		slot = kvp_frame_get(p, op->r->block_bytes);
		if (slot) {
			want_frame_pop(s);
			load_arm(s, op, slot);
			pthread_mutex_unlock(&p->lock);
			continue;
		}
		if (p->staged) {
			/* Read ahead and never asked for: make room. */
			struct kvp_op *old = p->staged;

			while (old->next)
				old = old->next;
			kvp_stage_drop(p, old);
			pthread_mutex_unlock(&p->lock);
			continue;
		}
		/* Each write-back queued or in flight frees a frame when it
		 * is done: evict only for the loads they will not cover. */
		bool wait = p->leaving >= s->nwant;

		pthread_mutex_unlock(&p->lock);
		if (wait || ++tries > 64 || kvp_evict_one(s, true) == -EAGAIN)
			return;
	}
}

/*
 * Settle a block the zapper took (zap.c).  Pages counted twice were also
 * dropped by the program: all of them, and the block reads as zeros; some,
 * and it is loaded again at once with those zeroed, as a partial drop of
 * an absent block is.  A block the call did not finish is evicted by move.
 */
static void zap_settle(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];
	size_t len = r->block_bytes, pages = len / KVP_PAGE_BYTES;
	size_t dropped = 0, lo = pages, hi = 0;
	bool waiters;

	pthread_mutex_lock(&p->lock);
	if (op->zapped && op->uncovered && !r->dying) {
		/* Our events are read, not all handled yet (zap.c). */
		op->parked = true;
		pthread_mutex_unlock(&p->lock);
		return;
	}
	p->leaving--;
	p->leaving_bytes -= len;
	if (!op->zapped && !(b->flags & BLK_GONE)) {
		/* The move ignores op->cover: a drop by the program that
		 * raced this cut-short zap (it needs a partial munmap of the
		 * block too) is not seen, and that part reads the store. */
		op->kind = OP_WRITEBACK;
		op->slot = kvp_frame_empty_slot(p, len);
		pthread_mutex_unlock(&p->lock);
		if (op->slot) {
			(void)kvp_evict_move(s, op);
			return;
		}
		/* No address space left for a slot (the arena is 64 GiB
		 * past the budget): let the zapper try again. */
		pthread_mutex_lock(&p->lock);
		op->kind = OP_ZAP;
		p->leaving++;
		p->leaving_bytes += len;
		kvp_zap_queue(p, op);
		pthread_mutex_unlock(&p->lock);
		return;
	}
	for (size_t i = 0; i < pages; i++)
		if (op->cover[i] > 1) {
			dropped++;
			lo = i < lo ? i : lo;
			hi = i + 1;
		}
	if (dropped == pages)
		b->flags |= BLK_DROP;
	if (b->flags & BLK_PREFETCHED)
		KVP_STAT_ADD(r, prefetch_wasted_total, 1);
	if (!(b->flags & BLK_DROP))
		KVP_STAT_ADD(r, evictions_clean_total, 1);
	KVP_STAT_ADD(r, evictions_zap_total, 1);
	waiters = b->flags & BLK_WAITERS;
	b->flags &= ~BLK_WAITERS;
	kvp_blk_evicted(r, b, false);
	kvp_frame_unuse(p, len);
	if (dropped && dropped < pages && (b->flags & BLK_IN_STORE) &&
	    !r->dying &&
	    kvp_load_start(s, r, op->blk, LOAD_FAULT, NULL, true) == 0) {
		b->op->rm_start = (uint32_t)(lo * KVP_PAGE_BYTES);
		b->op->rm_end = (uint32_t)(hi * KVP_PAGE_BYTES);
	}
	pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
	if (waiters)
		(void)kvp_uffd_wake(&p->uffd, kvp_blk_addr(r, op->blk), len);
	kvp_op_free(op);
}

static void zap_stage(struct kvp_service *s)
{
	struct kvp_pager *p = s->p;
	struct kvp_op *list;

	pthread_mutex_lock(&p->lock);
	list = p->zap_done;
	p->zap_done = NULL;
	pthread_mutex_unlock(&p->lock);
	while (list) {
		struct kvp_op *n = list->next;

		zap_settle(s, list);
		list = n;
	}
}

/* Evict ahead of need once resident bytes pass the high watermark. */
static void watermark_stage(struct kvp_service *s)
{
	struct kvp_pager *p = s->p;
	uint64_t budget = kvp_budget(p);
	uint64_t high = budget * p->cfg.evict_high_watermark_percent / 100;
	uint64_t low = budget * p->cfg.evict_low_watermark_percent / 100;
	unsigned n = 0;

	/* Blocks whose write-back is queued are as good as gone. */
	pthread_mutex_lock(&p->lock);
	bool over = p->frames.in_use - p->leaving_bytes > high;

	pthread_mutex_unlock(&p->lock);
	if (!over)
		return;
	while (n++ < 256) {
		pthread_mutex_lock(&p->lock);
		bool done = p->frames.in_use - p->leaving_bytes <= low;

		pthread_mutex_unlock(&p->lock);
		if (done || kvp_evict_one(s, false) == -EAGAIN)
			break;
	}
}

/* Under p->lock: drop this thread's queue on @store (nothing in flight:
 * its regions are gone). */
static void forget_store(struct kvp_service *s, struct kvp_store *store)
{
	for (unsigned i = 0; i < s->nqueues; i++)
		if (s->queues[i].store == store) {
			store->ops->queue_destroy(s->queues[i].q);
			s->queues[i] = s->queues[--s->nqueues];
			break;
		}
	s->p->forget_acks++;
	pthread_cond_broadcast(&s->p->idle);
}

void kvp_service_forget_store(struct kvp_pager *p, struct kvp_store *store)
{
	unsigned want = p->nsvc;

	p->forget_acks = 0;
	for (unsigned i = 0; i < p->nsvc; i++) {
		struct kvp_req *req = calloc(1, sizeof(*req));

		if (!req) {
			want--; /* that thread keeps its queue: a leak */
			continue;
		}
		req->kind = REQ_FORGET_STORE;
		req->store = store;
		req->next = p->svc[i].reqs;
		p->svc[i].reqs = req;
		kvp_service_poke(&p->svc[i]);
	}
	while (p->forget_acks < want)
		pthread_cond_wait(&p->idle, &p->lock);
}

static bool take_requests(struct kvp_service *s)
{
	struct kvp_pager *p = s->p;
	struct kvp_req *list, *rev = NULL;
	uint64_t v;
	bool stop = false;

	if (read(s->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		return false;
	pthread_mutex_lock(&p->lock);
	list = s->reqs;
	s->reqs = NULL;
	while (list) {
		struct kvp_req *n = list->next;

		list->next = rev;
		rev = list;
		list = n;
	}
	while (rev) {
		struct kvp_req *q = rev;

		rev = rev->next;
		if (q->kind == REQ_STOP)
			stop = true;
		else if (q->kind == REQ_FORGET_STORE)
			forget_store(s, q->store);
		else
			kvp_prefetch_run(s, q->pf);
		free(q);
	}
	pthread_mutex_unlock(&p->lock);
	return stop;
}

static void *service_main(void *arg)
{
	struct kvp_service *s = arg;
	struct kvp_pager *p = s->p;
	struct pollfd *pfd = NULL;
	unsigned npfd = 0;
	char name[16];

	this_service = s;
	/* Named for top -H, perf and gdb. */
	snprintf(name, sizeof(name), "kvp-svc%u", (unsigned)(s - p->svc));
	(void)pthread_setname_np(pthread_self(), name);

	for (;;) {
		unsigned want = 2 + s->nqueues;
		int timeout = -1;

		if (want > npfd) {
			struct pollfd *n = realloc(pfd, want * sizeof(*pfd));

			if (n) {
				pfd = n;
				npfd = want;
			}
		}
		pfd[0] = (struct pollfd){ .fd = p->uffd.fd, .events = POLLIN };
		pfd[1] = (struct pollfd){ .fd = s->wake_fd, .events = POLLIN };
		for (unsigned i = 0; i < s->nqueues && 2 + i < npfd; i++)
			pfd[2 + i] = (struct pollfd){
				.fd = s->queues[i].store->ops->queue_fd(
				    s->queues[i].q),
				.events = POLLIN
			};
		if (s->ndeferred)
			timeout = 0;
		else if (s->want_frame || s->to_submit || s->ready)
			timeout = 1; /* waiting on another thread's work */
		if (s->stopping)
			timeout = 10;
		int n = poll(pfd, 2 + s->nqueues < npfd ? 2 + s->nqueues : npfd,
			     timeout);

		if (n < 0 && errno != EINTR)
			break;
		if (pfd[1].revents & POLLIN)
			if (take_requests(s))
				s->stopping = true;
		deferred_stage(s);
		if (pfd[0].revents & POLLIN)
			read_events(s, false);
		zap_stage(s);
		ready_stage(s);
		reap_stage(s);
		ready_stage(s);
		frame_stage(s);
		submit_stage(s);
		watermark_stage(s);
		submit_stage(s);
		if (s->stopping) {
			unsigned inflight = 0;

			for (unsigned i = 0; i < s->nqueues; i++)
				inflight += s->queues[i].inflight;
			if (!inflight && !s->to_submit && !s->ready)
				break;
		}
	}
	free(pfd);
	free(s->deferred);
	return NULL;
}

void kvp_service_request(struct kvp_pager *p, struct kvp_req *req)
{
	struct kvp_service *s;

	/* Under p->lock. */
	s = &p->svc[p->rr++ % p->nsvc];
	req->next = s->reqs;
	s->reqs = req;
	kvp_service_poke(s);
}

void kvp_service_poke(struct kvp_service *s)
{
	uint64_t one = 1;
	ssize_t n = write(s->wake_fd, &one, sizeof(one));

	(void)n; /* EAGAIN: the counter is saturated, a wake-up is pending */
}

int kvp_service_start(struct kvp_pager *p)
{
	unsigned n = (unsigned)p->cfg.service_threads;
	int err = 0;

	p->svc = calloc(n, sizeof(*p->svc));
	if (!p->svc)
		return -ENOMEM;
	for (unsigned i = 0; i < n; i++) {
		struct kvp_service *s = &p->svc[i];

		s->p = p;
		s->want_tail = &s->want_frame;
		s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (s->wake_fd < 0) {
			err = -errno;
			break;
		}
		err = -pthread_create(&s->thread, NULL, service_main, s);
		if (err) {
			close(s->wake_fd);
			break;
		}
		p->nsvc++;
	}
	if (err)
		kvp_service_stop(p);
	return err;
}

void kvp_service_stop(struct kvp_pager *p)
{
	for (unsigned i = 0; i < p->nsvc; i++) {
		struct kvp_req *req = calloc(1, sizeof(*req));
		struct kvp_service *s = &p->svc[i];

		pthread_mutex_lock(&p->lock);
		if (req) {
			req->kind = REQ_STOP;
			req->next = s->reqs;
			s->reqs = req;
		} else {
			s->stopping = true;
		}
		pthread_mutex_unlock(&p->lock);
		kvp_service_poke(s);
	}
	for (unsigned i = 0; i < p->nsvc; i++) {
		struct kvp_service *s = &p->svc[i];

		pthread_join(s->thread, NULL);
		for (unsigned k = 0; k < s->nqueues; k++)
			s->queues[k].store->ops->queue_destroy(s->queues[k].q);
		free(s->queues);
		close(s->wake_fd);
	}
	free(p->svc);
	p->svc = NULL;
	p->nsvc = 0;
}
