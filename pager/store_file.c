/*
 * store_file.c - the file store: io_uring and O_DIRECT on a file.
 *
 * One io_uring ring per queue (the caller's thread), an eventfd registered
 * on it as the queue's pollable descriptor once someone asks for it (each
 * completion signals it: a queue that is only reaped skips that cost), the
 * file registered as a fixed file, and optionally one fixed buffer.  A filesystem that refuses O_DIRECT gets the same code path with a
 * buffered descriptor, a warning and the buffered_ios counter.  The
 * contract is in store.h.
 */
#include "pager/store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kmod-helpers/dio.h"
#include "kmod-helpers/fdset.h"
#include "kmod-helpers/uring.h"

#define FILE_QUEUE_MAX_DEPTH 32768u	/* IORING_MAX_ENTRIES */
#define FILE_BOUNCE_MAX	     (1u << 20) /* bounce buffer of misaligned sync I/O */
#define FILE_BUFFERED_ALIGN  4096u	/* reported when O_DIRECT is refused */

struct file_store {
	struct kvp_store base; /* first: the public part */
	int fd;		       /* O_DIRECT unless base.direct is false */
};

struct kvp_store_queue {
	struct io_uring ring;
	struct file_store *fs;
	int efd;	   /* eventfd signalled on each completion ... */
	bool efd_on;	   /* ... once registered (file_queue_fd) */
	bool fixed;	   /* fs->fd is registered as fixed file 0 */
	char *buf_base;	   /* the fixed buffers' range (file_queue_buffer),
			      or NULL: buffer i is its i-th FIXED_CHUNK */
	size_t buf_len;
	unsigned depth;	   /* most I/Os in flight, as asked */
	unsigned inflight; /* accepted and not reaped yet */
};

