/*
 * test_store_file.c - pager/store_file.c: the io_uring + O_DIRECT file store.
 *
 * Data round trips through the synchronous and the queue paths, alignment,
 * the temporary file's mode and unlinking, buffered fallback (ramfs, and
 * KVP_STORE_BUFFERED), ENOSPC on a tiny tmpfs, discard, bad input.  The
 * mounts are made once by main(); tests that need one say so and pass
 * trivially when it could not be made.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pager/store.h"
#include "tests/helpers/helpers.h"

#define MIB (1u << 20)

static char disk_dir[256];  /* a fresh directory on /var/tmp */
static char ramfs_dir[512]; /* "" when not mounted */
static char tiny_dir[512];  /* a 1 MiB tmpfs, "" when not mounted */

/* Write then read back @len bytes at @off through the synchronous path. */
static void sync_round_trip(struct kvp_store *s, size_t len, uint64_t off,
			    uint64_t seed)
{
	char *w = kvp_test_xalloc(len), *r = kvp_test_xalloc(len);

	kvp_test_fill(w, len, seed, off);
	memset(r, 0, len);
	ck_assert_int_eq(kvp_store_pwrite(s, w, len, off), 0);
	ck_assert_int_eq(kvp_store_pread(s, r, len, off), 0);
	ck_assert(kvp_test_check(r, len, seed, off) < 0);
	free(w);
	free(r);
}

/*
 * Write @n blocks of @bs through a queue of @depth, read them back through
 * the queue, check data, results and timestamps.
 */
static void queue_round_trip(struct kvp_store *s, unsigned depth, unsigned n,
			     size_t bs, uint64_t seed)
{
	struct kvp_store_queue *q;
	struct kvp_io *ios = calloc(n, sizeof(*ios));
	struct kvp_io **ptrs = calloc(n, sizeof(*ptrs));
	struct kvp_io **done = calloc(n, sizeof(*done));
	char *mem = kvp_test_xalloc((size_t)n * bs);
	int pass;

	ck_assert_int_eq(s->ops->queue_create(s, depth, &q), 0);
	ck_assert_int_ge(s->ops->queue_fd(q), 0);
	for (pass = 0; pass < 2; pass++) {
		unsigned sub = 0, reaped = 0, i;
		uint64_t t0 = kvp_test_now_ns();

		if (pass == 0)
			kvp_test_fill(mem, (size_t)n * bs, seed, 0);
		else
			memset(mem, 0, (size_t)n * bs);
		for (i = 0; i < n; i++) {
			ios[i] = (struct kvp_io){
				.op = pass ? KVP_IO_READ : KVP_IO_WRITE,
				.buf = mem + (size_t)i * bs,
				.len = bs,
				.off = (uint64_t)i * bs,
				.result = -1,
				.cookie = &ios[i],
			};
			ptrs[i] = &ios[i];
		}
		while (reaped < n) {
			int k;

			if (sub < n) {
				k = s->ops->submit(q, ptrs + sub, n - sub);
				ck_assert_int_ge(k, 0);
				ck_assert_int_le(k, (int)depth);
				sub += (unsigned)k;
			}
			k = s->ops->reap(q, done, n, true);
			ck_assert_int_ge(k, 0);
			for (i = 0; i < (unsigned)k; i++) {
				ck_assert_int_eq(done[i]->result, (int64_t)bs);
				ck_assert_ptr_eq(done[i]->cookie, done[i]);
				ck_assert_uint_ge(done[i]->submit_ns, t0);
				ck_assert_uint_le(done[i]->submit_ns,
						  kvp_test_now_ns());
			}
			reaped += (unsigned)k;
			ck_assert_uint_le(reaped, sub);
		}
	}
	ck_assert(kvp_test_check(mem, (size_t)n * bs, seed, 0) < 0);
	s->ops->queue_destroy(q);
	free(mem);
	free(done);
	free(ptrs);
	free(ios);
}

