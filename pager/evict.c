/*
 * evict.c - which block leaves, and how it leaves.
 *
 * Policy: CLOCK over every resident block of the pager, in install order
 * (the list is core.c's).  A block's reference bit is set when it is
 * installed, faulted on, written, pinned or asked for again by a prefetch;
 * the hand clears it and takes the first block without it.  Active blocks
 * (the working set, core.c) and prefetched ones not used yet go last, and
 * never to evict ahead of need (the watermark) while the charge is within
 * the budget.  Pinned blocks, blocks held by a flush or a peek, blocks
 * whose write-back failed (their data exists only in RAM) and blocks of a
 * region being destroyed are never taken.  A COLD hint
 * puts a block just before the hand, so it goes next.
 *
 * Mechanism: a victim's pages are moved (UFFDIO_MOVE, through the landing context)
 * from the region into an empty frame slot.  That detaches them
 * atomically: a write that lands before the move is in the frame and is
 * written back, a write after it faults on a missing page and waits for
 * the block to be loaded again.  It also recycles the pages as the next
 * frame and, unlike MADV_DONTNEED, raises no UFFD_EVENT_REMOVE.  Clean
 * blocks of copy-mode regions are dropped instead, in batches, by the
 * zapper (zap.c): the store holds their data, and a batch costs one TLB
 * flush where a move costs one per page.  A dirty block's frame stays with
 * it until its write-back is done (kvp_writeback_done); a write-back that
 * fails puts the pages back and keeps the block resident and dirty.  The
 * small pages of a dirty copy-mode block of a huge page are gathered into
 * one huge page before the write (gather).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "pager/pager_i.h"

bool kvp_copy_own_all(char *to, const char *from, size_t len)
{
	struct iovec l = { to, len }, rv = { (void *)from, len };

	return process_vm_readv(getpid(), &l, 1, &rv, 1, 0) == (ssize_t)len;
}

void kvp_copy_own(char *to, const char *from, size_t len)
{
	struct iovec l = { to, len }, rv = { (void *)from, len };
	ssize_t got = process_vm_readv(getpid(), &l, 1, &rv, 1, 0);
	size_t off = got > 0 ? (size_t)got & ~(size_t)(KVP_PAGE_BYTES - 1) : 0;

	for (; off < len; off += KVP_PAGE_BYTES) {
		l = (struct iovec){ to + off, KVP_PAGE_BYTES };
		rv = (struct iovec){ (void *)(from + off), KVP_PAGE_BYTES };
		if (process_vm_readv(getpid(), &l, 1, &rv, 1, 0) !=
		    (ssize_t)KVP_PAGE_BYTES)
			memset(to + off, 0, KVP_PAGE_BYTES);
	}
}

/* Is any page of [off, off + len) of a block set in @drops? */
static bool any_dropped(const uint64_t *drops, size_t off, size_t len)
{
	for (size_t pg = off / KVP_PAGE_BYTES;
	     drops && pg < (off + len) / KVP_PAGE_BYTES; pg++)
		if ((drops[pg / 64] >> (pg % 64)) & 1)
			return true;
	return false;
}

int kvp_store_windows(struct kvp_region *r, uint64_t blk, uint64_t wins,
		      uint32_t unit, const uint64_t *drops)
{
	unsigned first, n;
	int err = 0;

	while (!err && (n = kvp_win_next_run(&wins, &first)) != 0) {
		size_t off = (size_t)first * unit, len = (size_t)n * unit;
		char *src = kvp_blk_addr(r, blk) + off, *bounce = NULL;

		if (any_dropped(drops, off, len) ||
		    !kvp_mem_range_mapped(src, len)) {
			/* Never read a dropped page: it may fault; nor one
			 * unmapped (kvp_copy_own). */
			bounce = aligned_alloc(KVP_PAGE_BYTES, len);
			if (!bounce) {
				err = -ENOMEM;
				break;
			}
			for (size_t o = 0; o < len; o += KVP_PAGE_BYTES)
				if (any_dropped(drops, off + o, KVP_PAGE_BYTES))
					memset(bounce + o, 0, KVP_PAGE_BYTES);
				else
					kvp_copy_own(bounce + o, src + o,
						     KVP_PAGE_BYTES);
			src = bounce;
		}
		err = kvp_store_pwrite(r->store, src, len,
				       kvp_blk_store_off(r, blk) + off);
		free(bounce);
		if (!err)
			KVP_STAT_ADD(r, bytes_written_total, len);
	}
	if (err)
		KVP_STAT_ADD(r, write_errors_total, 1);
	return err;
}

