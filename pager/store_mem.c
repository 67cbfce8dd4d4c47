/*
 * store_mem.c - the memory store: a store in anonymous memory.
 *
 * For tests and as a RAM tier.  The bytes live in one private anonymous
 * mapping (MAP_NORESERVE: untouched parts cost nothing).  Its queue does
 * each I/O at submit time, in the submitter's thread, and keeps the
 * completions until they are reaped; an eventfd counts them so that a
 * service thread polls the queue like a file store's.  No alignment is
 * needed (mem_align and offset_align are 1).
 *
 * Concurrency: pread/pwrite are plain memcpy and may run from any threads
 * at once; ranges that overlap a concurrent write read torn data, as a
 * file would.  A queue belongs to one thread, as store.h says.
 */
#include "pager/store.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kmod-helpers/fdset.h"
#include "kmod-helpers/mem.h"

struct mem_store {
	struct kvp_store base; /* first: the public part */
	char *bytes;	       /* base.size bytes, rounded up to a page */
	size_t map_len;	       /* length of the mapping */
};

struct kvp_store_queue {
	struct mem_store *ms; /* the store it reads and writes */
	int efd;	      /* eventfd: completions waiting */
	unsigned depth;	      /* most I/Os held before they are reaped */
	unsigned head, count; /* ring of done I/Os in done[] */
	struct kvp_io **done; /* depth slots */
};

static struct mem_store *to_mem(struct kvp_store *s)
{
	return (struct mem_store *)s;
}

static uint64_t mem_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static bool mem_range_ok(const struct kvp_store *s, size_t len, uint64_t off)
{
	return off <= s->size && len <= s->size - off;
}

static int mem_pread(struct kvp_store *s, void *buf, size_t len, uint64_t off)
{
	if (!mem_range_ok(s, len, off))
		return -EINVAL;
	memcpy(buf, to_mem(s)->bytes + off, len);
	return 0;
}

static int mem_pwrite(struct kvp_store *s, const void *buf, size_t len,
		      uint64_t off)
{
	if (!mem_range_ok(s, len, off))
		return -EINVAL;
	memcpy(to_mem(s)->bytes + off, buf, len);
	return 0;
}

static int mem_queue_create(struct kvp_store *s, unsigned depth,
			    struct kvp_store_queue **out)
{
	struct kvp_store_queue *q;
	int err = -EINVAL;

	if (!depth)
		goto out;
	err = -ENOMEM;
	q = calloc(1, sizeof(*q));
	if (!q)
		goto out;
	q->done = calloc(depth, sizeof(*q->done));
	if (!q->done)
		goto out_free;
	q->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	q->efd = kvp_fd_own(q->efd < 0 ? -errno : q->efd);
	if (q->efd < 0) {
		err = q->efd;
		goto out_free;
	}
	q->ms = to_mem(s);
	q->depth = depth;
	*out = q;
	return 0;
out_free:
	free(q->done);
	free(q);
out:
	return err;
}

static void mem_queue_destroy(struct kvp_store_queue *q)
{
	if (!q)
		return;
	kvp_fd_close(q->efd);
	free(q->done);
	free(q);
}

static int mem_submit(struct kvp_store_queue *q, struct kvp_io *const *ios,
		      unsigned n)
{
	struct kvp_store *s = &q->ms->base;
	unsigned i;

	for (i = 0; i < n && q->count < q->depth; i++) {
		struct kvp_io *io = ios[i];
		int err;

		io->submit_ns = mem_now_ns();
		if (io->op == KVP_IO_READ)
			err = mem_pread(s, io->buf, io->len, io->off);
		else
			err = mem_pwrite(s, io->buf, io->len, io->off);
		io->result = err ? err : (int64_t)io->len;
		q->done[(q->head + q->count) % q->depth] = io;
		q->count++;
	}
	if (i) {
		uint64_t one = i;

		/* Cannot fail short of a counter overflow. */
		(void)!write(q->efd, &one, sizeof(one));
	}
	return (int)i;
}

static int mem_reap(struct kvp_store_queue *q, struct kvp_io **out,
		    unsigned max, unsigned wait)
{
	uint64_t cnt;
	unsigned n = 0;

	/* Every I/O completes at submit: there is never anything to wait for
	 * beyond what is queued, so @wait changes nothing. */
	while (n < max && q->count) {
		out[n++] = q->done[q->head];
		q->head = (q->head + 1) % q->depth;
		q->count--;
	}
	if (!q->count)
		(void)!read(q->efd, &cnt, sizeof(cnt));
	return (int)n;
}

static int mem_queue_fd(struct kvp_store_queue *q)
{
	return q->efd;
}

static int mem_discard(struct kvp_store *s, uint64_t off, uint64_t len)
{
	struct mem_store *ms = to_mem(s);
	uint64_t a, b;

	if (!mem_range_ok(s, len, off))
		return -EINVAL;
	/* Whole pages go back to the kernel; the ragged ends are zeroed. */
	a = (off + KVP_PAGE_SIZE - 1) & ~(uint64_t)(KVP_PAGE_SIZE - 1);
	b = (off + len) & ~(uint64_t)(KVP_PAGE_SIZE - 1);
	if (a < b) {
		memset(ms->bytes + off, 0, a - off);
		if (kvp_mem_advise(ms->bytes + a, b - a, MADV_DONTNEED))
			memset(ms->bytes + a, 0, b - a);
		memset(ms->bytes + b, 0, off + len - b);
	} else {
		memset(ms->bytes + off, 0, len);
	}
	return 0;
}

static void mem_destroy(struct kvp_store *s)
{
	struct mem_store *ms = to_mem(s);

	kvp_mem_release(ms->bytes, ms->map_len);
	free(ms);
}

static const struct kvp_store_ops mem_ops = {
	.kind = "memory",
	.pread = mem_pread,
	.pwrite = mem_pwrite,
	.queue_create = mem_queue_create,
	.queue_destroy = mem_queue_destroy,
	.submit = mem_submit,
	.reap = mem_reap,
	.queue_fd = mem_queue_fd,
	.discard = mem_discard,
	.destroy = mem_destroy,
};

int kvp_store_memory_create(uint64_t size, struct kvp_store **out)
{
	struct mem_store *ms;
	size_t len;
	void *p;
	int err = -EINVAL;

	if (!size || size > SIZE_MAX - KVP_PAGE_SIZE)
		goto out;
	len = (size + KVP_PAGE_SIZE - 1) & ~(KVP_PAGE_SIZE - 1);
	err = -ENOMEM;
	ms = calloc(1, sizeof(*ms));
	if (!ms)
		goto out;
	err = kvp_mem_reserve(len, KVP_PAGE_SIZE, false, &p);
	if (err)
		goto out_free;
	ms->bytes = p;
	ms->map_len = len;
	ms->base.ops = &mem_ops;
	ms->base.size = size;
	ms->base.mem_align = 1;
	ms->base.offset_align = 1;
	ms->base.direct = false;
	snprintf(ms->base.desc, sizeof(ms->base.desc), "memory %llu bytes",
		 (unsigned long long)size);
	*out = &ms->base;
	return 0;
out_free:
	free(ms);
out:
	return err;
}
