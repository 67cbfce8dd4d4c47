/*
 * store_faulty.c - a store that forwards to another and injects faults.
 *
 * For tests of the engine's error paths: reads overlapping a range fail
 * with an errno or come back short, writes fail (ENOSPC ...) once a number
 * of bytes were written, and every I/O can be given extra latency.  The
 * plan is read under a mutex at each I/O, so kvp_store_faulty_set may be
 * called while I/O runs.
 *
 * A queue wraps a queue of the inner store.  Injected failures complete at
 * once (they never reach the inner store); delayed completions are held
 * until their time.  Its queue_fd is an epoll descriptor over the inner
 * queue's descriptor, an eventfd (completions ready here) and a timerfd
 * (the earliest held completion falls due), so that a poller wakes for
 * each; it is -1 when the inner queue has no descriptor.
 */
#include "kmod-helpers/fdset.h"
#include "pager/store.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

struct faulty_store {
	struct kvp_store base;	 /* first: the public part */
	struct kvp_store *inner; /* the caller's */
	pthread_mutex_t lock;	 /* guards plan and written */
	struct kvp_fault_plan plan;
	uint64_t written; /* bytes written since the plan was set */
};

struct faulty_held {
	struct kvp_io *io;
	uint64_t due_ns; /* CLOCK_MONOTONIC */
};

struct kvp_store_queue {
	struct faulty_store *fs;
	struct kvp_store_queue *inner;
	int epfd;		     /* the queue_fd, or -1 */
	int efd;		     /* readable while ready[] is not empty */
	int tfd;		     /* fires when held[0..] falls due */
	unsigned depth;		     /* most I/Os outstanding */
	unsigned inflight;	     /* accepted, not reaped */
	struct kvp_io **ready;	     /* completed, to hand out in order */
	unsigned ready_head, nready; /* ring of depth entries */
	struct faulty_held *held;    /* completed, delayed: nheld entries */
	unsigned nheld;
	struct kvp_io **scratch; /* depth entries for the inner reap */
};

static const struct kvp_store_ops faulty_ops;

static struct faulty_store *to_faulty(struct kvp_store *s)
{
	return (struct faulty_store *)s;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000u),
			       .tv_nsec = (long)(ns % 1000000000u) };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static void mirror_counters(struct faulty_store *fs)
{
	__atomic_store_n(
	    &fs->base.buffered_ios,
	    __atomic_load_n(&fs->inner->buffered_ios, __ATOMIC_RELAXED),
	    __ATOMIC_RELAXED);
}

static bool range_ok(const struct kvp_store *s, size_t len, uint64_t off)
{
	return len && off <= s->size && len <= s->size - off;
}

/*
 * The fate of one I/O under the current plan: 0 to forward it, else the
 * result it completes with (-errno, or a short count).  A forwarded write
 * is counted against write_fail_after.
 */
static int64_t faulty_verdict(struct faulty_store *fs, enum kvp_io_op op,
			      size_t len, uint64_t off, uint64_t *delay_ns,
			      bool *inject)
{
	const struct kvp_fault_plan *p = &fs->plan;
	int64_t res = 0;

	*inject = false;
	pthread_mutex_lock(&fs->lock);
	*delay_ns = p->delay_us * 1000u;
	if (op == KVP_IO_READ && p->read_fail_len &&
	    off < p->read_fail_off + p->read_fail_len &&
	    p->read_fail_off < off + len) {
		*inject = true;
		if (p->read_errno) {
			res = -p->read_errno;
		} else {
			/* Short: what lies before the range, if anything. */
			uint64_t before =
			    p->read_fail_off > off ? p->read_fail_off - off : 0;
			res =
			    (int64_t)(before - before % fs->base.offset_align);
		}
	} else if (op == KVP_IO_WRITE) {
		if (p->write_errno && fs->written + len > p->write_fail_after) {
			*inject = true;
			res = -p->write_errno;
		} else {
			fs->written += len;
		}
	}
	pthread_mutex_unlock(&fs->lock);
	return res;
}