struct kvp_block *kvp_clock_victim(struct kvp_pager *p, struct kvp_region **rp,
				   bool take_prefetched)
{
	struct kvp_block *b = p->clock, *start = b;
	bool retry = kvp_writeback_retry_due(p);
	unsigned rounds = 0;

	if (!b)
		return NULL;
	for (;;) {
		/* A block prefetched and not used yet is about to be, and
		 * an active one is the working set: take them only when two
		 * rounds found nothing else (the first only clears
		 * reference bits), and only for a load that waits.  A dying
		 * region's blocks stay: its destroy writes them back and
		 * frees them once nothing of it is in flight.  So does a
		 * block a fault has yet to change (b->late): a late
		 * unprotect would lift the next load's protection, late
		 * zeros land on its next copy.  Nor does one that refused
		 * its move and can leave no other way (kvp_zap_stuck), nor
		 * one whose pages the program dropped are still there
		 * (kvp_blk_zap_waits). */
		if (b->pins == 0 && b->holds == 0 && b->late == 0 &&
		    !b->owner->dying && !kvp_zap_stuck(p, b) &&
		    (!(b->flags & BLK_WB_FAILED) || retry) &&
		    !(b->flags & BLK_REF) &&
		    ((rounds > 1 && take_prefetched) ||
		     !(b->flags & (BLK_PREFETCHED | BLK_ACTIVE))) &&
		    !kvp_blk_zap_waits(b->owner, b)) {
			/* The hand moves on; the victim stays in the list
			 * until its eviction takes it out (kvp_clock_del).
			 * One that stays resident (written first by the
			 * zapper, or no slot) must stay in it: alone there,
			 * the hand on NULL lost it from the clock, and the
			 * next block added began a list of its own. */
			p->clock = b->next;
			*rp = b->owner;
			return b;
		}
		kvp_blk_unref(b);
		b = b->next;
		if (b == start && ++rounds == 3)
			break;
	}
	/* Nothing can leave: the blocks that refused their move try it
	 * again next time (the program may have lifted its lock since). */
	do {
		if (kvp_zap_stuck(p, b))
			b->flags &= ~(BLK_NOMOVE | BLK_UNREAD);
		b = b->next;
	} while (b != start);
	return NULL;
}

/* The empty slot to detach @b into, and its return once done: the pages
 * of a block with a page table (BLK_PAGES) come one by one, and a frame
 * made of them would pass them on to the next block it loads (and that
 * block's range would keep a page table too), so they are freed and the
 * slot kept for such blocks. */
static void *detach_slot(struct kvp_pager *p, struct kvp_region *r,
			 struct kvp_block *b)
{
	return (b->flags & BLK_PAGES) ? kvp_frame_paged_slot(p, r->block_bytes)
				      : kvp_frame_empty_slot(p, r->block_bytes);
}

/*
 * A copy-mode region's block of a huge page or more holds pages that
 * UFFDIO_COPY put there 4 KiB at a time, scattered in memory.  Kept as a
 * frame, they are read into next, and virtio-blk splits such a read (254
 * segments a request: a 2 MiB read becomes three requests; raw reads into
 * 4 KiB pages ran at 0.6x of raw into huge pages).  So they are freed:
 * the kernel frees the slot's emptied page table with them (6.14's
 * page-table reclaim; an older kernel keeps it, and the slot's next frame
 * has small pages, as it had before), and the frames that copy installs
 * hand back stay huge pages.
 */
static void detached_slot_put(struct kvp_pager *p, struct kvp_region *r,
			      struct kvp_block *b, void *slot)
{
	if (b->flags & BLK_PAGES)
		kvp_frame_put_paged(p, slot, r->block_bytes);
	else if (r->install == KVP_INSTALL_COPY &&
		 r->block_bytes >= KVP_HUGE_SIZE)
		kvp_frame_put_undone(p, slot, r->block_bytes);
	else
		kvp_frame_put(p, slot, r->block_bytes, true);
}

