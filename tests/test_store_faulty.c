/*
 * test_store_faulty.c - pager/store_faulty.c: fault injection over a store.
 *
 * Over a file store on /var/tmp: reads overlapping the range fail with the
 * errno or come back short, others pass with their data; writes fail with
 * ENOSPC past the byte limit; latency is added and the queue descriptor
 * wakes a poller for injected, forwarded and delayed completions.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kmod-helpers/fdset.h"
#include "pager/store.h"
#include "tests/helpers/helpers.h"

#define KIB 1024u
#define MIB (1024u * 1024u)
#define BS  (64 * KIB)

static struct kvp_store *inner, *faulty;
static char *mem;

static void setup(void)
{
	void *p;

	ck_assert_int_eq(kvp_store_file_temp("/var/tmp", 4 * MIB, &inner), 0);
	ck_assert_int_eq(kvp_store_faulty_create(inner, &faulty), 0);
	ck_assert_int_eq(posix_memalign(&p, 4096, 4 * MIB), 0);
	mem = p;
	kvp_test_fill(mem, 4 * MIB, 1, 0);
	ck_assert_int_eq(kvp_store_pwrite(inner, mem, 4 * MIB, 0), 0);
}

static void teardown(void)
{
	kvp_store_destroy(faulty);
	kvp_store_destroy(inner);
	free(mem);
}

/* Submit one I/O and wait for it; returns its result. */
static int64_t queue_one(struct kvp_store_queue *q, enum kvp_io_op op,
			 void *buf, size_t len, uint64_t off)
{
	struct kvp_io io = { .op = op, .buf = buf, .len = len, .off = off },
		      *p = &io, *done = NULL;

	ck_assert_int_eq(faulty->ops->submit(q, &p, 1), 1);
	ck_assert_int_eq(faulty->ops->reap(q, &done, 1, true), 1);
	ck_assert_ptr_eq(done, &io);
	return io.result;
}

START_TEST(test_passthrough)
{
	char *r = mem + 2 * MIB;

	ck_assert_str_eq(faulty->ops->kind, "faulty");
	ck_assert_uint_eq(faulty->size, inner->size);
	ck_assert_uint_eq(faulty->offset_align, inner->offset_align);
	ck_assert_ptr_nonnull(strstr(faulty->desc, "faulty over file"));
	memset(r, 0, BS);
	ck_assert_int_eq(kvp_store_pread(faulty, r, BS, BS), 0);
	ck_assert_int_eq(memcmp(r, mem + BS, BS), 0);
	kvp_test_fill(r, BS, 9, 0);
	ck_assert_int_eq(kvp_store_pwrite(faulty, r, BS, 3 * MIB), 0);
	memset(r, 0, BS);
	ck_assert_int_eq(kvp_store_pread(inner, r, BS, 3 * MIB), 0);
	ck_assert_int_eq(kvp_test_check(r, BS, 9, 0), -1);
	ck_assert_int_eq(kvp_store_pread(faulty, r, BS, 4 * MIB), -EINVAL);
}
END_TEST

START_TEST(test_read_errors_sync)
{
	struct kvp_fault_plan p = { .read_fail_off = 1 * MIB + 4096,
				    .read_fail_len = 4096,
				    .read_errno = EIO };
	char *r = mem + 2 * MIB;

	ck_assert_int_eq(kvp_store_faulty_set(faulty, &p), 0);
	/* The block holding the range fails ... */
	ck_assert_int_eq(kvp_store_pread(faulty, r, BS, 1 * MIB), -EIO);
	/* ... its neighbours do not, nor do writes over it. */
	ck_assert_int_eq(kvp_store_pread(faulty, r, BS, 1 * MIB - BS), 0);
	ck_assert_int_eq(memcmp(r, mem + 1 * MIB - BS, BS), 0);
	ck_assert_int_eq(kvp_store_pread(faulty, r, BS, 1 * MIB + BS), 0);
	ck_assert_int_eq(kvp_store_pwrite(faulty, mem, BS, 1 * MIB), 0);
	p.read_errno = ENODATA;
	ck_assert_int_eq(kvp_store_faulty_set(faulty, &p), 0);
	ck_assert_int_eq(kvp_store_pread(faulty, r, 4096, 1 * MIB + 4096),
			 -ENODATA);
	/* Short reads are -EIO on the synchronous path. */
	p.read_errno = 0;
	ck_assert_int_eq(kvp_store_faulty_set(faulty, &p), 0);
	ck_assert_int_eq(kvp_store_pread(faulty, r, BS, 1 * MIB), -EIO);
	/* An empty plan heals it. */
	memset(&p, 0, sizeof(p));
	ck_assert_int_eq(kvp_store_faulty_set(faulty, &p), 0);
	ck_assert_int_eq(kvp_store_pread(faulty, r, BS, 1 * MIB), 0);
}
END_TEST

