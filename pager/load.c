/*
 * load.c - a load's life: frame, read, staging, install.
 *
 * A load (struct kvp_op, OP_LOAD) starts when a fault, a prefetch or
 * read-ahead finds a block ABSENT (kvp_load_start).  It gets a frame from
 * the pool at once or waits on its thread's want_frame queue until an
 * eviction frees one (the service loop's frame stage); loads a fault or a
 * prefetch asked for go before read-ahead.  With its frame it
 * is queued for the submit stage: a read from the store, or a zero fill
 * for a block the store never held.  When the read completes
 * (kvp_load_done) the block is installed into its region (kvp_load_install:
 * UFFDIO_MOVE or UFFDIO_COPY) and becomes RESIDENT, and the threads that
 * faulted on it are woken.  A read-ahead block nobody has asked for yet is
 * staged instead, its frame held, until a fault or a prefetch wants it
 * (kvp_stage_release) or a frame is needed (kvp_stage_drop).  A read that
 * fails poisons the block: every access gets SIGBUS.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
/* The library's SSE2, AVX2 and AVX-512 versions, picked at run time. */
#include <xxh_x86dispatch.h>
#endif

#include "pager/pager_i.h"

/* A load a fault or a prefetch asked for (read-ahead a fault joined
 * too): it takes a frame before read-ahead nobody asked for yet. */
static bool load_asked(const struct kvp_op *op)
{
	return !(op->r->blocks[op->blk].flags & BLK_READAHEAD);
}

static void want_frame_push(struct kvp_service *s, struct kvp_op *op)
{
	bool asked = load_asked(op);

	op->next = NULL;
	op->want_svc = s;
	*s->want_tail = op;
	s->want_tail = &op->next;
	s->nwant++;
	s->nasked += asked;
	s->p->nwant_all++;
	s->p->nwant_asked += asked;
}

void kvp_want_frame_asked(struct kvp_op *op)
{
	op->want_svc->nasked++;
	op->want_svc->p->nwant_asked++;
}

struct kvp_op *kvp_want_frame_next(const struct kvp_service *s)
{
	if (s->nasked)
		for (struct kvp_op *op = s->want_frame; op; op = op->next)
			if (load_asked(op))
				return op;
	return s->want_frame;
}

void kvp_want_frame_remove(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_op **t = &s->want_frame;
	bool asked = load_asked(op);

	while (*t != op)
		t = &(*t)->next;
	*t = op->next;
	if (s->want_tail == &op->next)
		s->want_tail = t;
	op->want_svc = NULL;
	s->nwant--;
	s->nasked -= asked;
	s->p->nwant_all--;
	s->p->nwant_asked -= asked;
	assert(s->nasked <= s->nwant && s->p->nwant_asked <= s->p->nwant_all);
}

void kvp_load_arm(struct kvp_service *s, struct kvp_op *op, void *slot)
{
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];

	op->slot = slot;
	op->zero = !(b->flags & BLK_IN_STORE);
	if (!op->zero) {
		op->io.op = KVP_IO_READ;
		op->io.buf = slot;
		op->io.len = op->win_len;
		op->io.off = kvp_blk_store_off(r, op->blk) + op->win_off;
	}
	kvp_io_queue(s, op);
}

/* A load's frame now, or its place in the queue for one. */
static void load_frame(struct kvp_service *s, struct kvp_op *op)
{
	/* Behind every load waiting for a frame, on any thread (a load
	 * asked for: behind those asked for): with two threads, read-ahead
	 * on one took the frames a fault's load on the other waited for,
	 * and that load then dropped staged read-ahead (read again) or
	 * evicted the working set. */
	struct kvp_pager *p = s->p;
	void *slot = (load_asked(op) ? p->nwant_asked : p->nwant_all)
			 ? NULL
			 : kvp_frame_get(p, op->win_len);

	if (slot)
		kvp_load_arm(s, op, slot);
	else
		want_frame_push(s, op);
}

