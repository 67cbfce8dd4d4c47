/*
 * zap.c - clean eviction by batched MADV_DONTNEED: the zapper thread.
 *
 * A block leaves its region either by moving its pages back into a frame
 * (UFFDIO_MOVE, evict.c) or, when the store already holds its data, by
 * dropping them.  A move flushes the TLB once per page for a block of up
 * to 32 pages, and in a guest each flush costs a hypercall and an IPI to
 * every CPU running the program: 40-70 us for a 64 KiB block on these
 * machines.  One process_madvise(MADV_DONTNEED_LOCKED) drops a whole
 * batch of blocks with one flush.  It serves clean blocks of copy-mode
 * regions, whose frames went back to the pool at install; move-mode
 * regions keep moving, since their pages are the pool's next frames.
 *
 * Each range dropped raises a UFFD_EVENT_REMOVE, and the call waits until
 * a service thread has read it: so the call runs on a thread of its own.
 * A service thread that reads a REMOVE over a zapping block counts it
 * page by page (kvp_zap_seen) instead of taking it for the program's.  Our
 * call drops each page of the block exactly once, so a page counted twice
 * was dropped by the program too and must read back as zeros; but for the
 * REMOVEs the kernel repeats when the VMA is split meanwhile (zap_walk).
 * A block split into several VMAs now or ever before (a page the program
 * locked or protected) is dropped a page at a time, which raises no
 * repeats (zap_ranges).
 *
 * Every block the zapper took goes back to a service thread (p->zap_done),
 * which settles it (service.c): state changes stay on service threads.  A
 * block the call did not finish (it stops at the first range it fails on,
 * such as one the program unmapped in part) is evicted by move there.
 *
 * The call returns once each event has been read, not handled: with two
 * service threads, one may still hold our event for a block while the
 * other settles it.  Handled after the block left, that event would read
 * as the program's drop and zero the block.  So the zapper waits for the
 * readers to have handled what they read (p->evlock) before it passes
 * its blocks on.
 *
 * Each range is a round trip with the reader: the call queues the event
 * and sleeps until it is read, and until the call wakes again the kernel
 * refuses the reader's installs (EAGAIN), so the reader retries.  Across
 * CPUs each round trip is a wake-up by IPI, which a guest pays dearly
 * (random 64 KiB faults ran a quarter slower).  On the reader's CPU its
 * retry yields straight to us.  So before each call the zapper moves to the
 * CPU that last read one of its events (zap_follow_reader).
 *
 * A block whose pages UFFDIO_MOVE refuses (a page the program mlocked or
 * mprotected: the move wants one plain VMA) can leave by no move, and
 * faults waiting for a frame would wait for ever once such blocks fill
 * the budget.  So it leaves by a zap in either install mode (BLK_NOMOVE),
 * and when dirty the zapper writes a copy of it first (clean_one): read
 * through /proc/self/mem, which reads a page the program made
 * inaccessible, with zeros filled in where the program dropped pages.
 * One that can leave neither way (unmapped in part) is no victim.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kmod-helpers/mem.h"
#include "kmod-helpers/uapi_compat.h"
#include "kmod-helpers/fdset.h"
#include "pager/pager_i.h"

#define ZAP_BATCH 256 /* blocks per call */
#define ZAP_IOVS 1024 /* ranges per call: the kernel's most (UIO_MAXIOV) */

bool kvp_zap_eligible(const struct kvp_pager *p, const struct kvp_region *r,
		      const struct kvp_block *b, bool dirty)
{
	/* A block resident in part leaves by a zap in move mode too: a move
	 * that fails puts its pages back writable (kvp_evict_move).  So does
	 * one with a page table (BLK_PAGES): the zap frees it. */
	return p->zapper_running &&
	       (r->install == KVP_INSTALL_COPY ||
		(b->flags & (BLK_PARTIAL | BLK_PAGES | BLK_NOMOVE))) &&
	       !dirty && !(b->flags & (BLK_SPLIT | BLK_HOLES | BLK_DROP));
}

/* Under p->lock: can a block the move refuses leave?  A clean one by a
 * zap; a dirty one (holes make it so) once the zapper has written it
 * (clean_one), which needs write protection, and all of it loaded and in
 * one piece. */
