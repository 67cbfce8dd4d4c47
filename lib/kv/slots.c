/*
 * slots.c - reuse slots: the sparse decode's chosen blocks read from the
 * store into memory the cache owns, not faulted into the region
 * (READING INTO SLOTS in kvcache.h; kvcache_i.h).
 *
 * A slot is one pager block of memory, touched once when the slots are
 * made.  Reading a block into it with the store's queue (O_DIRECT on the
 * file store) maps nothing, so the attention that reads it takes no fault
 * and no first touch, and a block the predictor picks again while its
 * slot still holds it is not read again (KVSwap's reuse buffer).
 *
 * Which blocks: a plan's pager block that is absent from the region, clean
 * and in the store (be->in_store: the store's copy is the block) gets a
 * slot; a block resident in the region is read there; any other, or one
 * for which no slot is free, is left to the region's fault path.
 *
 * STATES OF A SLOT (driving thread; sl_of[pb] names the slot of pb):
 *
 *   FREE --a plan wants an absent, stored block--> LOADING (read queued)
 *   LOADING --its plan settles, read whole--> VALID
 *   LOADING --its plan settles, read failed--> DEAD
 *   VALID --chosen again--> VALID (reused: not read again)
 *   VALID --CLOCK victim, no plan holds it--> FREE
 *   LOADING, VALID --the block is written or discarded--> DEAD
 *   DEAD --the last plan holding it lets go--> FREE
 *
 * Only VALID slots are read by attention; a plan whose block's slot is not
 * VALID at its compute reads the block through the region, whose fault path
 * serves it (and reports a failing store), so a failed or stale slot is
 * never served.  DEAD slots are out of sl_of, so a later plan reads again.
 *
 * The reads: the waiter thread (plan.c) owns the store queue, submits the
 * queued plans' reads in order, as deep as the queue goes, and reaps them;
 * it touches only the plans' I/O records and their counts.  Settling (the
 * results into the slots' states) is the driving thread's, after the wait.
 *
 * Which slot a new block takes: CLOCK with a count, not a bit.  A slot
 * chosen again gains a pass of the hand, up to SLOT_USE_MAX, so that the
 * blocks the predictor keeps choosing (heavy hitters, sinks) outlive the
 * ones chosen once (lowrank decode at 32K in 84 MiB of slots: reuse 0.248
 * against 0.231 with a bit, the same for counts of 2 to 255).
 *
 * Fewer, larger reads: a disk serves one read of four blocks sooner than
 * four reads of one.  A plan's blocks adjacent in the store are read as
 * one I/O into adjacent slots: CLOCK's hand looks on for a run of free
 * slots as long as the run of blocks (slot_victim).  CPU per read, which
 * shares the cores with attention and the predictor: the slots' memory is
 * the queue's fixed buffer where the store can (no page pinning per
 * read), and the waiter wakes once for a batch of completions, not once
 * for each.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kmod-helpers/mem.h"
#include "lib/kv/kvcache_i.h"

#define SLOT_QUEUE_DEPTH 128  /* reads in flight at most */
#define SLOT_WAKE_BATCH	 32   /* completions the waiter wakes for, at most */
#define SLOT_READ_MAX	 (256u << 10) /* one read of adjacent blocks, at most */
#define SLOT_RUN_SCAN	 64 /* slots CLOCK looks on for a run of free ones */
#define SLOT_USE_MAX	 3  /* CLOCK's count: passes a slot chosen again survives */

enum { SLOT_FREE, SLOT_LOADING, SLOT_VALID, SLOT_DEAD };

bool kvc_slots_wanted(const struct kvp_kvcache *c)
{
	return c->o.reuse_slots && c->o.backend == KVP_KVCACHE_PAGER &&
	       c->o.prefetch && c->o.pred.kind != KVP_PREDICTOR_EXACT &&
	       !(c->o.device && strcmp(c->o.device, "cpu"));
}

bool kvc_slots_on(const struct kvp_kvcache *c)
{
	return c->sl_of && c->sl_n && kvc_slots_wanted(c);
}

uint64_t kvc_slots_region_floor(const struct kvp_kvcache *c)
{
	uint64_t pbb = c->l.pager_block_bytes, f = 4 * pbb;

	if (f < (2u << 20))
		f = 2u << 20;
	/* the rolling blocks' pager blocks stay pinned (seq.c rb_repin) */
	if (c->l.blocks_per_pager_block == 1)
		f += (uint64_t)c->o.max_seqs * c->g.layers * pbb;
	return f;
}