static struct file_store *to_file(struct kvp_store *s)
{
	return (struct file_store *)s;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void count_buffered(struct file_store *fs, uint64_t n)
{
	if (!fs->base.direct)
		__atomic_fetch_add(&fs->base.buffered_ios, n, __ATOMIC_RELAXED);
}

/* Whether [off, off+len) is inside the store and aligned for its I/O. */
static bool range_ok(const struct kvp_store *s, size_t len, uint64_t off)
{
	uint64_t a = s->offset_align;

	return len && off <= s->size && len <= s->size - off && !(off % a) &&
	       !(len % a);
}

static bool buf_aligned(const struct kvp_store *s, const void *buf)
{
	return !((uintptr_t)buf % s->mem_align);
}

/* The whole of one transfer, retrying short and interrupted ones. */
static int file_xfer(int fd, bool write, char *buf, size_t len, uint64_t off)
{
	while (len) {
		ssize_t n = write ? pwrite(fd, buf, len, (off_t)off)
				  : pread(fd, buf, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO; /* end of file inside the store: short */
		buf += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

/*
 * O_DIRECT wants an aligned buffer: a misaligned one goes through an
 * aligned bounce buffer, a chunk at a time.
 */
static int file_sync(struct kvp_store *s, bool write, void *buf, size_t len,
		     uint64_t off)
{
	struct file_store *fs = to_file(s);
	size_t chunk, done;
	void *bounce;
	int err = 0;

	if (!len)
		return 0;
	if (!buf || !range_ok(s, len, off))
		return -EINVAL;
	count_buffered(fs, 1);
	if (!s->direct || buf_aligned(s, buf))
		return file_xfer(fs->fd, write, buf, len, off);

	chunk = len < FILE_BOUNCE_MAX ? len : FILE_BOUNCE_MAX;
	if (posix_memalign(&bounce,
			   s->mem_align < sizeof(void *) ? sizeof(void *)
							 : s->mem_align,
			   chunk))
		return -ENOMEM;
	for (done = 0; done < len && !err; done += chunk) {
		size_t n = len - done < chunk ? len - done : chunk;
		char *p = (char *)buf + done;

		if (write)
			memcpy(bounce, p, n);
		err = file_xfer(fs->fd, write, bounce, n, off + done);
		if (!err && !write)
			memcpy(p, bounce, n);
	}
	free(bounce);
	return err;
}

static int file_pread(struct kvp_store *s, void *buf, size_t len, uint64_t off)
{
	return file_sync(s, false, buf, len, off);
}

static int file_pwrite(struct kvp_store *s, const void *buf, size_t len,
		       uint64_t off)
{
	return file_sync(s, true, (void *)buf, len, off);
}

static int file_queue_create(struct kvp_store *s, unsigned depth,
			     struct kvp_store_queue **out)
{
	struct file_store *fs = to_file(s);
	struct kvp_store_queue *q;
	int err;

	if (!out || !depth || depth > FILE_QUEUE_MAX_DEPTH)
		return -EINVAL;
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->fs = fs;
	q->depth = depth;
	err = kvp_uring_init(&q->ring, depth, 0);
	if (err)
		goto out_free;
	q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	q->efd = kvp_fd_own(q->efd < 0 ? -errno : q->efd);
	if (q->efd < 0) {
		err = q->efd;
		goto out_ring;
	}
	/* A fixed file spares a file lookup per I/O; optional. */
	q->fixed = io_uring_register_files(&q->ring, &fs->fd, 1) == 0;
	*out = q;
	return 0;
out_ring:
	kvp_uring_exit(&q->ring);
out_free:
	free(q);
	return err;
}

/* Move up to @max completions into @out; returns how many. */
static unsigned file_harvest(struct kvp_store_queue *q, struct kvp_io **out,
			     unsigned max)
{
	struct io_uring_cqe *cqe;
	unsigned head, got = 0;

	io_uring_for_each_cqe(&q->ring, head, cqe)
	{
		struct kvp_io *io;

		if (got == max)
			break;
		io = io_uring_cqe_get_data(cqe);
		io->result = cqe->res;
		out[got++] = io;
	}
	io_uring_cq_advance(&q->ring, got);
	q->inflight -= got;
	return got;
}

static void file_queue_destroy(struct kvp_store_queue *q)
{
	struct io_uring_cqe *cqe;

	if (!q)
		return;
	/*
	 * Wait for what is in flight: the kernel would otherwise go on
	 * writing into buffers the caller is about to reuse.
	 */
	if (io_uring_sq_ready(&q->ring))
		io_uring_submit(&q->ring);
	while (q->inflight) {
		int err = io_uring_wait_cqe(&q->ring, &cqe);

		if (err == -EINTR)
			continue;
		if (err)
			break;
		io_uring_cqe_seen(&q->ring, cqe);
		q->inflight--;
	}
	kvp_uring_exit(&q->ring);
	kvp_fd_close(q->efd);
	free(q);
}

/* Does @io's buffer lie in the fixed buffer (buf_index 0, sqe zeroed)? */
/* io_uring refuses a registered buffer over 1 GiB (-EFAULT): a range is
 * registered as buffers of this size, the last one shorter. */
#define FIXED_CHUNK (1ull << 30)
#define FIXED_MAX_CHUNKS 64

/* The fixed buffer holding all of io's buffer, or -1: outside the range,
 * or across two of its buffers. */
static int fixed_index(const struct kvp_store_queue *q,
		       const struct kvp_io *io)
{
	const char *b = io->buf;
	size_t at;

	if (!q->buf_base || b < q->buf_base ||
	    (size_t)(b - q->buf_base) > q->buf_len ||
	    io->len > q->buf_len - (size_t)(b - q->buf_base) || !io->len)
		return -1;
	at = (size_t)(b - q->buf_base);
	if (at / FIXED_CHUNK != (at + io->len - 1) / FIXED_CHUNK)
		return -1;
	return (int)(at / FIXED_CHUNK);
}

static int file_submit(struct kvp_store_queue *q, struct kvp_io *const *ios,
		       unsigned n)
{
	const struct kvp_store *s = &q->fs->base;
	uint64_t t;
	unsigned i;
	int err;

	if (!ios)
		return -EINVAL;
	t = now_ns();
	for (i = 0; i < n && q->inflight < q->depth; i++) {
		struct kvp_io *io = ios[i];
		struct io_uring_sqe *sqe;
		int fd = q->fixed ? 0 : q->fs->fd, fb;

		if (!io || !range_ok(s, io->len, io->off) ||
		    (s->direct && !buf_aligned(s, io->buf)) ||
		    io->len > UINT_MAX ||
		    (io->op != KVP_IO_READ && io->op != KVP_IO_WRITE)) {
			if (!i)
				return -EINVAL;
			break; /* the caller resubmits the rest and learns */
		}
		sqe = io_uring_get_sqe(&q->ring);
		if (!sqe)
			break;
		/* a fixed buffer's pages are not pinned again per I/O */
		fb = fixed_index(q, io);
		if (fb >= 0 && io->op == KVP_IO_READ)
			io_uring_prep_read_fixed(sqe, fd, io->buf,
						 (unsigned)io->len, io->off, fb);
		else if (fb >= 0)
			io_uring_prep_write_fixed(sqe, fd, io->buf,
						  (unsigned)io->len, io->off,
						  fb);
		else if (io->op == KVP_IO_READ)
			io_uring_prep_read(sqe, fd, io->buf, (unsigned)io->len,
					   io->off);
		else
			io_uring_prep_write(sqe, fd, io->buf, (unsigned)io->len,
					    io->off);
		if (q->fixed)
			sqe->flags |= IOSQE_FIXED_FILE;
		io_uring_sqe_set_data(sqe, io);
		io->result = 0;
		io->submit_ns = t;
		q->inflight++;
	}
	if (!i)
		return 0;
	count_buffered(q->fs, i);
	/*
	 * One io_uring_enter for the batch.  On a transient failure the
	 * entries stay in the submission ring; reap submits them again.
	 */
	err = io_uring_submit(&q->ring);
	if (err < 0 && err != -EAGAIN && err != -EBUSY && err != -EINTR)
		fprintf(stderr,
			"kvpager: io_uring submit failed: %s; "
			"retrying at the next reap\n",
			strerror(-err));
	return (int)i;
}

static int file_reap(struct kvp_store_queue *q, struct kvp_io **out,
		     unsigned max, unsigned wait)
{
	unsigned got = 0, want;

	if (!out)
		return -EINVAL;
	if (!max)
		return 0;
	if (io_uring_sq_ready(&q->ring))
		io_uring_submit(&q->ring);
	want = wait < max ? wait : max;
	if (want > q->inflight)
		want = q->inflight;
	for (;;) {
		struct io_uring_cqe *cqe;
		unsigned kern;
		uint64_t v;
		int err;

		got += file_harvest(q, out + got, max - got);
		if (got < max && q->efd_on) {
			/*
			 * The ring was empty: clear the eventfd, then look
			 * again, so that a completion posted in between
			 * signals it anew.  If that fills @out with more
			 * waiting, signal it ourselves so that a poller
			 * comes back.
			 */
			if (read(q->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				return -errno;
			got += file_harvest(q, out + got, max - got);
			if (got == max && io_uring_cq_ready(&q->ring))
				eventfd_write(q->efd, 1);
		}
		if (got >= want)
			return (int)got;
		/*
		 * One io_uring_enter for the rest of what is wanted, but never
		 * for I/Os still in the submission ring (a submit that failed
		 * or stopped short): the kernel cannot complete those, so they
		 * are submitted again and waited for one at a time.
		 */
		kern = q->inflight - io_uring_sq_ready(&q->ring);
		if (kern)
			err = io_uring_wait_cqe_nr(&q->ring, &cqe,
						   want - got < kern ? want - got
								     : kern);
		else
			err = io_uring_submit_and_wait(&q->ring, 1);
		if (err < 0 && err != -EINTR && err != -EAGAIN)
			return got ? (int)got : err;
		if (err < 0 && !kern)
			return (int)got; /* the next reap submits again */
	}
}

static int file_queue_fd(struct kvp_store_queue *q)
{
	if (!q->efd_on) {
		if (io_uring_register_eventfd(&q->ring, q->efd))
			return -1;
		q->efd_on = true;
		/* what completed before it was registered */
		if (io_uring_cq_ready(&q->ring))
			eventfd_write(q->efd, 1);
	}
	return q->efd;
}

static int file_queue_buffer(struct kvp_store_queue *q, void *base,
			     size_t len)
{
	struct iovec iov[FIXED_MAX_CHUNKS];
	unsigned i, n;
	int err;

	if (q->buf_base)
		(void)io_uring_unregister_buffers(&q->ring);
	q->buf_base = NULL;
	q->buf_len = 0;
	if (!base || !len)
		return 0;
	if (len > FIXED_MAX_CHUNKS * FIXED_CHUNK)
		return -E2BIG;
	n = (unsigned)((len + FIXED_CHUNK - 1) / FIXED_CHUNK);
	for (i = 0; i < n; i++) {
		size_t at = (size_t)i * FIXED_CHUNK;

		iov[i].iov_base = (char *)base + at;
		iov[i].iov_len = len - at < FIXED_CHUNK ? len - at : FIXED_CHUNK;
	}
	err = io_uring_register_buffers(&q->ring, iov, n);
	if (err)
		return err;
	q->buf_base = base;
	q->buf_len = len;
	return 0;
}

static int file_discard(struct kvp_store *s, uint64_t off, uint64_t len)
{
	struct file_store *fs = to_file(s);

	if (!len)
		return 0;
	if (off > s->size || len > s->size - off)
		return -EINVAL;
	if (fallocate(fs->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		      (off_t)off, (off_t)len))
		return -errno;
	return 0;
}

static void file_destroy(struct kvp_store *s)
{
	struct file_store *fs = to_file(s);

	kvp_fd_close(fs->fd);
	free(fs);
}

static const struct kvp_store_ops file_ops = {
	.kind = "file",
	.pread = file_pread,
	.pwrite = file_pwrite,
	.queue_create = file_queue_create,
	.queue_destroy = file_queue_destroy,
	.submit = file_submit,
	.reap = file_reap,
	.queue_fd = file_queue_fd,
	.queue_buffer = file_queue_buffer,
	.discard = file_discard,
	.destroy = file_destroy,
};

/*
 * Make the file at least @size bytes with its blocks allocated, so that a
 * full disk says so now.  Filesystems without fallocate get a sparse
 * ftruncate.
 */
static int file_reserve(int fd, uint64_t cur, uint64_t size, const char *name)
{
	int err;

	if (size <= cur)
		return 0;
	if (!fallocate(fd, 0, (off_t)cur, (off_t)(size - cur)))
		return 0;
	err = -errno;
	if (err == -EOPNOTSUPP) {
		if (!ftruncate(fd, (off_t)size))
			return 0;
		err = -errno;
	}
	if (err == -ENOSPC || err == -EFBIG)
		fprintf(stderr,
			"kvpager: cannot reserve %llu bytes for %s: %s; free "
			"space there or give a smaller size or another "
			"directory\n",
			(unsigned long long)size, name, strerror(-err));
	return err;
}

/* Wrap the open @fd (owned from here on, closed on failure) in a store. */
static int file_store_new(int fd, bool direct, uint64_t size, const char *name,
			  struct kvp_store **out)
{
	struct kvp_dio_align a = { 0 };
	struct file_store *fs;
	int err;

	fd = kvp_fd_own(fd);
	if (fd < 0)
		return fd;
	err = kvp_dio_alignment(fd, &a);
	if (err)
		goto out_close;
	fs = calloc(1, sizeof(*fs));
	if (!fs) {
		err = -ENOMEM;
		goto out_close;
	}
	fs->fd = fd;
	fs->base.ops = &file_ops;
	fs->base.size = size;
	fs->base.direct = direct;
	if (direct) {
		fs->base.mem_align = a.mem_align;
		fs->base.offset_align = a.offset_align;
	} else {
		fs->base.mem_align = FILE_BUFFERED_ALIGN;
		fs->base.offset_align = FILE_BUFFERED_ALIGN;
	}
	snprintf(fs->base.desc, sizeof(fs->base.desc), "file %s (%s)", name,
		 direct ? "O_DIRECT" : "buffered");
	*out = &fs->base;
	return 0;
out_close:
	kvp_fd_close(fd);
	return err;
}

static void warn_buffered(const char *name, unsigned flags)
{
	if (flags & KVP_STORE_BUFFERED)
		return;
	fprintf(stderr,
		"kvpager: warning: %s refuses O_DIRECT; using buffered I/O "
		"(the page cache will hold copies of stored blocks); put the "
		"backing file on a disk filesystem (ext4, xfs) to avoid it\n",
		name);
}

/* open(2) with O_DIRECT unless told not to; the descriptor or -errno. */
static int store_open_fd(const char *path, int oflags, unsigned flags,
			 bool *direct)
{
	int fd;

	if (!(flags & KVP_STORE_BUFFERED))
		return kvp_dio_open(path, oflags, 0600, direct);
	*direct = false;
	fd = open(path, oflags, 0600);
	return fd < 0 ? -errno : fd;
}

int kvp_store_file_open(const char *path, uint64_t size, unsigned flags,
			struct kvp_store **out)
{
	const unsigned known =
	    KVP_STORE_CREATE | KVP_STORE_TRUNCATE | KVP_STORE_BUFFERED;
	int oflags = O_RDWR | O_CLOEXEC;
	bool direct = false, created = false;
	struct stat st;
	int fd, err;

	if (!path || !*path || !out || (flags & ~known))
		return -EINVAL;
	if ((flags & KVP_STORE_TRUNCATE) && !size)
		return -EINVAL;
	if (flags & KVP_STORE_CREATE) {
		/* O_EXCL first, to know whether a failure must remove it. */
		fd = store_open_fd(path, oflags | O_CREAT | O_EXCL, flags,
				   &direct);
		created = fd >= 0;
		if (fd == -EEXIST)
			fd = store_open_fd(path, oflags, flags, &direct);
	} else {
		fd = store_open_fd(path, oflags, flags, &direct);
	}
	if (fd < 0)
		return fd;

	err = -errno;
	if (fstat(fd, &st))
		goto out_close;
	err = -EINVAL;
	if (!S_ISREG(st.st_mode)) {
		fprintf(stderr,
			"kvpager: cannot use %s as a store: not a "
			"regular file\n",
			path);
		goto out_close;
	}
	if (flags & KVP_STORE_TRUNCATE) {
		err = -errno;
		if (ftruncate(fd, 0))
			goto out_close;
		st.st_size = 0;
	}
	if (!size)
		size = (uint64_t)st.st_size;
	err = -EINVAL;
	if (!size)
		goto out_close; /* an empty file and no size */
	err = file_reserve(fd, (uint64_t)st.st_size, size, path);
	if (err)
		goto out_close;
	if (!direct)
		warn_buffered(path, flags);
	err = file_store_new(fd, direct, size, path, out);
	if (err)
		goto out_unlink;
	return 0;
out_close:
	close(fd);
out_unlink:
	if (created)
		unlink(path);
	return err;
}

/* mkstemp(3) then unlink(2), for filesystems without O_TMPFILE. */
static int temp_mkstemp(const char *dir, bool *direct)
{
	char tmpl[PATH_MAX];
	int fd, fl;

	if (snprintf(tmpl, sizeof(tmpl), "%s/kvpager-XXXXXX", dir) >=
	    (int)sizeof(tmpl))
		return -ENAMETOOLONG;
	fd = mkostemp(tmpl, O_CLOEXEC); /* mode 0600 */
	if (fd < 0)
		return -errno;
	unlink(tmpl);
	fl = fcntl(fd, F_GETFL);
	*direct = fl >= 0 && !fcntl(fd, F_SETFL, fl | O_DIRECT);
	return fd;
}

int kvp_store_file_temp(const char *dir, uint64_t size, struct kvp_store **out)
{
	char name[PATH_MAX + 16];
	bool direct = false;
	int fd, err;

	if (!size || !out)
		return -EINVAL;
	if (!dir || !*dir)
		dir = getenv("TMPDIR");
	if (!dir || !*dir)
		dir = "/tmp";
	fd = kvp_dio_open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600, &direct);
	if (fd == -EOPNOTSUPP || fd == -EISDIR)
		fd = temp_mkstemp(dir, &direct);
	if (fd < 0)
		return fd;
	snprintf(name, sizeof(name), "temporary in %s", dir);
	err = file_reserve(fd, 0, size, name);
	if (err) {
		close(fd);
		return err;
	}
	if (!direct)
		warn_buffered(dir, 0);
	return file_store_new(fd, direct, size, name, out);
}
