/*
 * kvpbench.h - declarations shared by the parts of the benchmark program.
 *
 * kvpbench runs each scenario's modes side by side, in one run, on one
 * backing file filled once with a pattern (kvpb_pattern), and prints a
 * table or, with --json, one JSON object per line per scenario and mode.
 *
 *   main.c         options, the backing file, scenario dispatch, output
 *   io.c           the scenarios stream and random; modes raw and mmap
 *   pager_modes.c  modes kvpager-move/-copy and the install scenario
 *   touch.c        the touch scenario: 4 KiB touches, the preload shim
 *                  and the kernel's mmap under a memory cgroup
 *   decode.c       the decode scenario (kvpbench decode ...)
 *   compute.c      the CPU-bound rates (kvpbench compute ...)
 *   tier.c         a block fetched from each tier (kvpbench tier ...)
 *   plot.c         --plot: the figures drawn by gnuplot
 *   helpers.c      what they share: clock, results, pattern, threads
 *   cpu.c          CPU time samples
 *
 * Calls go down the list's reverse: main.c calls the scenarios, io.c the
 * pager modes, all of them helpers.c, and helpers.c only cpu.c.  The pager
 * modes and the decode and compute scenarios are weak references, so that
 * the program links without their files: main.c says "... not built".
 */
#ifndef KVPBENCH_H
#define KVPBENCH_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "lib/cli/plot.h"
#include "pager/stats.h"

#define KVPB_PAGE	 4096u
#define KVPB_MAX_RESULTS 64
#define KVPB_MAX_THREADS 64
#define KVPB_MAX_REPEAT	 15

/* Modes, as bits of kvpb_opts.modes. */
enum kvpb_mode {
	KVPB_RAW = 1u << 0,
	KVPB_MMAP = 1u << 1,
	KVPB_KVP_MOVE = 1u << 2,
	KVPB_KVP_COPY = 1u << 3,
	KVPB_PRELOAD = 1u << 4, /* touch only: the preload shim's line */
};

struct kvpb_opts {
	const char *dir;	/* where the backing file lives */
	uint64_t budget;	/* RAM budget: pager's and mmap's, bytes */
	uint64_t file_bytes;	/* backing file: 4 x budget unless set */
	uint64_t block;		/* stream block bytes */
	uint64_t rblock;	/* random block bytes */
	unsigned depth;		/* stream: I/Os in flight (readahead window) */
	unsigned ref_depth;	/* random: depth of the raw reference line */
	uint64_t reads;		/* random: reads per thread (0: derived) */
	unsigned threads[8];	/* random: thread counts to run */
	unsigned nthreads;	/* entries in threads[] */
	unsigned modes;		/* enum kvpb_mode bits */
	unsigned pager_threads; /* service_threads; 0: the pager's default */
	bool prefetch;		/* kvpager stream: prefetch the window ahead */
	bool json;		/* JSON lines instead of the table */
	bool short_run;		/* --short */
	bool no_thp;		/* PR_SET_THP_DISABLE for the process */
	bool quiet;		/* no progress on stderr */
	unsigned timeout_s;	/* a run without progress this long ends it */
	unsigned repeat;	/* runs per mode, interleaved; median kept */
	uint64_t touches;	/* touch: random touches per line (0: derived) */
	uint64_t touch_block;	/* touch: the pager's block (0: 2 MiB for the
				   region, the shim's default for preload) */
	const char *touch_prog;	 /* touch: touch_pages (NULL: found next to
				    this program, the build's or installed) */
	const char *preload_lib; /* touch: libkvpager-preload.so (likewise) */
	bool busy;		 /* random: a competing busy thread per CPU */
	const char *plot;	 /* --plot FILE, or NULL */
};

/* The backing file, created and filled by main.c; it has no name in
 * --dir, and goes with its last descriptor. */
struct kvpb_file {
	char path[PATH_MAX];   /* /proc/self/fd/N: fd, to open again */
	int fd;		       /* O_RDWR, buffered: mmap and fadvise */
	int dfd;	       /* O_RDONLY|O_DIRECT (== fd if refused) */
	bool direct;	       /* the filesystem accepts O_DIRECT */
	uint64_t size;	       /* bytes */
	uint32_t mem_align;    /* O_DIRECT buffer alignment */
	uint32_t offset_align; /* O_DIRECT offset/length alignment */
	char disk_stat[64];    /* /sys/dev/block/M:m/stat of its disk */
};