int kvp_load_start(struct kvp_service *s, struct kvp_region *r, uint64_t blk,
		   enum kvp_load_why why, struct kvp_prefetch *pf, bool write)
{
	struct kvp_block *b = &r->blocks[blk];
	struct kvp_op *op = kvp_op_new(OP_LOAD, r, blk);

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
	op->ahead = why == LOAD_READAHEAD;
	kvp_blk_begin_load(r, b, op, why);
	if (why == LOAD_FAULT)
		KVP_STAT_ADD(r, demand_faults_total, 1);
	else if (why == LOAD_PREFETCH)
		KVP_STAT_ADD(r, prefetch_issued_total, 1);
	else
		KVP_STAT_ADD(r, readahead_blocks_total, 1);
	if (!(b->flags & BLK_IN_STORE) && why == LOAD_FAULT)
		KVP_STAT_ADD(r, zero_fills_total, 1);
	load_frame(s, op);
	return 0;
}

/*
 * Fault-around.  A block is the unit of eviction and of a sequential
 * stream's reads (a 2 MiB block is one huge page to install), but a program
 * that touches pages at random would read a whole block for each page.  So
 * a read fault that does not continue a run loads only fault_around_bytes
 * around itself (the kernel's read-around does the same), and the block
 * becomes RESIDENT in part (BLK_PARTIAL): a fault on a page it lacks loads
 * another window.  Faults that run on from the last window double it, so a
 * stream's first block is read in a few growing windows and its next ones
 * whole (readahead takes over).  A block resident in part keeps its dirty
 * state per dirty window (r->win_bytes, block / 64, windows loaded cover
 * whole ones): a write to a window whose pages are all there dirties it
 * alone (events.c), and its write-back writes those windows only
 * (evict.c), never the pages it lacks, which are the store's.  Where
 * there are no dirty windows (a store that cannot take writes that
 * small), a write to it first makes it whole (kvp_load_complete), and so
 * does a drop in it, always.  Its charge against
 * the budget is the pages it holds.  It needs write protection (to see the
 * write) and the zapper (its eviction drops the pages it has, where a move
 * that fails would put them back writable).
 */
bool kvp_fault_around(const struct kvp_region *r, const struct kvp_block *b)
{
	const struct kvp_pager *p = r->p;
	uint64_t fa = p->cfg.fault_around_bytes;

	/* Four blocks of budget at least: a fill holds its block's pages
	 * while it waits for a frame (service.c lets it past the budget
	 * when nothing else can leave). */
	return fa && fa < r->block_bytes && p->have_wp && p->zapper_running &&
	       kvp_budget(p) >= 4 * (uint64_t)r->block_bytes &&
	       (b->flags & BLK_IN_STORE) &&
	       !(b->flags & (BLK_SPLIT | BLK_HOLES | BLK_DROP | BLK_GONE));
}

/* Under p->lock: begin a fill of RESIDENT @b, [off, off + len), with @op
 * (NULL: a new one). */
static int fill_start(struct kvp_service *s, struct kvp_region *r,
		      uint64_t blk, uint32_t off, uint32_t len, bool dirty,
		      struct kvp_op *op)
{
	if (!op)
		op = kvp_op_new(OP_LOAD, r, blk);
	if (!op)
		return -ENOMEM;
	op->win_off = off;
	op->win_len = len;
	op->dirty = dirty;
	kvp_blk_begin_fill(r, &r->blocks[blk], op);
	load_frame(s, op);
	return 0;
}

int kvp_load_window(struct kvp_service *s, struct kvp_region *r, uint64_t blk,
		    uint32_t off)
{
	struct kvp_block *b = &r->blocks[blk];
	uint32_t fa = (uint32_t)r->p->cfg.fault_around_bytes;
	uint32_t have = (b->flags & BLK_PARTIAL) ? b->present * KVP_PAGE_BYTES
						 : 0;
	uint32_t len = fa, start, left;

	if (!fa || fa >= r->block_bytes) {
		/* Fault-around turned off meanwhile: the rest, whole. */
		len = (uint32_t)r->block_bytes;
		start = 0;
	} else if (have >= fa && off == have) {
		/* The block was read from its start up to this fault (a
		 * stream, whichever thread): as much again, from here.
		 * Told by the block alone, so that streams of several
		 * threads are each seen. */
		len = have;
		start = off;
	} else {
		start = off & ~(len - 1);
	}
	/* Whole dirty windows, so that a window written is all there
	 * (full_win): the window around the fault, one at least. */
	if (r->win_bytes && (start % r->win_bytes || len % r->win_bytes)) {
		len = fa > r->win_bytes ? fa : r->win_bytes;
		len = 1u << (31 - __builtin_clz(len));
		start = off & ~(len - 1);
	}
	/* A power of two (the frame's size class), within the block. */
	len = 1u << (31 - __builtin_clz(len));
	left = (uint32_t)r->block_bytes - start;
	while (len > left)
		len /= 2;
	KVP_STAT_ADD(r, demand_faults_total, 1);
	if (b->state == KVP_BLOCK_RESIDENT)
		return fill_start(s, r, blk, start, len, false, NULL);

	struct kvp_op *op = kvp_op_new(OP_LOAD, r, blk);

	if (!op)
		return -ENOMEM;
	op->win_off = start;
	op->win_len = len;
	kvp_blk_begin_load(r, b, op, LOAD_FAULT);
	load_frame(s, op);
	return 0;
}

