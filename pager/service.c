/*
 * service.c - the fault service loop.
 *
 * Each service thread polls the pager's userfaultfd, its request eventfd
 * and the completion descriptors of its store queues, and runs its stages
 * in order on every turn:
 *
 *   read      read faults and drops in batches (non-blocking: POLLIN may be
 *             stale once another thread took the message) and decide under
 *             p->lock what each one needs (events.c); the reads gathered
 *             are submitted after each batch
 *   zap       settle the blocks the zapper dropped (zap.c)
 *   ready     install loads handed over (staged read-ahead asked for)
 *   reap      complete reads (install, load.c) and write-backs (evict.c)
 *   frame     give loads waiting for a frame one, evicting as needed, and
 *             give up those nobody can want any more
 *   submit    submit every queued read, write and zero fill
 *   watermark evict ahead of need past the high watermark
 *
 * A thread owns the I/O it submits: its own queue per store, so no ring is
 * shared.  Loads that find the budget full wait in want_frame until an
 * eviction frees a frame; evictions run on the same thread, never waiting
 * on another.  Requests from other threads (prefetches, a store's last
 * region going, stop) arrive through request.c.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <xxhash.h>

#include "kmod-helpers/fdset.h"
#include "pager/pager_i.h"

#define REAP_BATCH 64

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

		kvp_load_install(s, list);
		list = n;
	}
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
				kvp_load_done(s, op);
			else
				kvp_writeback_done(s, op);
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

		kvp_load_done(s, zeros);
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
					kvp_load_done(s, op);
				else
					kvp_writeback_done(s, op);
			}
		}
	}
	return total;
}

/* A load nobody can want any more: its region dying, its block unmapped
 * or dropped whole meanwhile.  (Not a fill's: its block has pages mapped,
 * which given up would stay, uncounted; a dropped one installs zeros.) */
static bool load_unwanted(const struct kvp_op *op)
{
	const struct kvp_block *b = &op->r->blocks[op->blk];

	return op->r->dying || (b->flags & BLK_GONE) ||
	       ((b->flags & BLK_DROP) && !(b->flags & BLK_PARTIAL));
}