/*
 * Slot memory: whole huge pages where it spans one or more (a TLB entry
 * and, in a guest that shadows page tables, a first touch per 2 MiB), so
 * that what is counted is what is held; small pages below.
 */
static uint32_t slots_fitting(const struct kvp_kvcache *c, uint64_t bytes)
{
	uint64_t pbb = c->l.pager_block_bytes;

	if (bytes >= KVP_HUGE_SIZE && pbb <= KVP_HUGE_SIZE &&
	    !(KVP_HUGE_SIZE % pbb))
		bytes -= bytes % KVP_HUGE_SIZE;
	return (uint32_t)(bytes / pbb);
}

static void slots_free_mem(struct kvp_kvcache *c)
{
	if (c->sl_mem && c->sl_q && c->sl_store->ops->queue_buffer)
		(void)c->sl_store->ops->queue_buffer(c->sl_q, NULL, 0);
	if (c->sl_mem)
		kvp_mem_release(c->sl_mem,
				(size_t)c->sl_n * c->l.pager_block_bytes);
	free(c->sl);
	c->sl_mem = NULL;
	c->sl = NULL;
	c->sl_n = 0;
	c->sl_hand = 0;
}

/* Slots for bytes (slots_fitting); what they held is dropped.  0, or
 * -EBUSY while a plan holds one, or -ENOMEM with none left. */
static int slots_resize(struct kvp_kvcache *c, uint64_t bytes)
{
	size_t pbb = c->l.pager_block_bytes, len, i;
	uint32_t n = slots_fitting(c, bytes);
	bool huge;
	int err;

	for (i = 0; i < c->sl_n; i++)
		if (c->sl[i].refs)
			return -EBUSY;
	if (n == c->sl_n)
		return 0;
	/* nothing in flight (no plan holds a slot): the old pool goes first,
	 * so that the two are never held at once */
	for (i = 0; i < c->npb; i++)
		c->sl_of[i] = -1;
	slots_free_mem(c);
	if (!n)
		return 0;
	len = (size_t)n * pbb;
	huge = !(len % KVP_HUGE_SIZE);
	c->sl = calloc(n, sizeof(*c->sl));
	err = c->sl ? kvp_mem_reserve(len, huge ? KVP_HUGE_SIZE : 4096, huge,
				      (void **)&c->sl_mem)
		    : -ENOMEM;
	if (!err) {
		err = kvp_mem_populate(c->sl_mem, len);
		if (err)
			kvp_mem_release(c->sl_mem, len);
	}
	if (err) {
		free(c->sl);
		c->sl = NULL;
		c->sl_mem = NULL;
		return -ENOMEM;
	}
	/* one touch of every page now, none on the decode's path */
	for (i = 0; i < len; i += 4096)
		c->sl_mem[i] = 0;
	for (i = 0; i < n; i++)
		c->sl[i].pb = UINT64_MAX;
	c->sl_n = n;
	/* optional: without it each read pins its slot's pages */
	if (c->sl_q && c->sl_store->ops->queue_buffer)
		(void)c->sl_store->ops->queue_buffer(c->sl_q, c->sl_mem, len);
	return 0;
}

int kvc_slots_refit(struct kvp_kvcache *c, uint64_t frames)
{
	uint64_t floor = kvc_slots_region_floor(c), slots = 0, region;
	struct kvp_config cfg;
	int err;

	if (!c->sl_of)
		return -EOPNOTSUPP;
	if (kvc_slots_wanted(c) &&
	    frames >= floor + 16 * (uint64_t)c->l.pager_block_bytes)
		slots = (uint64_t)slots_fitting(c, frames - floor) *
			c->l.pager_block_bytes;
	region = frames - slots;
	kvp_kvcache_drain(c);
	kvp_pager_config(c->pager, &cfg);
	if (slots < kvc_slots_bytes(c)) {
		/* the slots shrink before the region grows (-ENOMEM: none
		 * are left, and the region gets them all) */
		int rerr;

		err = slots_resize(c, slots);
		cfg.ram_budget_bytes = frames - kvc_slots_bytes(c);
		rerr = kvp_pager_reconfigure(c->pager, &cfg, NULL);
		err = err ? err : rerr;
	} else {
		cfg.ram_budget_bytes = region;
		err = kvp_pager_reconfigure(c->pager, &cfg, NULL);
		if (!err)
			err = slots_resize(c, slots);
		if (err == -ENOMEM) {
			cfg.ram_budget_bytes = frames - kvc_slots_bytes(c);
			(void)kvp_pager_reconfigure(c->pager, &cfg, NULL);
		}
	}
	kvp_pager_config(c->pager, &cfg);
	c->budget = cfg.ram_budget_bytes;
	return err;
}