START_TEST(test_read_errors_queue)
{
	struct kvp_fault_plan p = { .read_fail_off = 2 * BS + 8192,
				    .read_fail_len = 1,
				    .read_errno = EIO };
	struct kvp_store_queue *q;
	struct kvp_io ios[4], *ptrs[4], *done[4];
	char *r = mem + 2 * MIB;
	struct pollfd pfd;
	int i, got = 0;

	ck_assert_int_eq(kvp_store_faulty_set(faulty, &p), 0);
	ck_assert_int_eq(faulty->ops->queue_create(faulty, 8, &q), 0);
	pfd =
	    (struct pollfd){ .fd = faulty->ops->queue_fd(q), .events = POLLIN };
	ck_assert_int_ge(pfd.fd, 0);
	for (i = 0; i < 4; i++) {
		ios[i] = (struct kvp_io){ .op = KVP_IO_READ,
					  .buf = r + i * BS,
					  .len = BS,
					  .off = (uint64_t)i * BS,
					  .result = 12345 };
		ptrs[i] = &ios[i];
	}
	ck_assert_int_eq(faulty->ops->submit(q, ptrs, 4), 4);
	while (got < 4) {
		int k;

		ck_assert_int_eq(poll(&pfd, 1, 5000), 1);
		k = faulty->ops->reap(q, done + got, 4 - got, false);
		ck_assert_int_ge(k, 0);
		got += k;
	}
	ck_assert_int_eq(poll(&pfd, 1, 0), 0);
	for (i = 0; i < 4; i++) {
		if (i == 2) {
			ck_assert_int_eq(ios[i].result, -EIO);
		} else {
			ck_assert_int_eq(ios[i].result, BS);
			ck_assert_int_eq(memcmp(r + i * BS, mem + i * BS, BS),
					 0);
		}
	}
	/* Short: the aligned part before the range. */
	p.read_errno = 0;
	ck_assert_int_eq(kvp_store_faulty_set(faulty, &p), 0);
	ck_assert_int_eq(queue_one(q, KVP_IO_READ, r, BS, 2 * BS), 8192);
	ck_assert_int_eq(queue_one(q, KVP_IO_READ, r, 4096, 2 * BS + 8192), 0);
	faulty->ops->queue_destroy(q);
}
END_TEST

START_TEST(test_write_enospc)
{
	struct kvp_fault_plan p = { .write_errno = ENOSPC,
				    .write_fail_after = 3 * BS };
	struct kvp_store_queue *q;

	ck_assert_int_eq(kvp_store_faulty_set(faulty, &p), 0);
	ck_assert_int_eq(kvp_store_pwrite(faulty, mem, 2 * BS, 0), 0);
	ck_assert_int_eq(kvp_store_pwrite(faulty, mem, 2 * BS, 0), -ENOSPC);
	ck_assert_int_eq(kvp_store_pwrite(faulty, mem, BS, 0), 0);
	ck_assert_int_eq(kvp_store_pwrite(faulty, mem, 4096, 0), -ENOSPC);
	/* Reads are not affected. */
	ck_assert_int_eq(kvp_store_pread(faulty, mem + 2 * MIB, BS, 0), 0);
	/* Setting the plan restarts the count; the queue path too. */
	ck_assert_int_eq(kvp_store_faulty_set(faulty, &p), 0);
	ck_assert_int_eq(faulty->ops->queue_create(faulty, 4, &q), 0);
	ck_assert_int_eq(queue_one(q, KVP_IO_WRITE, mem, 3 * BS, 0), 3 * BS);
	ck_assert_int_eq(queue_one(q, KVP_IO_WRITE, mem, 4096, 0), -ENOSPC);
	faulty->ops->queue_destroy(q);
}
END_TEST

