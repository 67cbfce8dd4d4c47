/*
 * test_fdset.c - kmod-helpers/fdset.c: the engine's descriptors.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kmod-helpers/fdset.h"
#include "tests/helpers/helpers.h"

/* A program that raised RLIMIT_NOFILE and opened 65536 files before the
 * engine's first: its descriptors land above the first range.  (Numbers
 * only: the set does not look at the descriptors.) */
START_TEST(test_any_number)
{
	static const int high[] = { 65535, 65536, 70000, 131072, 1 << 20,
				    (1 << 24) + 5 };

	for (unsigned i = 0; i < sizeof(high) / sizeof(high[0]); i++) {
		ck_assert_int_eq(kvp_fd_note(high[i]), 0);
		ck_assert(kvp_fd_owned(high[i]));
		ck_assert(!kvp_fd_owned(high[i] + 1));
	}
	ck_assert_int_eq(kvp_fd_next_owned(65536), 65536);
	ck_assert_int_eq(kvp_fd_next_owned(65537), 70000);
	ck_assert_int_eq(kvp_fd_next_owned(70001), 131072);
	ck_assert_int_eq(kvp_fd_next_owned(131073), 1 << 20);
	ck_assert_int_eq(kvp_fd_next_owned((1 << 20) + 1), (1 << 24) + 5);
	ck_assert_int_eq(kvp_fd_next_owned((1 << 24) + 6), -1);
	ck_assert_int_eq(kvp_fd_next_owned(~0u), -1);
	kvp_fd_disown(70000);
	ck_assert(!kvp_fd_owned(70000));
	ck_assert_int_eq(kvp_fd_next_owned(65537), 131072);
}
END_TEST

START_TEST(test_next_owned)
{
	ck_assert_int_eq(kvp_fd_next_owned(0), -1);
	ck_assert_int_eq(kvp_fd_note(5), 0);
	ck_assert_int_eq(kvp_fd_note(63), 0);
	ck_assert_int_eq(kvp_fd_note(64), 0);
	ck_assert_int_eq(kvp_fd_note(200), 0);
	ck_assert_int_eq(kvp_fd_next_owned(0), 5);
	ck_assert_int_eq(kvp_fd_next_owned(5), 5);
	ck_assert_int_eq(kvp_fd_next_owned(6), 63);
	ck_assert_int_eq(kvp_fd_next_owned(64), 64);
	ck_assert_int_eq(kvp_fd_next_owned(65), 200);
	ck_assert_int_eq(kvp_fd_next_owned(201), -1);
	ck_assert(!kvp_fd_owned(-1));
	ck_assert_int_eq(kvp_fd_note(-1), -EBADF);
	kvp_fd_disown(-1);
	kvp_fd_disown(1 << 25); /* above every range: nothing to clear */
}
END_TEST

/* What the engine keeps: noted, closed (and forgotten) on its close. */
START_TEST(test_own_close)
{
	int fd = eventfd(0, EFD_CLOEXEC), kept;

	ck_assert_int_ge(fd, 0);
	kept = kvp_fd_own(fd);
	ck_assert_int_ge(kept, 3);
	ck_assert(kvp_fd_owned(kept));
	ck_assert_int_eq(kvp_fd_close(kept), 0);
	ck_assert(!kvp_fd_owned(kept));
	ck_assert_int_eq(fcntl(kept, F_GETFD), -1);
	ck_assert_int_eq(kvp_fd_own(-ENOENT), -ENOENT);
}
END_TEST

/* A program started with 0, 1 and 2 closed: the engine's descriptor is
 * moved above them, which the program's next opens get. */
START_TEST(test_own_moves_above_std)
{
	int fd, kept;

	ck_assert_int_eq(close(STDIN_FILENO), 0);
	fd = eventfd(0, EFD_CLOEXEC);
	ck_assert_int_eq(fd, STDIN_FILENO);
	kept = kvp_fd_own(fd);
	ck_assert_int_ge(kept, 3);
	ck_assert(kvp_fd_owned(kept));
	ck_assert(!kvp_fd_owned(STDIN_FILENO));
	ck_assert_int_eq(fcntl(kept, F_GETFD), FD_CLOEXEC);
	ck_assert_int_eq(open("/dev/null", O_RDONLY), STDIN_FILENO);
}
END_TEST

/* No number above 2 to move to: an error, and nothing left open. */
START_TEST(test_own_no_room)
{
	struct rlimit three = { 3, 3 };
	int fd;

	ck_assert_int_eq(close(STDIN_FILENO), 0);
	for (int i = 3; i < 1024; i++)
		close(i); /* Check's own files included: this child reports
			   * by its exit status */
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &three), 0);
	fd = eventfd(0, EFD_CLOEXEC);
	if (fd != STDIN_FILENO)
		_exit(2);
	if (kvp_fd_own(fd) != -EMFILE || fcntl(fd, F_GETFD) != -1 ||
	    kvp_fd_owned(fd))
		_exit(3);
	_exit(0);
}
END_TEST

/* 0 and 2 closed: taken while held, so that a new descriptor is 3 and up,
 * and closed again on release; 1, open, is left alone. */
START_TEST(test_hold_std)
{
	int saved0 = fcntl(0, F_DUPFD_CLOEXEC, 3);
	int saved2 = fcntl(2, F_DUPFD_CLOEXEC, 3);
	unsigned held;
	int fd;

	ck_assert_int_ge(saved0, 3);
	ck_assert_int_ge(saved2, 3);
	close(0);
	close(2);
	held = kvp_fd_hold_std();
	fd = eventfd(0, EFD_CLOEXEC);
	kvp_fd_release_std(held);
	ck_assert_uint_eq(held, 1u << 0 | 1u << 2);
	ck_assert_int_ge(fd, 3);
	ck_assert_int_eq(fcntl(0, F_GETFD), -1);
	ck_assert_int_ge(fcntl(1, F_GETFD), 0);
	ck_assert_int_eq(fcntl(2, F_GETFD), -1);
	ck_assert_int_eq(dup2(saved0, 0), 0);
	ck_assert_int_eq(dup2(saved2, 2), 2);
	close(saved0);
	close(saved2);
	close(fd);
	ck_assert_uint_eq(kvp_fd_hold_std(), 0);
}
END_TEST

static Suite *fdset_suite(void)
{
	Suite *s = suite_create("fdset");
	TCase *tc = kvp_test_tcase(s, "core", 20);

	tcase_add_test(tc, test_any_number);
	tcase_add_test(tc, test_next_owned);
	tcase_add_test(tc, test_own_close);
	tcase_add_test(tc, test_hold_std);
	tcase_add_test(tc, test_own_moves_above_std);
	tcase_add_exit_test(tc, test_own_no_room, 0);
	return s;
}

int main(void)
{
	return kvp_test_run(fdset_suite());
}