/* The same for a detach undone (the pages put back, or some left). */
static void undone_slot_put(struct kvp_pager *p, struct kvp_region *r,
			    struct kvp_block *b, void *slot)
{
	if (b->flags & BLK_PAGES)
		kvp_frame_put_paged(p, slot, r->block_bytes);
	else
		kvp_frame_put_undone(p, slot, r->block_bytes);
}

/*
 * Put the first @len bytes of @op's slot back in its block (an eviction
 * undone), retried through EAGAIN, a page the kernel will not move copied;
 * the waiters are not woken.  What the program dropped of the block while
 * its pages were away goes back as zeros: the zap came while they were in
 * the slot, or comes after (kvp_install_guard).  False when a page could
 * be neither moved nor copied (out of memory): its data is then only in
 * the slot, which must be kept.
 */
static bool put_back(struct kvp_pager *p, struct kvp_op *op, size_t len)
{
	char *addr = kvp_blk_addr(op->r, op->blk), *slot = op->slot;
	size_t off = 0, done;
	bool all = true;
	int err;

	if (kvp_test_hook)
		kvp_test_hook(KVP_TEST_PUT_BACK, addr);
	kvp_install_guard(p);
	kvp_op_apply_drops(p, op, 0, len);
	do {
		done = 0;
		err = kvp_uffd_move(&p->uffd, addr + off, slot + off, len - off,
				    UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES |
					UFFDIO_MOVE_MODE_DONTWAKE,
				    &done);
		off += done;
		if (err == -EAGAIN && done == 0) {
			kvp_uffd_unblock(p);
			kvp_op_apply_drops(p, op, off, len);
		}
	} while (err == -EAGAIN && off < len);
	/* The kernel would not move a page back (EBUSY): copy the rest page
	 * by page, so that the region keeps its data whatever becomes of the
	 * slot.  EEXIST: that page is in the region already. */
	if (err)
		for (; off < len; off += KVP_PAGE_BYTES) {
			while ((err = kvp_uffd_copy(&p->uffd, addr + off,
						    slot + off, KVP_PAGE_BYTES,
						    false, true, NULL)) ==
			       -EAGAIN) {
				kvp_uffd_unblock(p);
				kvp_op_apply_drops(p, op, off, len);
			}
			if (err && err != -EEXIST)
				all = false;
		}
	kvp_install_unguard(p);
	return all;
}

/* Detach @op's resident block's pages into its empty slot (p->lock not
 * held, block in EVICTING); returns 0 or -errno.  Where it fails part
 * way, the pages moved go back, or else op->slot is set to NULL: their
 * data lives in it. */
static int detach(struct kvp_pager *p, struct kvp_op *op)
{
	char *addr = kvp_blk_addr(op->r, op->blk), *slot = op->slot;
	size_t len = op->r->block_bytes, off = 0, moved = 0;
	bool pagewise = false, hole = false;
	int err;

	for (;;) {
		size_t done = 0, n = pagewise ? KVP_PAGE_BYTES : len - off;

		err = kvp_uffd_move(&p->frames.land, slot + off, addr + off, n,
				    UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES, &done);
		off += done;
		moved += done;
		if ((err == -ENOENT || err == -EINVAL) && !pagewise) {
			/* The range crosses a hole the program unmapped
			 * (ENOENT where the hole starts the range, EINVAL
			 * where it crosses the end of a mapping, as it
			 * does a boundary between two): go page by page. */
			pagewise = true;
			err = 0;
		} else if (err == -ENOENT) {
			off += KVP_PAGE_BYTES;
			hole = true;
			err = 0;
		} else if (err == -EAGAIN && done == 0) {
			kvp_uffd_unblock(p); /* an event to read first */
		} else if (err && err != -EAGAIN) {
			break;
		}
		if (off >= len || (!err && !pagewise))
			break;
	}
	if (err == 0 && hole && moved == 0)
		return -ENOENT; /* the program unmapped all of it */
	if (err && moved && !put_back(p, op, off)) {
		/* Part moved (a page pinned by I/O, or the slot was not
		 * empty): put back, or else its data lives in the slot. */
		op->slot = NULL;
	}
	return err;
}