static int faulty_sync(struct kvp_store *s, enum kvp_io_op op, void *buf,
		       size_t len, uint64_t off)
{
	struct faulty_store *fs = to_faulty(s);
	uint64_t delay;
	bool inject;
	int64_t res;
	int err;

	if (!len)
		return 0;
	if (!range_ok(s, len, off))
		return -EINVAL;
	res = faulty_verdict(fs, op, len, off, &delay, &inject);
	if (delay)
		sleep_ns(delay);
	if (inject)
		return res < 0 ? (int)res : -EIO; /* short is -EIO here */
	err = op == KVP_IO_READ ? kvp_store_pread(fs->inner, buf, len, off)
				: kvp_store_pwrite(fs->inner, buf, len, off);
	mirror_counters(fs);
	return err;
}

static int faulty_pread(struct kvp_store *s, void *buf, size_t len,
			uint64_t off)
{
	return faulty_sync(s, KVP_IO_READ, buf, len, off);
}

static int faulty_pwrite(struct kvp_store *s, const void *buf, size_t len,
			 uint64_t off)
{
	return faulty_sync(s, KVP_IO_WRITE, (void *)buf, len, off);
}

static void ready_push(struct kvp_store_queue *q, struct kvp_io *io)
{
	q->ready[(q->ready_head + q->nready) % q->depth] = io;
	q->nready++;
}

static void faulty_queue_free(struct kvp_store_queue *q)
{
	if (q->inner)
		q->fs->inner->ops->queue_destroy(q->inner);
	if (q->epfd >= 0)
		kvp_fd_close(q->epfd);
	if (q->efd >= 0)
		kvp_fd_close(q->efd);
	if (q->tfd >= 0)
		kvp_fd_close(q->tfd);
	free(q->ready);
	free(q->held);
	free(q->scratch);
	free(q);
}

static int epoll_add(int epfd, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN };

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) ? -errno : 0;
}

static int faulty_queue_create(struct kvp_store *s, unsigned depth,
			       struct kvp_store_queue **out)
{
	struct faulty_store *fs = to_faulty(s);
	struct kvp_store_queue *q;
	int err = -ENOMEM, ifd;

	if (!out || !depth)
		return -EINVAL;
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->fs = fs;
	q->depth = depth;
	q->epfd = q->efd = q->tfd = -1;
	q->ready = calloc(depth, sizeof(*q->ready));
	q->held = calloc(depth, sizeof(*q->held));
	q->scratch = calloc(depth, sizeof(*q->scratch));
	if (!q->ready || !q->held || !q->scratch)
		goto fail;
	err = fs->inner->ops->queue_create(fs->inner, depth, &q->inner);
	if (err) {
		q->inner = NULL;
		goto fail;
	}
	q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	q->efd = kvp_fd_own(q->efd < 0 ? -errno : q->efd);
	if (q->efd < 0) {
		err = q->efd;
		goto fail;
	}
	q->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	q->tfd = kvp_fd_own(q->tfd < 0 ? -errno : q->tfd);
	if (q->tfd < 0) {
		err = q->tfd;
		goto fail;
	}
	ifd =
	    fs->inner->ops->queue_fd ? fs->inner->ops->queue_fd(q->inner) : -1;
	if (ifd >= 0) {
		q->epfd = epoll_create1(EPOLL_CLOEXEC);
		q->epfd = kvp_fd_own(q->epfd < 0 ? -errno : q->epfd);
		if (q->epfd < 0) {
			err = q->epfd;
			goto fail;
		}
		err = epoll_add(q->epfd, ifd);
		if (!err)
			err = epoll_add(q->epfd, q->efd);
		if (!err)
			err = epoll_add(q->epfd, q->tfd);
		if (err)
			goto fail;
	}
	*out = q;
	return 0;
fail:
	faulty_queue_free(q);
	return err;
}