/* The mode of the deleted file under @dir that this process holds open. */
static int deleted_file_mode(const char *dir)
{
	char link[PATH_MAX], path[300];
	struct dirent *d;
	int mode = -1;
	DIR *fds = opendir("/proc/self/fd");

	ck_assert_ptr_nonnull(fds);
	while ((d = readdir(fds))) {
		struct stat st;
		ssize_t n;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", d->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		if (strncmp(link, dir, strlen(dir)) ||
		    !strstr(link, "(deleted)"))
			continue;
		if (!stat(path, &st))
			mode = st.st_mode & 07777;
	}
	closedir(fds);
	return mode;
}

static int dir_entries(const char *dir)
{
	struct dirent *d;
	int n = 0;
	DIR *dd = opendir(dir);

	ck_assert_ptr_nonnull(dd);
	while ((d = readdir(dd)))
		if (strcmp(d->d_name, ".") && strcmp(d->d_name, ".."))
			n++;
	closedir(dd);
	return n;
}

START_TEST(test_temp_store)
{
	struct kvp_store *s = NULL;

	ck_assert_int_eq(kvp_store_file_temp(disk_dir, 8 * MIB, &s), 0);
	ck_assert_str_eq(s->ops->kind, "file");
	ck_assert_uint_eq(s->size, 8 * MIB);
	ck_assert(s->direct);
	ck_assert(kvp_test_pow2(s->mem_align) &&
		  kvp_test_pow2(s->offset_align));
	ck_assert_uint_le(s->offset_align, 4096);
	ck_assert_ptr_nonnull(strstr(s->desc, "O_DIRECT"));
	/* Unlinked once open, and 0600. */
	ck_assert_int_eq(dir_entries(disk_dir), 0);
	ck_assert_int_eq(deleted_file_mode(disk_dir), 0600);
	sync_round_trip(s, 1 * MIB, 3 * MIB, 1);
	ck_assert_uint_eq(s->buffered_ios, 0);
	kvp_store_destroy(s);
	ck_assert_int_eq(deleted_file_mode(disk_dir), -1);
}
END_TEST

START_TEST(test_sync_paths)
{
	struct kvp_store *s;
	char *raw = kvp_test_xalloc(3 * 4096 + 64), *mis = raw + 8;
	uint32_t a;

	ck_assert_int_eq(kvp_store_file_temp(disk_dir, 4 * MIB, &s), 0);
	a = s->offset_align;
	sync_round_trip(s, 4 * MIB, 0, 2);
	sync_round_trip(s, a, 4 * MIB - a, 3); /* the last aligned unit */
	/* A misaligned buffer goes through the bounce buffer both ways. */
	kvp_test_fill(mis, 3 * 4096, 4, 8192);
	ck_assert_int_eq(kvp_store_pwrite(s, mis, 3 * 4096, 8192), 0);
	memset(raw, 0, 3 * 4096 + 64);
	ck_assert_int_eq(kvp_store_pread(s, raw + 24, 3 * 4096, 8192), 0);
	ck_assert(kvp_test_check(raw + 24, 3 * 4096, 4, 8192) < 0);
	/* Bad input. */
	ck_assert_int_eq(kvp_store_pread(s, raw, 4096, a / 2 ? a / 2 : 1),
			 -EINVAL);
	ck_assert_int_eq(kvp_store_pread(s, raw, a + 1, 0), -EINVAL);
	ck_assert_int_eq(kvp_store_pread(s, raw, 4096, 4 * MIB), -EINVAL);
	ck_assert_int_eq(kvp_store_pwrite(s, raw, 8192, 4 * MIB - 4096),
			 -EINVAL);
	ck_assert_int_eq(kvp_store_pread(s, raw, 4096, UINT64_MAX - 4095),
			 -EINVAL);
	kvp_store_destroy(s);
	free(raw);
}
END_TEST

