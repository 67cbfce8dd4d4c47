/* threads.c - this process's threads: their count, their nice values. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "tests/helpers/helpers.h"

/* The tid of this process's thread named @name, or 0. */
static int find_thread(const char *name)
{
	char path[300], comm[32];
	size_t len = strlen(name);
	struct dirent *d;
	DIR *dir = opendir("/proc/self/task");
	int tid = 0;

	ck_assert_ptr_nonnull(dir);
	while (!tid && (d = readdir(dir))) {
		FILE *f;

		snprintf(path, sizeof(path), "/proc/self/task/%s/comm",
			 d->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f) && !strncmp(comm, name, len) &&
		    comm[len] == '\n')
			tid = atoi(d->d_name);
		fclose(f);
	}
	closedir(dir);
	return tid;
}

int kvp_test_thread_nice(const char *name)
{
	int i, tid;

	for (i = 0; i < 1000; i++) {
		tid = find_thread(name);
		if (tid)
			return getpriority(PRIO_PROCESS, (id_t)tid);
		usleep(10000);
	}
	return INT_MIN;
}

int kvp_test_boosted_nice(int levels)
{
	int base = getpriority(PRIO_PROCESS, 0), want = base - levels;

	if (want < -20)
		want = -20;
	/* Whether this process may lower a nice value: try it on a thread
	 * of its own, and put it back. */
	if (setpriority(PRIO_PROCESS, (id_t)gettid(), want))
		return base;
	ck_assert_int_eq(setpriority(PRIO_PROCESS, (id_t)gettid(), base), 0);
	return want;
}

int kvp_test_thread_count(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	int n = -1;

	ck_assert_ptr_nonnull(f);
	while (n < 0 && fgets(line, sizeof(line), f))
		if (sscanf(line, "Threads: %d", &n) != 1)
			n = -1;
	fclose(f);
	ck_assert_int_gt(n, 0);
	return n;
}