int kvc_slots_init(struct kvp_kvcache *c)
{
	struct kvp_store *st = c->be->store ? c->be->store(c) : NULL;
	size_t i;
	int err;

	if (!kvc_slots_wanted(c) || !st || !st->ops->queue_create ||
	    c->l.pager_block_bytes % (st->offset_align ? st->offset_align : 1))
		return 0; /* no queue to read with: the region serves all */
	c->sl_of = malloc(sizeof(int32_t) * c->npb);
	if (!c->sl_of)
		return -ENOMEM;
	for (i = 0; i < c->npb; i++)
		c->sl_of[i] = -1;
	err = st->ops->queue_create(st, SLOT_QUEUE_DEPTH, &c->sl_q);
	if (err)
		return err;
	c->sl_store = st;
	err = kvc_slots_refit(c, c->budget);
	return err == -ENOMEM ? 0 : err; /* -ENOMEM: the region has all */
}

void kvc_slots_fini(struct kvp_kvcache *c)
{
	if (c->sl_q)
		c->sl_store->ops->queue_destroy(c->sl_q);
	c->sl_q = NULL;
	slots_free_mem(c);
	free(c->sl_of);
	c->sl_of = NULL;
}

/* Can slot i hold a new block: free, or VALID, unreferenced and its
 * CLOCK count spent? */
static bool slot_takeable(const struct kvp_kvcache *c, uint32_t i)
{
	const struct kvc_slot *s = &c->sl[i];

	return !s->refs && (s->state == SLOT_FREE ||
			    (s->state == SLOT_VALID && !s->used));
}

/* Empty slot i, which is takeable, for a new block. */
static void slot_take(struct kvp_kvcache *c, uint32_t i)
{
	struct kvc_slot *s = &c->sl[i];

	if (s->state == SLOT_VALID)
		c->sl_of[s->pb] = -1;
	s->state = SLOT_FREE;
	s->pb = UINT64_MAX;
	if (c->sl_hand == i)
		c->sl_hand = (i + 1) % c->sl_n;
}

/*
 * A slot no plan holds, by CLOCK over the use counts, where the next
 * @want - 1 are takeable too if the hand finds such a run within
 * SLOT_RUN_SCAN slots of the first: a run of blocks adjacent in the store
 * is then read as one I/O into them (slots_extend).  The first slot of
 * the longest run seen, taken, or -1: none.
 */
static int32_t slot_victim(struct kvp_kvcache *c, uint32_t want)
{
	uint32_t k, run = 0, best = 0, at = 0, scan = 0;

	for (k = 0; k < (SLOT_USE_MAX + 1) * c->sl_n && run < want; k++) {
		uint32_t i = c->sl_hand;
		struct kvc_slot *s = &c->sl[i];

		if (best && ++scan > SLOT_RUN_SCAN)
			break;
		c->sl_hand = (i + 1) % c->sl_n;
		if (!i)
			run = 0; /* a run does not wrap */
		if (s->refs || s->state == SLOT_LOADING ||
		    s->state == SLOT_DEAD) {
			run = 0;
			continue;
		}
		if (s->state == SLOT_VALID && s->used) {
			/* looking on for a run spares the counts */
			if (!best)
				s->used--;
			run = 0;
			continue;
		}
		if (++run > best) {
			best = run;
			at = i + 1 - run;
		}
	}
	if (!best)
		return -1;
	c->sl_hand = (at + 1) % c->sl_n;
	slot_take(c, at);
	return (int32_t)at;
}

/* Slots a read starting at plan block i could fill: the run of adjacent
 * blocks from it, up to SLOT_READ_MAX. */
static uint32_t slots_run(const struct kvp_kvcache *c,
			  const struct kvc_plan *pl, size_t i)
{
	size_t max = SLOT_READ_MAX / c->l.pager_block_bytes, n = 1;

	while (i + n < pl->npb && n < max && pl->pb[i + n] == pl->pb[i] + n)
		n++;
	return (uint32_t)n;
}

