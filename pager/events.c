/*
 * events.c - what each userfaultfd message asks for, decided under p->lock.
 *
 * A missing fault on an ABSENT block starts a load (and read-ahead when the
 * faults run sequentially), or with fault-around a window of it when they
 * do not (load.c); on a LOADING block it joins that load, and on
 * a staged read-ahead block it has it installed now; on a RESIDENT block
 * (another thread's fault installed it) it only wakes the thread.  A
 * write-protect fault marks a block dirty and lifts the protection.  A
 * REMOVE or UNMAP event (the program's MADV_DONTNEED or munmap) drops the
 * bytes it covers, whatever state their block is in: they read back as
 * zeros and are never loaded from the store again.  The loads this starts
 * are submitted by the service loop (service.c) after each batch.
 */
#include <stdlib.h>

#include "pager/pager_i.h"

/* Under p->lock: the stream a fault at @blk continues (past its last fault,
 * no further than the block after its window: a read-ahead block installed
 * before it was touched takes no fault), or -1. */
static int ra_match(const struct kvp_region *r, uint64_t blk)
{
	for (int i = 0; i < KVP_RA_STREAMS; i++)
		if (r->ra[i].seen && blk > r->ra[i].last &&
		    blk <= r->ra[i].next)
			return i;
	return -1;
}

/* Under p->lock: a fault at @blk that may begin a run: in its own stream's
 * slot, or in the one seen least recently. */
static int ra_begin(struct kvp_region *r, uint64_t blk)
{
	int old = 0;

	for (int i = 0; i < KVP_RA_STREAMS; i++) {
		if (r->ra[i].seen && r->ra[i].last == blk)
			return i;
		if (r->ra[i].seen < r->ra[old].seen)
			old = i;
	}
	r->ra[old] = (struct kvp_ra_stream){ .last = blk,
					     .next = blk + 1,
					     .seen = ++r->ra_tick };
	return old;
}

/* Streams reading ahead, seen within the last faults: they share the
 * read-ahead cap.  (Not the states random faults take, which never read
 * ahead: with sixteen, a stream among random faults got none.) */
static unsigned ra_active(const struct kvp_region *r)
{
	unsigned n = 0;

	for (int i = 0; i < KVP_RA_STREAMS; i++)
		n += r->ra[i].seen && r->ra[i].window &&
		     r->ra[i].seen + 64 > r->ra_tick;
	return n ? n : 1;
}

/*
 * Under p->lock: load ahead of a sequential run of faults at @blk.
 *
 * A fault on an absent block just past a stream's last one (within the
 * window read ahead) starts a window of read-ahead after it; a fault on a
 * staged read-ahead block of stream @slot (-1: a demand fault) slides its
 * window along.  The window doubles only when the reader reaches its
 * marker, the last block of the window it grew to, so once per window
 * consumed (as the kernel's read-ahead ramps), never once per block used:
 * a short ascending run of blocks (a predictor's chosen blocks) reads at
 * most a small window it does not use.  Streams share a quarter of the
 * budget.
 */
static void readahead(struct kvp_service *s, struct kvp_region *r, uint64_t blk,
		      int slot)
{
	struct kvp_pager *p = r->p;
	uint64_t max = p->cfg.readahead_bytes >> r->block_shift;
	uint64_t cap = (kvp_budget(p) / 4 / ra_active(r)) >> r->block_shift;
	struct kvp_ra_stream *ra;

	if (max > cap)
		max = cap;
	max = r->ra_shrink < 63 ? max >> r->ra_shrink : 0;
	if (slot < 0)
		slot = ra_match(r, blk);
	if (slot < 0) {
		(void)ra_begin(r, blk);
		return;
	}
	ra = &r->ra[slot];
	ra->last = blk;
	ra->next = blk + 1;
	ra->seen = ++r->ra_tick;
	if (max == 0 && r->ra_shrink) {
		/* Shrunk to none by waste, and the faults run on: try a
		 * little again. */
		r->ra_shrink--;
		return;
	}
	if (max == 0)
		return;
	if (!ra->window || blk >= ra->mark) {
		ra->window = ra->window ? ra->window * 2 : 2;
		if (ra->window > max)
			ra->window = (unsigned)max;
		ra->mark = blk + ra->window;
	} else if (ra->window > max) {
		ra->window = (unsigned)max; /* shrunk meanwhile */
	}
	for (uint64_t i = blk + 1; i <= blk + ra->window && i < r->nblocks;
	     i++) {
		struct kvp_block *b = &r->blocks[i];

		if (b->state != KVP_BLOCK_ABSENT ||
		    !(b->flags & BLK_IN_STORE) || b->pins || b->late)
			continue;
		if (kvp_load_start(s, r, i, LOAD_READAHEAD, NULL, false))
			break;
		b->op->ra_slot = (uint8_t)slot;
	}
	ra->next = blk + 1 + ra->window;
}

