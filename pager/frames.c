/*
 * frames.c - the frame pool and the RAM budget.
 *
 * Frames are slots of one block size carved from one arena: a large
 * reservation (virtual only, MAP_NORESERVE, THP-aligned, MADV_HUGEPAGE,
 * MADV_DONTFORK).  A slot either holds pages ("full": its memory has been
 * touched, so reusing it costs nothing) or not ("empty": its pages were
 * moved into a region by UFFDIO_MOVE, or freed).  Fresh memory is slow to
 * touch on these machines, so full slots are recycled first and pages are
 * freed only when the budget needs the room for another block size.
 *
 * The arena is registered (write-protect mode only, so it never takes a
 * missing fault) with a second userfaultfd, the "landing" one: UFFDIO_MOVE
 * needs its destination registered with the context that moves, and
 * eviction moves a block's pages from a region back into a slot.  That
 * context has no EVENT_REMOVE, so freeing a slot with MADV_DONTNEED raises
 * no event and cannot block on our own service threads.
 *
 * Budget: charged = in_use (frames of LOADING, RESIDENT and EVICTING
 * blocks) + full free slots + pre-touched memory not carved yet (the first
 * pool_prefault_bytes of the arena are touched at open).  kvp_frame_get never lets charged pass the
 * budget; a UFFDIO_COPY install briefly holds the block twice (its frame
 * and the region's new pages), and so does a dirty block's write-back
 * while its pages are copied into a stand-in frame (evict.c's gather):
 * one block per service thread at most, which is the documented slack.
 * All calls are made under p->lock.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "kmod-helpers/mem.h"
#include "pager/pager_i.h"

#define OVERDRAFT_MIN (4ULL << 20)
/* Budgets below this reserve as if they were this large: a small pager
 * can still be raised at run time to twice this (a few GiB of address
 * space, no memory). */
#define ARENA_BUDGET_FLOOR (1ULL << 30)

uint64_t kvp_budget(const struct kvp_pager *p)
{
	return p->cfg.ram_budget_bytes;
}

/*
 * The budget invariant, asserted wherever the charge changes: the frames
 * of blocks are charged (in_use <= charged), and a charge is only taken
 * while it stays within the budget (@grew: this change raised it).  After
 * the budget is lowered the charge may stand above it until evictions
 * bring it down; it never grows there.
 */
static bool budget_sane(const struct kvp_pager *p, bool grew)
{
	const struct kvp_frames *f = &p->frames;

	return f->in_use <= f->charged &&
	       (!grew || f->charged <= kvp_budget(p) + kvp_overdraft_cap(p));
}

/* An eighth of the budget, at least 4 MiB: room for the faults of a
 * program whose store stopped taking writes, while the back-off retries
 * them (README: "When the store refuses writes"). */
static uint64_t overdraft_for(uint64_t budget)
{
	return budget / 8 > OVERDRAFT_MIN ? budget / 8 : OVERDRAFT_MIN;
}

uint64_t kvp_overdraft_cap(const struct kvp_pager *p)
{
	return overdraft_for(kvp_budget(p));
}

unsigned kvp_size_class(size_t bytes)
{
	return (unsigned)__builtin_ctzll(bytes) - 12;
}

static int stack_push(struct kvp_slot_stack *s, void *slot)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		void **v = realloc(s->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = slot;
	return 0;
}

static void *stack_pop(struct kvp_slot_stack *s)
{
	return s->n ? s->v[--s->n] : NULL;
}

/*
 * Address space (MAP_NORESERVE: no memory) the arena reserves for @budget.
 * Slots are carved per block size and never returned: slots of one size
 * that are not empty hold charged bytes, so one block size needs the
 * budget and its overdraft; twice that serves a second block size at
 * once, and twice again lets a running pager raise its budget to twice
 * the first, or to 2 GiB for a budget under ARENA_BUDGET_FLOOR
 * (kvp_pager_reconfigure refuses more).  The pre-touched part lies
 * within it.
 */
uint64_t kvp_arena_bytes(uint64_t budget)
{
	uint64_t b = budget > ARENA_BUDGET_FLOOR ? budget : ARENA_BUDGET_FLOOR;
	uint64_t len = 4 * (b + overdraft_for(b));

	return (len + KVP_HUGE_SIZE - 1) & ~(uint64_t)(KVP_HUGE_SIZE - 1);
}

