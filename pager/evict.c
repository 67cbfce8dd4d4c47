/*
 * evict.c - which block leaves, and how it leaves.
 *
 * Policy: CLOCK over every resident block of the pager, in install order.
 * A block's reference bit is set when it is installed, faulted on, written,
 * pinned or asked for again by a prefetch; the hand clears it and takes the
 * first block without it.  Pinned blocks, and blocks whose write-back
 * failed (their data exists only in RAM), are never taken.  A COLD hint
 * puts a block just before the hand, so it goes next.
 *
 * Mechanism: a victim's pages are moved (UFFDIO_MOVE, through the landing
 * context) from the region into an empty frame slot.  That detaches them
 * atomically: a write that lands before the move is in the frame and is
 * written back, a write after it faults on a missing page and waits for
 * the block to be loaded again.  It also recycles the pages as the next
 * frame and, unlike MADV_DONTNEED, raises no UFFD_EVENT_REMOVE.  Clean
 * blocks of copy-mode regions are dropped instead, in batches, by the
 * zapper (zap.c): the store holds their data, and a batch costs one TLB
 * flush where a move costs one per page.
 */
#include <errno.h>
#include <stdlib.h>

#include "pager/pager_i.h"

void kvp_clock_add(struct kvp_pager *p, struct kvp_block *b)
{
	if (!p->clock) {
		b->next = b->prev = b;
		p->clock = b;
		return;
	}
	/* Insert just behind the hand: the last to be examined. */
	b->next = p->clock;
	b->prev = p->clock->prev;
	b->prev->next = b;
	p->clock->prev = b;
}

void kvp_clock_del(struct kvp_pager *p, struct kvp_block *b)
{
	if (b->next == b) {
		p->clock = NULL;
	} else {
		b->prev->next = b->next;
		b->next->prev = b->prev;
		if (p->clock == b)
			p->clock = b->next;
	}
	b->next = b->prev = NULL;
}

void kvp_clock_cold(struct kvp_pager *p, struct kvp_block *b)
{
	b->flags &= ~BLK_REF;
	kvp_clock_del(p, b);
	kvp_clock_add(p, b);
	p->clock = b; /* the hand points at it: next victim */
}

struct kvp_block *kvp_clock_victim(struct kvp_pager *p, struct kvp_region **rp,
				   bool take_prefetched)
{
	struct kvp_block *b = p->clock, *start = b;
	unsigned rounds = 0;

	if (!b)
		return NULL;
	for (;;) {
		/* A block prefetched and not used yet is about to be: take
		 * it only when two rounds found nothing else (the first
		 * only clears reference bits). */
		if (b->pins == 0 && b->holds == 0 &&
		    !(b->flags & BLK_WB_FAILED) && !(b->flags & BLK_REF) &&
		    ((rounds > 1 && take_prefetched) ||
		     !(b->flags & BLK_PREFETCHED))) {
			p->clock = b->next == b ? NULL : b->next;
			*rp = b->owner;
			return b;
		}
		b->flags &= ~BLK_REF;
		b = b->next;
		if (b == start && ++rounds == 3)
			return NULL;
	}
}

