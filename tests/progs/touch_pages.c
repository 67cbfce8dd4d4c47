/*
 * touch_pages - touch 4 KiB pages of a large buffer, knowing nothing of
 * kvpager.
 *
 * Built without kvpager (plain libc) and run by `kvpbench touch` in two
 * ways: under LD_PRELOAD of the shim with a malloc'd buffer (mode
 * "preload"), and on a file mapped MAP_SHARED inside a memory cgroup (mode
 * "mmap": the kernel's page cache under the same budget).  Usage:
 *
 *   touch_pages SIZE TOUCHES THREADS random|sequential ro|rw [FILE]
 *
 * Without FILE, malloc(SIZE) and fill it with the pattern (not timed);
 * with FILE, mmap its first SIZE bytes, which hold the pattern already.
 * Then THREADS threads make TOUCHES touches in all (an equal share each):
 * random: page touch_page(t, i) of the whole buffer; sequential: thread t
 * scans its own 1/THREADS of the buffer page by page from its start.  A
 * touch reads the first word of the page and checks it (rw: writes it
 * back, which dirties the page and changes nothing; with FILE, the
 * touches end with msync, so that their writes are in it).  One line on
 * stdout:
 *
 *   touch seconds=S touches=N cpu_s=C read_bytes=R write_bytes=W bad=B
 *
 * cpu_s is the process's CPU (every thread's, a preloaded pager's too)
 * and read_bytes/write_bytes its /proc/self/io counters, over the touches
 * only.  Exit 0 when every word was right, 1 when not, 2 on bad usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096ull
#define MAX_THREADS 64

/* The word at byte @off: the same as kvpbench's backing file holds. */
static uint64_t pattern(uint64_t off)
{
	uint64_t z = (off >> 3) + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Thread @t's @i-th random page of @pages: kvpbench draws the same. */
static uint64_t touch_page(unsigned t, uint64_t i, uint64_t pages)
{
	return pattern(((uint64_t)(t + 1) << 43) | (i << 3)) % pages;
}

static uint8_t *buf;
static uint64_t pages, per_thread;
static _Atomic uint64_t touched;   /* touches done, all threads */
static _Atomic unsigned finished; /* threads done */
static unsigned nthreads;
static int random_order, writes;

struct worker {
	unsigned t;
	uint64_t bad;
	double end; /* when its last touch was done */
};

static double now(void);

static void *worker(void *arg)
{
	struct worker *w = arg;
	uint64_t slice = pages / nthreads, i, p;

	for (i = 0; i < per_thread; i++) {
		volatile uint64_t *word;
		uint64_t v;

		p = random_order ? touch_page(w->t, i, pages)
				 : w->t * slice + i % slice;
		word = (volatile uint64_t *)(buf + p * PAGE);
		v = *word;
		w->bad += v != pattern(p * PAGE);
		if (writes)
			*word = v;
		if ((i & 255) == 255)
			atomic_fetch_add_explicit(&touched, 256,
						  memory_order_relaxed);
	}
	w->end = now();
	atomic_fetch_add(&finished, 1);
	return NULL;
}

/* With TOUCH_PAGES_PROGRESS set (kvpbench does), a "progress DONE TOTAL"
 * line on stdout every second until the threads end, before the result
 * line: the parent draws its bar from them. */
static void report_progress(void)
{
	struct timespec tick = { 0, 100000000 };
	unsigned ticks = 0;

	if (!getenv("TOUCH_PAGES_PROGRESS"))
		return;
	while (atomic_load(&finished) < nthreads) {
		nanosleep(&tick, NULL);
		if (++ticks % 10)
			continue;
		printf("progress %llu %llu\n",
		       (unsigned long long)atomic_load_explicit(
			   &touched, memory_order_relaxed),
		       (unsigned long long)(per_thread * nthreads));
		fflush(stdout);
	}
}

static int io_counts(uint64_t *rd, uint64_t *wr)
{
	char line[128];
	FILE *f = fopen("/proc/self/io", "r");
	unsigned long long v;
	int n = 0;

	*rd = *wr = 0;
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "read_bytes: %llu", &v) == 1)
			*rd = v, n++;
		else if (sscanf(line, "write_bytes: %llu", &v) == 1)
			*wr = v, n++;
	}
	fclose(f);
	return n == 2 ? 0 : -1;
}

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t size_arg(const char *s)
{
	char *end;
	uint64_t v = strtoull(s, &end, 10);

	switch (*end) {
	case 'G': v <<= 10; /* fall through */
	case 'M': v <<= 10; /* fall through */
	case 'K': v <<= 10; end++; break;
	}
	return *end ? 0 : v;
}

