/*
 * core.c - block states, block flags and the functions that change them.
 *
 * Every block has one state, changed only here and only under p->lock:
 *
 *   ABSENT --kvp_blk_begin_load (fault, prefetch, readahead)--> LOADING
 *   LOADING --kvp_blk_installed--> RESIDENT (clean, or dirty when a write
 *                                  fault asked for it)
 *   LOADING --kvp_blk_load_failed (read error)--> POISONED: every access
 *                                  gets SIGBUS, never a hang
 *   LOADING --kvp_blk_load_dropped (discarded, unmapped, region dying;
 *             all of it dropped meanwhile: contents gone)--> ABSENT
 *   LOADING --kvp_blk_load_unmapped (nothing of it mapped at install)--> ABSENT
 *   LOADING --kvp_blk_fill_undone (a fill of a block with dirty windows
 *             given up: its region dying; the pages it had are its
 *             data)--> RESIDENT
 *   RESIDENT --kvp_blk_written (first write, a WP fault)--> RESIDENT (dirty)
 *   RESIDENT --kvp_blk_write_begin / kvp_blk_write_done (flush, once no
 *             fault's late change is pending, such as a write fault's
 *             unprotect: kvp_blk_late_begin and _done count
 *             them)--> RESIDENT
 *   RESIDENT --kvp_blk_write_retry (the store takes writes again)--> RESIDENT
 *   RESIDENT --kvp_blk_begin_fill (more of a block resident in part, or
 *             all of it before a write or a drop: load.c)--> LOADING
 *   RESIDENT --kvp_blk_begin_evict--> EVICTING
 *   EVICTING --kvp_blk_evicted (detached; written back if dirty)--> ABSENT
 *   EVICTING --kvp_blk_evict_aborted (pages busy, write-back failed,
 *                                     discard undone)--> RESIDENT (dirty)
 *   any but LOADING/EVICTING --kvp_blk_forget (discard, unmap)--> ABSENT
 *
 * Flags (BLK_* in pager_i.h) change only here too, each through a named
 * function: the use marks (kvp_blk_used, kvp_blk_joined, kvp_blk_touch,
 * kvp_blk_unref), the program's drops (kvp_blk_drop_pending,
 * kvp_blk_holes, kvp_blk_unmapped, kvp_blk_contents_gone), the waiters
 * (kvp_blk_wait, kvp_blk_take_waiters) and the dirty bit
 * (kvp_blk_written, kvp_blk_redirty, kvp_blk_abandon_dirty).
 *
 * The clock list (kvp_clock_add, kvp_clock_del, kvp_clock_cold) holds every
 * RESIDENT block; evict.c's hand walks it.
 *
 * Working set: a block's last access is only seen as a fault, so a block
 * that a program reads again and again while it stays resident looks no
 * different to the clock from one read once.  What tells them apart is the
 * refault: a block loaded again (by a fault or a prefetch) before twice
 * the budget's worth of blocks were used after its eviction was evicted
 * too early.  kvp_blk_begin_load marks it BLK_ACTIVE, and the
 * clock takes active blocks last, so that read-ahead and blocks read once
 * go before the set a program keeps coming back to (the kernel's refault
 * distance, in blocks of this region).
 *
 * Invariants (kvp_blk_sane): a RESIDENT block is on the clock list and has
 * no operation; a LOADING or EVICTING block has exactly one operation; an
 * ABSENT or POISONED block has neither; a block is installed at most once
 * per load; a dirty block's data reaches its store before its frame is
 * reused (eviction of a dirty block passes through a write-back operation
 * that holds the frame); in_use counts the bytes of LOADING, RESIDENT and
 * EVICTING blocks, but a block resident in part (BLK_PARTIAL) counts only
 * the pages it holds.
 *
 * A block installed by UFFDIO_MOVE arrives writable and is write-protected
 * just after (the kernel does not carry the uffd-wp bit across a move): a
 * thread that did not fault on it may write it in between with no fault.
 * load.c reads such a block back once protected and installs it dirty
 * when its bytes changed (written_unseen); install_mode=copy (UFFDIO_COPY
 * with MODE_WP, atomic) has no such window.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmod-helpers/mem.h"

#include "pager/pager_i.h"

void (*kvp_test_hook)(enum kvp_test_point at, void *addr);

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
	op->win_len = (uint32_t)r->block_bytes;
	return op;
}

void kvp_pages_set(uint64_t *pages, uint32_t lo, uint32_t hi)
{
	for (uint32_t pg = lo / KVP_PAGE_BYTES;
	     pg < (hi + KVP_PAGE_BYTES - 1) / KVP_PAGE_BYTES; pg++)
		pages[pg / 64] |= 1ull << (pg % 64);
}

void kvp_op_note_drop(struct kvp_op *op, uint32_t lo, uint32_t hi)
{
	/* Page by page: two partial drops of one block in flight zero
	 * what they dropped, never the pages between them. */
	kvp_pages_set(op->rm_pages, lo, hi);
	if (hi > lo)
		op->rm_any = true;
}