/* Under p->lock: is @b resident whole, or being loaded whole? */
static bool loaded_whole(const struct kvp_region *r, const struct kvp_block *b)
{
	if (b->state == KVP_BLOCK_RESIDENT)
		return !(b->flags & BLK_PARTIAL);
	return b->state == KVP_BLOCK_LOADING && b->op->win_len == r->block_bytes;
}

/* Under p->lock: is a fault at byte @off of ABSENT block @blk part of a
 * run, to be loaded whole?  At the block's start (within the fault-around
 * window): when the faults go on from the last one (readahead's test), or
 * from a block loaded whole (a stream of another thread, whose faults
 * interleave).  Past it, only where they go on from a stream under way:
 * reading ahead, or its last block loaded whole (a reader that enters
 * each block at its end, or whose threads share each block).  A random
 * fault on the block after a recent one, which its window alone holds,
 * is none: that would load 2 MiB for 4 KiB, the more often the more
 * streams are followed. */
static bool run_fault(const struct kvp_region *r, uint64_t blk, uint32_t off)
{
	int i = ra_match(r, blk);

	if (off >= r->p->cfg.fault_around_bytes)
		return i >= 0 &&
		       (r->ra[i].window ||
			loaded_whole(r, &r->blocks[r->ra[i].last]));
	return i >= 0 || (blk && loaded_whole(r, &r->blocks[blk - 1]));
}

/* A fault's late change to block @b (at @baddr, @blen bytes) is made.  A
 * block dropped meanwhile may be loaded now: its faults are woken whether
 * or not a wait is marked (a second drop clears the mark; a woken thread
 * only faults again). */
static void late_done(struct kvp_pager *p, struct kvp_region *r,
		      struct kvp_block *b, char *baddr, size_t blen)
{
	bool wake = false;

	pthread_mutex_lock(&p->lock);
	if (kvp_blk_late_done(r, b)) {
		pthread_cond_broadcast(&p->idle);
		wake = b->state == KVP_BLOCK_ABSENT;
		if (wake)
			(void)kvp_blk_take_waiters(b);
	}
	pthread_mutex_unlock(&p->lock);
	if (wake)
		(void)kvp_uffd_wake(&p->uffd, baddr, blen);
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
	char *baddr = NULL, *uaddr = NULL;
	size_t ulen = 0, blen;
	uint64_t blk;

	pthread_mutex_lock(&p->lock);
	r = kvp_region_find(p, (uintptr_t)page);
	if (!r) {
		pthread_mutex_unlock(&p->lock);
		return;
	}
	blk = (uint64_t)(page - r->addr) >> r->block_shift;
	b = &r->blocks[blk];
	baddr = kvp_blk_addr(r, blk);
	blen = r->block_bytes; /* r may go once the lock is released */
	if (b->state == KVP_BLOCK_LOADING && b->op->verifying &&
	    !(flags & UFFD_PAGEFAULT_FLAG_WP)) {
		/* Moved in whole and being read back (load.c): a page
		 * missing now was dropped by the program (and zapped).
		 * Served in a dying region too: its destroy waits for this
		 * load. */
		if (!kvp_mem_page_resident(page))
			kvp_blk_zap_filled(r, b, (uint32_t)(page - baddr),
					   KVP_PAGE_BYTES, NULL);
		kvp_blk_late_begin(r, b);
		act = HOLE;
		goto out;
	}
	if (r->dying) {
		pthread_mutex_unlock(&p->lock);
		return;
	}