/* Give waiting loads their frames, evicting as needed. */
static void serve_frames(struct kvp_service *s)
{
	struct kvp_pager *p = s->p;
	unsigned tries = 0;

	for (;;) {
		struct kvp_op *op;
		void *slot;

		pthread_mutex_lock(&p->lock);
		op = kvp_want_frame_next(s);
		if (!op) {
			pthread_mutex_unlock(&p->lock);
			return;
		}
		if (load_unwanted(op)) {
			kvp_want_frame_remove(s, op);
			kvp_load_abandon(s, op);
			continue;
		}
		/* Read-ahead waits while a load asked for does, on any
		 * thread: the frames write-backs free go to those first. */
		bool ra = op->r->blocks[op->blk].flags & BLK_READAHEAD;
		unsigned asked = p->nwant_asked;

		if (ra && asked) {
			pthread_mutex_unlock(&p->lock);
			return;
		}
		slot = kvp_frame_get(p, op->win_len);
		if (slot) {
			kvp_want_frame_remove(s, op);
			kvp_load_arm(s, op, slot);
			pthread_mutex_unlock(&p->lock);
			continue;
		}
		/* Each write-back queued or in flight frees a frame when it
		 * is done: evict only for the loads they will not cover
		 * (those asked for first). */
		bool wait = p->leaving >= (ra ? p->nwant_all : asked);

		/* Staged read-ahead was read already: dropped, it is read
		 * again.  So only a load that is asked for, and no
		 * write-back will free a frame for, takes one's frame, and
		 * the one its stream needs last (a sequential writer whose
		 * blocks leave by write-back read each block twice when
		 * its next block was taken); any load takes the frame of
		 * one its stream has passed, which nobody will ask for,
		 * before a resident block's. */
		if (kvp_stage_drop_farthest(p, ra || wait)) {
			pthread_mutex_unlock(&p->lock);
			continue;
		}
		pthread_mutex_unlock(&p->lock);
		if (wait || ++tries > 64)
			return;
		/* Read-ahead nobody has asked for yet takes the frame of a
		 * block read once, never one of the working set or of a
		 * prefetch: when only those are left, it is given up. */
		if (kvp_evict_one(s, !ra) != -EAGAIN)
			continue;
		if (ra) {
			/* Still read-ahead nobody asked for: a fault or a
			 * prefetch may have joined it meanwhile. */
			pthread_mutex_lock(&p->lock);
			if (kvp_want_frame_next(s) == op &&
			    (op->r->blocks[op->blk].flags & BLK_READAHEAD)) {
				kvp_want_frame_remove(s, op);
				kvp_load_abandon(s, op); /* unlocks */
			} else {
				pthread_mutex_unlock(&p->lock);
			}
			continue;
		}
		/* Nothing can leave.  When that is because write-backs
		 * fail, no wait is bounded (the store may never take a
		 * write again): the fault is served past the budget, or
		 * gets SIGBUS, now. */
		pthread_mutex_lock(&p->lock);
		if (kvp_want_frame_next(s) == op && !p->leaving &&
		    (op->r->blocks[op->blk].flags & BLK_PARTIAL)) {
			/* A fill holds its block's pages while it waits, and
			 * nothing else can leave: past the budget by one
			 * block at most, or it would wait for ever. */
			slot = kvp_frame_get_overdraft(p, op->win_len);
			if (slot) {
				KVP_STAT_ADD(op->r, overdraft_loads_total, 1);
				kvp_want_frame_remove(s, op);
				kvp_load_arm(s, op, slot);
				pthread_mutex_unlock(&p->lock);
				continue;
			}
		}
		if (!p->wb_failed_bytes || p->leaving ||
		    kvp_want_frame_next(s) != op) {
			pthread_mutex_unlock(&p->lock);
			return;
		}
		kvp_load_past_budget(s, op);
	}
}

/* Give up the unwanted loads anywhere on want_frame.  Read-ahead behind a
 * load asked for is not looked at while that one waits, and a region's
 * destroy waits for its loads: when the one asked for needed the frames
 * the destroy frees, neither went on. */
static void reap_unwanted(struct kvp_service *s)
{
	struct kvp_pager *p = s->p;

	for (;;) {
		struct kvp_op *op;

		pthread_mutex_lock(&p->lock);
		for (op = s->want_frame; op && !load_unwanted(op);
		     op = op->next)
			;
		if (!op) {
			pthread_mutex_unlock(&p->lock);
			return;
		}
		kvp_want_frame_remove(s, op);
		kvp_load_abandon(s, op); /* unlocks */
	}
}