/*
 * One run of one mode: which bytes of the file are read, in which unit and
 * order, by how many threads at which depth.  Every mode of a scenario gets
 * the same job, so that each reads the same bytes.
 */
struct kvpb_job {
	const char *scenario;  /* "stream", "random" */
	uint64_t off;	       /* file offset of the region */
	uint64_t len;	       /* region bytes, a multiple of block */
	uint64_t block;	       /* unit of I/O (and the pager's block size) */
	unsigned threads;      /* threads reading */
	unsigned depth;	       /* I/Os each thread keeps in flight (raw) */
	uint64_t reads;	       /* blocks each thread reads */
	const uint32_t *order; /* random: block indices in the region, thread
				  t reads order[t * reads + i]; NULL: in
				  sequence from block 0 (one thread) */
	unsigned group;	       /* results compared with each other */
	uint64_t region_block; /* kvpager: the region's block size when it
				  is not @block (touch: 4 KiB touches of
				  larger blocks); 0: @block */
	bool writes;	       /* touch: kvpager writes each touched page's
				  first word back (dirties it, same data),
				  raw each block it read */
};

struct kvpb_result {
	char scenario[16];
	char mode[24]; /* "raw", "mmap", "kvpager-move", ... */
	uint64_t block_bytes;
	unsigned threads;
	unsigned depth;
	unsigned group; /* the job's group; ratios are within it */
	bool reference; /* the depth-32 raw anchor line */
	unsigned busy_threads; /* competing busy threads meanwhile (--busy) */
	uint64_t bytes; /* bytes the mode read (touched) */
	double seconds;
	double gb_per_s;     /* 1e9 bytes per second */
	double gb_per_s_min; /* over the runs (--repeat) */
	double gb_per_s_max;
	unsigned runs;	     /* runs the figures are the median of */
	double ratio_vs_raw; /* < 0: not applicable */
	double ratio_vs_mmap;
	double ratio_vs_raw_ref; /* vs the depth-32 raw line (random) */
	uint64_t bad;		 /* pattern mismatches found by sampling */
	int64_t disk_bytes;  /* read from the file's disk meanwhile, by anyone;
			     < 0: unknown */
	double cpu_s;	     /* CPU time of this process in the run */
	double cpu_pager_s;  /* of it, the pager's threads' (kvp-*) */
	double machine_busy; /* share of all CPUs busy meanwhile, 0..1 */
	bool has_stats;	     /* a kvpager mode: the fields below are set */
	struct kvp_stats stats;
	char install_mode[8]; /* what the region reported: "move", "copy" */
};

struct kvpb_ctx {
	struct kvpb_opts opts;
	struct kvpb_file file;
	struct kvpb_result results[KVPB_MAX_RESULTS];
	unsigned nresults;
	unsigned next_group;
	int failures; /* modes that failed or read wrong data */
};

/*
 * The pattern: the 8-byte word at file offset @off (a multiple of 8) holds
 * kvpb_pattern(@off).  Consumers read the first word of every 4 KiB page
 * (a touch per page, as a program scanning the data would) and compare the
 * sum with kvpb_expect(), and compare two more words per block exactly.
 */