/* Under p->lock: kvp_load_complete with @op (NULL: a new one). */
static int complete_with(struct kvp_service *s, struct kvp_region *r,
			 uint64_t blk, bool dirty, const uint64_t *drops,
			 struct kvp_op *op)
{
	if (!op)
		op = kvp_op_new(OP_LOAD, r, blk);
	if (!op)
		return -ENOMEM;
	for (size_t i = 0; drops && i < KVP_BLOCK_PAGES_MAX / 64; i++) {
		op->rm_pages[i] = drops[i];
		op->rm_any = op->rm_any || drops[i];
	}
	return fill_start(s, r, blk, 0, (uint32_t)r->block_bytes, dirty, op);
}

int kvp_load_complete(struct kvp_service *s, struct kvp_region *r,
		      uint64_t blk, bool dirty, const uint64_t *drops)
{
	return complete_with(s, r, blk, dirty, drops, NULL);
}

/*
 * A block moved in arrives writable (the kernel makes a moved page
 * writable, and UFFDIO_MOVE has no write-protect mode), and is
 * write-protected just after.  Only the threads that faulted on it are
 * held meanwhile: another thread whose first access to it falls in
 * between writes with no fault, and a clean block would drop that write
 * when it leaves.  So the slot is digested before the move (slot_digest)
 * and the block read back once protected (a write after that faults):
 * bytes other than those moved in were written unseen, and the block is
 * dirty.  XXH3-128: a change goes unseen with odds of 2^-128.
 */
static void slot_digest(struct kvp_op *op)
{
	XXH128_hash_t h = XXH3_128bits(op->slot, op->win_len);

	op->sum[0] = h.low64;
	op->sum[1] = h.high64;
	op->summed = true;
}

/* Bytes read back a chunk at a time (L2-sized), for the digest. */
#define READBACK_CHUNK (256u << 10)

/*
 * XXH3-128 of [@addr, @addr + @len) of our own memory, read through the
 * kernel (process_vm_readv) into @s's bounce buffer: a page the program
 * unmapped meanwhile is an error here, never a SIGSEGV on the service
 * thread.  (A page dropped meanwhile faults on the kernel's side and is
 * served as a hole, events.c.)  The same digest as XXH3_128bits over the
 * whole range.  0, or -errno (-EFAULT: part of it is gone).
 */
static int digest_own(struct kvp_service *s, const char *addr, size_t len,
		      XXH128_hash_t *out)
{
	size_t off, n;
	int err = 0;

	if (!s->bounce && !(s->bounce = malloc(READBACK_CHUNK)))
		return -ENOMEM;
	if (!s->readback && !(s->readback = XXH3_createState()))
		return -ENOMEM;
	(void)XXH3_128bits_reset(s->readback);
	for (off = 0; off < len && !err; off += n) {
		struct iovec to, from;
		ssize_t got;

		n = len - off < READBACK_CHUNK ? len - off : READBACK_CHUNK;
		to = (struct iovec){ .iov_base = s->bounce, .iov_len = n };
		from = (struct iovec){ .iov_base = (void *)(addr + off),
				       .iov_len = n };
		got = process_vm_readv(getpid(), &to, 1, &from, 1, 0);
		if (got != (ssize_t)n)
			err = got < 0 ? -errno : -EFAULT;
		else
			(void)XXH3_128bits_update(s->readback, s->bounce, n);
	}
	if (!err)
		*out = XXH3_128bits_digest(s->readback);
	return err;
}