bool kvp_op_zero_dropped(struct kvp_op *op, size_t from, size_t to)
{
	uint32_t first = op->win_off / KVP_PAGE_BYTES;
	uint32_t end = first + (uint32_t)(to / KVP_PAGE_BYTES);
	uint32_t from_pg = first + (uint32_t)(from / KVP_PAGE_BYTES);
	uint32_t pages = (uint32_t)(op->r->block_bytes / KVP_PAGE_BYTES);
	bool any = false, left = false;

	if (!op->rm_any)
		return false;
	/* The slot holds the op's window: pages dropped outside it stay
	 * noted (a window load makes the block whole for them next). */
	for (uint32_t pg = 0; pg < pages; pg++) {
		uint64_t bit = 1ull << (pg % 64);

		if (!(op->rm_pages[pg / 64] & bit))
			continue;
		if (pg < from_pg || pg >= end) {
			left = true;
			continue;
		}
		memset((char *)op->slot + (size_t)(pg - first) * KVP_PAGE_BYTES,
		       0, KVP_PAGE_BYTES);
		op->rm_pages[pg / 64] &= ~bit;
		any = true;
	}
	op->rm_any = left;
	return any;
}

void kvp_op_apply_drops(struct kvp_pager *p, struct kvp_op *op, size_t from,
			size_t to)
{
	struct kvp_block *b = &op->r->blocks[op->blk];

	pthread_mutex_lock(&p->lock);
	if (b->flags & BLK_DROP)
		memset((char *)op->slot + from, 0, to - from);
	else
		(void)kvp_op_zero_dropped(op, from, to);
	pthread_mutex_unlock(&p->lock);
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

/* The clock list: every RESIDENT block, in install order (evict.c's
 * kvp_clock_victim moves the hand). */
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
		assert(p->clock == b); /* else it was lost from the list */
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
	kvp_blk_unref(b);
	b->flags &= ~BLK_ACTIVE;
	kvp_clock_del(p, b);
	kvp_clock_add(p, b);
	p->clock = b; /* the hand points at it: next victim */
}

void kvp_blk_init(struct kvp_block *b, bool in_store)
{
	b->flags = in_store ? BLK_IN_STORE : 0;
}

void kvp_blk_touch(struct kvp_pager *p, struct kvp_block *b)
{
	b->last_use = ++p->tick;
	b->flags |= BLK_REF;
}

void kvp_blk_unref(struct kvp_block *b)
{
	b->flags &= ~BLK_REF;
}

/* A read-ahead block used: read-ahead may grow back. */
static void readahead_used(struct kvp_region *r, struct kvp_block *b)
{
	if ((b->flags & BLK_READAHEAD) && r->ra_shrink)
		r->ra_shrink--;
}

/* A read-ahead block leaves unused: counted, and read-ahead shrinks. */
static void readahead_wasted(struct kvp_region *r, struct kvp_block *b)
{
	if (!(b->flags & BLK_READAHEAD))
		return;
	KVP_STAT_ADD(r, readahead_wasted_total, 1);
	if (r->ra_shrink < 63)
		r->ra_shrink++;
}

/* Read-ahead asked for now: a load of it that waits for a frame goes
 * before the read-ahead nobody asked for (load.c counts them). */
