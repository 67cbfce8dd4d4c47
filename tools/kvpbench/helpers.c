/*
 * helpers.c - what the scenarios and modes of kvpbench share: the clock,
 * progress, result slots, the pattern's fill and check, the worker
 * threads with their watchdog, option values.  It calls only cpu.c and
 * the library, so main.c, io.c, pager_modes.c, decode.c and compute.c
 * call down into it and never into each other's helpers.
 */
#include "tools/kvpbench/kvpbench.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lib/cli/progress.h"
#include "lib/tunables/tunables.h"

/* ---- the clock, progress, the page cache, the disk -------------------- */

double kvpb_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void kvpb_progress(const struct kvpb_ctx *c, const char *fmt, ...)
{
	va_list ap;

	if (c->opts.quiet)
		return;
	fputs("kvpbench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

void kvpb_drop_cache(const struct kvpb_file *f)
{
	posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
}

int64_t kvpb_disk_read_bytes(const struct kvpb_file *f)
{
	unsigned long long rd_ios, rd_merges, rd_sectors;
	FILE *fp;
	int n;

	if (!f->disk_stat[0])
		return -1;
	fp = fopen(f->disk_stat, "r");
	if (!fp)
		return -1;
	n = fscanf(fp, "%llu %llu %llu", &rd_ios, &rd_merges, &rd_sectors);
	fclose(fp);
	return n == 3 ? (int64_t)(rd_sectors * 512) : -1;
}

/* ---- child processes ---------------------------------------------------- */

pid_t kvpb_fork_pipe(int pfd[2])
{
	pid_t pid;
	int err;

	if (pipe2(pfd, O_CLOEXEC))
		return -errno;
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		err = -errno;
		close(pfd[0]);
		close(pfd[1]);
		return err;
	}
	return pid;
}

/* ---- competing load (--busy) ------------------------------------------- */

static void *spin(void *arg)
{
	volatile uint64_t x = (uintptr_t)arg;

	for (;;)
		x = x * 6364136223846793005ull + 1442695040888963407ull;
	return NULL;
}

int kvpb_busy_start(unsigned *n)
{
	cpu_set_t set;
	unsigned cpus = 1, i;
	pthread_t tid;
	pid_t pid;

	if (!sched_getaffinity(0, sizeof(set), &set))
		cpus = (unsigned)CPU_COUNT(&set);
	*n = cpus;
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid)
		return pid; /* the parent, or -1 */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() == 1)
		_exit(0); /* the parent is gone already */
	for (i = 1; i < cpus; i++)
		pthread_create(&tid, NULL, spin, (void *)(uintptr_t)i);
	spin(NULL);
	_exit(0);
}