int kvp_frames_init(struct kvp_pager *p)
{
	struct kvp_frames *f = &p->frames;
	uint64_t len = kvp_arena_bytes(p->cfg.ram_budget_bytes), pre;
	void *a;
	int err;

	err = kvp_uffd_open(&f->land, 0);
	if (err)
		return err;
	err = kvp_uffd_api(&f->land, UFFD_FEATURE_MOVE, UFFD_FEATURE_MOVE);
	if (err)
		goto out_close;
	err = kvp_mem_reserve(len, KVP_HUGE_SIZE, true, &a);
	if (err)
		goto out_close;
	(void)kvp_mem_advise(a, len, MADV_DONTFORK);
	err =
	    kvp_uffd_register(&f->land, a, len, UFFDIO_REGISTER_MODE_WP, NULL);
	if (err) {
		kvp_mem_release(a, len);
		goto out_close;
	}
	f->arena = a;
	f->arena_len = len;
	/* Touch the first frames now: fresh memory is slow to fault in on
	 * these machines, and a read into it would pay that on the data
	 * path.  These bytes are charged from the start. */
	pre = p->cfg.pool_prefault_bytes < p->cfg.ram_budget_bytes
		  ? p->cfg.pool_prefault_bytes
		  : p->cfg.ram_budget_bytes;
	pre &= ~(uint64_t)(KVP_HUGE_SIZE - 1);
	if (pre && kvp_mem_populate(a, pre) == 0) {
		f->prefault_end = pre;
		f->charged = pre;
	}
	f->bump = f->prefault_end;
	return 0;
out_close:
	kvp_uffd_close(&f->land);
	return err;
}

void kvp_frames_fini(struct kvp_pager *p)
{
	struct kvp_frames *f = &p->frames;

	if (f->arena) {
		kvp_uffd_unregister(&f->land, f->arena, f->arena_len);
		kvp_mem_release(f->arena, f->arena_len);
	}
	for (unsigned c = 0; c < KVP_SIZE_CLASSES; c++) {
		free(f->full[c].v);
		free(f->empty[c].v);
		free(f->paged[c].v);
	}
	kvp_uffd_close(&f->land);
	f->arena = NULL;
}

/* Free the pages of one full slot of another class than @keep. */
static bool drop_one_full(struct kvp_pager *p, int keep)
{
	struct kvp_frames *f = &p->frames;

	for (int c = KVP_SIZE_CLASSES - 1; c >= 0; c--) {
		size_t bytes = (size_t)4096 << c;
		void *slot;

		if (c == keep || !f->full[c].n)
			continue;
		slot = stack_pop(&f->full[c]);
		(void)kvp_mem_drop(slot, bytes);
		f->charged -= bytes;
		assert(budget_sane(p, false));
		/* On failure the slot's address range is lost, not memory. */
		(void)stack_push(&f->empty[c], slot);
		return true;
	}
	return false;
}

void *kvp_frame_empty_slot(struct kvp_pager *p, size_t bytes)
{
	struct kvp_frames *f = &p->frames;
	unsigned c = kvp_size_class(bytes);
	void *slot = stack_pop(&f->empty[c]);
	size_t at;

	if (slot)
		return slot;
	at = (f->bump + bytes - 1) & ~(bytes - 1);
	if (at + bytes > f->arena_len)
		return NULL;
	f->bump = at + bytes;
	/* The arena is MADV_HUGEPAGE for blocks of 2 MiB and more.  A
	 * smaller slot must not be: its first touch (a read into it) would
	 * fault in a whole huge page, over the budget and into the slots
	 * carved next, which are then not empty.  Consecutive slots of one
	 * size share one VMA. */
	if (bytes < KVP_HUGE_SIZE)
		(void)kvp_mem_advise(f->arena + at, bytes, MADV_NOHUGEPAGE);
	return f->arena + at;
}

/* Free pre-touched memory not carved yet, from its end, in huge pages:
 * at least @want bytes where there are that many; returns the bytes freed
 * (0: none is left). */
static uint64_t pretouched_give_back(struct kvp_pager *p, uint64_t want)
{
	struct kvp_frames *f = &p->frames;
	uint64_t from = (f->pre_bump + KVP_HUGE_SIZE - 1) &
			~(uint64_t)(KVP_HUGE_SIZE - 1);
	uint64_t have = f->prefault_end > from ? f->prefault_end - from : 0;
	uint64_t give = (want + KVP_HUGE_SIZE - 1) &
			~(uint64_t)(KVP_HUGE_SIZE - 1);

	if (give > have)
		give = have;
	if (!give)
		return 0;
	(void)kvp_mem_drop(f->arena + f->prefault_end - give, give);
	f->prefault_end -= give;
	f->charged -= give;
	assert(budget_sane(p, false));
	return give;
}

void *kvp_frame_paged_slot(struct kvp_pager *p, size_t bytes)
{
	void *slot = stack_pop(&p->frames.paged[kvp_size_class(bytes)]);

	return slot ? slot : kvp_frame_empty_slot(p, bytes);
}