static void readahead_asked(struct kvp_block *b)
{
	if ((b->flags & BLK_READAHEAD) && b->state == KVP_BLOCK_LOADING &&
	    b->op->want_svc)
		kvp_want_frame_asked(b->op);
	b->flags &= ~BLK_READAHEAD;
}

void kvp_blk_used(struct kvp_region *r, struct kvp_block *b)
{
	if (b->flags & BLK_PREFETCHED)
		KVP_STAT_ADD(r, prefetch_hit_total, 1);
	readahead_used(r, b);
	readahead_asked(b);
	b->flags &= ~BLK_PREFETCHED;
}

bool kvp_blk_joined(struct kvp_region *r, struct kvp_block *b)
{
	bool readahead = b->flags & BLK_READAHEAD;

	assert(b->state == KVP_BLOCK_LOADING);
	KVP_STAT_ADD(r, coalesced_faults_total, 1);
	if (b->flags & BLK_PREFETCHED)
		KVP_STAT_ADD(r, prefetch_late_total, 1);
	readahead_used(r, b);
	readahead_asked(b);
	b->flags &= ~BLK_PREFETCHED;
	return readahead;
}

void kvp_blk_prefetch_joined(struct kvp_region *r, struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_LOADING);
	if (!(b->flags & BLK_READAHEAD))
		return;
	readahead_used(r, b);
	readahead_asked(b);
	b->flags |= BLK_PREFETCHED;
}

void kvp_blk_written(struct kvp_region *r, struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_RESIDENT);
	if (!(b->flags & BLK_DIRTY))
		KVP_STAT_ADD(r, wp_faults_total, 1);
	b->flags |= BLK_DIRTY;
}

void kvp_blk_written_window(struct kvp_region *r, struct kvp_block *b,
			    unsigned win)
{
	assert(b->state == KVP_BLOCK_RESIDENT && (b->flags & BLK_PARTIAL) &&
	       (b->full_win >> win) & 1);
	if (!((b->dirty_win >> win) & 1))
		KVP_STAT_ADD(r, wp_faults_total, 1);
	b->dirty_win |= 1ull << win;
	b->flags |= BLK_DIRTY;
}

bool kvp_blk_keeps_windows(const struct kvp_region *r,
			   const struct kvp_block *b)
{
	return (b->flags & BLK_PARTIAL) && r->win_bytes &&
	       (!(b->flags & BLK_DIRTY) || b->dirty_win);
}

bool kvp_blk_dirty_windows(const struct kvp_block *b)
{
	return (b->flags & BLK_PARTIAL) && b->dirty_win;
}

unsigned kvp_win_next_run(uint64_t *mask, unsigned *first)
{
	unsigned n = 0;

	if (!*mask)
		return 0;
	*first = (unsigned)__builtin_ctzll(*mask);
	while (*first + n < 64 && ((*mask >> (*first + n)) & 1)) {
		*mask &= ~(1ull << (*first + n));
		n++;
	}
	return n;
}

/* The dirty windows of @r that [off, off + len) covers whole. */
static uint64_t win_mask(const struct kvp_region *r, uint32_t off, uint32_t len)
{
	uint32_t w = r->win_bytes, first, end;

	if (!w)
		return 0;
	first = (off + w - 1) / w;
	end = (off + len) / w;
	if (end <= first)
		return 0;
	return (end - first >= 64 ? ~0ull : ((1ull << (end - first)) - 1))
	       << first;
}

void kvp_blk_late_begin(struct kvp_region *r, struct kvp_block *b)
{
	assert((b->state == KVP_BLOCK_RESIDENT ||
		b->state == KVP_BLOCK_POISONED ||
		(b->state == KVP_BLOCK_LOADING && b->op->verifying)) &&
	       b->late < UINT8_MAX);
	b->late++;
	r->inflight++;
}

bool kvp_blk_late_done(struct kvp_region *r, struct kvp_block *b)
{
	assert(b->late);
	r->inflight--;
	return --b->late == 0;
}

void kvp_blk_redirty(struct kvp_block *b)
{
	b->flags |= BLK_DIRTY;
}

void kvp_blk_abandon_dirty(struct kvp_block *b)
{
	b->flags &= ~BLK_DIRTY;
}