int kvp_evict_one(struct kvp_service *s, bool take_prefetched)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = NULL;
	struct kvp_block *b;
	struct kvp_op *op;
	void *slot;

	pthread_mutex_lock(&p->lock);
	b = kvp_clock_victim(p, &r, take_prefetched);
	if (!b) {
		pthread_mutex_unlock(&p->lock);
		return -EAGAIN;
	}
	if (kvp_zap_clean_first(p, r, b)) {
		pthread_mutex_unlock(&p->lock);
		return 0;
	}
	op = kvp_op_new(OP_WRITEBACK, r, kvp_blk_index(r, b));
	if (op &&
	    kvp_zap_eligible(p, r, b, (b->flags & BLK_DIRTY) || !p->have_wp) &&
	    kvp_zap_begin(p, r, b, op)) {
		pthread_mutex_unlock(&p->lock);
		return 0;
	}
	slot = op ? detach_slot(p, r, b) : NULL;
	if (!slot) {
		pthread_mutex_unlock(&p->lock);
		kvp_op_free(op);
		return -ENOMEM;
	}
	op->slot = slot;
	kvp_blk_begin_evict(r, b, op);
	pthread_mutex_unlock(&p->lock);
	return kvp_evict_move(s, op);
}

/* Under p->lock, which it releases: @op's block has left clean, its pages
 * in @slot (dropped); with @drops (a block resident in part that the
 * program dropped into meanwhile) it is loaded again whole at once, those
 * pages zeroed. */
static int evicted_clean(struct kvp_service *s, struct kvp_op *op, void *slot,
			 const uint64_t *drops)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	uint64_t blk = op->blk;
	struct kvp_block *b = &r->blocks[blk];
	bool waiters = kvp_blk_take_waiters(b);
	/* What it wakes: a dying region may go once p->lock is let go. */
	char *addr = kvp_blk_addr(r, blk);
	size_t len = r->block_bytes;

	kvp_blk_evicted(r, b, false);
	kvp_frame_unuse(p, op->held);
	detached_slot_put(p, r, b, slot);
	if (drops && kvp_load_start(s, r, blk, LOAD_FAULT, NULL, true) == 0) {
		memcpy(b->op->rm_pages, drops, sizeof(b->op->rm_pages));
		b->op->rm_any = true;
	}
	if (r->dying)
		pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
	kvp_op_free(op);
	if (waiters)
		(void)kvp_uffd_wake(&p->uffd, addr, len);
	return 0;
}

/* Under p->lock: @op's next write, the next run of its block's dirty
 * windows (a block resident in part: only those are written, from the
 * slot, where they sit at their offsets). */
static void windows_next(struct kvp_region *r, struct kvp_op *op)
{
	unsigned first = 0, n = kvp_win_next_run(&op->wb_left, &first);
	size_t off = (size_t)first * r->win_bytes;

	op->io.op = KVP_IO_WRITE;
	op->io.buf = (char *)op->slot + off;
	op->io.len = (size_t)n * r->win_bytes;
	op->io.off = kvp_blk_store_off(r, op->blk) + off;
}

/* Put the installed windows @wins of @op's block, resident in part, back
 * from its slot, write-protected as they arrive (UFFDIO_COPY with MODE_WP,
 * so no write between the put-back and a protection goes unseen: only its
 * dirty windows will be written back), what the program dropped zeroed as
 * put_back does.  False when a page could not go back: its data is then
 * only in the slot. */
static bool put_back_windows(struct kvp_pager *p, struct kvp_op *op,
			     uint64_t wins)
{
	struct kvp_region *r = op->r;
	char *addr = kvp_blk_addr(r, op->blk), *slot = op->slot;
	unsigned first, n;
	bool all = true;

	kvp_install_guard(p);
	kvp_op_apply_drops(p, op, 0, r->block_bytes);
	while ((n = kvp_win_next_run(&wins, &first)) != 0) {
		size_t off = (size_t)first * r->win_bytes;
		size_t end = off + (size_t)n * r->win_bytes;

		while (off < end) {
			size_t done = 0;
			int err = kvp_uffd_copy(&p->uffd, addr + off,
						slot + off, end - off, true,
						true, &done);

			off += done;
			if (!err)
				break;
			if (err == -EAGAIN && done == 0) {
				kvp_uffd_unblock(p);
				kvp_op_apply_drops(p, op, off,
						   r->block_bytes);
			} else if (err != -EAGAIN) {
				/* EEXIST: there already; else lost to us */
				if (err != -EEXIST)
					all = false;
				off += KVP_PAGE_BYTES;
			}
		}
	}
	kvp_install_unguard(p);
	return all;
}