static bool nomove_can_leave(const struct kvp_pager *p,
			     const struct kvp_block *b)
{
	if (!p->zapper_running ||
	    (b->flags & (BLK_SPLIT | BLK_DROP | BLK_UNREAD)))
		return false;
	return !(b->flags & BLK_DIRTY) ||
	       (p->have_wp && !(b->flags & BLK_PARTIAL));
}

bool kvp_zap_stuck(const struct kvp_pager *p, const struct kvp_block *b)
{
	return (b->flags & BLK_NOMOVE) && !nomove_can_leave(p, b);
}

bool kvp_zap_clean_first(struct kvp_pager *p, struct kvp_region *r,
			 struct kvp_block *b)
{
	struct kvp_op *op;

	if (!(b->flags & BLK_NOMOVE) || !(b->flags & BLK_DIRTY) ||
	    !nomove_can_leave(p, b) || (b->flags & BLK_FLUSHING))
		return false;
	op = kvp_op_new(OP_WRITEBACK, r, kvp_blk_index(r, b));
	if (!op)
		return false;
	b->holds++; /* stays resident, and no victim, while written */
	b->flags |= BLK_FLUSHING;
	kvp_blk_write_begin(b);
	r->inflight++;
	/* It leaves once written (by a zap clean_one starts): counted as
	 * leaving meanwhile, so that the loads waiting for a frame wait for
	 * it rather than evict more. */
	op->held = kvp_blk_charge(r, b);
	p->leaving++;
	p->leaving_bytes += op->held;
	op->next = p->clean_queue;
	p->clean_queue = op;
	pthread_cond_signal(&p->zap_cond);
	return true;
}

/* Under p->lock: a block clean_one wrote, still clean and ours, leaves
 * by a zap now; false if it may not (pinned since, say). */
static bool clean_then_zap(struct kvp_pager *p, struct kvp_op *op)
{
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];

	return !b->pins && !b->holds && !b->late && !r->dying &&
	       kvp_zap_eligible(p, r, b, false) && kvp_zap_begin(p, r, b, op);
}

/*
 * Read @len bytes of our own memory at @from, pages the program made
 * inaccessible too: /proc/self/mem reads as a debugger does.  Without it
 * (a kernel that forbids that), those fail.
 */
static bool read_own(const struct kvp_pager *p, char *to, const char *from,
		     size_t len)
{
	size_t off = 0;

	if (p->mem_fd < 0)
		return kvp_copy_own_all(to, from, len);
	while (off < len) {
		ssize_t n = pread(p->mem_fd, to + off, len - off,
				  (off_t)(uintptr_t)(from + off));

		if (n == 0 || (n < 0 && errno != EINTR))
			return false;
		off += n > 0 ? (size_t)n : 0;
	}
	return true;
}

/* Is @b still clean_one's, and resident?  (A drop of all of it, or a
 * discard, forgets it.) */
static bool still_cleaning(struct kvp_pager *p, const struct kvp_block *b)
{
	bool ours;

	pthread_mutex_lock(&p->lock);
	ours = (b->flags & BLK_FLUSHING) && b->state == KVP_BLOCK_RESIDENT;
	pthread_mutex_unlock(&p->lock);
	return ours;
}

/*
 * Put zeros, write-protected, where the program dropped pages of a block
 * clean_one writes: the copy then reads them, and a write since faults
 * and is seen.  (A hole's fault fills them writable, its write unseen:
 * that is why a block with holes stays dirty.)  Guarded as an install
 * is, while the block is still ours: a drop read meanwhile gives it holes
 * again, and a forgotten one gets no zeros (its next load would find
 * them there).
 */