START_TEST(test_queue_paths)
{
	struct kvp_store *s;

	ck_assert_int_eq(kvp_store_file_temp(disk_dir, 16 * MIB, &s), 0);
	queue_round_trip(s, 8, 64, 64 * 1024, 5);
	queue_round_trip(s, 1, 8, 4096, 6);
	queue_round_trip(s, 4, 8, 2 * MIB, 7);
	kvp_store_destroy(s);
}
END_TEST

START_TEST(test_queue_fd_and_limits)
{
	struct kvp_store *s;
	struct kvp_store_queue *q;
	struct kvp_io ios[6], *p[6], *done[6];
	char *mem = kvp_test_xalloc(6 * 4096);
	struct pollfd pfd;
	int i, got = 0;

	ck_assert_int_eq(kvp_store_file_temp(disk_dir, 1 * MIB, &s), 0);
	ck_assert_int_eq(s->ops->queue_create(s, 0, &q), -EINVAL);
	ck_assert_int_eq(s->ops->queue_create(s, 4, &q), 0);
	for (i = 0; i < 6; i++) {
		ios[i] = (struct kvp_io){ .op = KVP_IO_READ,
					  .buf = mem + i * 4096,
					  .len = 4096,
					  .off = (uint64_t)i * 4096 };
		p[i] = &ios[i];
	}
	/* A misaligned offset first: nothing accepted. */
	ios[0].off = 1;
	ck_assert_int_eq(s->ops->submit(q, p, 6), -EINVAL);
	ios[0].off = 0;
	/* A bad one later: the good ones before it are accepted. */
	ios[2].off = 1 * MIB;
	ck_assert_int_eq(s->ops->submit(q, p, 3), 2);
	ios[2].off = 2 * 4096;
	/* The queue holds at most its depth. */
	ck_assert_int_eq(s->ops->submit(q, p + 2, 4), 2);
	ck_assert_int_eq(s->ops->submit(q, p + 4, 2), 0);

	/* The eventfd polls readable when completions wait ... */
	pfd = (struct pollfd){ .fd = s->ops->queue_fd(q), .events = POLLIN };
	ck_assert_int_eq(poll(&pfd, 1, 5000), 1);
	while (got < 4) {
		int k = s->ops->reap(q, done, 1, true);

		ck_assert_int_eq(k, 1);
		ck_assert_int_eq(done[0]->result, 4096);
		got++;
	}
	/* ... and not once all are reaped; reap does not block then. */
	ck_assert_int_eq(s->ops->reap(q, done, 6, true), 0);
	ck_assert_int_eq(poll(&pfd, 1, 0), 0);
	ck_assert_int_eq(s->ops->submit(q, p + 4, 2), 2);
	/* Destroyed with I/O in flight: waits for it. */
	s->ops->queue_destroy(q);
	kvp_store_destroy(s);
	free(mem);
}
END_TEST

/* Submit @n I/Os of @bs at offsets i * bs into mem; one reap gets all. */
static void batch_io(struct kvp_store *s, struct kvp_store_queue *q,
		     enum kvp_io_op op, char *mem, unsigned n, size_t bs)
{
	struct kvp_io ios[16], *p[16], *done[16];
	unsigned i;

	ck_assert_uint_le(n, 16);
	for (i = 0; i < n; i++) {
		ios[i] = (struct kvp_io){ .op = op,
					  .buf = mem + i * bs,
					  .len = bs,
					  .off = (uint64_t)i * bs,
					  .result = -1 };
		p[i] = &ios[i];
	}
	ck_assert_int_eq(s->ops->submit(q, p, n), (int)n);
	/* wait n: one call returns them all */
	ck_assert_int_eq(s->ops->reap(q, done, 16, n), (int)n);
	for (i = 0; i < n; i++)
		ck_assert_int_eq(done[i]->result, (int64_t)bs);
}

/* queue_buffer, where locked memory allows it: 0, or -ENOMEM / -EPERM
 * (RLIMIT_MEMLOCK, shared by every process of the user: a note, and the
 * I/O goes on unregistered).  Any other error fails. */