START_TEST(test_delay)
{
	struct kvp_fault_plan p = { .delay_us = 50000 };
	struct kvp_store_queue *q;
	struct kvp_io ios[3], *ptrs[3], *done[3];
	struct pollfd pfd;
	uint64_t t0;
	int i, got = 0;

	ck_assert_int_eq(kvp_store_faulty_set(faulty, &p), 0);
	t0 = kvp_test_now_ns();
	ck_assert_int_eq(kvp_store_pread(faulty, mem + 2 * MIB, BS, 0), 0);
	ck_assert_uint_ge(kvp_test_now_ns() - t0, 50000000u);

	ck_assert_int_eq(faulty->ops->queue_create(faulty, 4, &q), 0);
	pfd =
	    (struct pollfd){ .fd = faulty->ops->queue_fd(q), .events = POLLIN };
	/* Two forwarded reads and one injected failure, all delayed. */
	p.read_fail_off = 2 * BS;
	p.read_fail_len = BS;
	p.read_errno = EIO;
	ck_assert_int_eq(kvp_store_faulty_set(faulty, &p), 0);
	for (i = 0; i < 3; i++) {
		ios[i] = (struct kvp_io){ .op = KVP_IO_READ,
					  .buf = mem + 2 * MIB + i * BS,
					  .len = BS,
					  .off = (uint64_t)i * BS };
		ptrs[i] = &ios[i];
	}
	t0 = kvp_test_now_ns();
	ck_assert_int_eq(faulty->ops->submit(q, ptrs, 3), 3);
	ck_assert_int_eq(faulty->ops->reap(q, done, 3, false), 0);
	/* The poller is woken when they fall due, not before. */
	while (got < 3) {
		ck_assert_int_eq(poll(&pfd, 1, 5000), 1);
		got += faulty->ops->reap(q, done + got, 3 - got, false);
	}
	ck_assert_uint_ge(kvp_test_now_ns() - t0, 50000000u);
	ck_assert_int_eq(ios[0].result, BS);
	ck_assert_int_eq(ios[1].result, BS);
	ck_assert_int_eq(ios[2].result, -EIO);
	/* A waiting reap waits for the delay too. */
	t0 = kvp_test_now_ns();
	ck_assert_int_eq(faulty->ops->submit(q, ptrs, 1), 1);
	ck_assert_int_eq(faulty->ops->reap(q, done, 1, true), 1);
	ck_assert_uint_ge(kvp_test_now_ns() - t0, 50000000u);
	/* Destroyed with delayed I/O in flight: waits, then frees. */
	ck_assert_int_eq(faulty->ops->submit(q, ptrs, 3), 3);
	faulty->ops->queue_destroy(q);
}
END_TEST

START_TEST(test_bad_input)
{
	struct kvp_fault_plan p = { 0 };
	struct kvp_store *s;

	ck_assert_int_eq(kvp_store_faulty_create(NULL, &s), -EINVAL);
	ck_assert_int_eq(kvp_store_faulty_create(inner, NULL), -EINVAL);
	ck_assert_int_eq(kvp_store_faulty_set(inner, &p), -EINVAL);
	ck_assert_int_eq(kvp_store_faulty_set(faulty, NULL), -EINVAL);
	p.read_errno = -5;
	ck_assert_int_eq(kvp_store_faulty_set(faulty, &p), -EINVAL);
	/* Stacked: a faulty store over a faulty store. */
	ck_assert_int_eq(kvp_store_faulty_create(faulty, &s), 0);
	ck_assert_int_eq(kvp_store_pread(s, mem + 2 * MIB, BS, 0), 0);
	kvp_store_destroy(s);
}
END_TEST

/* Over the memory store (whose queue completes at submit) as well. */
START_TEST(test_over_memory)
{
	struct kvp_fault_plan p = { .read_fail_off = BS,
				    .read_fail_len = BS,
				    .read_errno = EIO,
				    .delay_us = 20000 };
	struct kvp_store *m, *f;
	struct kvp_store_queue *q;
	struct kvp_io io = { .op = KVP_IO_READ,
			     .buf = mem,
			     .len = BS,
			     .off = BS },
		      *ptr = &io, *done;
	uint64_t t0;

	ck_assert_int_eq(kvp_store_memory_create(1 * MIB, &m), 0);
	ck_assert_int_eq(kvp_store_faulty_create(m, &f), 0);
	ck_assert_int_eq(kvp_store_faulty_set(f, &p), 0);
	ck_assert_int_eq(kvp_store_pwrite(f, mem + BS, BS, 0), 0);
	ck_assert_int_eq(kvp_store_pread(f, mem, BS, BS), -EIO);
	ck_assert_int_eq(f->ops->queue_create(f, 2, &q), 0);
	t0 = kvp_test_now_ns();
	ck_assert_int_eq(f->ops->submit(q, &ptr, 1), 1);
	ck_assert_int_eq(f->ops->reap(q, &done, 1, true), 1);
	ck_assert_int_eq(io.result, -EIO);
	io.off = 0;
	ck_assert_int_eq(f->ops->submit(q, &ptr, 1), 1);
	ck_assert_int_eq(f->ops->reap(q, &done, 1, true), 1);
	ck_assert_int_eq(io.result, BS);
	ck_assert_uint_ge(kvp_test_now_ns() - t0, 40000000u);
	ck_assert_int_eq(memcmp(mem, mem + BS, BS), 0);
	f->ops->queue_destroy(q);
	kvp_store_destroy(f);
	kvp_store_destroy(m);
}
END_TEST