static void fill_holes(struct kvp_pager *p, const struct kvp_block *b,
		       char *addr, size_t len)
{
	uint64_t there[KVP_BLOCK_PAGES_MAX / 64] = { 0 };
	bool ours;

	kvp_mem_resident_bits(addr, len, there, 0);
	kvp_install_guard(p);
	ours = still_cleaning(p, b);
	for (size_t pg = 0; ours && pg < len / KVP_PAGE_BYTES; pg++) {
		char *page = addr + pg * KVP_PAGE_BYTES;

		if ((there[pg / 64] >> (pg % 64)) & 1)
			continue;
		while (ours && kvp_uffd_copy(&p->uffd, page, p->zero_page,
					     KVP_PAGE_BYTES, true, false,
					     NULL) == -EAGAIN) {
			kvp_uffd_unblock(p);
			ours = still_cleaning(p, b);
		}
	}
	kvp_install_unguard(p);
}

/*
 * Under p->lock, which it lets go meanwhile: write a block queued by
 * kvp_zap_clean_first from the region, then zap it.  It is protected
 * first, as a flush does: a write after that faults and makes it dirty.
 * Holes are filled with zeros, so that every page reads: their flag goes
 * first, so that a hole's fault from then on gives it back (events.c),
 * and only while no hole's fill is under way (b->late: its page would
 * come writable).  The copy out is made with p->evlock held, so that no
 * drop is read meanwhile and no page it reads can go (a drop read before
 * is handled: the block has holes, or is forgotten, and is not copied),
 * and every page present, so that the zapper, which frees frames, never
 * waits on a fault of its own.  The block is ours while BLK_FLUSHING
 * stays (a forget clears it), and written only as it was at the copy: a
 * write since (dirty, or a fault's unprotect under way) or a drop since
 * (holes) keeps it dirty.
 */
static void clean_one(struct kvp_pager *p, struct kvp_op *op)
{
	struct kvp_region *r = op->r;
	struct kvp_block *b = &r->blocks[op->blk];
	char *addr = kvp_blk_addr(r, op->blk), *buf;
	size_t len = r->block_bytes;
	bool copied = false, unread, gone, ours, holes = false;
	int err = 0;

	/* Without /proc/self/mem, the copy would fault on a page the
	 * kernel reclaims meanwhile (MADV_FREE's) with evlock held, which
	 * the fault's reader needs: holes stay. */
	if ((b->flags & (BLK_HOLES | BLK_FLUSHING)) ==
		(BLK_HOLES | BLK_FLUSHING) &&
	    b->state == KVP_BLOCK_RESIDENT && !b->late && p->mem_fd >= 0 &&
	    !kvp_blk_zap_waits(r, b)) {
		b->flags &= ~BLK_HOLES;
		holes = true;
	}
	pthread_mutex_unlock(&p->lock);
	(void)kvp_uffd_protect(p, addr, len, true);
	if (holes)
		fill_holes(p, b, addr, len);
	buf = aligned_alloc(KVP_PAGE_BYTES, len);
	pthread_rwlock_rdlock(&p->evlock);
	pthread_mutex_lock(&p->lock);
	copied = buf && (b->flags & BLK_FLUSHING) &&
		 b->state == KVP_BLOCK_RESIDENT && !b->late &&
		 !(b->flags & (BLK_DIRTY | BLK_HOLES | BLK_SPLIT | BLK_DROP |
			       BLK_ZAPWAIT)) &&
		 kvp_mem_range_resident(addr, len);
	pthread_mutex_unlock(&p->lock);
	/* A page that does not read (PROT_NONE, where /proc/self/mem may
	 * not be read): then the block is not written, and stays
	 * (BLK_UNREAD).  A page gone meanwhile with no drop read (one
	 * MADV_FREE'd that the kernel reclaimed: /proc/self/mem fails on
	 * it rather than wait) is a hole, filled next time.  (Found by
	 * review.) */
	unread = gone = false;
	if (copied && !read_own(p, buf, addr, len)) {
		unread = kvp_mem_range_resident(addr, len);
		gone = !unread;
		copied = false;
	}
	pthread_rwlock_unlock(&p->evlock);
	if (copied) {
		err = kvp_store_pwrite(r->store, buf, len,
				       kvp_blk_store_off(r, op->blk));
		if (err)
			KVP_STAT_ADD(r, write_errors_total, 1);
		else
			KVP_STAT_ADD(r, bytes_written_total, len);
		if (kvp_test_hook)
			kvp_test_hook(KVP_TEST_CLEANED, addr);
	}
	free(buf);
	pthread_mutex_lock(&p->lock);
	p->leaving--;
	p->leaving_bytes -= op->held;
	ours = b->flags & BLK_FLUSHING;
	if (ours) {
		b->flags &= ~BLK_FLUSHING;
		if (copied) {
			kvp_blk_write_done(r, b, err);
			kvp_writeback_result(r, err);
		} else if (b->state == KVP_BLOCK_RESIDENT) {
			b->flags |= BLK_DIRTY; /* not written */
			if (unread)
				b->flags |= BLK_UNREAD;
			/* A hole may be left unfilled, or a page gone. */
			if (holes || gone)
				kvp_blk_holes(b, false);
		}
	}
	b->holds--;
	r->inflight--;
	pthread_cond_broadcast(&p->idle);
	kvp_service_poke(&p->svc[p->rr++ % p->nsvc]);
	if (ours && copied && !err && b->state == KVP_BLOCK_RESIDENT &&
	    !(b->flags & BLK_DIRTY) && clean_then_zap(p, op))
		return;
	kvp_op_free(op);
}