int main(int argc, char **argv)
{
	struct worker w[MAX_THREADS];
	pthread_t tid[MAX_THREADS];
	uint64_t size, touches, rd0, wr0, rd1, wr1, bad = 0, i;
	double t0, t1, c0, c1;
	unsigned t;
	int fd;

	if (argc < 6 || argc > 7)
		goto usage;
	size = size_arg(argv[1]);
	touches = strtoull(argv[2], NULL, 10);
	nthreads = (unsigned)strtoul(argv[3], NULL, 10);
	random_order = !strcmp(argv[4], "random");
	writes = !strcmp(argv[5], "rw");
	pages = size / PAGE;
	if (!pages || !touches || !nthreads || nthreads > MAX_THREADS ||
	    pages < nthreads ||
	    (!random_order && strcmp(argv[4], "sequential")) ||
	    (!writes && strcmp(argv[5], "ro")))
		goto usage;
	per_thread = touches / nthreads;
	if (!per_thread)
		per_thread = 1;

	if (argc == 7) {
		fd = open(argv[6], O_RDWR);
		if (fd < 0) {
			fprintf(stderr, "touch_pages: %s: %s\n", argv[6],
				strerror(errno));
			return 1;
		}
		buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			   0);
		close(fd);
		if (buf == MAP_FAILED) {
			fprintf(stderr, "touch_pages: mmap %s: %s\n", argv[6],
				strerror(errno));
			return 1;
		}
	} else {
		buf = malloc(size);
		if (!buf) {
			fprintf(stderr, "touch_pages: malloc(%llu) failed\n",
				(unsigned long long)size);
			return 1;
		}
		for (i = 0; i < size / 8; i++)
			((uint64_t *)buf)[i] = pattern(i * 8);
	}

	if (io_counts(&rd0, &wr0))
		fprintf(stderr, "touch_pages: no /proc/self/io\n");
	c0 = cpu_s();
	t0 = now();
	for (t = 0; t < nthreads; t++) {
		w[t] = (struct worker){ .t = t };
		if (pthread_create(&tid[t], NULL, worker, &w[t])) {
			fprintf(stderr, "touch_pages: cannot start a thread\n");
			return 1;
		}
	}
	report_progress();
	/* The touches end with the last thread's, not when the progress
	 * loop (100 ms ticks) saw them end. */
	t1 = t0;
	for (t = 0; t < nthreads; t++) {
		pthread_join(tid[t], NULL);
		bad += w[t].bad;
		t1 = w[t].end > t1 ? w[t].end : t1;
	}
	/* A file's writes count once they are in it (kvpbench times the
	 * pager's last flush and raw's writes too). */
	if (argc == 7 && writes) {
		if (msync(buf, size, MS_SYNC)) {
			fprintf(stderr, "touch_pages: msync: %s\n",
				strerror(errno));
			return 1;
		}
		t1 = now();
	}
	c1 = cpu_s();
	io_counts(&rd1, &wr1);
	printf("touch seconds=%.6f touches=%llu cpu_s=%.6f read_bytes=%llu "
	       "write_bytes=%llu bad=%llu\n",
	       t1 - t0, (unsigned long long)(per_thread * nthreads), c1 - c0,
	       (unsigned long long)(rd1 - rd0),
	       (unsigned long long)(wr1 - wr0), (unsigned long long)bad);
	fflush(stdout);
	if (argc == 7)
		munmap(buf, size);
	else
		free(buf);
	return bad ? 1 : 0;
usage:
	fprintf(stderr, "usage: touch_pages SIZE TOUCHES THREADS "
			"random|sequential ro|rw [FILE]\n");
	return 2;
}