	if (flags & UFFD_PAGEFAULT_FLAG_WP) {
		switch (b->state) {
		case KVP_BLOCK_RESIDENT: {
			uint32_t off = (uint32_t)(page - baddr);
			unsigned win = r->win_bytes ? off / r->win_bytes : 0;

			/* Resident in part: the window written is dirty, if
			 * every page of it is there (else they are loaded
			 * and the write faults again); without windows,
			 * whole first, then dirty (with no memory for that,
			 * it faults again). */
			if (kvp_blk_keeps_windows(r, b) &&
			    ((b->full_win >> win) & 1)) {
				kvp_blk_written_window(r, b, win);
				kvp_blk_used(r, b);
				kvp_blk_touch(p, b);
				kvp_blk_late_begin(r, b);
				uaddr = baddr + (size_t)win * r->win_bytes;
				ulen = r->win_bytes;
				act = UNPROTECT;
				break;
			}
			if (kvp_blk_keeps_windows(r, b)) {
				if (kvp_load_window(s, r, blk, off))
					act = WAKE_PAGE;
				break;
			}
			if (b->flags & BLK_PARTIAL) {
				if (kvp_load_complete(s, r, blk, true, NULL))
					act = WAKE_PAGE;
				break;
			}
			kvp_blk_written(r, b);
			kvp_blk_used(r, b);
			kvp_blk_touch(p, b);
			kvp_blk_late_begin(r, b);
			act = UNPROTECT;
			break;
		}
		case KVP_BLOCK_EVICTING:
			kvp_blk_wait(b); /* woken when detached */
			break;
		case KVP_BLOCK_LOADING:
			/* Resident in part and loading more: the writer is
			 * woken when it is installed and faults again (its
			 * window dirty then); without windows it is made
			 * whole and dirty when installed. */
			if (b->flags & BLK_PARTIAL) {
				if (!kvp_blk_keeps_windows(r, b))
					b->op->dirty = true;
				kvp_blk_wait(b);
			} else if (b->op->verifying) {
				/* Moved in, protected and being read back:
				 * woken once it is RESIDENT, where the write
				 * faults again (not a fault/wake spin). */
				kvp_blk_wait(b);
			} else {
				act = WAKE_PAGE; /* stale: it faults again */
			}
			break;
		case KVP_BLOCK_POISONED:
			/* A page a failed fill left: nothing of the block is
			 * ever written back, the write may go on (counted as
			 * a RESIDENT block's: a drop meanwhile must not let
			 * it be loaded again before that is done).  Dirty:
			 * a flush says those bytes are not stored. */
			b->flags |= BLK_DIRTY;
			kvp_blk_late_begin(r, b);
			act = UNPROTECT;
			break;
		default:
			act = WAKE_PAGE;
		}
		goto out;
	}