/* Did the program write the block @op moved in and protected before its
 * protection?  True too where it cannot be read back whole: pages the
 * program dropped meanwhile (a fault there is filled with zeros while
 * op->verifying, events.c) leave holes, and pages it unmapped (or a
 * read-back refused: process_vm_readv forbidden here) cannot be told
 * apart from written ones. */
static bool written_unseen(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_block *b = &op->r->blocks[op->blk];
	XXH128_hash_t after;
	bool whole;
	int err;

	pthread_mutex_lock(&p->lock);
	whole = !op->rm_any && !(b->flags & (BLK_DROP | BLK_GONE | BLK_SPLIT));
	op->verifying = whole;
	pthread_mutex_unlock(&p->lock);
	if (!whole)
		return true;
	if (kvp_test_hook)
		kvp_test_hook(KVP_TEST_READBACK, kvp_blk_addr(op->r, op->blk));
	err = digest_own(s, kvp_blk_addr(op->r, op->blk), op->win_len, &after);
	pthread_mutex_lock(&p->lock);
	op->verifying = false;
	whole = !op->rm_any;
	pthread_mutex_unlock(&p->lock);
	return err || !whole || after.low64 != op->sum[0] ||
	       after.high64 != op->sum[1];
}

/*
 * Move a load's frame into its region (the op's window of its block).
 * Returns 0, or -ENOENT when none of it is mapped any more.  A block the
 * program unmapped in part (the range crosses a hole, which the ioctls
 * refuse as a whole) is installed page by page, skipping the hole, and
 * *split is set: its write protection cannot be set over the hole, so the
 * caller counts it dirty.  A page already there (a hole refilled, or one a
 * block resident in part has) is kept, and its bit set in @kept (pages of
 * the block, zeroed by the caller); *placed counts the
 * pages that arrived.  *check is set for a block moved in and then
 * protected: the caller reads it back (written_unseen) before it counts
 * it clean.
 */
static int install(struct kvp_pager *p, struct kvp_op *op, bool wp,
		   bool paged, bool *slot_full, bool *split, uint32_t *placed,
		   bool *check, uint64_t *kept)
{
	struct kvp_region *r = op->r;
	char *addr = kvp_blk_addr(r, op->blk) + op->win_off;
	void *slot = op->slot;
	size_t len = op->win_len, off = 0, mapped = 0, arrived = 0;
	bool skipped = false, pagewise = false;
	bool move = r->install == KVP_INSTALL_MOVE && !paged, copied = !move;
	int err = 0;

	*split = false;
	*check = false;
	if (move && wp && !op->summed)
		slot_digest(op);
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
		arrived += done;
		if (err == -EEXIST) {
			/* A page already there (a hole refilled): keep it. */
			uint32_t pg = (op->win_off + (uint32_t)off) /
				      KVP_PAGE_BYTES;

			kept[pg / 64] |= 1ull << (pg % 64);
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
			kvp_op_apply_drops(p, op, off, len);
		} else if (err && err != -EAGAIN && move) {
			/* The kernel would not move these pages (a THP shared
			 * with a slot under I/O cannot be split: EBUSY):
			 * copy the rest, which always works. */
			move = false;
			copied = true;
		} else if (err && err != -EAGAIN) {
			/* The block stays LOADING: retried (the pages placed
			 * so far stay, counted here; kept then). */
			*placed = (uint32_t)(arrived / KVP_PAGE_BYTES);
			return err;
		}
		if (!err && !pagewise)
			break;
		err = 0;
	}
	*placed = (uint32_t)(arrived / KVP_PAGE_BYTES);
	/* Nothing of a window mapped is not nothing of its block: the
	 * caller makes the rest whole around the hole. */
	if (*split && mapped == 0 && len == r->block_bytes)
		return -ENOENT;
	if (r->install == KVP_INSTALL_MOVE && !paged) {
		KVP_STAT_ADD(r, installs_move_total, 1);
		/* Moved pages arrive writable (and, after a fallback to
		 * copy, the part moved first): protected, then read back. */
		if (kvp_test_hook)
			kvp_test_hook(KVP_TEST_MOVED, addr);
		if (wp && !*split) {
			(void)kvp_uffd_protect(p, addr, len, true);
			*check = true;
		}
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
	uint64_t ns = kvp_now_ns() - submit_ns, us = ns / 1000;
	unsigned i = 0;

	while (us > 1 && i < KVP_LATENCY_BUCKETS - 1) {
		us >>= 1;
		i++;
	}
	atomic_fetch_add_explicit(&r->st.io_latency_us[i], 1,
				  memory_order_relaxed);
	atomic_fetch_add_explicit(&r->st.io_latency_sum_ns, ns,
				  memory_order_relaxed);
}