static int faulty_submit(struct kvp_store_queue *q, struct kvp_io *const *ios,
			 unsigned n)
{
	const struct kvp_store *s = &q->fs->base;
	struct kvp_io *fwd[64];
	unsigned i, nfwd = 0, injected = 0;
	uint64_t t = now_ns();
	int err;

	if (!ios)
		return -EINVAL;
	if (n > 64)
		n = 64; /* the caller submits the rest next */
	for (i = 0; i < n && q->inflight < q->depth; i++) {
		struct kvp_io *io = ios[i];
		uint64_t delay;
		bool inject;
		int64_t res;

		if (!io || !range_ok(s, io->len, io->off) ||
		    (io->op != KVP_IO_READ && io->op != KVP_IO_WRITE)) {
			if (!i)
				return -EINVAL;
			break;
		}
		res = faulty_verdict(q->fs, io->op, io->len, io->off, &delay,
				     &inject);
		io->submit_ns = t;
		q->inflight++;
		if (inject) {
			io->result = res;
			if (delay) {
				q->held[q->nheld++] =
				    (struct faulty_held){ .io = io,
							  .due_ns = t + delay };
			} else {
				ready_push(q, io);
				injected++;
			}
		} else {
			fwd[nfwd++] = io;
		}
	}
	if (nfwd) {
		unsigned done = 0;

		while (done < nfwd) {
			err = q->fs->inner->ops->submit(q->inner, fwd + done,
							nfwd - done);
			if (err <= 0)
				break;
			done += (unsigned)err;
		}
		/* Refused by the inner store: complete them with its error. */
		for (; done < nfwd; done++) {
			fwd[done]->result = err < 0 ? err : -EAGAIN;
			ready_push(q, fwd[done]);
			injected++;
		}
		/* The inner queue overwrote submit_ns; ours counts. */
		for (done = 0; done < nfwd; done++)
			fwd[done]->submit_ns = t;
	}
	if (injected)
		eventfd_write(q->efd, 1);
	return (int)i;
}

