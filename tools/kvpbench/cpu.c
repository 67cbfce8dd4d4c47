/*
 * cpu.c - where a run's CPU time goes.
 *
 * A mode's speed here is often bounded by CPU, not by the disk: a guest
 * pays a trap for every 4 KiB mapping first touched, every PTE written and
 * every page flushed, and a pager makes many of them per block.  So each
 * run records the CPU time this process spent (its reading threads and,
 * in kvpager modes, the pager's own: the threads named kvp-*) and how busy
 * the whole machine was, from /proc, between the start of the timed part
 * and its end.  A run whose machine is near 100% busy is CPU-bound; the
 * CPU per block says how much work a block costs each mode.
 */
#include "tools/kvpbench/kvpbench.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/*
 * CPU seconds of thread @tid of this process, to the nanosecond, or -1.
 * Its clock id is the kernel's encoding of a per-thread CPU clock
 * (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED), what pthread_getcpuclockid
 * returns); /proc's tick counts are too coarse for runs of 50 ms.
 */
static double task_cpu_s(const char *tid)
{
	clockid_t id = (clockid_t)((~(unsigned)atoi(tid) << 3) | 6);
	struct timespec ts;

	if (clock_gettime(id, &ts))
		return -1;
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Whether thread @tid is one of the pager's (kvp-svcN, kvp-zap). */
static bool pager_thread(const char *tid)
{
	char path[320], name[32] = "";
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%s/comm", tid);
	f = fopen(path, "re");
	if (!f)
		return false;
	if (!fgets(name, sizeof(name), f))
		name[0] = 0;
	fclose(f);
	return !strncmp(name, "kvp-", 4);
}

void kvpb_cpu_sample(struct kvpb_cpu *s)
{
	unsigned long long v[8] = { 0 };
	struct rusage ru;
	struct dirent *d;
	DIR *dir;
	FILE *f;

	*s = (struct kvpb_cpu){ .self_s = -1, .pager_s = -1 };
	if (getrusage(RUSAGE_SELF, &ru) == 0)
		s->self_s = (double)ru.ru_utime.tv_sec +
			    (double)ru.ru_utime.tv_usec / 1e6 +
			    (double)ru.ru_stime.tv_sec +
			    (double)ru.ru_stime.tv_usec / 1e6;
	dir = opendir("/proc/self/task");
	if (dir) {
		s->pager_s = 0;
		while ((d = readdir(dir)))
			if (d->d_name[0] != '.' && pager_thread(d->d_name)) {
				double t = task_cpu_s(d->d_name);

				if (t > 0)
					s->pager_s += t;
			}
		closedir(dir);
	}
	/* cpu  user nice system idle iowait irq softirq steal ... */
	f = fopen("/proc/stat", "re");
	if (f) {
		if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu",
			   &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
			   &v[7]) == 8) {
			for (int i = 0; i < 8; i++)
				s->total += v[i];
			s->busy = s->total - v[3] - v[4];
		}
		fclose(f);
	}
}

void kvpb_cpu_account(const struct kvpb_cpu *a, const struct kvpb_cpu *b,
		      struct kvpb_result *r)
{
	r->cpu_s = a->self_s >= 0 && b->self_s >= a->self_s
		       ? b->self_s - a->self_s
		       : -1;
	/* Pager threads live through the run: their times only grow. */
	r->cpu_pager_s = a->pager_s >= 0 && b->pager_s >= a->pager_s
			     ? b->pager_s - a->pager_s
			     : -1;
	r->machine_busy =
	    b->total > a->total
		? (double)(b->busy - a->busy) / (double)(b->total - a->total)
		: -1;
}