static void finish_pfs(struct kvp_pager *p, struct kvp_op *op, bool failed)
{
	for (struct kvp_pf_ref *ref = op->pfs; ref; ref = ref->next)
		kvp_prefetch_block_done(p, ref->pf, failed);
}

/* Under p->lock: a fill that ends without its install gives up the
 * charge of the pages the block had (they are gone: unmapped, dropped,
 * the region dying, or poisoned out of use). */
static void fill_release(struct kvp_pager *p, struct kvp_region *r,
			 struct kvp_block *b)
{
	if (b->flags & BLK_PARTIAL)
		kvp_frame_unuse(p, kvp_blk_charge(r, b));
}

/* Under p->lock: does @b hold writes of the program that a fill given up
 * would lose?  (Its pages stay mapped: they are its data.) */
static bool fill_dirty(const struct kvp_block *b)
{
	return (b->flags & (BLK_PARTIAL | BLK_DIRTY)) ==
		   (BLK_PARTIAL | BLK_DIRTY) &&
	       !(b->flags & (BLK_DROP | BLK_GONE));
}

void kvp_load_abandon(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];
	char *addr;
	size_t len;

	if (fill_dirty(b) && b->dirty_win) {
		/* Resident again as it was: its dirty windows are not given
		 * up (a dying region's destroy writes them back).  Not one
		 * dirty beyond them: destroy would write it whole, zeros
		 * where it lacks pages, over the store's bytes. */
		kvp_blk_fill_undone(r, b);
	} else {
		fill_release(p, r, b);
		kvp_blk_load_dropped(r, b);
	}
	finish_pfs(p, op, false);
	/* Taken under the lock: once it is let go, a dying region's
	 * destroy may free r. */
	addr = kvp_blk_addr(r, op->blk);
	len = r->block_bytes;
	pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
	/* A fault that waited on it faults again (and reads zeros). */
	(void)kvp_uffd_wake(&p->uffd, addr, len);
	kvp_op_free(op);
}

/* Under p->lock: what of a failing fill's dirty block poison_load writes
 * first, in runs of *unit bytes (kvp_store_windows): its dirty windows; a
 * block dirty beyond them, all of it where every page is there, else its
 * windows that are all there (the rest it lacks came from the store).  0
 * where a page of it may be gone unseen (holes): reading it could fault. */
static uint64_t fill_dirty_runs(const struct kvp_region *r,
				const struct kvp_block *b, uint32_t *unit)
{
	*unit = r->win_bytes;
	if (!fill_dirty(b) || (b->flags & (BLK_HOLES | BLK_SPLIT)))
		return 0;
	if (b->dirty_win)
		return b->dirty_win;
	if ((size_t)b->present * KVP_PAGE_BYTES == r->block_bytes) {
		*unit = (uint32_t)r->block_bytes;
		return 1;
	}
	return b->full_win;
}

/* Under p->lock, which it releases: a load that holds no frame fails; its
 * block is POISONED, SIGBUS for every access, now and later: never a
 * hang.  A fill's block holds writes of the program (dirty): those are
 * written to the store first, from the pages it had, which stay. */
static void poison_load(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];
	bool fill = b->flags & BLK_PARTIAL;
	uint32_t unit;
	uint64_t runs = fill_dirty_runs(r, b, &unit);
	int err;

	fill_release(p, r, b);
	kvp_blk_load_failed(r, b);
	finish_pfs(p, op, true);
	/* The region stays until the write, the poison and the wake below
	 * are done: a dying one's destroy waits for inflight. */
	r->inflight++;
	pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
	if (runs) {
		/* Dropped pages (noted on the op) are zeros, never read. */
		err = kvp_store_windows(r, op->blk, runs, unit,
					op->rm_any ? op->rm_pages : NULL);
		if (err) {
			fprintf(stderr,
				"kvpager: region %s block %" PRIu64
				": reading it failed, and writing back what "
				"the program wrote to it failed too (%s): "
				"those writes are lost\n",
				r->name, op->blk, strerror(-err));
			pthread_mutex_lock(&p->lock);
			if (b->state == KVP_BLOCK_POISONED)
				b->flags |= BLK_DIRTY; /* flush: -EIO */
			pthread_mutex_unlock(&p->lock);
		}
	}
	if (p->have_poison)
		kvp_uffd_poison_range(p, kvp_blk_addr(r, op->blk),
				      r->block_bytes);
	/* A fill's block keeps the pages it had (the poison skips them):
	 * threads waiting on those (a write) are woken here; they find it
	 * POISONED and write on (events.c). */
	if (fill)
		(void)kvp_uffd_wake(&p->uffd, kvp_blk_addr(r, op->blk),
				    r->block_bytes);
	pthread_mutex_lock(&p->lock);
	r->inflight--;
	pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
	kvp_op_free(op);
}