bool kvp_zap_begin(struct kvp_pager *p, struct kvp_region *r,
		   struct kvp_block *b, struct kvp_op *op)
{
	op->cover = calloc(r->block_bytes / KVP_PAGE_BYTES, 1);
	if (!op->cover)
		return false;
	op->kind = OP_ZAP;
	kvp_blk_begin_evict(r, b, op);
	p->leaving++;
	p->leaving_bytes += op->held;
	kvp_zap_queue(p, op);
	return true;
}

void kvp_zap_queue(struct kvp_pager *p, struct kvp_op *op)
{
	op->next = p->zap_queue;
	p->zap_queue = op;
	pthread_cond_signal(&p->zap_cond);
}

/*
 * The REMOVE over [lo, hi) of a zapping block: which of its bytes does
 * the program's drop, or our call's first pass, account for?  Returns
 * where the bytes to count start (@hi: none).
 *
 * The kernel walks our range VMA by VMA, one event each, and drops the
 * mmap lock while an event waits to be read.  If the program splits a VMA
 * then (mprotect or mlock of part of the block), the kernel drops only the
 * first piece of the range it announced and walks on from the split,
 * raising a REMOVE again for each piece after it.  Counted, their pages
 * would read as the program's drop: zeros.  So the walk is followed: it
 * begins at the block's start, an event that starts where it goes on is
 * ours, and so is one that starts inside the last one's range where a VMA
 * begins now (PROCMAP_QUERY, Linux 6.11): the walk goes on from a split.
 * Each ended where a VMA ended, or at the block's end.  Of such events,
 * the part before the walk's furthest end is a repeat.
 *
 * The program's drop can have that shape too.  A drop from the block's
 * start is counted, and takes the walk on only as far as it reaches.
 * Missed: a drop of the program's own of exactly such a piece (taken for
 * a repeat, and the kernel's own repeat before it then counts), a split
 * undone before its repeat is handled (counted), and every repeat without
 * PROCMAP_QUERY (counted).  (Going back a step when an event starts
 * before the last one taken for ours mended the first of these and broke
 * an order as likely: a split behind the walk, its piece dropped.)
 */
