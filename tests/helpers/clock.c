/* clock.c - the one clock of the tests. */
#include <time.h>

#include "tests/helpers/helpers.h"

uint64_t kvp_test_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