void kvp_load_past_budget(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];
	void *slot;

	if (b->flags & BLK_PREFETCHED) {
		/* Nobody faulted on it: not worth the overdraft.  (Read-ahead
		 * never comes here: the frame stage gives it up.) */
		kvp_want_frame_remove(s, op);
		kvp_load_abandon(s, op);
		return;
	}
	slot = kvp_frame_get_overdraft(p, op->win_len);
	if (slot) {
		KVP_STAT_ADD(r, overdraft_loads_total, 1);
		kvp_want_frame_remove(s, op);
		kvp_load_arm(s, op, slot);
		pthread_mutex_unlock(&p->lock);
		return;
	}
	if (!op->forced_retry) {
		/* The overdraft is spent.  Before a SIGBUS, one write-back
		 * now, whatever the back-off says: the store may be back. */
		op->forced_retry = true;
		p->wb_retry_ns = 0;
		pthread_mutex_unlock(&p->lock);
		return;
	}
	KVP_STAT_ADD(r, unservable_faults_total, 1);
	kvp_want_frame_remove(s, op);
	poison_load(s, op);
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

void kvp_stage_release(struct kvp_service *s, struct kvp_op *op)
{
	unstage(s->p, op);
	kvp_blk_used(op->r, &op->r->blocks[op->blk]);
	op->next = s->ready;
	s->ready = op;
}

void kvp_stage_drop(struct kvp_pager *p, struct kvp_op *op)
{
	struct kvp_region *r = op->r;

	unstage(p, op);
	kvp_blk_load_dropped(r, &r->blocks[op->blk]);
	finish_pfs(p, op, false);
	kvp_frame_unuse(p, op->win_len);
	kvp_frame_put(p, op->slot, op->win_len, true);
	pthread_cond_broadcast(&p->idle);
	kvp_op_free(op);
}

/* How far a staged block is from its stream's last fault, in bytes (so
 * that regions of other block sizes compare): the one a stream needs
 * last.  One its faults have passed is never needed: UINT64_MAX. */
static uint64_t stage_distance(const struct kvp_op *op)
{
	uint64_t last = op->r->ra[op->ra_slot].last;

	return op->blk < last ? UINT64_MAX
			      : (op->blk - last) << op->r->block_shift;
}

bool kvp_stage_drop_farthest(struct kvp_pager *p, bool passed_only)
{
	struct kvp_op *far = p->staged;
	uint64_t fd;

	if (!far)
		return false;
	fd = stage_distance(far);
	for (struct kvp_op *op = far->next; op; op = op->next) {
		uint64_t d = stage_distance(op);

		if (d > fd) {
			far = op;
			fd = d;
		}
	}
	if (passed_only && fd != UINT64_MAX)
		return false;
	kvp_stage_drop(p, far);
	return true;
}

void kvp_stage_drop_passed(struct kvp_pager *p)
{
	for (struct kvp_op *op = p->staged, *next; op; op = next) {
		next = op->next;
		if (stage_distance(op) == UINT64_MAX)
			kvp_stage_drop(p, op);
	}
}

uint64_t kvp_stage_bytes(const struct kvp_pager *p)
{
	uint64_t n = 0;

	for (const struct kvp_op *op = p->staged; op; op = op->next)
		n += op->r->block_bytes;
	return n;
}