void kvp_blk_cold(struct kvp_pager *p, struct kvp_block *b)
{
	if (b->state == KVP_BLOCK_LOADING)
		b->flags |= BLK_COLD; /* taken at its install */
	else if (b->state == KVP_BLOCK_RESIDENT && !b->pins && !b->holds)
		kvp_clock_cold(p, b);
}

/* Under p->lock: RESIDENT again or at last; a COLD hint that came
 * meanwhile (a woken fault's thread may give one before the install ends:
 * load.c wakes a moved-in block's waiters before its read-back) is taken
 * now, or it would be lost. */
static void cold_if_hinted(struct kvp_pager *p, struct kvp_block *b)
{
	if (!(b->flags & BLK_COLD))
		return;
	b->flags &= ~BLK_COLD;
	kvp_blk_cold(p, b);
}

void kvp_blk_wait(struct kvp_block *b)
{
	b->flags |= BLK_WAITERS;
}

bool kvp_blk_take_waiters(struct kvp_block *b)
{
	bool waiters = b->flags & BLK_WAITERS;

	b->flags &= ~BLK_WAITERS;
	return waiters;
}

void kvp_blk_drop_pending(struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_LOADING || b->state == KVP_BLOCK_EVICTING);
	b->flags |= BLK_DROP;
}

void kvp_blk_holes(struct kvp_block *b, bool unmapped)
{
	assert(b->state == KVP_BLOCK_RESIDENT);
	b->flags |= BLK_DIRTY | BLK_HOLES;
	b->dirty_win = 0; /* dirty beyond its windows: written whole */
	if (unmapped)
		b->flags |= BLK_SPLIT;
}

/*
 * madvise returns once its REMOVE is read; the kernel zaps the range
 * after that read.  Between the two, a move that evicts the block takes
 * the pages the program dropped with their bytes, the zap finds nothing,
 * and they come back from the store where the program reads zeros.  So
 * the block is no victim while a page of the dropped part is still there.
 * How long?  The zap of MADV_DONTNEED follows its read at once, unless its
 * thread is descheduled; the same event comes for MADV_FREE, whose pages
 * stay until the kernel reclaims them (and keep a write made since, which
 * a move must keep too).  The two cannot be told apart, so a page still
 * there after kvp_zap_wait_ns (1 s) is taken for MADV_FREE's.  That is a
 * bet on the scheduler: a madvise thread kept off its CPU for longer
 * between the read and its zap (a tight CPU quota) still loses the drop.
 */
uint64_t kvp_zap_wait_ns = 1000000000ull;

static struct kvp_zap_wait *zap_wait_find(struct kvp_region *r, uint64_t blk)
{
	for (size_t i = 0; i < r->nzap_waits; i++)
		if (r->zap_waits[i].blk == blk)
			return &r->zap_waits[i];
	return NULL;
}

static void zap_wait_end(struct kvp_region *r, struct kvp_block *b)
{
	struct kvp_zap_wait *w = zap_wait_find(r, kvp_blk_index(r, b));

	b->flags &= ~BLK_ZAPWAIT;
	if (w)
		*w = r->zap_waits[--r->nzap_waits];
}

void kvp_blk_zap_wait(struct kvp_region *r, struct kvp_block *b,
		      const uint64_t *pages)
{
	uint64_t blk = kvp_blk_index(r, b);
	uint64_t there[KVP_BLOCK_PAGES_MAX / 64] = { 0 }, any = 0;
	size_t words = (r->block_bytes / KVP_PAGE_BYTES + 63) / 64;
	struct kvp_zap_wait *w;

	assert(b->state != KVP_BLOCK_ABSENT && b->state != KVP_BLOCK_POISONED);
	/* The pages still there: one missing was zapped already, or never
	 * came (a fill places zeros there). */
	kvp_mem_resident_bits(kvp_blk_addr(r, blk), r->block_bytes, there, 0);
	for (size_t i = 0; i < words; i++)
		any |= there[i] &= pages[i];
	if (!any)
		return;
	w = (b->flags & BLK_ZAPWAIT) ? zap_wait_find(r, blk) : NULL;
	if (!w) {
		if (r->nzap_waits == r->zap_waits_cap) {
			size_t cap =
			    r->zap_waits_cap ? 2 * r->zap_waits_cap : 4;
			struct kvp_zap_wait *v =
			    realloc(r->zap_waits, cap * sizeof(*v));

			if (!v) {
				/* Unrecorded: a move before the zap keeps
				 * the bytes dropped (said once). */
				static bool said;

				if (!said)
					fprintf(stderr,
						"kvpager: out of memory: a "
						"drop's zap not waited for\n");
				said = true;
				return;
			}
			r->zap_waits = v;
			r->zap_waits_cap = cap;
		}
		w = &r->zap_waits[r->nzap_waits++];
		memset(w, 0, sizeof(*w));
		w->blk = blk;
		/* From the first drop: drops that go on do not keep the
		 * block in for ever. */
		w->until_ns = kvp_now_ns() + kvp_zap_wait_ns;
		b->flags |= BLK_ZAPWAIT;
	}
	for (size_t i = 0; i < words; i++)
		w->pages[i] |= there[i];
}