static inline uint64_t kvpb_pattern(uint64_t off)
{
	uint64_t z = (off >> 3) + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/*
 * kvpb_consume - touch one word per 4 KiB page of the @len bytes at @p,
 * which hold the file's bytes from offset @off, and check them against the
 * pattern.  Returns the number of mismatches (0 when the data is right).
 */
uint64_t kvpb_consume(const void *p, uint64_t off, uint64_t len);

/* Fill @buf with the pattern of the file's bytes at [off, off+len). */
void kvpb_fill(void *buf, uint64_t off, uint64_t len);

/*
 * kvpb_busy_start - a process of its own (as an inference process that
 * computes beside the pager) with one thread spinning on each CPU this
 * process may use; their number in *n.  Returns its pid, or -1 and errno.
 * kvpb_busy_stop ends it (SIGKILL) and reaps it.  It dies with us too.
 */
int kvpb_busy_start(unsigned *n);
void kvpb_busy_stop(int pid);

/*
 * kvpb_fork_pipe - a pipe into @pfd (both ends close-on-exec) and a child
 * process, stdio flushed first so that the child repeats nothing buffered.
 * Returns the child's pid in the parent and 0 in the child, with the
 * pipe's two ends in both; or -errno and no pipe.
 */
pid_t kvpb_fork_pipe(int pfd[2]);

/* CLOCK_MONOTONIC in seconds. */
double kvpb_now(void);

/* Progress line on stderr (unless --quiet), printf-style, no newline
 * needed. */
void kvpb_progress(const struct kvpb_ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Drop the backing file's pages from the page cache (cold start). */
void kvpb_drop_cache(const struct kvpb_file *f);

/* Bytes read from the backing file's disk so far, or -1 if unknown. */
int64_t kvpb_disk_read_bytes(const struct kvpb_file *f);

/* @r for the job's mode, filled from @j, the rest zero (ratios -1). */
void kvpb_result_init(struct kvpb_result *r, const struct kvpb_job *j,
		      const char *mode);

/* A result slot for the job's mode, pre-filled from @j; NULL when full. */
struct kvpb_result *kvpb_result_new(struct kvpb_ctx *c,
				    const struct kvpb_job *j, const char *mode);

/* qsort's comparison of struct kvpb_result by gb_per_s, ascending. */
int kvpb_cmp_gbps(const void *a, const void *b);
/* A kvpager mode's statistics (@r->has_stats) as JSON members, each
 * ",\"name\":value": the install mode, every counter the pager declares
 * by its name, and the I/O latency's p50 and p99 buckets. */
void kvpb_print_stats_json(const struct kvpb_result *r);

/*
 * kvpb_parse_opt - @text as the value of option --@name: a size (@bytes:
 * "64M") or a whole decimal number, within [@min, @max].  0 and *out, or
 * -EINVAL after a message on stderr naming the option and what it takes.
 */
int kvpb_parse_opt(const char *name, const char *text, bool bytes, uint64_t min,
		   uint64_t max, uint64_t *out);

/* A numeric option: what it takes, and the field of an options struct
 * (a uint64_t or a 32-bit unsigned) its value goes to. */
struct kvpb_num_opt {
	int id;		   /* getopt_long's value; 0 ends a table */
	const char *name;  /* without the -- */
	bool bytes;	   /* a size ("64M") rather than a count */
	uint64_t min, max; /* inclusive */
	size_t off, size;  /* KVPB_FIELD(struct, field) */
};
#define KVPB_FIELD(type, f) offsetof(type, f), sizeof(((type *)0)->f)

/*
 * kvpb_num_opt_set - if option @id is in @table, parse @text for it
 * (kvpb_parse_opt) into its field of @opts.  0 when set, -EINVAL when
 * refused (said on stderr, @opts unchanged), -ENOENT when @id is not a
 * numeric option of @table.
 */
int kvpb_num_opt_set(const struct kvpb_num_opt *table, int id, const char *text,
		     void *opts);

/* One thread of a mode's run (kvpb_run_threads). */
struct kvpb_worker {
	struct kvpb_ctx *c;
	const struct kvpb_job *j;
	unsigned t;		  /* thread index */
	pthread_barrier_t *start; /* all workers and the timer */
	uint8_t *base;		  /* mmap, kvpager: where the region is */
	void *arg;		  /* the mode's */
	uint64_t bytes;		  /* consumed */
	uint64_t at;		  /* file offset being read */
	uint64_t bad;		  /* mismatches */
	int err;		  /* 0 or -errno */
	const char *what;	  /* what failed */
};

/* Where worker @w is about to read (the watchdog shows it when stuck). */
static inline void kvpb_worker_at(struct kvpb_worker *w, uint64_t off)
{
	__atomic_store_n(&w->at, off, __ATOMIC_RELAXED);
}

/* Worker @w consumed @n more bytes. */
static inline void kvpb_worker_done(struct kvpb_worker *w, uint64_t n)
{
	__atomic_store_n(&w->bytes, w->bytes + n, __ATOMIC_RELAXED);
}

/* File offset of the @i-th block thread @t of job @j reads. */
uint64_t kvpb_job_off(const struct kvpb_job *j, unsigned t, uint64_t i);

/*
 * kvpb_run_threads - run @fn on j->threads threads, each given its struct
 * kvpb_worker (with @base and @arg); @fn does its set-up, then waits on
 * w->start, then reads.  The time runs from when every thread is ready to
 * when the last is done; @r gets bytes, bad, seconds and gb_per_s.
 * Meanwhile the bytes read show on stderr as "SCENARIO MODE" progress
 * (lib/cli/progress.h), unless --quiet.
 * Returns the first thread's error, or 0.
 */
int kvpb_run_threads(struct kvpb_ctx *c, const struct kvpb_job *j,
		     void *(*fn)(void *), uint8_t *base, void *arg,
		     struct kvpb_result *r);

/* cpu.c: a snapshot of CPU time (< 0: unknown). */
struct kvpb_cpu {
	double self_s;			/* this process, all its threads */
	double pager_s;			/* the pager's threads (kvp-*) */
	unsigned long long busy, total; /* /proc/stat, all CPUs, ticks */
};
void kvpb_cpu_sample(struct kvpb_cpu *s);
/* @r's cpu_s, cpu_pager_s and machine_busy from two snapshots (-1 where
 * unknown). */
void kvpb_cpu_account(const struct kvpb_cpu *a, const struct kvpb_cpu *b,
		      struct kvpb_result *r);

/* Scenarios (io.c).  0, or -errno when the scenario could not run. */
int kvpb_stream(struct kvpb_ctx *c);
int kvpb_random(struct kvpb_ctx *c);

/* touch.c: the touch scenario, its own table or JSON lines, printed. */
int kvpb_touch(struct kvpb_ctx *c);

/* kvpb_touch_plot - --plot of the last kvpb_touch: a cluster per line of
 * its table (pattern, access, threads), a bar per mode that ran with its
 * GB/s: raw, mmap and preload (programs of their own) beside kvpager.
 * 0, or -errno (said on stderr). */
int kvpb_touch_plot(const struct kvpb_ctx *c, const char *file);

/* Modes of io.c, also used by the pager modes' reporting. */
int kvpb_raw_run(struct kvpb_ctx *c, const struct kvpb_job *j,
		 struct kvpb_result *r);
int kvpb_mmap_run(struct kvpb_ctx *c, const struct kvpb_job *j,
		  struct kvpb_result *r);

/*
 * pager_modes.c (weak: NULL when not linked).  kvpb_pager_run runs job @j
 * on a pager opened with the budget and @install_mode (enum
 * kvp_install_mode) forced, over a file store on the backing file.
 * kvpb_install runs the install micro-scenario.
 */
int kvpb_pager_run(struct kvpb_ctx *c, const struct kvpb_job *j,
		   unsigned install_mode, struct kvpb_result *r)
    __attribute__((weak));
int kvpb_install(struct kvpb_ctx *c) __attribute__((weak));

/*
 * decode.c (weak: NULL when not linked): `kvpbench decode [options]`.
 * @argv[0] is "decode", its options follow; getopt has not been called.
 * Returns the program's exit status.
 */
int kvpbench_decode(int argc, char **argv) __attribute__((weak));

/* compute.c (weak): `kvpbench compute [options]`, as kvpbench_decode. */
int kvpbench_compute(int argc, char **argv) __attribute__((weak));

/* tier.c (weak): `kvpbench tier [options]`, as kvpbench_decode. */
int kvpbench_tier(int argc, char **argv) __attribute__((weak));

/*
 * plot.c: --plot FILE, drawn by the tools' gnuplot driver (lib/cli/plot.h:
 * kvp_plot_check at start, kvp_plot_begin and kvp_plot_end around a
 * chart's script).
 *
 * kvpb_plot_results - the chart of c->results (stream, random, install):
 * a cluster per job, a bar per kvpager mode with its GB/s, raw and mmap
 * as lines across their cluster, the depth-32 raw line across the
 * clusters of its block size.  0 or -errno (said).
 */
int kvpb_plot_results(const struct kvpb_ctx *c, const char *file);

#endif /* KVPBENCH_H */