/*
 * Under p->lock, which it lets go meanwhile.  A copy-mode block of a huge
 * page or more holds small pages scattered in memory (UFFDIO_COPY put
 * them there), and virtio-blk splits a write from them into requests of
 * 254 segments; where the device offers no indirect descriptors
 * (Firecracker's), each such request takes the whole ring, so the writes
 * went one at a time and a sequential writer ran at 0.83x raw.  So the
 * pages of @op's dirty block are copied into a frame of one huge page
 * and freed, the write goes from that frame, and the frame is kept full
 * for the next load (kvp_writeback_done).  With no frame within one block
 * past the budget, the write goes from the small pages.
 */
static void gather(struct kvp_pager *p, struct kvp_op *op)
{
	struct kvp_region *r = op->r;
	size_t len = r->block_bytes;
	char *frame;

	if (r->install != KVP_INSTALL_COPY || len < KVP_HUGE_SIZE ||
	    op->held != len || (r->blocks[op->blk].flags & BLK_PAGES))
		return;
	frame = kvp_frame_get_stand_in(p, len);
	if (!frame)
		return;
	pthread_mutex_unlock(&p->lock);
	memcpy(frame, op->slot, len);
	(void)kvp_mem_drop(op->slot, len);
	pthread_mutex_lock(&p->lock);
	kvp_frame_unuse(p, len);
	kvp_frame_put(p, op->slot, len, false);
	op->slot = frame;
	op->gathered = true;
}

int kvp_evict_move(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	uint64_t blk = op->blk;
	struct kvp_block *b = &r->blocks[blk];
	char *addr = kvp_blk_addr(r, blk);
	size_t r_len = r->block_bytes;
	void *slot;
	bool dirty, split, waiters = false;
	int err;

	pthread_mutex_lock(&p->lock);
	dirty = (b->flags & BLK_DIRTY) || !p->have_wp;
	pthread_mutex_unlock(&p->lock);

	err = detach(p, op);
	slot = op->slot;
	/* A move refused as the program locked or protected part of the
	 * block: it may undo that before the zap and do it again during
	 * the zap's call (zap.c). */
	split = err == -EINVAL && kvp_zap_split_now(p, r, blk);

	pthread_mutex_lock(&p->lock);
	if (err == -ENOENT) {
		kvp_blk_unmapped(b, true);
		kvp_blk_drop_pending(b);
		err = 0;
	}
	if (err) {
		/* Could not take the pages (pinned by in-flight I/O, shared
		 * after a fork, a slot that was not empty): leave it
		 * resident, try another.  Pages put back arrive writable:
		 * dirty, so that no write goes unseen. */
		if (slot)
			undone_slot_put(p, r, b, slot);
		kvp_blk_evict_aborted(r, b, ABORT_BUSY);
		/* EINVAL: a page the program locked or protected, which no
		 * move takes: it leaves by a zap from now on (zap.c). */
		if (err == -EINVAL)
			b->flags |= BLK_NOMOVE | (split ? BLK_VMAS : 0);
		/* Resident in part and now dirty: made whole before its
		 * write-back could write the pages it lacks. */
		if ((b->flags & BLK_PARTIAL) &&
		    kvp_load_complete(s, r, blk, true, NULL))
			fprintf(stderr, "kvpager: out of memory making block "
					"%" PRIu64 " of %s whole\n",
				blk, r->name);
		waiters = kvp_blk_take_waiters(b);
		pthread_mutex_unlock(&p->lock); /* r may go: addr, r_len */
		kvp_op_free(op);
		if (waiters) /* they find it resident again */
			(void)kvp_uffd_wake(&p->uffd, addr, r_len);
		return 0;
	}
	if (b->flags & BLK_PREFETCHED)
		KVP_STAT_ADD(r, prefetch_wasted_total, 1);
	if (kvp_blk_dirty_windows(b) && !(b->flags & BLK_DROP)) {
		/* Resident in part: its dirty windows only, one write per
		 * run of them.  Pages the program dropped meanwhile are
		 * zeroed by loading it whole again once written
		 * (kvp_writeback_done). */
		op->part = true;
		op->wb_left = b->dirty_win;
		windows_next(r, op);
		kvp_io_queue(s, op);
		p->leaving++;
		p->leaving_bytes += op->held;
		pthread_mutex_unlock(&p->lock);
		return 0;
	}
	/* The program dropped part of it while it moved (handle_drop): the
	 * slot may hold the old bytes there, and the store certainly does.
	 * A block resident in part is loaded again whole with those pages
	 * zeroed instead (its write-back would write the pages it lacks). */
	if ((b->flags & BLK_PARTIAL) && op->rm_any &&
	    !(b->flags & BLK_DROP)) {
		uint64_t drops[KVP_BLOCK_PAGES_MAX / 64];

		memcpy(drops, op->rm_pages, sizeof(drops));
		return evicted_clean(s, op, slot, drops);
	}
	if (kvp_op_zero_dropped(op, 0, op->win_len))
		dirty = true;
	if (dirty && !(b->flags & BLK_DROP)) {
		gather(p, op);
		/* The frame stays with the block until the write is done. */
		op->io.op = KVP_IO_WRITE;
		op->io.buf = op->slot;
		op->io.len = r->block_bytes;
		op->io.off = kvp_blk_store_off(r, blk);
		if (kvp_test_hook)
			kvp_test_hook(KVP_TEST_WRITE_BACK, op->io.buf);
		kvp_io_queue(s, op);
		p->leaving++;
		p->leaving_bytes += op->held;
		pthread_mutex_unlock(&p->lock);
		return 0;
	}
	if (!(b->flags & BLK_DROP))
		KVP_STAT_ADD(r, evictions_clean_total, 1);
	return evicted_clean(s, op, slot, NULL);
}