bool kvp_blk_zap_waits(struct kvp_region *r, struct kvp_block *b)
{
	uint64_t there[KVP_BLOCK_PAGES_MAX / 64] = { 0 }, any = 0, now;
	struct kvp_zap_wait *w;

	if (!(b->flags & BLK_ZAPWAIT))
		return false;
	w = zap_wait_find(r, kvp_blk_index(r, b));
	now = kvp_now_ns();
	if (w && now < w->until_ns) {
		/* The clock passes it again and again: a look a ms. */
		if (now < w->seen_ns + 1000000)
			return true;
		w->seen_ns = now;
		/* A page gone was zapped: it waits no more (a fill or a
		 * fault puts the program's zeros there next). */
		kvp_mem_resident_bits(kvp_blk_addr(r, w->blk), r->block_bytes,
				      there, 0);
		size_t words = (r->block_bytes / KVP_PAGE_BYTES + 63) / 64;

		for (size_t i = 0; i < words; i++)
			any |= w->pages[i] &= there[i];
		if (any)
			return true;
	}
	zap_wait_end(r, b);
	return false;
}

void kvp_blk_zap_waiting(struct kvp_region *r, const struct kvp_block *b,
			 uint64_t *pages)
{
	struct kvp_zap_wait *w = (b->flags & BLK_ZAPWAIT)
					 ? zap_wait_find(r, kvp_blk_index(r, b))
					 : NULL;

	memset(pages, 0, KVP_BLOCK_PAGES_MAX / 8);
	if (w)
		memcpy(pages, w->pages, KVP_BLOCK_PAGES_MAX / 8);
}

void kvp_blk_zap_filled(struct kvp_region *r, struct kvp_block *b,
			uint32_t off, uint32_t len, const uint64_t *kept)
{
	struct kvp_zap_wait *w;
	uint64_t any = 0;

	if (!(b->flags & BLK_ZAPWAIT))
		return;
	w = zap_wait_find(r, kvp_blk_index(r, b));
	for (uint32_t pg = off / KVP_PAGE_BYTES;
	     w && pg < (off + len) / KVP_PAGE_BYTES; pg++)
		if (!kept || !(kept[pg / 64] >> (pg % 64) & 1))
			w->pages[pg / 64] &= ~(1ull << (pg % 64));
	for (size_t i = 0; w && i < KVP_BLOCK_PAGES_MAX / 64; i++)
		any |= w->pages[i];
	if (!any)
		zap_wait_end(r, b);
}

void kvp_blk_unmapped(struct kvp_block *b, bool whole)
{
	b->flags |= whole ? BLK_GONE : BLK_SPLIT;
}

void kvp_blk_load_keep(struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_LOADING);
	readahead_asked(b);
}

void kvp_blk_contents_gone(struct kvp_block *b)
{
	b->flags &= ~(BLK_IN_STORE | BLK_DIRTY);
	b->dirty_win = 0;
}

/* BLK_WB_FAILED on or off, with the bytes it holds counted. */
static void set_wb_failed(struct kvp_region *r, struct kvp_block *b, bool on)
{
	if (on == !!(b->flags & BLK_WB_FAILED))
		return;
	if (on) {
		b->flags |= BLK_WB_FAILED;
		r->p->wb_failed_bytes += r->block_bytes;
		KVP_STAT_ADD(r, unwritten_bytes, r->block_bytes);
	} else {
		b->flags &= ~BLK_WB_FAILED;
		r->p->wb_failed_bytes -= r->block_bytes;
		KVP_STAT_SUB(r, unwritten_bytes, r->block_bytes);
	}
}