void kvp_frame_put_paged(struct kvp_pager *p, void *slot, size_t bytes)
{
	(void)kvp_mem_drop(slot, bytes);
	/* On failure the slot's address range is lost, not memory. */
	(void)stack_push(&p->frames.paged[kvp_size_class(bytes)], slot);
}

/* A frame while the charge stays within @limit. */
static void *frame_get(struct kvp_pager *p, size_t bytes, uint64_t limit)
{
	struct kvp_frames *f = &p->frames;
	unsigned c = kvp_size_class(bytes);
	size_t at;
	void *slot;

	/* Over the limit (the budget was just lowered): free what is free,
	 * and hand out nothing until evictions bring the charge under it. */
	if (f->charged > limit) {
		kvp_frames_shrink(p, limit);
		if (f->charged > limit)
			return NULL;
	}
	slot = stack_pop(&f->full[c]);
	if (slot) {
		f->in_use += bytes;
		assert(budget_sane(p, false));
		return slot;
	}
	/* The pre-touched part is huge pages: a smaller frame (a
	 * fault-around window) carved there would split one, and every
	 * block later moved from it would go page by page. */
	at = (f->pre_bump + bytes - 1) & ~(bytes - 1);
	if (bytes >= KVP_HUGE_SIZE && at + bytes <= f->prefault_end) {
		/* A pre-touched frame, charged since open. */
		f->pre_bump = at + bytes;
		f->in_use += bytes;
		assert(budget_sane(p, false));
		return f->arena + at;
	}
	while (f->charged + bytes > limit)
		if (!drop_one_full(p, (int)c) &&
		    !pretouched_give_back(p, bytes))
			return NULL;
	slot = kvp_frame_empty_slot(p, bytes);
	if (!slot)
		return NULL;
	f->in_use += bytes;
	f->charged += bytes;
	assert(budget_sane(p, true));
	return slot;
}

void *kvp_frame_get(struct kvp_pager *p, size_t bytes)
{
	return frame_get(p, bytes, kvp_budget(p));
}

void *kvp_frame_get_overdraft(struct kvp_pager *p, size_t bytes)
{
	return frame_get(p, bytes, kvp_budget(p) + kvp_overdraft_cap(p));
}

void *kvp_frame_get_stand_in(struct kvp_pager *p, size_t bytes)
{
	uint64_t slack = bytes < kvp_overdraft_cap(p) ? bytes
						      : kvp_overdraft_cap(p);

	return frame_get(p, bytes, kvp_budget(p) + slack);
}


void kvp_frame_put(struct kvp_pager *p, void *slot, size_t bytes, bool full)
{
	struct kvp_frames *f = &p->frames;
	unsigned c = kvp_size_class(bytes);

	if (full && f->charged + bytes > kvp_budget(p))
		/* Over budget (after a copy install, the block's pages are in
		 * the region and its frame is free): keep this frame, warm
		 * for the next read, and give back pre-touched memory nobody
		 * used yet, a huge page at a time. */
		pretouched_give_back(p, f->charged + bytes - kvp_budget(p));
	if (full && f->charged + bytes > kvp_budget(p)) {
		/* Still over (a smaller budget): free the pages. */
		(void)kvp_mem_drop(slot, bytes);
		full = false;
	}
	if (full) {
		f->charged += bytes;
		assert(budget_sane(p, true));
		if (stack_push(&f->full[c], slot) == 0)
			return;
		(void)kvp_mem_drop(slot, bytes);
		f->charged -= bytes;
	}
	(void)stack_push(&f->empty[c], slot);
}

void kvp_frame_put_undone(struct kvp_pager *p, void *slot, size_t bytes)
{
	/* A failed eviction, or the small pages of a copy-mode block once
	 * written (evict.c): freed, so that an empty slot holds none. */
	(void)kvp_mem_drop(slot, bytes);
	kvp_frame_put(p, slot, bytes, false);
}

/* A block gave up its frame's bytes (evicted, dropped, forgotten). */
void kvp_frame_unuse(struct kvp_pager *p, size_t bytes)
{
	assert(p->frames.in_use >= bytes);
	p->frames.in_use -= bytes;
	p->frames.charged -= bytes;
	assert(budget_sane(p, false));
}

uint64_t kvp_frames_shrink(struct kvp_pager *p, uint64_t target)
{
	struct kvp_frames *f = &p->frames;
	uint64_t before = f->charged;

	while (f->charged > target && drop_one_full(p, -1))
		;
	if (f->charged > target)
		pretouched_give_back(p, f->charged - target);
	return before - p->frames.charged;
}