static int register_or_note(struct kvp_store *s, struct kvp_store_queue *q,
			    void *mem, size_t len)
{
	int err = s->ops->queue_buffer(q, mem, len);

	if (err == -ENOMEM || err == -EPERM)
		printf("note: queue_buffer of %zu bytes: %s (locked memory "
		       "limit): the I/O runs unregistered\n",
		       len, strerror(-err));
	else
		ck_assert_int_eq(err, 0);
	return err;
}

/*
 * reap waits for a batch in one call (capped at what is in flight), and
 * I/O into a registered fixed buffer (queue_buffer) moves the same bytes
 * as I/O that pins its pages each time, before and after it is dropped.
 */
START_TEST(test_queue_batch_and_fixed)
{
	const size_t bs = 64 * 1024;
	struct kvp_store *s;
	struct kvp_store_queue *q;
	struct kvp_io io, *p = &io, *done[16];
	char *mem = kvp_test_xalloc(16 * bs), *other = kvp_test_xalloc(bs);
	int pass;

	ck_assert_int_eq(kvp_store_file_temp(disk_dir, 4 * MIB, &s), 0);
	ck_assert_int_eq(s->ops->queue_create(s, 16, &q), 0);
	ck_assert_int_eq(s->ops->reap(q, done, 16, 0), 0);
	ck_assert_int_eq(s->ops->reap(q, done, 16, 5), 0); /* none in flight */
	for (pass = 0; pass < 3; pass++) {
		/* 0: not registered, 1: registered, 2: forgotten again */
		if (pass == 1)
			register_or_note(s, q, mem, 16 * bs);
		if (pass == 2)
			ck_assert_int_eq(s->ops->queue_buffer(q, NULL, 0), 0);
		kvp_test_fill(mem, 16 * bs, 40 + (uint64_t)pass, 0);
		batch_io(s, q, KVP_IO_WRITE, mem, 16, bs);
		memset(mem, 0, 16 * bs);
		batch_io(s, q, KVP_IO_READ, mem, 16, bs);
		ck_assert(kvp_test_check(mem, 16 * bs, 40 + (uint64_t)pass,
					 0) < 0);
		/* a buffer outside the registered one, and wait > in flight */
		memset(other, 0, bs);
		io = (struct kvp_io){ .op = KVP_IO_READ, .buf = other,
				      .len = bs, .off = 3 * bs };
		ck_assert_int_eq(s->ops->submit(q, &p, 1), 1);
		ck_assert_int_eq(s->ops->reap(q, done, 16, 16), 1);
		ck_assert_int_eq(io.result, (int64_t)bs);
		ck_assert(kvp_test_check(other, bs, 40 + (uint64_t)pass,
					 3 * bs) < 0);
	}
	/* registered, then destroyed with it registered */
	register_or_note(s, q, mem, 16 * bs);
	s->ops->queue_destroy(q);
	kvp_store_destroy(s);
	free(mem);
	free(other);
}
END_TEST

/*
 * A range over 1 GiB (io_uring's limit for one registered buffer) is
 * registered as 1 GiB buffers: I/O in the second one, and I/O across the
 * boundary (done unregistered), move the right bytes.  The range is
 * pinned while registered: huge pages keep that cheap.
 */