void kvp_load_install(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];
	size_t len = op->win_len, grew = 0;
	bool whole = len == r->block_bytes;
	bool drop, dirty, fill, paged, full = true, split = false;
	bool more = false;
	bool check = false, unseen = false, kept = false;
	uint64_t kept_pages[KVP_BLOCK_PAGES_MAX / 64] = { 0 };
	/* The pages waiting for their zap at the look at the drops (their
	 * drops zeroed in the slot), then those whose wait its install
	 * does not end. */
	uint64_t waited[KVP_BLOCK_PAGES_MAX / 64];
	struct kvp_op *next = NULL;
	/* What the end wakes: r may be gone once p->lock is let go. */
	char *waddr = kvp_blk_addr(r, op->blk);
	size_t wlen = r->block_bytes;
	uint32_t placed = 0;
	int err;

	/* A window may have to make its block whole at once (see below):
	 * its op is ready before the install, which cannot be undone. */
	if (!whole)
		next = kvp_op_new(OP_LOAD, r, op->blk);
	if (kvp_test_hook)
		kvp_test_hook(KVP_TEST_INSTALL, kvp_blk_addr(r, op->blk));
	/* From the look at its drops to the install, no drop is read. */
	kvp_install_guard(p);
	pthread_mutex_lock(&p->lock);
	fill = b->flags & BLK_PARTIAL;
	/* Into a range with a page table, or a window: by copy (BLK_PAGES). */
	paged = fill || !whole || (b->flags & BLK_PAGES);
	drop = b->flags & BLK_DROP;
	if (drop)
		kvp_blk_contents_gone(b);
	dirty = op->dirty || !p->have_wp;
	if (!op->zero && !drop && kvp_op_zero_dropped(op, 0, op->win_len))
		op->summed = false;
	kvp_blk_zap_waiting(r, b, waited);
	pthread_mutex_unlock(&p->lock);

	if (op->zero || drop) {
		memset(op->slot, 0, len);
		op->summed = false;
	}
	err = !whole && !next ? -ENOMEM
			      : install(p, op, !dirty, paged, &full, &split,
					&placed, &check, kept_pages);
	kvp_install_unguard(p);
	for (size_t i = 0; i < KVP_BLOCK_PAGES_MAX / 64; i++)
		kept = kept || kept_pages[i];
	op->placed += placed;
	if (check) {
		/* Its waiters go on now (what they read is there; a write
		 * faults, and waits until it is RESIDENT) while it is read
		 * back. */
		(void)kvp_uffd_wake(&p->uffd, kvp_blk_addr(r, op->blk),
				    r->block_bytes);
		unseen = written_unseen(s, op);
	}

	if (err && err != -ENOENT) {
		/* Could not map it (out of memory): keep it loading and try
		 * again on the next turn; the faulting threads still wait. */
		pthread_mutex_lock(&p->lock);
		op->next = s->ready;
		s->ready = op;
		pthread_mutex_unlock(&p->lock);
		kvp_op_free(next);
		return;
	}
	/* A fill for a write: the pages it had are still write-protected.
	 * Lifted quietly: a thread woken now would find the block LOADING
	 * (advice passes such a block by, a COLD hint among them). */
	if (err == 0 && whole && dirty && fill)
		(void)kvp_uffd_unprotect_quiet(p, kvp_blk_addr(r, op->blk),
					       r->block_bytes);
	pthread_mutex_lock(&p->lock);
	/* The pages it placed end the waits of the drops it knew of: the
	 * page there now is the slot's, zeroed.  Not a wait that began
	 * since: a drop read in the install's retry, or after its guard
	 * (a drop read while the read-back runs, or before p->lock is
	 * taken here), found the page placed with the bytes it dropped, and
	 * its zap may not have come yet.  Ended here, the block was a victim
	 * at once, moved out with those bytes before the zap, and loaded
	 * again from the store where the program reads zeros. */
	for (size_t i = 0; i < KVP_BLOCK_PAGES_MAX / 64; i++)
		waited[i] = kept_pages[i] | ~waited[i];
	if (err == 0)
		kvp_blk_zap_filled(r, b, op->win_off, (uint32_t)len, waited);
	if (err == -ENOENT) {
		fill_release(p, r, b);
		kvp_blk_load_unmapped(r, b);
		kvp_frame_unuse(p, len);
		full = true;
	} else {
		/* A window that a write joined, that the program dropped into
		 * (before or during the install: the bits left are outside
		 * it), or that crossed a hole it unmapped, is dirty: its block
		 * is made whole at once, always clean in part. */
		more = !whole && !(b->flags & BLK_DROP) &&
		       (op->dirty || op->rm_any || split);
		/* A page already there in a whole block that had none: zeros
		 * a hole's late fill left after the block was dropped, which
		 * the program may have written since, with no fault.  The
		 * store never had it: dirty.  (Or one this load placed before
		 * a failed try: a write-back too many.)  Not a window: only a
		 * block the store holds is loaded in windows, and a drop
		 * forgets that; a window kept its own pages from a failed
		 * try, and dirty it would be written whole. */
		if (kept && whole && !fill)
			unseen = true;
		/* (op->dirty: a drop handled in the install's retry, its
		 * zeros placed by kvp_op_apply_drops.) */
		drop = kvp_blk_installed(r, b,
					 dirty || op->dirty || more || unseen,
					 split, whole, op->placed, &grew);
		/* Pages of a whole block the program dropped while it went
		 * in (their REMOVE handled meanwhile): holes, as when they
		 * go once it is resident (events.c). */
		if (whole && op->rm_any && !drop)
			kvp_blk_holes(b, false);
		/* The frame was charged for the window; the block for what
		 * arrived. */
		kvp_frame_unuse(p, len - grew);
	}
	finish_pfs(p, op, false);
	kvp_frame_put(p, op->slot, len, full);
	if (err == 0 && drop && !b->pins && !b->holds)
		/* Discarded while it was being installed: drop it now.  The
		 * waiters are woken by the discard (they read zeros). */
		kvp_discard_resident(r, op->blk);
	else if (err == 0 && !whole && more && !drop) {
		(void)complete_with(s, r, op->blk, true, op->rm_pages, next);
		next = NULL; /* complete_with cannot fail with an op */
	}
	pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
	/* Only now: a woken thread finds the block RESIDENT. */
	(void)kvp_uffd_wake(&p->uffd, waddr, wlen);
	kvp_op_free(next);
	kvp_op_free(op);
}