	switch (b->state) {
	case KVP_BLOCK_ABSENT:
		if (b->flags & BLK_GONE) {
			/* Unmapped before its fault was handled (a fault and
			 * the UNMAP read in one batch, the drop first): woken,
			 * it faults again and finds nothing there. */
			act = WAKE_PAGE;
			break;
		}
		if (b->late) {
			/* Dropped while a fault of its residency still
			 * changes its pages: loaded now, the new copy's
			 * protection would be lifted (and the writes after
			 * it lost), or a hole's zeros land on it.  Woken
			 * once that is done. */
			kvp_blk_wait(b);
			break;
		}
		/* A write too, where dirty windows are kept: the window
		 * goes in write-protected, and the write faults again. */
		if ((!(flags & UFFD_PAGEFAULT_FLAG_WRITE) || r->win_bytes) &&
		    kvp_fault_around(r, b) &&
		    !run_fault(r, blk, (uint32_t)(page - baddr))) {
			/* Not a run: a window around the fault. */
			(void)ra_begin(r, blk);
			(void)kvp_load_window(s, r, blk,
					      (uint32_t)(page - baddr));
			break;
		}
		if (kvp_load_start(s, r, blk, LOAD_FAULT, NULL,
				   flags & UFFD_PAGEFAULT_FLAG_WRITE))
			break; /* no memory: the fault is retried on wake */
		if (b->flags & BLK_IN_STORE)
			readahead(s, r, blk, -1);
		break;
	case KVP_BLOCK_LOADING: {
		bool ra;
		int slot = b->op->ra_slot;

		ra = kvp_blk_joined(r, b);

		/* A window's write faults again once it is in (its window
		 * dirty then), where dirty windows are kept. */
		if ((flags & UFFD_PAGEFAULT_FLAG_WRITE) &&
		    (b->op->win_len == r->block_bytes || !r->win_bytes))
			b->op->dirty = true;
		if (b->op->staged)
			kvp_stage_release(s, b->op);
		if (ra)
			readahead(s, r, blk, slot);
		break;
	}
	case KVP_BLOCK_RESIDENT:
		kvp_blk_used(r, b);
		kvp_blk_touch(p, b);
		if (b->flags & BLK_PARTIAL) {
			/* A page it lacks (or one a fill placed meanwhile:
			 * the window keeps it). */
			(void)ra_begin(r, blk);
			if ((flags & UFFD_PAGEFAULT_FLAG_WRITE) &&
			    !kvp_blk_keeps_windows(r, b)
				? kvp_load_complete(s, r, blk, true, NULL) == 0
				: kvp_load_window(s, r, blk,
						  (uint32_t)(page - baddr)) ==
				      0)
				break;
			act = WAKE_PAGE; /* no memory: it faults again */
			break;
		}
		/* A page missing from a whole block: one the program
		 * dropped (a hole), or a fault from before the install read
		 * late (the page is there: woken).  A drop whose pages the
		 * kernel zapped after a fill had placed them leaves the first
		 * kind without BLK_HOLES: without this, a fault/wake spin. */
		if (!(b->flags & BLK_HOLES) && !kvp_mem_page_resident(page))
			kvp_blk_holes(b, false);
		if (b->flags & BLK_HOLES) {
			/* Missing: its zap came (kvp_blk_zap_wait). */
			if ((b->flags & BLK_ZAPWAIT) &&
			    !kvp_mem_page_resident(page))
				kvp_blk_zap_filled(r, b,
						   (uint32_t)(page - baddr),
						   KVP_PAGE_BYTES, NULL);
			kvp_blk_late_begin(r, b);
			act = HOLE;
		} else {
			act = WAKE_PAGE;
		}
		break;
	case KVP_BLOCK_EVICTING:
		kvp_blk_wait(b);
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
		/* The block, or the window written of one resident in
		 * part.  A flush waits for it (kvp_blk_late_begin):
		 * its protection must not be undone by this one. */
		if (kvp_test_hook)
			kvp_test_hook(KVP_TEST_UNPROTECT, uaddr ? uaddr : baddr);
		(void)kvp_uffd_protect(p, uaddr ? uaddr : baddr,
				       uaddr ? ulen : blen, false);
		if (kvp_test_hook)
			kvp_test_hook(KVP_TEST_UNPROTECTED, baddr);
		late_done(p, r, b, baddr, blen);
		break;
	case HOLE:
		/* Counted (kvp_blk_late_begin) until they are in: zeros
		 * that landed after the block left would stay in its range,
		 * and its next load keep them (a page already there) over
		 * the store's bytes. */
		if (kvp_test_hook)
			kvp_test_hook(KVP_TEST_HOLE, page);
		kvp_uffd_fill_zeros(p, page);
		late_done(p, r, b, baddr, blen);
		break;
	case POISON:
		kvp_uffd_poison_range(p, page, KVP_PAGE_BYTES);
		break;
	}
}

/* Under p->lock: the program dropped [lo, hi) of a block resident in part:
 * the pages it lacks there are zeros now, not the store's, and a block
 * resident in part is always clean: load the rest, that part zeroed, and
 * it is whole and dirty. */