START_TEST(test_fixed_over_1g)
{
	const size_t bs = 64 * 1024, g = 1ull << 30, len = g + 4 * MIB;
	const size_t at[3] = { 0, g + bs, g - bs / 2 }; /* the last across */
	struct kvp_store *s;
	struct kvp_store_queue *q;
	struct kvp_io io, *p = &io, *done[1];
	char *mem;
	int i, err;

	mem = mmap(NULL, len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	ck_assert_ptr_ne(mem, MAP_FAILED);
	(void)madvise(mem, len, MADV_HUGEPAGE);
	ck_assert_int_eq(kvp_store_file_temp(disk_dir, 4 * MIB, &s), 0);
	ck_assert_int_eq(s->ops->queue_create(s, 4, &q), 0);
	err = register_or_note(s, q, mem, len);
	for (i = 0; i < 3; i++) {
		kvp_test_fill(mem + at[i], bs, 60 + (uint64_t)i, 0);
		io = (struct kvp_io){ .op = KVP_IO_WRITE, .buf = mem + at[i],
				      .len = bs, .off = (uint64_t)i * bs };
		ck_assert_int_eq(s->ops->submit(q, &p, 1), 1);
		ck_assert_int_eq(s->ops->reap(q, done, 1, 1), 1);
		ck_assert_int_eq(io.result, (int64_t)bs);
	}
	for (i = 0; i < 3; i++) {
		memset(mem + at[i], 0, bs);
		io = (struct kvp_io){ .op = KVP_IO_READ, .buf = mem + at[i],
				      .len = bs, .off = (uint64_t)i * bs };
		ck_assert_int_eq(s->ops->submit(q, &p, 1), 1);
		ck_assert_int_eq(s->ops->reap(q, done, 1, 1), 1);
		ck_assert_int_eq(io.result, (int64_t)bs);
		ck_assert_msg(kvp_test_check(mem + at[i], bs,
					     60 + (uint64_t)i, 0) < 0,
			      "block %d (at %zu) read back wrong (%s)", i,
			      at[i], err ? "unregistered" : "registered");
	}
	s->ops->queue_destroy(q);
	kvp_store_destroy(s);
	munmap(mem, len);
}
END_TEST

START_TEST(test_open_paths)
{
	char path[PATH_MAX + 8];
	struct kvp_store *s;
	struct stat st;

	snprintf(path, sizeof(path), "%s/store", disk_dir);
	ck_assert_int_eq(kvp_store_file_open(path, 0, 0, &s), -ENOENT);
	ck_assert_int_eq(kvp_store_file_open(path, 0, KVP_STORE_CREATE, &s),
			 -EINVAL);
	ck_assert_int_eq(access(path, F_OK), -1); /* removed again */
	ck_assert_int_eq(kvp_store_file_open(path, 0, 1u << 20, &s), -EINVAL);
	ck_assert_int_eq(kvp_store_file_open(path, 0, KVP_STORE_TRUNCATE, &s),
			 -EINVAL);
	ck_assert_int_eq(kvp_store_file_open(NULL, 4096, 0, &s), -EINVAL);
	ck_assert_int_lt(kvp_store_file_open(disk_dir, 4096, 0, &s), 0);

	ck_assert_int_eq(
	    kvp_store_file_open(path, 2 * MIB, KVP_STORE_CREATE, &s), 0);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0600);
	ck_assert_int_eq(st.st_size, 2 * MIB);
	ck_assert_int_ge(st.st_blocks * 512, 2 * MIB); /* fallocated */
	sync_round_trip(s, 64 * 1024, 1 * MIB, 8);
	kvp_store_destroy(s);

	/* Reopened: its size and its data. */
	ck_assert_int_eq(kvp_store_file_open(path, 0, 0, &s), 0);
	ck_assert_uint_eq(s->size, 2 * MIB);
	{
		char *r = kvp_test_xalloc(64 * 1024);

		ck_assert_int_eq(kvp_store_pread(s, r, 64 * 1024, 1 * MIB), 0);
		ck_assert(kvp_test_check(r, 64 * 1024, 8, 1 * MIB) < 0);
		free(r);
	}
	kvp_store_destroy(s);
	/* Grown on open; truncated on request. */
	ck_assert_int_eq(kvp_store_file_open(path, 4 * MIB, 0, &s), 0);
	kvp_store_destroy(s);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_eq(st.st_size, 4 * MIB);
	ck_assert_int_eq(
	    kvp_store_file_open(path, 1 * MIB,
				KVP_STORE_CREATE | KVP_STORE_TRUNCATE, &s),
	    0);
	{
		char *r = kvp_test_xalloc(4096);

		ck_assert_int_eq(kvp_store_pread(s, r, 4096, 0), 0);
		ck_assert_int_eq(((uint64_t *)r)[0], 0);
		free(r);
	}
	kvp_store_destroy(s);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_eq(st.st_size, 1 * MIB);
	unlink(path);
}
END_TEST