/* Arm the timer for the earliest held completion, or disarm it. */
static void faulty_arm(struct kvp_store_queue *q)
{
	struct itimerspec its = { 0 };
	uint64_t due = UINT64_MAX;
	unsigned i;

	for (i = 0; i < q->nheld; i++)
		if (q->held[i].due_ns < due)
			due = q->held[i].due_ns;
	if (q->nheld) {
		its.it_value.tv_sec = (time_t)(due / 1000000000u);
		its.it_value.tv_nsec = (long)(due % 1000000000u);
		if (!its.it_value.tv_sec && !its.it_value.tv_nsec)
			its.it_value.tv_nsec = 1;
	}
	timerfd_settime(q->tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

/* Gather the inner completions and the held ones that fell due. */
static int faulty_collect(struct kvp_store_queue *q, bool wait_inner)
{
	const struct kvp_store_ops *iops = q->fs->inner->ops;
	uint64_t delay, now, v;
	unsigned i;
	int k;

	pthread_mutex_lock(&q->fs->lock);
	delay = q->fs->plan.delay_us * 1000u;
	pthread_mutex_unlock(&q->fs->lock);

	k = iops->reap(q->inner, q->scratch, q->depth, wait_inner);
	if (k < 0)
		return k;
	now = now_ns();
	for (i = 0; i < (unsigned)k; i++) {
		struct kvp_io *io = q->scratch[i];

		if (delay && now < io->submit_ns + delay)
			q->held[q->nheld++] = (struct faulty_held){
				.io = io, .due_ns = io->submit_ns + delay
			};
		else
			ready_push(q, io);
	}
	if (k)
		mirror_counters(q->fs);
	for (i = 0; i < q->nheld;) {
		if (q->held[i].due_ns <= now) {
			ready_push(q, q->held[i].io);
			q->held[i] = q->held[--q->nheld];
		} else {
			i++;
		}
	}
	/* Both are level sources for the poller: clear, then re-arm. */
	if (read(q->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		return -errno;
	if (read(q->tfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		return -errno;
	faulty_arm(q);
	return 0;
}

static int faulty_reap(struct kvp_store_queue *q, struct kvp_io **out,
		       unsigned max, unsigned wait)
{
	unsigned got = 0;
	int err;

	if (!out)
		return -EINVAL;
	for (;;) {
		unsigned inner_out;

		err = faulty_collect(q, false);
		if (err)
			return err;
		while (got < max && q->nready) {
			out[got++] = q->ready[q->ready_head];
			q->ready_head = (q->ready_head + 1) % q->depth;
			q->nready--;
			q->inflight--;
		}
		if (q->nready)
			eventfd_write(q->efd, 1); /* more for the poller */
		if (got || !wait || !q->inflight || !max)
			return (int)got;
		/* Wait for the inner queue or the earliest held one. */
		inner_out = q->inflight - q->nheld;
		if (q->epfd >= 0) {
			struct pollfd pfd = { .fd = q->epfd, .events = POLLIN };

			poll(&pfd, 1, -1);
		} else if (inner_out) {
			err = faulty_collect(q, true);
			if (err)
				return err;
		} else {
			sleep_ns(100000); /* only held ones: 0.1 ms steps */
		}
	}
}

static int faulty_queue_fd(struct kvp_store_queue *q)
{
	return q->epfd;
}

/* The I/Os reach the inner queue with their buffers: register it there. */
static int faulty_queue_buffer(struct kvp_store_queue *q, void *base,
			       size_t len)
{
	const struct kvp_store_ops *iops = q->fs->inner->ops;

	return iops->queue_buffer ? iops->queue_buffer(q->inner, base, len)
				  : -EOPNOTSUPP;
}

static void faulty_queue_destroy(struct kvp_store_queue *q)
{
	struct kvp_io *io;

	if (!q)
		return;
	while (q->inflight && faulty_reap(q, &io, 1, true) > 0)
		;
	faulty_queue_free(q);
}

static int faulty_discard(struct kvp_store *s, uint64_t off, uint64_t len)
{
	struct faulty_store *fs = to_faulty(s);

	if (!fs->inner->ops->discard)
		return -EOPNOTSUPP;
	return fs->inner->ops->discard(fs->inner, off, len);
}

static void faulty_destroy(struct kvp_store *s)
{
	struct faulty_store *fs = to_faulty(s);

	pthread_mutex_destroy(&fs->lock);
	free(fs);
}

static const struct kvp_store_ops faulty_ops = {
	.kind = "faulty",
	.pread = faulty_pread,
	.pwrite = faulty_pwrite,
	.queue_create = faulty_queue_create,
	.queue_destroy = faulty_queue_destroy,
	.submit = faulty_submit,
	.reap = faulty_reap,
	.queue_fd = faulty_queue_fd,
	.queue_buffer = faulty_queue_buffer,
	.discard = faulty_discard,
	.destroy = faulty_destroy,
};

int kvp_store_faulty_create(struct kvp_store *inner, struct kvp_store **out)
{
	struct faulty_store *fs;

	if (!inner || !inner->ops || !out)
		return -EINVAL;
	fs = calloc(1, sizeof(*fs));
	if (!fs)
		return -ENOMEM;
	fs->inner = inner;
	pthread_mutex_init(&fs->lock, NULL);
	fs->base.ops = &faulty_ops;
	fs->base.size = inner->size;
	fs->base.mem_align = inner->mem_align;
	fs->base.offset_align = inner->offset_align ? inner->offset_align : 1;
	fs->base.direct = inner->direct;
	snprintf(fs->base.desc, sizeof(fs->base.desc), "faulty over %.100s",
		 inner->desc);
	*out = &fs->base;
	return 0;
}

int kvp_store_faulty_set(struct kvp_store *s, const struct kvp_fault_plan *p)
{
	struct faulty_store *fs;

	if (!s || s->ops != &faulty_ops || !p || p->read_errno < 0 ||
	    p->write_errno < 0)
		return -EINVAL;
	fs = to_faulty(s);
	pthread_mutex_lock(&fs->lock);
	fs->plan = *p;
	fs->written = 0;
	pthread_mutex_unlock(&fs->lock);
	return 0;
}