static bool walk_takes(struct kvp_pager *p, struct kvp_op *op, uint32_t lo,
		       uint32_t hi, uint32_t *from)
{
	uintptr_t at = (uintptr_t)kvp_blk_addr(op->r, op->blk);
	uint32_t bs = (uint32_t)op->r->block_bytes;
	struct kvp_zap_walk *w = &op->walk;
	bool goes_on = lo == w->next;
	bool restart = !goes_on && lo > w->lo && lo < w->hi;
	uintptr_t vs, ve;

	if (!goes_on && !restart)
		return false;
	/* The shape of a walk's event: it ended where a VMA ended, or at the
	 * block's end (no need to ask then); a restart begins where one
	 * begins.  Splits since only bring the VMA's end closer. */
	if ((hi != bs || restart) &&
	    (p->maps_fd < 0 ||
	     kvp_mem_vma_at(p->maps_fd, (void *)(at + lo), &vs, &ve) ||
	     (restart && vs != at + lo) || (hi != bs && ve > at + hi)))
		return false;
	/* A repeat announced its pages before. */
	for (uint32_t pg = lo / KVP_PAGE_BYTES;
	     pg < (hi < w->end ? hi : w->end) / KVP_PAGE_BYTES; pg++)
		if (op->cover[pg] == 0)
			return false;
	*from = lo > w->end ? lo : w->end;
	if (*from > hi)
		*from = hi;
	w->next = hi;
	w->lo = lo;
	w->hi = hi;
	if (hi > w->end)
		w->end = hi;
	if (*from > lo)
		KVP_STAT_ADD(op->r, zap_repeats_total, 1);
	/* An event of the call from where a VMA begins inside the block:
	 * the kernel's walk passed a VMA's end, so the program split it.
	 * (The program's own drops can take this shape: asked, not taken.) */
	if (!(op->r->blocks[op->blk].flags & BLK_VMAS) && p->maps_fd >= 0 &&
	    !kvp_mem_vma_at(p->maps_fd, (void *)(at + lo), &vs, &ve) &&
	    vs == at + lo)
		op->r->blocks[op->blk].flags |= BLK_VMAS;
	return true;
}

static void cover_add(struct kvp_op *op, uint32_t lo, uint32_t hi)
{
	for (uint32_t pg = lo / KVP_PAGE_BYTES;
	     pg < (hi + KVP_PAGE_BYTES - 1) / KVP_PAGE_BYTES; pg++)
		if (op->cover[pg] < UINT8_MAX)
			op->cover[pg]++;
}

static uint32_t zap_walk(struct kvp_pager *p, struct kvp_op *op, uint32_t lo,
			 uint32_t hi)
{
	struct kvp_zap_walk *w = &op->walk;
	uint32_t from;

	if (!op->zap_called)
		return lo;
	if (lo == 0) {
		/* Ours (the walk's first event) or the program's: counted
		 * whole either way, and the walk goes no way back. */
		if (hi >= w->hi)
			*w = (struct kvp_zap_walk){ .next = hi, .hi = hi,
						    .end = w->end };
		if (hi > w->end)
			w->end = hi;
		return 0;
	}
	return walk_takes(p, op, lo, hi, &from) ? from : lo;
}

void kvp_zap_seen(struct kvp_pager *p, struct kvp_op *op, uint32_t lo,
		  uint32_t hi)
{
	p->zap_reader_cpu = sched_getcpu();
	/* Dropped a page at a time, the call raises one event a page and
	 * no repeat (a page is not split): all count (zap_ranges). */
	cover_add(op, op->zap_pages ? lo : zap_walk(p, op, lo, hi), hi);
}

bool kvp_zap_split_now(const struct kvp_pager *p, const struct kvp_region *r,
		       uint64_t blk)
{
	char *at = kvp_blk_addr(r, blk);
	uintptr_t vs = 0, ve = 0;
	int err;

	if (p->maps_fd < 0)
		return false;
	err = kvp_mem_vma_at(p->maps_fd, at, &vs, &ve);
	return err == -ENOENT ||
	       (!err &&
		(vs > (uintptr_t)at || ve < (uintptr_t)at + r->block_bytes));
}

/*
 * The ranges that drop @op's block, into @iov (@room of them): the block
 * whole, or a range a page when its program splits it: when it spans
 * several VMAs now (a page the program locked or protected: every block
 * whose move was refused), or did before (@split, BLK_VMAS: in one VMA
 * again once the program undid its lock).  The program that split it
 * once is likely to split it again while the call walks it, and the
 * kernel's repeats then may read as its drops or its drops as repeats
 * (zap_walk); a page at a time, nothing can be split and every event
 * counts.  Returns the ranges, 0 if they do not fit; *pages says which
 * it chose.  A block of more pages than a call takes (8 MiB) is dropped
 * whole; so is one never seen split where PROCMAP_QUERY is missing.
 */