START_TEST(test_discard)
{
	struct kvp_store *s;
	char *r = kvp_test_xalloc(1 * MIB);
	size_t i;

	ck_assert_int_eq(kvp_store_file_temp(disk_dir, 2 * MIB, &s), 0);
	sync_round_trip(s, 2 * MIB, 0, 9);
	ck_assert_int_eq(s->ops->discard(s, 512 * 1024, 1 * MIB), 0);
	ck_assert_int_eq(s->ops->discard(s, 1 * MIB, 2 * MIB), -EINVAL);
	ck_assert_int_eq(kvp_store_pread(s, r, 1 * MIB, 512 * 1024), 0);
	for (i = 0; i < 1 * MIB; i++)
		ck_assert_int_eq(r[i], 0);
	ck_assert_int_eq(kvp_store_pread(s, r, 512 * 1024, 0), 0);
	ck_assert(kvp_test_check(r, 512 * 1024, 9, 0) < 0);
	kvp_store_destroy(s);
	free(r);
}
END_TEST

START_TEST(test_forced_buffered)
{
	char path[PATH_MAX + 8];
	struct kvp_store *s;
	uint64_t before;

	snprintf(path, sizeof(path), "%s/buffered", disk_dir);
	ck_assert_int_eq(
	    kvp_store_file_open(path, 4 * MIB,
				KVP_STORE_CREATE | KVP_STORE_BUFFERED, &s),
	    0);
	unlink(path);
	ck_assert(!s->direct);
	ck_assert_ptr_nonnull(strstr(s->desc, "buffered"));
	sync_round_trip(s, 1 * MIB, 0, 10);
	ck_assert_uint_eq(s->buffered_ios, 2);
	before = s->buffered_ios;
	queue_round_trip(s, 4, 16, 64 * 1024, 11);
	ck_assert_uint_eq(s->buffered_ios, before + 32);
	kvp_store_destroy(s);
}
END_TEST

START_TEST(test_tmpfs_store)
{
	struct kvp_store *s;

	if (access("/dev/shm", W_OK))
		return;
	ck_assert_int_eq(kvp_store_file_temp("/dev/shm", 4 * MIB, &s), 0);
	/* tmpfs has O_DIRECT since Linux 6.6; either way data round trips
	 * and buffered I/O is counted. */
	sync_round_trip(s, 1 * MIB, 1 * MIB, 12);
	queue_round_trip(s, 8, 16, 64 * 1024, 13);
	ck_assert_uint_eq(s->buffered_ios, s->direct ? 0 : 34);
	kvp_store_destroy(s);
}
END_TEST

START_TEST(test_ramfs_refuses_direct)
{
	char path[PATH_MAX + 8];
	struct kvp_store *s;

	if (!*ramfs_dir)
		return; /* main() said why */
	snprintf(path, sizeof(path), "%s/store", ramfs_dir);
	ck_assert_int_eq(
	    kvp_store_file_open(path, 2 * MIB, KVP_STORE_CREATE, &s), 0);
	ck_assert(!s->direct);
	sync_round_trip(s, 256 * 1024, 0, 14);
	queue_round_trip(s, 4, 8, 64 * 1024, 15);
	ck_assert_uint_eq(s->buffered_ios, 2 + 16);
	/* ramfs cannot punch holes: said so, not faked. */
	ck_assert_int_lt(s->ops->discard(s, 0, 4096), 0);
	kvp_store_destroy(s);
	unlink(path);
	/* The temporary file too. */
	ck_assert_int_eq(kvp_store_file_temp(ramfs_dir, 1 * MIB, &s), 0);
	ck_assert(!s->direct);
	sync_round_trip(s, 64 * 1024, 0, 16);
	kvp_store_destroy(s);
	ck_assert_int_eq(dir_entries(ramfs_dir), 0);
}
END_TEST