#define BACKOFF_MIN_MS 10
#define BACKOFF_MAX_MS 1000

bool kvp_writeback_retry_due(const struct kvp_pager *p)
{
	return p->wb_failed_bytes && kvp_now_ns() >= p->wb_retry_ns;
}

void kvp_writeback_result(struct kvp_region *r, int err)
{
	struct kvp_pager *p = r->p;

	if (!err) {
		if (!p->wb_backoff_ms)
			return;
		fprintf(stderr, "kvpager: write-back to %s works again\n",
			r->store->desc);
		p->wb_backoff_ms = 0;
		p->wb_retry_ns = 0;
		/* Every block that failed is an ordinary dirty one again. */
		for (struct kvp_block *b = p->clock, *first = b; b;) {
			struct kvp_block *next = b->next;

			if (b->flags & BLK_WB_FAILED)
				kvp_blk_write_retry(b->owner, b);
			b = next == first ? NULL : next;
		}
		return;
	}
	if (!p->wb_backoff_ms)
		fprintf(stderr,
			"kvpager: write-back to %s failed: %s; dirty blocks "
			"stay resident and are retried (write_errors_total, "
			"unwritten_bytes)\n",
			r->store->desc, strerror(-err));
	p->wb_backoff_ms =
	    p->wb_backoff_ms ? 2 * p->wb_backoff_ms : BACKOFF_MIN_MS;
	if (p->wb_backoff_ms > BACKOFF_MAX_MS)
		p->wb_backoff_ms = BACKOFF_MAX_MS;
	p->wb_retry_ns = kvp_now_ns() + p->wb_backoff_ms * 1000000ull;
}