/* Loaded again before twice the budget's worth of blocks was used since
 * it was evicted (last_use holds the clock at its eviction; 0: never
 * resident).  Twice: the clock counts read-ahead installs too, and a set
 * that fits the budget comes back within it plus what was read around it;
 * a stream over more than twice the budget never does. */
static bool refault_in_budget(const struct kvp_region *r,
			      const struct kvp_block *b)
{
	const struct kvp_pager *p = r->p;

	return b->last_use &&
	       p->tick - b->last_use <= 2 * (kvp_budget(p) >> r->block_shift);
}

void kvp_blk_begin_load(struct kvp_region *r, struct kvp_block *b,
			struct kvp_op *op, enum kvp_load_why why)
{
	/* (Not while a fault's late change is on its way: events.c.) */
	assert(b->state == KVP_BLOCK_ABSENT && kvp_blk_sane(r, b) && !b->late);
	b->state = KVP_BLOCK_LOADING;
	b->op = op;
	b->owner = r;
	if (why == LOAD_PREFETCH)
		b->flags |= BLK_PREFETCHED;
	else if (why == LOAD_READAHEAD)
		b->flags |= BLK_READAHEAD;
	if (why != LOAD_READAHEAD && refault_in_budget(r, b))
		b->flags |= BLK_ACTIVE;
	r->inflight++;
}

size_t kvp_blk_charge(const struct kvp_region *r, const struct kvp_block *b)
{
	if (b->flags & BLK_PARTIAL)
		return (size_t)b->present * KVP_PAGE_BYTES;
	return r->block_bytes;
}

void kvp_blk_begin_fill(struct kvp_region *r, struct kvp_block *b,
			struct kvp_op *op)
{
	assert(b->state == KVP_BLOCK_RESIDENT && kvp_blk_sane(r, b));
	kvp_clock_del(r->p, b);
	b->state = KVP_BLOCK_LOADING;
	b->op = op;
	if (!(b->flags & BLK_PARTIAL)) {
		/* Counted whole already (see kvp_blk_installed). */
		b->flags |= BLK_PARTIAL;
		b->present = (uint16_t)(r->block_bytes / KVP_PAGE_BYTES);
		b->full_win = win_mask(r, 0, (uint32_t)r->block_bytes);
		b->dirty_win = (b->flags & BLK_DIRTY) ? b->full_win : 0;
	}
	r->inflight++;
}

/* Its charge leaves with it (evicted, forgotten, a fill given up); call
 * before its state changes. */
static void uncharge(struct kvp_region *r, struct kvp_block *b)
{
	if (b->state == KVP_BLOCK_RESIDENT || b->state == KVP_BLOCK_EVICTING ||
	    (b->flags & BLK_PARTIAL))
		KVP_STAT_SUB(r, resident_bytes, kvp_blk_charge(r, b));
	b->flags &= ~BLK_PARTIAL;
	b->present = 0;
	b->full_win = b->dirty_win = 0;
}

bool kvp_blk_installed(struct kvp_region *r, struct kvp_block *b, bool dirty,
		       bool split, bool whole, uint32_t placed, size_t *grew)
{
	bool drop = b->flags & BLK_DROP;
	size_t was = (b->flags & BLK_PARTIAL) ? kvp_blk_charge(r, b) : 0;
	uint32_t pages = (uint32_t)(r->block_bytes / KVP_PAGE_BYTES);

	assert(b->state == KVP_BLOCK_LOADING && b->op != NULL);
	if (!whole && b->present + placed < pages) {
		b->flags |= BLK_PARTIAL;
		b->present = (uint16_t)(b->present + placed);
		/* Every page of the window is there now (placed, or kept),
		 * but across a hole: made whole at once (load.c). */
		if (!split)
			b->full_win |=
			    win_mask(r, b->op->win_off, b->op->win_len);
	} else {
		b->flags &= ~BLK_PARTIAL;
		b->present = 0;
		b->full_win = b->dirty_win = 0;
	}
	*grew = kvp_blk_charge(r, b) - was;
	if (!whole || was)
		b->flags |= BLK_PAGES;
	b->state = KVP_BLOCK_RESIDENT;
	b->op = NULL;
	b->flags &= ~(BLK_HOLES | BLK_DROP);
	if (split)
		b->flags |= BLK_SPLIT;
	if (dirty || split)
		b->flags |= BLK_DIRTY;
	r->inflight--;
	kvp_clock_add(r->p, b);
	kvp_blk_touch(r->p, b);
	cold_if_hinted(r->p, b);
	KVP_STAT_ADD(r, resident_bytes, *grew);
	assert(kvp_blk_sane(r, b));
	return drop;
}

