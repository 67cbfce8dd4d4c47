/* run.c - the Check runner and the skips of every suite's main(). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <liburing.h>

#include "tests/helpers/helpers.h"

int kvp_test_run(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}

TCase *kvp_test_tcase(Suite *s, const char *name, int timeout_s)
{
	TCase *tc = tcase_create(name);

	tcase_set_timeout(tc, timeout_s);
	suite_add_tcase(s, tc);
	return tc;
}

int kvp_test_skip(const char *fmt, ...)
{
	va_list ap;

	fputs("skipped: ", stdout);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	return 77;
}

const char *kvp_test_missing_uring(void)
{
	static char why[160];
	struct io_uring ring;
	int err = io_uring_queue_init(2, &ring, 0);

	if (!err) {
		io_uring_queue_exit(&ring);
		return NULL;
	}
	snprintf(why, sizeof(why),
		 "io_uring unavailable: %s (check "
		 "/proc/sys/kernel/io_uring_disabled)",
		 strerror(-err));
	return why;
}