static void frame_stage(struct kvp_service *s)
{
	serve_frames(s);
	reap_unwanted(s);
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
	char *addr = kvp_blk_addr(r, op->blk);
	size_t held = op->held, dropped = 0;
	bool waiters;

	/* A range the program unmapped in part fails (ENOMEM) once the
	 * kernel has dropped every page still mapped: nothing is left to
	 * move (a move would take the block for unmapped whole and forget
	 * it), and the zap is done.  (EVICTING: no page comes back.) */
	if (!op->zapped &&
	    !kvp_mem_any_resident(kvp_blk_addr(r, op->blk), len))
		op->zapped = true;
	pthread_mutex_lock(&p->lock);
	p->leaving--;
	p->leaving_bytes -= held;
	if (!op->zapped && !(b->flags & BLK_GONE)) {
		/* The move ignores op->cover: a drop by the program that
		 * raced this cut-short zap (it needs a partial munmap of the
		 * block too) is not seen, and that part reads the store. */
		op->kind = OP_WRITEBACK;
		op->slot = (b->flags & BLK_PAGES)
			       ? kvp_frame_paged_slot(p, len)
			       : kvp_frame_empty_slot(p, len);
		pthread_mutex_unlock(&p->lock);
		if (op->slot) {
			(void)kvp_evict_move(s, op);
			return;
		}
		/* No address space left for a slot (kvp_arena_bytes): let
		 * the zapper try again. */
		pthread_mutex_lock(&p->lock);
		op->kind = OP_ZAP;
		p->leaving++;
		p->leaving_bytes += held;
		kvp_zap_queue(p, op);
		pthread_mutex_unlock(&p->lock);
		return;
	}
	for (size_t i = 0; i < pages; i++)
		dropped += op->cover[i] > 1;
	if (dropped == pages)
		kvp_blk_drop_pending(b);
	if (b->flags & BLK_PREFETCHED)
		KVP_STAT_ADD(r, prefetch_wasted_total, 1);
	if (!(b->flags & BLK_DROP))
		KVP_STAT_ADD(r, evictions_clean_total, 1);
	KVP_STAT_ADD(r, evictions_zap_total, 1);
	waiters = kvp_blk_take_waiters(b);
	kvp_blk_evicted(r, b, false);
	kvp_frame_unuse(p, held);
	if (dropped && dropped < pages && (b->flags & BLK_IN_STORE) &&
	    !r->dying &&
	    kvp_load_start(s, r, op->blk, LOAD_FAULT, NULL, true) == 0) {
		for (size_t i = 0; i < pages; i++)
			if (op->cover[i] > 1)
				kvp_op_note_drop(
				    b->op, (uint32_t)(i * KVP_PAGE_BYTES),
				    (uint32_t)((i + 1) * KVP_PAGE_BYTES));
	}
	pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
	if (waiters) /* addr: r may be gone once p->lock is let go */
		(void)kvp_uffd_wake(&p->uffd, addr, len);
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

	/* Blocks whose write-back is queued are as good as gone.  Staged
	 * read-ahead that the faults have run past goes first; when that
	 * alone brings the charge under the high mark, every resident block
	 * stays: a working set that fits the budget is not evicted to make
	 * room for read-ahead nobody asked for. */
	pthread_mutex_lock(&p->lock);
	bool over = p->frames.in_use - p->leaving_bytes > high;

	if (over)
		kvp_stage_drop_passed(p);
	over = p->frames.in_use - p->leaving_bytes > high;
	pthread_mutex_unlock(&p->lock);
	if (!over)
		return;
	while (n++ < 256) {
		pthread_mutex_lock(&p->lock);
		uint64_t charge = p->frames.in_use - p->leaving_bytes;
		uint64_t staged = kvp_stage_bytes(p);

		pthread_mutex_unlock(&p->lock);
		/* Ahead of need the working set stays; when what is resident
		 * alone passes the budget (it was lowered) it goes too. */
		if (charge <= low ||
		    kvp_evict_one(s, charge - staged > budget) == -EAGAIN)
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

/* Read the userfaultfd until it is empty, submitting after each batch. */
static void read_stage(struct kvp_service *s)
{
	size_t n;

	while ((n = kvp_events_read(s, false)) != 0) {
		submit_stage(s);
		if (n < KVP_EVENT_BATCH)
			break;
	}
}

/*
 * Under p->lock: start a load for every absent block of a prefetch, join
 * those already loading, mark those resident referenced.
 */
static void run_prefetch(struct kvp_service *s, struct kvp_prefetch *pf)
{
	struct kvp_region *r = pf->r;
	struct kvp_pager *p = r->p;

	r->pf_reqs--;
	for (; pf->next < pf->n; pf->next++) {
		uint64_t blk = pf->blocks[pf->next];
		struct kvp_block *b = &r->blocks[blk];

		if (pf->cancelled || r->dying)
			break;
		switch (b->state) {
		case KVP_BLOCK_ABSENT:
			/* (Not one whose fault still changes its pages:
			 * events.c.) */
			if ((b->flags & BLK_GONE) || b->late)
				break;
			if (kvp_load_start(s, r, blk, LOAD_PREFETCH, pf, false))
				pf->failed = true;
			break;
		case KVP_BLOCK_LOADING: {
			struct kvp_pf_ref *ref = malloc(sizeof(*ref));

			if (b->op->staged)
				kvp_stage_release(s, b->op);
			else
				kvp_blk_prefetch_joined(r, b);
			if (!ref) {
				pf->failed = true;
				break;
			}
			ref->pf = pf;
			ref->next = b->op->pfs;
			b->op->pfs = ref;
			pf->pending++;
			break;
		}
		case KVP_BLOCK_RESIDENT:
			kvp_blk_touch(p, b);
			break;
		case KVP_BLOCK_POISONED:
			pf->failed = true;
			break;
		case KVP_BLOCK_EVICTING:
			/* On its way out: the program's fault will bring it
			 * back.  Rare, since the clock takes blocks that
			 * were not referenced lately. */
			break;
		}
	}
	pthread_cond_broadcast(&p->idle);
	kvp_prefetch_all_started(pf);
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
			run_prefetch(s, q->pf);
		free(q);
	}
	pthread_mutex_unlock(&p->lock);
	return stop;
}

/* Milliseconds until failed write-backs may be retried, so that the
 * loop wakes then (the watermark stage or a load's eviction retries
 * them), or -1: none failed, or the retry is due and waits for a need. */
static int retry_timeout(struct kvp_pager *p)
{
	uint64_t now = kvp_now_ns();
	int timeout = -1;

	pthread_mutex_lock(&p->lock);
	if (p->wb_failed_bytes && now < p->wb_retry_ns)
		timeout = (int)((p->wb_retry_ns - now) / 1000000 + 1);
	pthread_mutex_unlock(&p->lock);
	return timeout;
}

static void *service_main(void *arg)
{
	struct kvp_service *s = arg;
	struct kvp_pager *p = s->p;
	struct pollfd *pfd = NULL;
	unsigned npfd = 0;
	char name[16];

	kvp_uffd_bind_reader(s, kvp_events_read_all_deferring);
	snprintf(name, sizeof(name), "kvp-svc%u", (unsigned)(s - p->svc));
	kvp_thread_begin(p, name);

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
		bool blind = false; /* I/O in flight on a queue without fd */

		for (unsigned i = 0; i < s->nqueues && 2 + i < npfd; i++) {
			pfd[2 + i] = (struct pollfd){
				.fd = s->queues[i].store->ops->queue_fd(
				    s->queues[i].q),
				.events = POLLIN
			};
			blind |= pfd[2 + i].fd < 0 && s->queues[i].inflight;
		}
		if (s->ndeferred)
			timeout = 0;
		else if (s->want_frame || s->to_submit || s->ready || blind)
			timeout = 1; /* another thread's work, or a queue
					poll cannot watch: look again soon */
		else
			timeout = retry_timeout(p);
		if (s->stopping)
			timeout = 10;
		int n = poll(pfd, 2 + s->nqueues < npfd ? 2 + s->nqueues : npfd,
			     timeout);

		if (n < 0 && errno != EINTR)
			break;
		if (pfd[1].revents & POLLIN)
			if (take_requests(s))
				s->stopping = true;
		kvp_events_run_deferred(s);
		if (pfd[0].revents & POLLIN)
			read_stage(s);
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
	free(s->bounce);
	XXH3_freeState(s->readback);
	return NULL;
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
		s->wake_fd = kvp_fd_own(s->wake_fd < 0 ? -errno : s->wake_fd);
		if (s->wake_fd < 0) {
			err = s->wake_fd;
			break;
		}
		err = -kvp_thread_create(&s->thread, service_main, s);
		if (err) {
			kvp_fd_close(s->wake_fd);
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
		kvp_fd_close(s->wake_fd);
	}
	free(p->svc);
	p->svc = NULL;
	p->nsvc = 0;
}