static unsigned zap_ranges(const struct kvp_pager *p, const struct kvp_op *op,
			   bool split, struct iovec *iov, unsigned room,
			   bool *pages)
{
	char *at = kvp_blk_addr(op->r, op->blk);
	size_t len = op->r->block_bytes, n = len / KVP_PAGE_BYTES;

	*pages = n <= ZAP_IOVS &&
		 (split || kvp_zap_split_now(p, op->r, op->blk));
	if (!*pages) {
		if (!room)
			return 0;
		iov[0] = (struct iovec){ at, len };
		return 1;
	}
	if (n > room)
		return 0;
	for (size_t i = 0; i < n; i++)
		iov[i] = (struct iovec){ at + i * KVP_PAGE_BYTES,
					 KVP_PAGE_BYTES };
	return (unsigned)n;
}

/*
 * Drop @iov's @niov ranges; returns the bytes dropped, in range order,
 * with a page the program unmapped meanwhile counted among them.  The
 * kernel stops at the first range it fails on.  A range that spans a hole
 * fails once every page still mapped is dropped; a block dropped a page
 * at a time has a range of its own for the unmapped page, and then the
 * pages before it were dropped and the rest not: the move that took such
 * a block next wrote it over the store with zeros for those.  So the
 * call goes on past such a page, as it does past a hole in one range:
 * the page alone is tried again, and ENOMEM says no VMA holds it (no
 * look at the VMAs between, which the program may change).
 */
static size_t zap_call(const struct kvp_pager *p, const struct iovec *iov,
		       unsigned niov)
{
	size_t total = 0;
	unsigned at = 0;

	while (at < niov) {
		size_t done = 0;
		int err;

		(void)kvp_mem_advise_batch(p->pidfd, iov + at, niov - at,
					   MADV_DONTNEED_LOCKED, &done);
		total += done;
		while (at < niov && done >= iov[at].iov_len)
			done -= iov[at++].iov_len;
		if (at == niov || iov[at].iov_len != KVP_PAGE_BYTES)
			break;
		err = kvp_mem_advise_batch(p->pidfd, iov + at, 1,
					   MADV_DONTNEED_LOCKED, &done);
		if (err && err != -ENOMEM)
			break;
		total += iov[at++].iov_len;
	}
	return total;
}

/*
 * Run on CPU @want only (-1: on the thread's own set, @allowed).  Returns
 * the CPU the thread is now tied to, or -1.  A CPU outside @allowed is not
 * followed; a refused change keeps the old one.
 */
static int follow_reader(int want, int cur, const cpu_set_t *allowed)
{
	cpu_set_t one;

	if (want == cur)
		return cur;
	if (want < 0 || want >= CPU_SETSIZE || !CPU_ISSET(want, allowed)) {
		if (cur >= 0 && pthread_setaffinity_np(pthread_self(),
							sizeof(*allowed),
							allowed))
			return cur;
		return -1;
	}
	CPU_ZERO(&one);
	CPU_SET(want, &one);
	if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one))
		return cur;
	return want;
}