void kvp_writeback_done(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];
	size_t len = r->block_bytes;
	char *addr = kvp_blk_addr(r, op->blk); /* r may go once unlocked */
	bool ok = op->io.result == (int64_t)op->io.len, waiters;
	uint64_t drops[KVP_BLOCK_PAGES_MAX / 64];
	bool redo = false;

	pthread_mutex_lock(&p->lock);
	if (op->part) {
		if (ok && op->wb_left && !(b->flags & BLK_DROP)) {
			/* The next run of its dirty windows. */
			KVP_STAT_ADD(r, bytes_written_total, op->io.len);
			windows_next(r, op);
			kvp_io_queue(s, op);
			pthread_mutex_unlock(&p->lock);
			return;
		}
		/* Dropped into meanwhile: the pages it has are zeroed in the
		 * slot (they go back if the write failed), and once it is
		 * out it is loaded whole again, those pages zeroed. */
		redo = op->rm_any && !(b->flags & BLK_DROP);
		if (redo)
			memcpy(drops, op->rm_pages, sizeof(drops));
		(void)kvp_op_zero_dropped(op, 0, op->win_len);
	} else if (!(b->flags & BLK_DROP) && kvp_op_zero_dropped(op, 0, op->win_len) && ok) {
		/* The program dropped part of it while it was written: the
		 * store has the old bytes there.  Write it again, zeroed. */
		kvp_io_queue(s, op);
		pthread_mutex_unlock(&p->lock);
		return;
	}
	p->leaving--;
	p->leaving_bytes -= op->held;
	if (!(b->flags & BLK_DROP))
		kvp_writeback_result(r, ok		    ? 0
					: op->io.result < 0 ? (int)op->io.result
							    : -EIO);
	if (!ok && !(b->flags & BLK_DROP)) {
		/* Keep the only copy: put the pages back, dirty, and pick
		 * the block again only when the back-off says so. */
		KVP_STAT_ADD(r, write_errors_total, 1);
		uint64_t wins = b->full_win;

		pthread_mutex_unlock(&p->lock);
		bool back = op->part ? put_back_windows(p, op, wins)
				     : put_back(p, op, len);

		pthread_mutex_lock(&p->lock);
		kvp_blk_evict_aborted(r, b, ABORT_WRITE_FAILED);
		if (back) /* else the data lives in the slot: keep it */
			undone_slot_put(p, r, b, op->slot);
		/* Pages it lacks dropped meanwhile: whole, those zeroed. */
		if (redo && kvp_load_complete(s, r, op->blk, true, drops))
			fprintf(stderr, "kvpager: out of memory making block "
					"%" PRIu64 " of %s whole\n",
				op->blk, r->name);
		waiters = true;
	} else {
		if (ok) {
			KVP_STAT_ADD(r, bytes_written_total, op->io.len);
			KVP_STAT_ADD(r, evictions_dirty_total, 1);
		}
		waiters = kvp_blk_take_waiters(b);
		kvp_blk_evicted(r, b, ok);
		kvp_frame_unuse(p, op->held);
		if (op->gathered) /* one huge page: the next load's frame */
			kvp_frame_put(p, op->slot, len, true);
		else
			detached_slot_put(p, r, b, op->slot);
		if (redo && kvp_load_start(s, r, op->blk, LOAD_FAULT, NULL,
					   true) == 0) {
			memcpy(b->op->rm_pages, drops, sizeof(drops));
			b->op->rm_any = true;
		}
	}
	pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
	if (waiters)
		(void)kvp_uffd_wake(&p->uffd, addr, len);
	kvp_op_free(op);
}

void kvp_discard_resident(struct kvp_region *r, uint64_t blk)
{
	struct kvp_pager *p = r->p;
	struct kvp_block *b = &r->blocks[blk];
	struct kvp_op *op = kvp_op_new(OP_WRITEBACK, r, blk);
	void *slot;

	slot = op ? detach_slot(p, r, b) : NULL;
	if (!slot) {
		/* No slot: keep it, dirty contents dropped is all we can't
		 * do; mark it so that it is never written back. */
		kvp_blk_contents_gone(b);
		kvp_op_free(op);
		return;
	}
	op->slot = slot;
	kvp_blk_begin_evict(r, b, op);
	kvp_blk_drop_pending(b);
	pthread_mutex_unlock(&p->lock);
	int err = detach(p, op);

	slot = op->slot;

	pthread_mutex_lock(&p->lock);
	/* A fault that came while it was EVICTING waits either way: the
	 * pages put back (put_back does not wake), or gone. */
	bool waiters = kvp_blk_take_waiters(b);

	if (err && err != -ENOENT) {
		if (slot)
			undone_slot_put(p, r, b, slot);
		kvp_blk_evict_aborted(r, b, ABORT_DISCARD);
	} else {
		kvp_blk_evicted(r, b, false);
		kvp_frame_unuse(p, op->held);
		detached_slot_put(p, r, b, slot);
	}
	if (waiters) {
		pthread_mutex_unlock(&p->lock);
		(void)kvp_uffd_wake(&p->uffd, kvp_blk_addr(r, blk),
				    r->block_bytes);
		pthread_mutex_lock(&p->lock);
	}
	pthread_cond_broadcast(&p->idle);
	kvp_op_free(op);
}