/*
 * A read (or zero fill) is done.  A read-ahead block nobody has asked for
 * yet is staged, not installed: it is installed when the program faults on
 * it (a fault with no I/O to wait for), so that read-ahead nobody uses is
 * seen: it is dropped from the stage, counted wasted, and read-ahead
 * shrinks.  (A write between its move and its protection is caught by
 * written_unseen, whoever installs it.)
 */
void kvp_load_done(struct kvp_service *s, struct kvp_op *op)
{
	struct kvp_pager *p = s->p;
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];
	size_t len = op->win_len;
	bool ok = op->zero || op->io.result == (int64_t)len;

	if (!op->zero) {
		latency(r, op->io.submit_ns);
		if (op->io.result > 0)
			KVP_STAT_ADD(r, bytes_read_total,
				     (uint64_t)op->io.result);
	}
	/* A read-ahead block to be moved in whole: its digest now, while
	 * no fault waits for it (written_unseen); a demand load's is taken
	 * at its install, only where it goes in by move, protected. */
	if (ok && !op->zero && op->ahead && r->install == KVP_INSTALL_MOVE &&
	    len == r->block_bytes && p->have_wp)
		slot_digest(op);
	pthread_mutex_lock(&p->lock);
	/* A dying region's loads are given up, but for a fill of a block
	 * the program wrote: installed, it is whole (or has its windows)
	 * for destroy to write back; given up, the writes beyond its dirty
	 * windows would be lost (the region is registered until nothing
	 * of it is in flight). */
	if ((r->dying && !fill_dirty(b)) || (b->flags & BLK_GONE)) {
		kvp_frame_unuse(p, len);
		kvp_frame_put(p, op->slot, len, true);
		kvp_load_abandon(s, op);
		return;
	}
	if (!ok && !(b->flags & BLK_DROP)) {
		KVP_STAT_ADD(r, read_errors_total, 1);
		kvp_frame_unuse(p, len);
		kvp_frame_put(p, op->slot, len, true);
		poison_load(s, op);
		return;
	}
	if ((b->flags & BLK_READAHEAD) && !(b->flags & BLK_DROP)) {
		op->staged = true;
		op->next = p->staged;
		p->staged = op;
		pthread_mutex_unlock(&p->lock);
		return;
	}
	pthread_mutex_unlock(&p->lock);
	kvp_load_install(s, op);
}
