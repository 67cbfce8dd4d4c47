/*
 * test_uring.c - kmod-helpers/uring.c: ring set-up and opcode probing.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kmod-helpers/uring.h"
#include "tests/helpers/helpers.h"

static void nop_round_trip(struct io_uring *ring, unsigned n)
{
	struct io_uring_cqe *cqe;
	unsigned i;

	for (i = 0; i < n; i++) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

		ck_assert_ptr_nonnull(sqe);
		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data64(sqe, 100 + i);
	}
	ck_assert_int_eq(io_uring_submit(ring), (int)n);
	for (i = 0; i < n; i++) {
		ck_assert_int_eq(io_uring_wait_cqe(ring, &cqe), 0);
		ck_assert_int_eq(cqe->res, 0);
		ck_assert_uint_ge(cqe->user_data, 100);
		ck_assert_uint_lt(cqe->user_data, 100 + n);
		io_uring_cqe_seen(ring, cqe);
	}
}

START_TEST(test_init_plain)
{
	struct io_uring ring;

	ck_assert_int_eq(kvp_uring_init(&ring, 8, 0), 0);
	ck_assert_uint_ge(ring.sq.ring_entries, 8);
	nop_round_trip(&ring, 8);
	kvp_uring_exit(&ring);
}
END_TEST

START_TEST(test_init_single_issuer)
{
	struct io_uring ring;

	ck_assert_int_eq(kvp_uring_init(&ring, 4, KVP_URING_SINGLE_ISSUER), 0);
	nop_round_trip(&ring, 4);
	kvp_uring_exit(&ring);
}
END_TEST

START_TEST(test_init_rounds_up)
{
	struct io_uring ring;

	ck_assert_int_eq(kvp_uring_init(&ring, 5, 0), 0);
	ck_assert_uint_ge(ring.sq.ring_entries, 5);
	nop_round_trip(&ring, 5);
	kvp_uring_exit(&ring);
}
END_TEST

START_TEST(test_init_bad)
{
	struct io_uring ring;

	ck_assert_int_eq(kvp_uring_init(&ring, 0, 0), -EINVAL);
	ck_assert_int_eq(kvp_uring_init(NULL, 8, 0), -EINVAL);
	/* Beyond IORING_MAX_ENTRIES without CLAMP. */
	ck_assert_int_lt(kvp_uring_init(&ring, 1u << 30, 0), 0);
}
END_TEST

START_TEST(test_read_through_ring)
{
	char path[] = "/var/tmp/kvp-test-uring-XXXXXX";
	char buf[64] = { 0 };
	struct io_uring ring;
	struct io_uring_cqe *cqe;
	struct io_uring_sqe *sqe;
	int fd;

	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	unlink(path);
	ck_assert_int_eq(pwrite(fd, "hello, ring", 11, 5), 11);
	ck_assert_int_eq(kvp_uring_init(&ring, 2, 0), 0);
	sqe = io_uring_get_sqe(&ring);
	io_uring_prep_read(sqe, fd, buf, sizeof(buf), 5);
	ck_assert_int_eq(io_uring_submit(&ring), 1);
	ck_assert_int_eq(io_uring_wait_cqe(&ring, &cqe), 0);
	ck_assert_int_eq(cqe->res, 11);
	io_uring_cqe_seen(&ring, cqe);
	ck_assert_str_eq(buf, "hello, ring");
	kvp_uring_exit(&ring);
	close(fd);
}
END_TEST

START_TEST(test_supports)
{
	ck_assert(kvp_uring_supports(IORING_OP_NOP));
	ck_assert(kvp_uring_supports(IORING_OP_READ));
	ck_assert(kvp_uring_supports(IORING_OP_WRITE));
	ck_assert(kvp_uring_supports(IORING_OP_FALLOCATE));
	ck_assert(!kvp_uring_supports(-1));
	ck_assert(!kvp_uring_supports(100000));
}
END_TEST

static Suite *uring_suite(void)
{
	Suite *s = suite_create("uring");
	TCase *tc = kvp_test_tcase(s, "core", 20);

	tcase_add_test(tc, test_init_plain);
	tcase_add_test(tc, test_init_single_issuer);
	tcase_add_test(tc, test_init_rounds_up);
	tcase_add_test(tc, test_init_bad);
	tcase_add_test(tc, test_read_through_ring);
	tcase_add_test(tc, test_supports);
	return s;
}

int main(void)
{
	const char *why = kvp_test_missing_uring();

	if (why)
		return kvp_test_skip("%s", why);
	return kvp_test_run(uring_suite());
}