void kvpb_busy_stop(int pid)
{
	if (pid <= 0)
		return;
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/* ---- results ---------------------------------------------------------- */

void kvpb_result_init(struct kvpb_result *r, const struct kvpb_job *j,
		      const char *mode)
{
	memset(r, 0, sizeof(*r));
	snprintf(r->scenario, sizeof(r->scenario), "%s", j->scenario);
	snprintf(r->mode, sizeof(r->mode), "%s", mode);
	r->block_bytes = j->block;
	r->threads = j->threads;
	r->depth = j->depth;
	r->group = j->group;
	r->ratio_vs_raw = r->ratio_vs_mmap = r->ratio_vs_raw_ref = -1;
	r->cpu_s = r->cpu_pager_s = r->machine_busy = -1;
	r->disk_bytes = -1;
	r->runs = 1;
}

struct kvpb_result *kvpb_result_new(struct kvpb_ctx *c,
				    const struct kvpb_job *j, const char *mode)
{
	struct kvpb_result *r;

	if (c->nresults == KVPB_MAX_RESULTS) {
		fprintf(stderr,
			"kvpbench: too many results (%d), %s %s "
			"skipped\n",
			KVPB_MAX_RESULTS, j->scenario, mode);
		return NULL;
	}
	r = &c->results[c->nresults++];
	kvpb_result_init(r, j, mode);
	return r;
}

int kvpb_cmp_gbps(const void *a, const void *b)
{
	const struct kvpb_result *x = a, *y = b;

	return (x->gb_per_s > y->gb_per_s) - (x->gb_per_s < y->gb_per_s);
}

/* ---- the pattern ------------------------------------------------------ */

static inline uint64_t load64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

uint64_t kvpb_consume(const void *p, uint64_t off, uint64_t len)
{
	const uint8_t *b = p;
	uint64_t sum = 0, want = 0, bad = 0, o, s;

	for (o = 0; o < len; o += KVPB_PAGE) {
		sum += load64(b + o);
		want += kvpb_pattern(off + o);
	}
	if (sum != want) {
		/* Rare: count the wrong pages one by one. */
		for (o = 0; o < len; o += KVPB_PAGE)
			bad += load64(b + o) != kvpb_pattern(off + o);
		bad += !bad;
	}
	s = len - 8;
	bad += load64(b + s) != kvpb_pattern(off + s);
	s = (kvpb_pattern(off ^ 0x5a5a5a5aull) % (len / 8)) * 8;
	bad += load64(b + s) != kvpb_pattern(off + s);
	return bad;
}

void kvpb_fill(void *buf, uint64_t off, uint64_t len)
{
	uint8_t *b = buf;
	uint64_t o, v;

	for (o = 0; o + 8 <= len; o += 8) {
		v = kvpb_pattern(off + o);
		memcpy(b + o, &v, sizeof(v));
	}
}

/* ---- worker threads --------------------------------------------------- */

uint64_t kvpb_job_off(const struct kvpb_job *j, unsigned t, uint64_t i)
{
	uint64_t b = j->order ? j->order[(uint64_t)t * j->reads + i] : i;

	return j->off + b * j->block;
}

/* The progress of a run: MiB, or KiB when it is small (touch). */
struct run_progress {
	struct kvp_progress pg;
	uint64_t total;	  /* bytes the job reads */
	unsigned shift;	  /* 20 or 10 */
	const char *unit; /* "MiB", "KiB" */
	char what[48];	  /* "stream raw": the phase, named in pg */
};

static void run_progress_start(struct run_progress *rp,
			       const struct kvpb_ctx *c,
			       const struct kvpb_job *j, const char *mode)
{
	rp->total = j->reads * j->block * j->threads;
	rp->shift = rp->total >= (64ull << 20) ? 20 : 10;
	rp->unit = rp->shift == 20 ? "MiB" : "KiB";
	snprintf(rp->what, sizeof(rp->what), "%s %s", j->scenario, mode);
	kvp_progress_start(&rp->pg, "kvpbench", rp->what, c->opts.quiet);
}

/* @bytes read so far; @end: the run is over (the bar gets its newline). */
static void run_progress_show(struct run_progress *rp, uint64_t bytes,
			      bool end)
{
	uint64_t done = bytes >> rp->shift, total = rp->total >> rp->shift;

	if (end || bytes < rp->total)
		kvp_progress_update(&rp->pg, done, total, rp->unit);
	if (end)
		kvp_progress_done(&rp->pg, done, total, rp->unit);
}

/* Bytes the workers of @j have consumed so far. */
static uint64_t workers_bytes(const struct kvpb_job *j,
			      struct kvpb_worker *w)
{
	uint64_t n = 0;
	unsigned t;

	for (t = 0; t < j->threads; t++)
		n += __atomic_load_n(&w[t].bytes, __ATOMIC_RELAXED);
	return n;
}

/*
 * Join @tid, watching that the workers move: a mode that makes no progress
 * for --timeout seconds (a fault never served) ends the program with the
 * place it is stuck at, rather than hanging `make bench`.  Meanwhile @rp
 * shows how far the run is.
 */
static void watch_join(struct kvpb_ctx *c, const struct kvpb_job *j,
		       const char *mode, struct kvpb_worker *w, pthread_t tid,
		       struct run_progress *rp)
{
	uint64_t last = ~0ull, now, total = rp->total;
	double since = kvpb_now();
	struct timespec ts;
	unsigned t;

	for (;;) {
		clock_gettime(CLOCK_REALTIME, &ts);
		/* a fifth of a second: the bar's pace, not the watchdog's */
		ts.tv_nsec += 200000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		if (pthread_timedjoin_np(tid, NULL, &ts) != ETIMEDOUT)
			return;
		now = workers_bytes(j, w);
		run_progress_show(rp, now, false);
		if (now != last) {
			last = now;
			since = kvpb_now();
			continue;
		}
		if (kvpb_now() - since < c->opts.timeout_s)
			continue;
		run_progress_show(rp, now, true);
		fprintf(stderr,
			"kvpbench: %s %s: no progress for %u s: stuck after "
			"%llu of %llu bytes\n",
			j->scenario, mode, c->opts.timeout_s,
			(unsigned long long)now, (unsigned long long)total);
		for (t = 0; t < j->threads; t++) {
			uint64_t at =
			    __atomic_load_n(&w[t].at, __ATOMIC_RELAXED);

			fprintf(stderr,
				"kvpbench:   thread %u at file offset %llu "
				"(block %llu of the region, %llu done)\n",
				t, (unsigned long long)at,
				(unsigned long long)((at - j->off) / j->block),
				(unsigned long long)__atomic_load_n(
				    &w[t].bytes, __ATOMIC_RELAXED));
		}
		exit(3); /* the backing file has no name to leave behind */
	}
}

int kvpb_run_threads(struct kvpb_ctx *c, const struct kvpb_job *j,
		     void *(*fn)(void *), uint8_t *base, void *arg,
		     struct kvpb_result *r)
{
	struct kvpb_worker w[KVPB_MAX_THREADS];
	pthread_t tid[KVPB_MAX_THREADS];
	pthread_barrier_t start;
	struct kvpb_cpu cpu0, cpu1;
	struct run_progress rp;
	unsigned t, n = j->threads;
	double t0, t1;
	int err = 0;

	if (!n || n > KVPB_MAX_THREADS)
		return -EINVAL;
	pthread_barrier_init(&start, NULL, n + 1);
	for (t = 0; t < n; t++) {
		w[t] = (struct kvpb_worker){ .c = c,
					     .j = j,
					     .t = t,
					     .start = &start,
					     .base = base,
					     .arg = arg };
		err = -pthread_create(&tid[t], NULL, fn, &w[t]);
		if (err) {
			/* The barrier waits for n + 1: no clean way back.
			 * The backing file goes with the process. */
			fprintf(stderr, "kvpbench: cannot start a thread: %s\n",
				strerror(-err));
			exit(1);
		}
	}
	run_progress_start(&rp, c, j, r->mode);
	pthread_barrier_wait(&start);
	t0 = kvpb_now(); /* the workers run from here: sample after */
	kvpb_cpu_sample(&cpu0);
	for (t = 0; t < n; t++)
		watch_join(c, j, r->mode, w, tid[t], &rp);
	t1 = kvpb_now();
	kvpb_cpu_sample(&cpu1);
	kvpb_cpu_account(&cpu0, &cpu1, r);
	pthread_barrier_destroy(&start);
	/* the bar ends at what was read (all of it, unless a read failed) */
	run_progress_show(&rp, workers_bytes(j, w), true);

	r->bytes = 0;
	r->bad = 0;
	for (t = 0; t < n; t++) {
		r->bytes += w[t].bytes;
		r->bad += w[t].bad;
		if (w[t].err && !err) {
			err = w[t].err;
			fprintf(stderr, "kvpbench: %s %s: %s failed: %s\n",
				j->scenario, r->mode, w[t].what,
				strerror(-err));
		}
	}
	r->seconds = t1 - t0;
	r->gb_per_s = r->seconds > 0 ? r->bytes / r->seconds / 1e9 : 0;
	r->gb_per_s_min = r->gb_per_s_max = r->gb_per_s;
	return err;
}

/* ---- option values ---------------------------------------------------- */

int kvpb_parse_opt(const char *name, const char *text, bool bytes, uint64_t min,
		   uint64_t max, uint64_t *out)
{
	char opt[64], err[KVP_TUNABLE_ERR_MAX];

	snprintf(opt, sizeof(opt), "--%s", name);
	if (kvp_option_parse(opt, bytes ? KVP_T_BYTES : KVP_T_UINT, min, max,
			     text, out, err, sizeof(err))) {
		fprintf(stderr, "kvpbench: %s\n", err);
		return -EINVAL;
	}
	return 0;
}

int kvpb_num_opt_set(const struct kvpb_num_opt *table, int id, const char *text,
		     void *opts)
{
	const struct kvpb_num_opt *n;
	uint64_t v;

	for (n = table; n->id && n->id != id; n++)
		;
	if (!n->id)
		return -ENOENT;
	if (kvpb_parse_opt(n->name, text, n->bytes, n->min, n->max, &v))
		return -EINVAL;
	if (n->size == sizeof(uint64_t))
		*(uint64_t *)((char *)opts + n->off) = v;
	else
		*(uint32_t *)((char *)opts + n->off) = (uint32_t)v;
	return 0;
}

/* The upper bound of the latency bucket holding the @q quantile. */
static uint64_t lat_pct(const struct kvp_stats *s, double q)
{
	uint64_t n = 0, acc = 0;
	unsigned i;

	for (i = 0; i < KVP_LATENCY_BUCKETS; i++)
		n += s->io_latency_us[i];
	if (!n)
		return 0;
	for (i = 0; i < KVP_LATENCY_BUCKETS; i++) {
		acc += s->io_latency_us[i];
		if (acc >= q * n)
			break;
	}
	return 2ull << i;
}

void kvpb_print_stats_json(const struct kvpb_result *r)
{
	const struct kvp_stats *s = &r->stats;
	uint64_t ios = 0;

	printf(",\"install_mode\":\"%s\"", r->install_mode);
	/* Every statistic the pager declares, by its name. */
#define J(name, kind, doc)                                                     \
	printf(",\"" #name "\":%llu", (unsigned long long)s->name);
	KVP_STATS(J)
#undef J
	for (unsigned i = 0; i < KVP_LATENCY_BUCKETS; i++)
		ios += s->io_latency_us[i];
	printf(",\"io_latency_p50_us_below\":%llu,"
	       "\"io_latency_p99_us_below\":%llu,\"io_latency_mean_us\":%.1f",
	       (unsigned long long)lat_pct(s, 0.50),
	       (unsigned long long)lat_pct(s, 0.99),
	       ios ? (double)s->io_latency_sum_ns / ios / 1e3 : 0.0);
}