/* Can @io, the plan's last read, grow to take in pb: the block after its
 * last, into the slot after its last, if that one is takeable?  The slot
 * pb gets, or -1. */
static int32_t slots_extend(struct kvp_kvcache *c, struct kvp_io *io,
			    uint64_t pb)
{
	size_t pbb = c->l.pager_block_bytes;
	uint32_t s = (uint32_t)(((char *)io->buf + io->len - c->sl_mem) / pbb);

	if (pb != (io->off - c->o.store_offset + io->len) / pbb ||
	    io->len + pbb > SLOT_READ_MAX || s >= c->sl_n ||
	    !slot_takeable(c, s))
		return -1;
	slot_take(c, s);
	io->len += pbb;
	return (int32_t)s;
}

int kvc_slots_plan(struct kvp_kvcache *c, struct kvc_plan *pl)
{
	size_t pbb = c->l.pager_block_bytes, i;
	struct kvp_io *last = NULL; /* the plan's last read, if it can grow */

	pl->nio = pl->io_sub = pl->io_done = 0;
	if (kvc_grow((void **)&pl->io, &pl->io_cap, pl->npb + 1,
		     sizeof(*pl->io)))
		return -ENOMEM;
	for (i = 0; i < pl->npb; i++) {
		uint64_t pb = pl->pb[i];
		int32_t s = c->sl_of[pb];
		struct kvp_io *io;
		bool grown;

		pl->slot[i] = -1;
		if (s >= 0) {
			c->sl[s].refs++;
			if (c->sl[s].used < SLOT_USE_MAX)
				c->sl[s].used++;
			pl->slot[i] = s;
			pl->res[i] = c->sl[s].state == SLOT_VALID;
			last = NULL;
			continue;
		}
		pl->res[i] = c->be->resident(c, pb);
		if (pl->res[i] || !c->be->in_store(c, pb)) {
			last = NULL;
			continue;
		}
		s = last ? slots_extend(c, last, pb) : -1;
		grown = s >= 0;
		if (!grown && (s = slot_victim(c, slots_run(c, pl, i))) < 0) {
			last = NULL;
			continue; /* every slot in use: the region serves it */
		}
		c->sl[s].pb = pb;
		c->sl[s].state = SLOT_LOADING;
		c->sl[s].refs = 1;
		c->sl[s].used = 1;
		c->sl_of[pb] = s;
		pl->slot[i] = s;
		if (grown)
			continue;
		io = last = &pl->io[pl->nio++];
		memset(io, 0, sizeof(*io));
		io->op = KVP_IO_READ;
		io->buf = c->sl_mem + (size_t)s * pbb;
		io->len = pbb;
		io->off = c->o.store_offset + pb * pbb;
		io->cookie = pl;
	}
	return 0;
}

void kvc_slots_settle(struct kvp_kvcache *c, struct kvc_plan *pl)
{
	size_t pbb = c->l.pager_block_bytes, i;

	if (pl->settled)
		return;
	for (i = 0; i < pl->nio; i++) {
		const struct kvp_io *io = &pl->io[i];
		uint32_t s = (uint32_t)(((char *)io->buf - c->sl_mem) / pbb), k;
		bool whole = io->result == (int64_t)io->len;

		c->st.slot_ios++;
		/* one read of adjacent blocks into adjacent slots */
		for (k = 0; k < io->len / pbb; k++) {
			struct kvc_slot *sl = &c->sl[s + k];

			if (sl->state != SLOT_LOADING)
				continue; /* written or discarded meanwhile */
			if (whole) {
				sl->state = SLOT_VALID;
				c->cur.bytes_read += pbb;
				c->st.slot_reads++;
			} else {
				sl->state = SLOT_DEAD;
				c->sl_of[sl->pb] = -1;
				c->st.slot_read_errors++;
			}
		}
	}
	pl->settled = true;
}

void kvc_slots_release(struct kvp_kvcache *c, struct kvc_plan *pl)
{
	size_t i;

	kvc_slots_settle(c, pl);
	for (i = 0; i < pl->npb; i++) {
		int32_t s = pl->slot[i];

		if (s < 0)
			continue;
		if (!--c->sl[s].refs && c->sl[s].state == SLOT_DEAD) {
			c->sl[s].state = SLOT_FREE;
			c->sl[s].pb = UINT64_MAX;
		}
		pl->slot[i] = -1;
	}
	pl->nio = 0;
}