int kvp_detach(struct kvp_pager *p, struct kvp_region *r, uint64_t blk,
	       void **slot)
{
	char *addr = kvp_blk_addr(r, blk);
	size_t len = r->block_bytes, off = 0, moved = 0;
	bool pagewise = false, hole = false;
	int err;

	for (;;) {
		size_t done = 0, n = pagewise ? KVP_PAGE_BYTES : len - off;

		err = kvp_uffd_move(&p->frames.land, (char *)*slot + off,
				    addr + off, n,
				    UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES, &done);
		off += done;
		moved += done;
		if (err == -ENOENT && !pagewise) {
			/* The range crosses a hole the program unmapped:
			 * go page by page. */
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
	if (err && moved && !kvp_put_back(p, addr, *slot, off)) {
		/* Part moved (a page pinned by I/O, or the slot was not
		 * empty): put back, or else its data lives in the slot. */
		*slot = NULL;
	}
	return err;
}

bool kvp_put_back(struct kvp_pager *p, char *addr, void *slot, size_t len)
{
	size_t off = 0, done;
	bool all = true;
	int err;

	do {
		done = 0;
		err = kvp_uffd_move(&p->uffd, addr + off, (char *)slot + off,
				    len - off,
				    UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES |
					UFFDIO_MOVE_MODE_DONTWAKE,
				    &done);
		off += done;
		if (err == -EAGAIN && done == 0)
			kvp_uffd_unblock(p);
	} while (err == -EAGAIN && off < len);
	/* The kernel would not move a page back (EBUSY): copy the rest page
	 * by page, so that the region keeps its data whatever becomes of the
	 * slot.  EEXIST: that page is in the region already. */
	if (err)
		for (; off < len; off += KVP_PAGE_BYTES) {
			while ((err = kvp_uffd_copy(&p->uffd, addr + off,
						    (char *)slot + off,
						    KVP_PAGE_BYTES, false, true,
						    NULL)) == -EAGAIN)
				kvp_uffd_unblock(p);
			if (err && err != -EEXIST)
				all = false;
		}
	return all;
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
	op = kvp_op_new(OP_WRITEBACK, r, kvp_blk_index(r, b));
	if (op && kvp_zap_eligible(p, r, b,
				   (b->flags & BLK_DIRTY) || !p->have_wp)) {
		op->cover = calloc(r->block_bytes / KVP_PAGE_BYTES, 1);
		if (op->cover) {
			op->kind = OP_ZAP;
			op->uncovered =
			    (uint32_t)(r->block_bytes / KVP_PAGE_BYTES);
			kvp_blk_begin_evict(r, b, op);
			p->leaving++;
			p->leaving_bytes += r->block_bytes;
			kvp_zap_queue(p, op);
			pthread_mutex_unlock(&p->lock);
			return 0;
		}
	}
	slot = op ? kvp_frame_empty_slot(p, r->block_bytes) : NULL;
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

int kvp_evict_move(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	uint64_t blk = op->blk;
	struct kvp_block *b = &r->blocks[blk];
	void *slot = op->slot;
	bool dirty, waiters = false;
	int err;

	pthread_mutex_lock(&p->lock);
	dirty = (b->flags & BLK_DIRTY) || !p->have_wp;
	pthread_mutex_unlock(&p->lock);

	err = kvp_detach(p, r, blk, &slot);

	pthread_mutex_lock(&p->lock);
	if (err == -ENOENT) {
		b->flags |= BLK_GONE | BLK_DROP;
		err = 0;
	}
	if (err) {
		/* Could not take the pages (pinned by in-flight I/O, shared
		 * after a fork, a slot that was not empty): leave it
		 * resident, try another.  Pages put back arrive writable:
		 * dirty, so that no write goes unseen. */
		if (slot)
			kvp_frame_put_undone(p, slot, r->block_bytes);
		kvp_blk_evict_aborted(r, b);
		b->flags |= BLK_REF | BLK_DIRTY;
		waiters = b->flags & BLK_WAITERS;
		b->flags &= ~BLK_WAITERS;
		pthread_mutex_unlock(&p->lock);
		kvp_op_free(op);
		if (waiters) /* they find it resident again */
			(void)kvp_uffd_wake(&p->uffd, kvp_blk_addr(r, blk),
					    r->block_bytes);
		return 0;
	}
	if (b->flags & BLK_PREFETCHED)
		KVP_STAT_ADD(r, prefetch_wasted_total, 1);
	/* The program dropped part of it while it moved (handle_drop): the
	 * slot may hold the old bytes there, and the store certainly does. */
	if (kvp_op_zero_dropped(op))
		dirty = true;
	if (dirty && !(b->flags & BLK_DROP)) {
		/* The frame stays with the block until the write is done. */
		op->io.op = KVP_IO_WRITE;
		op->io.buf = slot;
		op->io.len = r->block_bytes;
		op->io.off = kvp_blk_store_off(r, blk);
		op->next = s->to_submit;
		s->to_submit = op;
		p->leaving++;
		p->leaving_bytes += r->block_bytes;
		pthread_mutex_unlock(&p->lock);
		return 0;
	}
	if (!(b->flags & BLK_DROP))
		KVP_STAT_ADD(r, evictions_clean_total, 1);
	waiters = b->flags & BLK_WAITERS;
	b->flags &= ~BLK_WAITERS;
	kvp_blk_evicted(r, b, false);
	kvp_frame_unuse(p, r->block_bytes);
	kvp_frame_put(p, slot, r->block_bytes, true);
	if (r->dying)
		pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
	kvp_op_free(op);
	if (waiters)
		(void)kvp_uffd_wake(&p->uffd, kvp_blk_addr(r, blk),
				    r->block_bytes);
	return 0;
}
