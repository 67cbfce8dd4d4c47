/*
 * core.c - block states and the functions that change them.
 *
 * Every block has one state, changed only here and only under p->lock:
 *
 *   ABSENT --kvp_blk_begin_load (fault, prefetch, readahead)--> LOADING
 *   LOADING --kvp_blk_installed--> RESIDENT (clean, or dirty when a write
 *                                  fault asked for it)
 *   LOADING --kvp_blk_load_failed (read error)--> POISONED: every access
 *                                  gets SIGBUS, never a hang
 *   LOADING --kvp_blk_load_dropped (discarded, unmapped, region dying)--> ABSENT
 *   RESIDENT --first write (WP fault, service.c sets BLK_DIRTY)--> RESIDENT
 *   RESIDENT --kvp_blk_begin_evict--> EVICTING
 *   EVICTING --kvp_blk_evicted (detached; written back if dirty)--> ABSENT
 *   EVICTING --kvp_blk_evict_aborted (write-back failed, page busy)--> RESIDENT
 *   any but LOADING/EVICTING --kvp_blk_forget (discard, unmap)--> ABSENT
 *
 * Invariants (kvp_blk_sane): a RESIDENT block is on the clock list and has
 * no operation; a LOADING or EVICTING block has exactly one operation; an
 * ABSENT or POISONED block has neither; a block is installed at most once
 * per load; a dirty block's data reaches its store before its frame is
 * reused (eviction of a dirty block passes through a write-back operation
 * that holds the frame); in_use counts the bytes of LOADING, RESIDENT and
 * EVICTING blocks.
 *
 * Known window: a block installed by UFFDIO_MOVE arrives writable and is
 * write-protected just after (the kernel does not carry the uffd-wp bit
 * across a move).  A thread that did not fault on the block and writes it
 * in those microseconds is not seen as a writer; install_mode=copy
 * (UFFDIO_COPY with MODE_WP, atomic) has no such window.
 */
#include <assert.h>

#include "pager/pager_i.h"

uint64_t kvp_blk_index(const struct kvp_region *r, const struct kvp_block *b)
{
	return (uint64_t)(b - r->blocks);
}

char *kvp_blk_addr(const struct kvp_region *r, uint64_t blk)
{
	return r->addr + (blk << r->block_shift);
}

uint64_t kvp_blk_store_off(const struct kvp_region *r, uint64_t blk)
{
	return r->store_offset + (blk << r->block_shift);
}

bool kvp_blk_sane(const struct kvp_region *r, const struct kvp_block *b)
{
	switch (b->state) {
	case KVP_BLOCK_ABSENT:
	case KVP_BLOCK_POISONED:
		return b->op == NULL && b->next == NULL;
	case KVP_BLOCK_LOADING:
	case KVP_BLOCK_EVICTING:
		return b->op != NULL && b->next == NULL;
	case KVP_BLOCK_RESIDENT:
		return b->op == NULL && b->next != NULL && b->prev != NULL;
	}
	return false;
}

void kvp_blk_touch(struct kvp_pager *p, struct kvp_block *b)
{
	b->last_use = ++p->tick;
	b->flags |= BLK_REF;
}

void kvp_blk_begin_load(struct kvp_region *r, struct kvp_block *b,
			struct kvp_op *op)
{
	assert(b->state == KVP_BLOCK_ABSENT && kvp_blk_sane(r, b));
	b->state = KVP_BLOCK_LOADING;
	b->op = op;
	r->inflight++;
}

void kvp_blk_installed(struct kvp_region *r, struct kvp_block *b, bool dirty)
{
	assert(b->state == KVP_BLOCK_LOADING && b->op != NULL);
	b->state = KVP_BLOCK_RESIDENT;
	b->op = NULL;
	b->flags &= ~BLK_HOLES; /* BLK_DROP: the caller discards at once */
	if (dirty)
		b->flags |= BLK_DIRTY;
	r->inflight--;
	kvp_clock_add(r->p, b);
	kvp_blk_touch(r->p, b);
	KVP_STAT_ADD(r, resident_bytes, r->block_bytes);
	assert(kvp_blk_sane(r, b));
}

void kvp_blk_load_failed(struct kvp_region *r, struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_LOADING);
	b->state = KVP_BLOCK_POISONED;
	b->op = NULL;
	b->flags &= ~(BLK_PREFETCHED | BLK_READAHEAD | BLK_WAITERS);
	r->inflight--;
	KVP_STAT_ADD(r, poisoned_blocks, 1);
	assert(kvp_blk_sane(r, b));
}

void kvp_blk_load_dropped(struct kvp_region *r, struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_LOADING);
	b->state = KVP_BLOCK_ABSENT;
	b->op = NULL;
	b->flags &= ~(BLK_PREFETCHED | BLK_READAHEAD | BLK_DROP | BLK_DIRTY);
	r->inflight--;
	assert(kvp_blk_sane(r, b));
}

void kvp_blk_begin_evict(struct kvp_region *r, struct kvp_block *b,
			 struct kvp_op *op)
{
	assert(b->state == KVP_BLOCK_RESIDENT && b->pins == 0 && !b->holds);
	kvp_clock_del(r->p, b);
	b->state = KVP_BLOCK_EVICTING;
	b->op = op;
	r->inflight++;
	assert(kvp_blk_sane(r, b));
}

void kvp_blk_evicted(struct kvp_region *r, struct kvp_block *b, bool stored)
{
	assert(b->state == KVP_BLOCK_EVICTING);
	b->state = KVP_BLOCK_ABSENT;
	b->op = NULL;
	if (stored)
		b->flags |= BLK_IN_STORE;
	if (b->flags & BLK_DROP)
		b->flags &= ~BLK_IN_STORE;
	b->flags &= ~(BLK_DIRTY | BLK_REF | BLK_PREFETCHED | BLK_READAHEAD |
		      BLK_DROP | BLK_HOLES | BLK_WB_FAILED);
	r->inflight--;
	KVP_STAT_SUB(r, resident_bytes, r->block_bytes);
	assert(kvp_blk_sane(r, b));
}

void kvp_blk_evict_aborted(struct kvp_region *r, struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_EVICTING);
	b->state = KVP_BLOCK_RESIDENT;
	b->op = NULL;
	r->inflight--;
	kvp_clock_add(r->p, b);
	assert(kvp_blk_sane(r, b));
}

void kvp_blk_forget(struct kvp_region *r, struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_RESIDENT || b->state == KVP_BLOCK_ABSENT ||
	       b->state == KVP_BLOCK_POISONED);
	if (b->state == KVP_BLOCK_RESIDENT) {
		kvp_clock_del(r->p, b);
		KVP_STAT_SUB(r, resident_bytes, r->block_bytes);
	}
	if (b->state == KVP_BLOCK_POISONED)
		KVP_STAT_SUB(r, poisoned_blocks, 1);
	b->state = KVP_BLOCK_ABSENT;
	b->flags &= BLK_GONE | BLK_SPLIT;
	assert(kvp_blk_sane(r, b));
}