START_TEST(test_enospc)
{
	char path[PATH_MAX + 8];
	struct kvp_store_queue *q;
	struct kvp_store *s;
	struct kvp_io io, *p = &io, *done;
	char *w;
	int fd;

	if (!*tiny_dir)
		return; /* main() said why */
	/* Too big for the disk: fails at creation, leaves nothing. */
	snprintf(path, sizeof(path), "%s/store", tiny_dir);
	ck_assert_int_eq(
	    kvp_store_file_open(path, 8 * MIB, KVP_STORE_CREATE, &s), -ENOSPC);
	ck_assert_int_eq(access(path, F_OK), -1);
	ck_assert_int_eq(kvp_store_file_temp(tiny_dir, 8 * MIB, &s), -ENOSPC);
	ck_assert_int_eq(dir_entries(tiny_dir), 0);

	/* A sparse file bigger than the disk: writes get -ENOSPC. */
	fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 8 * MIB), 0);
	close(fd);
	ck_assert_int_eq(kvp_store_file_open(path, 0, 0, &s), 0);
	w = kvp_test_xalloc(4 * MIB);
	kvp_test_fill(w, 4 * MIB, 17, 0);
	ck_assert_int_eq(kvp_store_pwrite(s, w, 4 * MIB, 0), -ENOSPC);
	ck_assert_int_eq(s->ops->queue_create(s, 2, &q), 0);
	io = (struct kvp_io){
		.op = KVP_IO_WRITE, .buf = w, .len = 4 * MIB, .off = 4 * MIB
	};
	ck_assert_int_eq(s->ops->submit(q, &p, 1), 1);
	ck_assert_int_eq(s->ops->reap(q, &done, 1, true), 1);
	ck_assert_ptr_eq(done, &io);
	/* Either nothing fits (-ENOSPC) or a short write. */
	ck_assert(io.result == -ENOSPC ||
		  (io.result >= 0 && io.result < 4 * MIB));
	s->ops->queue_destroy(q);
	kvp_store_destroy(s);
	unlink(path);
	free(w);
}
END_TEST

static Suite *store_file_suite(void)
{
	Suite *s = suite_create("store_file");
	TCase *tc = kvp_test_tcase(s, "core", 30);

	tcase_add_test(tc, test_temp_store);
	tcase_add_test(tc, test_sync_paths);
	tcase_add_test(tc, test_queue_paths);
	tcase_add_test(tc, test_queue_fd_and_limits);
	tcase_add_test(tc, test_queue_batch_and_fixed);
	tcase_add_test(tc, test_open_paths);
	tcase_add_test(tc, test_discard);
	tcase_add_test(tc, test_forced_buffered);
	tcase_add_test(tc, test_tmpfs_store);
	tcase_add_test(tc, test_ramfs_refuses_direct);
	tcase_add_test(tc, test_enospc);
	tcase_add_test(tc, test_fixed_over_1g);
	return s;
}

int main(void)
{
	char root[200] = "/var/tmp/kvp-test-store-XXXXXX";
	const char *why = kvp_test_missing_uring();
	int failed;

	if (why)
		return kvp_test_skip("%s", why);
	if (!mkdtemp(root))
		return kvp_test_skip("cannot make a directory in /var/tmp: %s",
				     strerror(errno));
	/* Disk tests want disk_dir empty: the mounts live beside it. */
	kvp_test_mount(ramfs_dir, sizeof(ramfs_dir), root, "ramfs", "ramfs",
		       "mode=0700");
	kvp_test_mount(tiny_dir, sizeof(tiny_dir), root, "tiny", "tmpfs",
		       "size=1m,mode=0700");
	snprintf(disk_dir, sizeof(disk_dir), "%s/disk", root);
	mkdir(disk_dir, 0700);

	failed = kvp_test_run(store_file_suite());

	kvp_test_unmount(ramfs_dir);
	kvp_test_unmount(tiny_dir);
	rmdir(disk_dir);
	rmdir(root);
	return failed;
}