/*
 * queue_buffer reaches the inner store's queue: reads into the registered
 * buffer move the right bytes, and the faults still apply; over a store
 * without it, -EOPNOTSUPP.
 */
START_TEST(test_fixed_buffer)
{
	struct kvp_fault_plan p = { .read_fail_off = BS,
				    .read_fail_len = 1,
				    .read_errno = EIO };
	struct kvp_store *m, *f;
	struct kvp_store_queue *q;
	char *r = mem + 2 * MIB;
	int err;

	ck_assert_int_eq(faulty->ops->queue_create(faulty, 4, &q), 0);
	err = faulty->ops->queue_buffer(q, r, 2 * MIB);
	if (err) /* locked memory (RLIMIT_MEMLOCK): the I/O runs unregistered */
		ck_assert_msg(err == -ENOMEM || err == -EPERM,
			      "queue_buffer: %d", err);
	memset(r, 0, 2 * BS);
	ck_assert_int_eq(queue_one(q, KVP_IO_READ, r, BS, 0), BS);
	ck_assert_int_eq(memcmp(r, mem, BS), 0);
	ck_assert_int_eq(kvp_store_faulty_set(faulty, &p), 0);
	ck_assert_int_eq(queue_one(q, KVP_IO_READ, r + BS, BS, BS), -EIO);
	faulty->ops->queue_destroy(q);

	ck_assert_int_eq(kvp_store_memory_create(1 * MIB, &m), 0);
	ck_assert_int_eq(kvp_store_faulty_create(m, &f), 0);
	ck_assert_int_eq(f->ops->queue_create(f, 2, &q), 0);
	ck_assert_int_eq(f->ops->queue_buffer(q, r, BS), -EOPNOTSUPP);
	f->ops->queue_destroy(q);
	kvp_store_destroy(f);
	kvp_store_destroy(m);
}
END_TEST

/* Every descriptor a queue opens is the engine's: a program's close-all
 * under the preload shim skips it (the faulty store's timerfd and epoll
 * descriptor were not noted, so such a close-all took them). */
START_TEST(test_queue_fds_are_the_engines)
{
	struct kvp_store_queue *q = NULL;
	bool before[1024] = { false };
	unsigned fresh = 0;

	for (int fd = 0; fd < 1024; fd++)
		before[fd] = fcntl(fd, F_GETFD) >= 0;
	ck_assert_int_eq(faulty->ops->queue_create(faulty, 4, &q), 0);
	for (int fd = 0; fd < 1024; fd++) {
		if (before[fd] || fcntl(fd, F_GETFD) < 0)
			continue;
		fresh++;
		ck_assert_msg(kvp_fd_owned(fd), "fd %d of the queue is not the "
						"engine's", fd);
	}
	ck_assert_uint_ge(fresh, 3); /* the ring's, the eventfd, the timer */
	faulty->ops->queue_destroy(q);
}
END_TEST

static Suite *faulty_suite(void)
{
	Suite *s = suite_create("store_faulty");
	TCase *tc = kvp_test_tcase(s, "core", 30);

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_passthrough);
	tcase_add_test(tc, test_read_errors_sync);
	tcase_add_test(tc, test_read_errors_queue);
	tcase_add_test(tc, test_write_enospc);
	tcase_add_test(tc, test_delay);
	tcase_add_test(tc, test_bad_input);
	tcase_add_test(tc, test_over_memory);
	tcase_add_test(tc, test_fixed_buffer);
	tcase_add_test(tc, test_queue_fds_are_the_engines);
	return s;
}

int main(void)
{
	const char *why = kvp_test_missing_uring();

	if (why)
		return kvp_test_skip("%s", why);
	return kvp_test_run(faulty_suite());
}