void kvp_blk_load_failed(struct kvp_region *r, struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_LOADING);
	if (b->flags & BLK_ZAPWAIT)
		zap_wait_end(r, b);
	set_wb_failed(r, b, false); /* written now or never (load.c) */
	uncharge(r, b); /* a fill's pages stay mapped, uncounted: rare */
	b->state = KVP_BLOCK_POISONED;
	b->op = NULL;
	b->flags &= ~(BLK_PREFETCHED | BLK_READAHEAD | BLK_WAITERS |
		      BLK_ACTIVE | BLK_COLD | BLK_DIRTY);
	r->inflight--;
	KVP_STAT_ADD(r, poisoned_blocks, 1);
	assert(kvp_blk_sane(r, b));
}

void kvp_blk_load_dropped(struct kvp_region *r, struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_LOADING);
	if (b->flags & BLK_ZAPWAIT)
		zap_wait_end(r, b);
	set_wb_failed(r, b, false);
	uncharge(r, b);
	readahead_wasted(r, b);
	if (b->flags & BLK_DROP)
		kvp_blk_contents_gone(b); /* all of it dropped meanwhile */
	b->state = KVP_BLOCK_ABSENT;
	b->op = NULL;
	b->flags &= ~(BLK_PREFETCHED | BLK_READAHEAD | BLK_DROP | BLK_DIRTY |
		      BLK_ACTIVE | BLK_COLD);
	r->inflight--;
	assert(kvp_blk_sane(r, b));
}

void kvp_blk_fill_undone(struct kvp_region *r, struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_LOADING && (b->flags & BLK_PARTIAL));
	/* Its charge, masks and dirty bit are what they were before the
	 * fill began. */
	b->state = KVP_BLOCK_RESIDENT;
	b->op = NULL;
	b->flags &= ~(BLK_PREFETCHED | BLK_READAHEAD | BLK_WAITERS);
	r->inflight--;
	kvp_clock_add(r->p, b);
	cold_if_hinted(r->p, b);
	assert(kvp_blk_sane(r, b));
}

void kvp_blk_load_unmapped(struct kvp_region *r, struct kvp_block *b)
{
	b->flags |= BLK_GONE;
	kvp_blk_load_dropped(r, b);
}

void kvp_blk_begin_evict(struct kvp_region *r, struct kvp_block *b,
			 struct kvp_op *op)
{
	assert(b->state == KVP_BLOCK_RESIDENT && b->pins == 0 && !b->holds);
	kvp_clock_del(r->p, b);
	b->state = KVP_BLOCK_EVICTING;
	b->op = op;
	op->held = kvp_blk_charge(r, b);
	r->inflight++;
	assert(kvp_blk_sane(r, b));
}

void kvp_blk_evicted(struct kvp_region *r, struct kvp_block *b, bool stored)
{
	assert(b->state == KVP_BLOCK_EVICTING);
	uncharge(r, b);
	b->state = KVP_BLOCK_ABSENT;
	b->op = NULL;
	if (stored)
		b->flags |= BLK_IN_STORE;
	b->last_use = r->p->tick; /* the refault distance counts from here */
	readahead_wasted(r, b);
	if (b->flags & BLK_DROP)
		b->flags &= ~BLK_IN_STORE;
	set_wb_failed(r, b, false);
	/* BLK_NOMOVE too: one move refused a residency costs little, and a
	 * lock or protection lifted since would keep it from moving. */
	if (b->flags & BLK_ZAPWAIT)
		zap_wait_end(r, b);
	b->flags &= ~(BLK_DIRTY | BLK_REF | BLK_PREFETCHED | BLK_READAHEAD |
		      BLK_DROP | BLK_HOLES | BLK_ACTIVE | BLK_NOMOVE |
		      BLK_UNREAD);
	r->inflight--;
	assert(kvp_blk_sane(r, b));
}