static int drop_into_partial(struct kvp_service *s, struct kvp_region *r,
			     uint64_t blk, uint32_t lo, uint32_t hi)
{
	uint64_t drops[KVP_BLOCK_PAGES_MAX / 64] = { 0 };

	kvp_pages_set(drops, lo, hi);
	return kvp_load_complete(s, r, blk, true, drops);
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
			/* Its pages still there, to be zapped yet: placed
			 * before the read (a load's, or a move's that stopped
			 * short), or resident. */
			if (!whole && !gone &&
			    (b->state == KVP_BLOCK_RESIDENT ||
			     b->state == KVP_BLOCK_LOADING ||
			     (b->state == KVP_BLOCK_EVICTING &&
			      b->op->kind != OP_ZAP))) {
				uint64_t pages[KVP_BLOCK_PAGES_MAX / 64] = {
					0
				};

				kvp_pages_set(pages, lo, hi);
				kvp_blk_zap_wait(r, b, pages);
			}
			switch (b->state) {
			case KVP_BLOCK_RESIDENT:
				if (whole) {
					if (b->flags & BLK_PREFETCHED)
						KVP_STAT_ADD(
						    r, prefetch_wasted_total,
						    1);
					kvp_frame_unuse(p,
							kvp_blk_charge(r, b));
					kvp_blk_forget(r, b);
				} else if ((b->flags & BLK_PARTIAL) &&
					   drop_into_partial(s, r, blk, lo,
							     hi) == 0) {
					/* Loading the rest now. */
				} else {
					kvp_blk_holes(b, gone);
				}
				break;
			case KVP_BLOCK_LOADING:
				if (whole && b->op->staged) {
					kvp_stage_drop(p, b->op);
					kvp_blk_contents_gone(b);
				} else if (whole) {
					kvp_blk_drop_pending(b);
				} else {
					/* The zeros must reach the region:
					 * a load given up (no frame, or
					 * staged and dropped) would forget
					 * them, and the store's data would
					 * come back. */
					kvp_op_note_drop(b->op, lo, hi);
					b->op->dirty = true;
					kvp_blk_load_keep(b);
					if (b->op->staged)
						kvp_stage_release(s, b->op);
				}
				break;
			case KVP_BLOCK_EVICTING:
				if (b->op->kind == OP_ZAP && !gone) {
					/* Ours, or the program's too: counted
					 * page by page (zap.c). */
					kvp_zap_seen(p, b->op, lo, hi);
					continue;
				}
				/* Its pages are on their way to the store
				 * (in the slot, or about to be): the
				 * dropped part is zeroed there, and the
				 * block written (again) with it. */
				if (whole)
					kvp_blk_drop_pending(b);
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
						kvp_op_note_drop(b->op, lo,
								 hi);
					}
				}
				break;
			}
			if (gone)
				kvp_blk_unmapped(b, whole);
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
 * From a read until the drops it read are handled, no other thread reads:
 * madvise and munmap return once their REMOVE or UNMAP is read, not
 * handled, so the program's next fault on the range it dropped may already
 * be queued.  Read and handled by a second service thread before the drop,
 * it loaded the store's bytes where the program must read zeros.  The
 * faults read are handled after the drops of their batch and the lock: a
 * fault's handling may wait (ioctls), and the other thread reads meanwhile.
 * (A fault read before a drop of its range, handled after it, is an access
 * that ends after the drop: it reads what the drop left.)  Installs wait
 * meanwhile (kvp_install_guard, ioctl.c).  A read nested in
 * an ioctl's retry (ioctl.c) that finds another thread reading returns
 * nothing: that thread reads the event.
 */
size_t kvp_events_read(struct kvp_service *s, bool defer_faults)
{
	struct kvp_pager *p = s->p;
	struct uffd_msg msgs[KVP_EVENT_BATCH];
	size_t got = 0, nf = 0;
	bool outer = !kvp_evlock_nested();

	if (outer && !kvp_evlock_read_events(p, defer_faults))
		return 0;
	if (kvp_uffd_read(&p->uffd, msgs, KVP_EVENT_BATCH, &got) != 0)
		got = 0;
	for (size_t i = 0; i < got; i++) {
		const struct uffd_msg *m = &msgs[i];

		if (m->event == UFFD_EVENT_PAGEFAULT) {
			msgs[nf++] = *m; /* in order, after the drops */
			continue;
		}
		if (kvp_test_hook)
			kvp_test_hook(KVP_TEST_DROP_READ,
				      (void *)(uintptr_t)m->arg.remove.start);
		if (m->event == UFFD_EVENT_REMOVE)
			handle_drop(s, m->arg.remove.start, m->arg.remove.end,
				    false);
		else if (m->event == UFFD_EVENT_UNMAP)
			handle_drop(s, m->arg.remove.start, m->arg.remove.end,
				    true);
	}
	if (outer)
		kvp_evlock_read_done(p);
	for (size_t i = 0; i < nf; i++) {
		const struct uffd_msg *m = &msgs[i];

		if (defer_faults && defer_fault(s, m))
			continue;
		handle_fault(s, m);
	}
	return got;
}

void kvp_events_run_deferred(struct kvp_service *s)
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

/* The reader kvp_uffd_unblock runs on a service thread (ioctl.c). */
size_t kvp_events_read_all_deferring(struct kvp_service *s)
{
	size_t n, total = 0;

	while ((n = kvp_events_read(s, true)) != 0) {
		total += n;
		if (n < KVP_EVENT_BATCH)
			break;
	}
	return total;
}