const char *kvc_slots_addr(const struct kvp_kvcache *c,
			   const struct kvc_plan *pl, uint64_t pb)
{
	size_t i = kvc_plan_find(pl, pb);
	int32_t s;

	if (i == pl->npb)
		return NULL;
	s = pl->slot[i];
	if (s < 0 || c->sl[s].state != SLOT_VALID)
		return NULL;
	return c->sl_mem + (size_t)s * c->l.pager_block_bytes;
}

void kvc_slots_forget(struct kvp_kvcache *c, uint64_t pb, uint64_t n)
{
	uint64_t end = pb + n;

	if (!c->sl_of)
		return;
	for (; pb < end && pb < c->npb; pb++) {
		int32_t s = c->sl_of[pb];

		if (s < 0)
			continue;
		c->sl_of[pb] = -1;
		if (c->sl[s].refs) {
			c->sl[s].state = SLOT_DEAD;
		} else {
			c->sl[s].state = SLOT_FREE;
			c->sl[s].pb = UINT64_MAX;
		}
	}
}

uint64_t kvc_slots_bytes(const struct kvp_kvcache *c)
{
	return (uint64_t)c->sl_n * c->l.pager_block_bytes;
}

/* ---- the waiter thread's side ------------------------------------------ */

/* Submit what the queued plans have not, in queue order; c->mu not held. */
static void slots_submit(struct kvp_kvcache *c)
{
	struct kvp_io *batch[SLOT_QUEUE_DEPTH];
	unsigned room = SLOT_QUEUE_DEPTH - c->sl_inflight, nb = 0, k;
	struct kvc_plan *pls[SLOT_QUEUE_DEPTH];
	uint32_t q, len;
	int got;

	if (!room)
		return;
	pthread_mutex_lock(&c->mu);
	len = c->wq_len;
	for (q = 0; q < len && nb < room; q++) {
		struct kvc_plan *p = c->wq[(c->wq_head + q) % c->nplans];
		size_t j;

		for (j = p->io_sub; j < p->nio && nb < room; j++) {
			pls[nb] = p;
			batch[nb++] = &p->io[j];
		}
	}
	pthread_mutex_unlock(&c->mu);
	if (!nb)
		return;
	got = c->sl_store->ops->submit(c->sl_q, batch, nb);
	if (got < 0) {
		/* the queue refused: fail them, the region serves them */
		for (k = 0; k < nb; k++) {
			batch[k]->result = got;
			pls[k]->io_sub++;
			pls[k]->io_done++;
		}
		return;
	}
	for (k = 0; k < (unsigned)got; k++)
		pls[k]->io_sub++;
	c->sl_inflight += (unsigned)got;
}

void kvc_slots_wait(struct kvp_kvcache *c, struct kvc_plan *pl)
{
	struct kvp_io *done[SLOT_QUEUE_DEPTH];
	int n, k;

	while (pl->io_done < pl->nio) {
		unsigned want;

		slots_submit(c);
		if (!c->sl_inflight) {
			/* the queue took none with none in flight: give up
			 * the rest, the region serves them */
			for (; pl->io_sub < pl->nio; pl->io_sub++) {
				pl->io[pl->io_sub].result = -EAGAIN;
				pl->io_done++;
			}
			break;
		}
		/* one wakeup for what pl still waits for (any plan's
		 * completions count: pl's cannot come sooner), in batches
		 * so that the queue is refilled on the way */
		want = (unsigned)(pl->io_sub - pl->io_done);
		if (want > SLOT_WAKE_BATCH)
			want = SLOT_WAKE_BATCH;
		n = c->sl_store->ops->reap(c->sl_q, done, SLOT_QUEUE_DEPTH,
					   want ? want : 1);
		if (n < 0) {
			/* the reads stay in flight (their buffers are the
			 * kernel's until reaped): try again, not in a spin */
			usleep(1000);
			n = 0;
		}
		for (k = 0; k < n; k++) {
			struct kvc_plan *p = done[k]->cookie;

			p->io_done++;
			c->sl_inflight--;
		}
	}
	slots_submit(c); /* the next plans' reads go while pl computes */
}