void kvp_blk_evict_aborted(struct kvp_region *r, struct kvp_block *b,
			   enum kvp_evict_abort why)
{
	assert(b->state == KVP_BLOCK_EVICTING);
	b->state = KVP_BLOCK_RESIDENT;
	b->op = NULL;
	/* Pages put back arrive writable: dirty, so no write goes unseen;
	 * a block resident in part then dirty beyond its windows (made
	 * whole by the caller), but after a failed write-back of its dirty
	 * windows, whose pages go back write-protected (evict.c). */
	b->flags |= BLK_DIRTY;
	if (why != ABORT_WRITE_FAILED)
		b->dirty_win = 0;
	switch (why) {
	case ABORT_BUSY:
		b->flags |= BLK_REF;
		break;
	case ABORT_WRITE_FAILED:
		set_wb_failed(r, b, true);
		break;
	case ABORT_DISCARD:
		/* Its contents are dropped all the same. */
		b->flags &= ~(BLK_IN_STORE | BLK_DROP);
		break;
	}
	r->inflight--;
	kvp_clock_add(r->p, b);
	assert(kvp_blk_sane(r, b));
}

void kvp_blk_write_begin(struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_RESIDENT && b->holds);
	b->flags &= ~BLK_DIRTY;
}

void kvp_blk_write_done(struct kvp_region *r, struct kvp_block *b, int err)
{
	/* Held, but a fill may be loading more of it (LOADING). */
	assert(b->holds);
	set_wb_failed(r, b, err != 0);
	if (err) {
		b->flags |= BLK_DIRTY;
		return;
	}
	b->flags |= BLK_IN_STORE;
	/* Without write protection, across a hole where it cannot be set,
	 * or on a page the program dropped (its zeros go in writable, at
	 * its next fault or at this write-back's read), a later write would
	 * go unseen: it stays dirty. */
	if (!r->p->have_wp || (b->flags & (BLK_SPLIT | BLK_HOLES)))
		b->flags |= BLK_DIRTY;
}

uint64_t kvp_blk_write_windows_begin(struct kvp_block *b)
{
	uint64_t wins = b->dirty_win;

	assert(b->state == KVP_BLOCK_RESIDENT && b->holds &&
	       kvp_blk_dirty_windows(b));
	b->dirty_win = 0;
	b->flags &= ~BLK_DIRTY;
	return wins;
}

void kvp_blk_write_windows_done(struct kvp_region *r, struct kvp_block *b,
				uint64_t wins, int err)
{
	/* Held, but a fill may be loading more of it (LOADING). */
	assert(b->holds);
	set_wb_failed(r, b, err != 0);
	if (!err)
		return;
	b->flags |= BLK_DIRTY;
	/* Made whole meanwhile: dirty whole. */
	if (b->flags & BLK_PARTIAL)
		b->dirty_win |= wins;
}

void kvp_blk_write_retry(struct kvp_region *r, struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_RESIDENT);
	set_wb_failed(r, b, false);
}

void kvp_blk_forget(struct kvp_region *r, struct kvp_block *b)
{
	assert(b->state == KVP_BLOCK_RESIDENT || b->state == KVP_BLOCK_ABSENT ||
	       b->state == KVP_BLOCK_POISONED);
	if (b->state == KVP_BLOCK_RESIDENT)
		kvp_clock_del(r->p, b);
	if (b->flags & BLK_ZAPWAIT)
		zap_wait_end(r, b);
	uncharge(r, b);
	if (b->state == KVP_BLOCK_POISONED)
		KVP_STAT_SUB(r, poisoned_blocks, 1);
	set_wb_failed(r, b, false);
	b->state = KVP_BLOCK_ABSENT;
	b->flags &= BLK_GONE | BLK_SPLIT | BLK_PAGES | BLK_VMAS;
	assert(kvp_blk_sane(r, b));
}