static void *zapper_main(void *arg)
{
	struct kvp_pager *p = arg;
	struct iovec iov[ZAP_IOVS];
	struct kvp_op *batch[ZAP_BATCH];
	bool pages[ZAP_BATCH], split[ZAP_BATCH];
	cpu_set_t allowed;
	int cpu = -1;
	bool can_follow;

	kvp_thread_begin(p, "kvp-zap");
	can_follow = pthread_getaffinity_np(pthread_self(), sizeof(allowed),
					    &allowed) == 0;
	pthread_mutex_lock(&p->lock);
	for (;;) {
		unsigned n = 0, niov = 0, fit;
		size_t done = 0;
		int want;

		while (!p->zap_queue && !p->clean_queue && !p->zap_stop)
			pthread_cond_wait(&p->zap_cond, &p->lock);
		while (p->clean_queue) {
			struct kvp_op *op = p->clean_queue;

			p->clean_queue = op->next;
			clean_one(p, op);
		}
		if (!p->zap_queue) {
			if (p->zap_stop)
				break;
			continue;
		}
		while (p->zap_queue && n < ZAP_BATCH) {
			struct kvp_op *op = p->zap_queue;

			p->zap_queue = op->next;
			op->zap_called = false;
			op->zap_pages = false;
			op->walk = (struct kvp_zap_walk){ 0 };
			split[n] = op->r->blocks[op->blk].flags & BLK_VMAS;
			batch[n++] = op;
		}
		want = can_follow && p->cfg.zap_follow_reader
			   ? p->zap_reader_cpu
			   : -1;
		pthread_mutex_unlock(&p->lock);
		for (fit = 0; fit < n; fit++) {
			unsigned k = zap_ranges(p, batch[fit], split[fit],
						iov + niov, ZAP_IOVS - niov,
						&pages[fit]);

			if (!k)
				break;
			niov += k;
		}
		if (kvp_test_hook)
			kvp_test_hook(KVP_TEST_ZAP_CALL, iov[0].iov_base);
		cpu = follow_reader(want, cpu, &allowed);
		/* Only now: a drop read before the call is the program's,
		 * whatever its shape.  Those that did not fit wait for the
		 * next call. */
		pthread_mutex_lock(&p->lock);
		for (unsigned i = 0; i < fit; i++) {
			batch[i]->zap_called = true;
			batch[i]->zap_pages = pages[i];
			if (pages[i]) /* split: by the program, a page is not */
				batch[i]->r->blocks[batch[i]->blk].flags |=
				    BLK_VMAS;
		}
		while (n > fit)
			kvp_zap_queue(p, batch[--n]);
		pthread_mutex_unlock(&p->lock);
		/* Pages the program mlocked go too: a plain DONTNEED stops
		 * at their VMA, having dropped the block's pages before it,
		 * and the move that takes such a block next refuses the
		 * locked page as well, so the block stayed resident without
		 * them (they read back as zeros). */
		done = zap_call(p, iov, niov);
		/* Every event of our call is read, and a reader handles the
		 * drops it read before it lets go of evlock: so once we have
		 * held it, all are handled (counted, or known for repeats)
		 * before a service thread settles these blocks.  A repeat
		 * handled after that read as the program's drop. */
		pthread_rwlock_rdlock(&p->evlock);
		pthread_rwlock_unlock(&p->evlock);
		pthread_mutex_lock(&p->lock);
		for (unsigned i = 0; i < n; i++) {
			size_t len = batch[i]->r->block_bytes;

			batch[i]->zapped = done >= len;
			done -= batch[i]->zapped ? len : done;
			batch[i]->next = p->zap_done;
			p->zap_done = batch[i];
		}
		kvp_service_poke(&p->svc[p->rr++ % p->nsvc]);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static void zap_close_fds(struct kvp_pager *p)
{
	if (p->pidfd >= 0)
		kvp_fd_close(p->pidfd);
	p->pidfd = -1;
	if (p->maps_fd >= 0)
		kvp_fd_close(p->maps_fd);
	p->maps_fd = -1;
	if (p->mem_fd >= 0)
		kvp_fd_close(p->mem_fd);
	p->mem_fd = -1;
}

int kvp_zap_start(struct kvp_pager *p)
{
	int err;

	p->pidfd = kvp_fd_own(kvp_mem_self_pidfd());
	if (p->pidfd < 0 || kvp_mem_batch_dontneed_works(p->pidfd)) {
		/* Older kernels: every block leaves by move. */
		zap_close_fds(p);
		return 0;
	}
	/* -errno: the kernel's repeats read as drops (zap_walk). */
	p->maps_fd = kvp_fd_own(kvp_mem_vma_open());
	/* < 0: pages the program made inaccessible keep their block (read_own). */
	p->mem_fd = kvp_fd_own(open("/proc/self/mem", O_RDONLY | O_CLOEXEC));
	err = -kvp_thread_create(&p->zapper, zapper_main, p);
	if (err) {
		zap_close_fds(p);
		return err;
	}
	p->zapper_running = true;
	return 0;
}

void kvp_zap_stop(struct kvp_pager *p)
{
	if (p->zapper_running) {
		pthread_mutex_lock(&p->lock);
		p->zap_stop = true;
		pthread_cond_signal(&p->zap_cond);
		pthread_mutex_unlock(&p->lock);
		pthread_join(p->zapper, NULL);
		p->zapper_running = false;
	}
	zap_close_fds(p);
}
