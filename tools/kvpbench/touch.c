/*
 * touch.c - the touch scenario: 4 KiB touches over a buffer 8 x the
 * budget, as a program that knows nothing of paging makes them.
 *
 * For each pattern (random, sequential), thread count (--threads) and
 * access (ro: read a page's words; rw: and write its first word back,
 * which dirties it with the same data), the modes run one after the other
 * on the same pages of the backing file:
 *
 *   raw      io_uring O_DIRECT reads of exactly the touched bytes: 4 KiB
 *            at depth 1 per thread (random), --block reads at --depth
 *            (sequential); on the sequential rw lines each block is
 *            also written back once read (the buffer is 8 x the budget:
 *            what is written must reach the file, whoever pages it).  The
 *            random rw lines only read: at depth 1 a write linked to each
 *            read would time every write, which the others make later.
 *   mmap     tests/progs/touch_pages on the file, MAP_SHARED, in a memory
 *            cgroup of its own whose limit is the budget plus
 *            CGROUP_SLACK for the program itself (v2 memory.max
 *            where a v2 memory controller is there, else v1
 *            memory.limit_in_bytes); skipped, with the reason, without.
 *   kvpager  a region over the file (KVP_REGION_FROM_STORE) in
 *            --touch-block blocks, the pager's own read-ahead and the
 *            shim's fault-around (KVP_FAULT_AROUND_BYTES sets another).
 *   preload  tests/progs/touch_pages under LD_PRELOAD of the shim, on a
 *            malloc'd buffer it fills first (not timed), with the shim's
 *            defaults (its block size unless --touch-block is given).
 *
 * Random touches are page touch_page(t, i) for thread t's i-th touch (the
 * same function as touch_pages'), so every mode touches the same pages.
 * Bytes read and written are the process's /proc/self/io counters over the
 * run (for the children, over their touches only): what went to the
 * block layer, page cache read-around and pager blocks included.  mmap's
 * written bytes are the pages it dirtied, kvpager's its write-backs
 * including the region's last flush, preload's the write-backs during the
 * touches (the buffer is freed unwritten).  An rw line of mmap and kvpager
 * ends when its writes are in the file: the child's msync and the
 * region's last flush (which waits for write-backs in flight) are timed,
 * as raw's writes are on the sequential lines.
 */
#include "tools/kvpbench/kvpbench.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/cli/progress.h"

#define TOUCH_MODES 4
#define CHILD_TIMEOUT_S 900 /* a child's fill and touches, at most */
/* The mmap line's cgroup holds the budget for the file's pages plus this
 * for the program itself (text, libc, stacks, page tables), which the
 * pager's budget does not count either: without it the program's own
 * pages thrash at small budgets. */
#define CGROUP_SLACK (16ull << 20)

enum { M_RAW, M_MMAP, M_KVP, M_PRELOAD };
static const char *const mode_names[TOUCH_MODES] = { "raw", "mmap", "kvpager",
						     "preload" };
/* The --modes bits that select each (kvpager: either install mode). */
static const unsigned mode_bits[TOUCH_MODES] = {
	KVPB_RAW, KVPB_MMAP, KVPB_KVP_MOVE | KVPB_KVP_COPY, KVPB_PRELOAD
};

struct touch_result {
	const char *pattern; /* "random", "sequential" */
	const char *access;  /* "ro", "rw" */
	unsigned threads;
	const char *mode;
	char skipped[PATH_MAX + 160]; /* why the mode has no figures; "" when run */
	uint64_t block;	   /* the pager's block size (kvpager, preload) */
	uint64_t touches;
	double seconds;
	double gb_per_s; /* touched bytes (touches x 4 KiB) per second */
	int64_t read_bytes, written_bytes; /* < 0: unknown */
	double cpu_s;			   /* < 0: unknown */
	uint64_t bad;
	double vs_raw, vs_mmap; /* < 0: no such line */
	/* The kvpager line: its pager's statistics and threads' CPU. */
	struct kvpb_result pager;
};

#define MAX_TOUCH_RESULTS (2 * 8 * 2 * TOUCH_MODES)
static struct touch_result res[MAX_TOUCH_RESULTS];
static unsigned nres;
static uint64_t buffer_bytes; /* the last run's buffer, for its chart */

/* The same page sequence as tests/progs/touch_pages' touch_page(). */
static uint64_t touch_page(unsigned t, uint64_t i, uint64_t pages)
{
	return kvpb_pattern(((uint64_t)(t + 1) << 43) | (i << 3)) % pages;
}

static int io_counts(pid_t pid, int64_t *rd, int64_t *wr)
{
	char path[64], line[128];
	unsigned long long v;
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/io", (int)pid);
	*rd = *wr = -1;
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "read_bytes: %llu", &v) == 1)
			*rd = (int64_t)v, n++;
		else if (sscanf(line, "write_bytes: %llu", &v) == 1)
			*wr = (int64_t)v, n++;
	}
	fclose(f);
	return n == 2 ? 0 : -1;
}

/* ---- the memory cgroup of the mmap line ------------------------------- */

static bool has_word(const char *file, const char *word)
{
	char buf[512], *tok, *save;
	FILE *f = fopen(file, "r");
	bool found = false;

	if (!f)
		return false;
	if (fgets(buf, sizeof(buf), f))
		for (tok = strtok_r(buf, " \n", &save); tok && !found;
		     tok = strtok_r(NULL, " \n", &save))
			found = !strcmp(tok, word);
	fclose(f);
	return found;
}

static int write_file(const char *dir, const char *name, const char *text)
{
	char path[PATH_MAX];
	int fd, err = 0;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (write(fd, text, strlen(text)) != (ssize_t)strlen(text))
		err = -errno;
	close(fd);
	return err;
}

/* Remove the cgroups of kvpbench runs that were killed (their pid gone):
 * a cgroup is not removed by its maker's death. */
static void cgroup_sweep(const char *root)
{
	char path[PATH_MAX];
	struct dirent *e;
	DIR *d = opendir(root);
	int pid;

	if (!d)
		return;
	while ((e = readdir(d)))
		if (sscanf(e->d_name, "kvpbench-%d", &pid) == 1 &&
		    kill(pid, 0) && errno == ESRCH) {
			snprintf(path, sizeof(path), "%s/%s", root, e->d_name);
			rmdir(path);
		}
	closedir(d);
}

/*
 * A memory cgroup with @limit bytes for the mmap line, in @dir: v2 where a
 * v2 hierarchy offers the memory controller, else v1.  0, or -errno with
 * the reason (and the remedy) in @why.
 */
static int cgroup_make(uint64_t limit, char *dir, size_t len, char *why,
		       size_t wlen)
{
	static const char *const v2_roots[] = { "/sys/fs/cgroup",
						"/sys/fs/cgroup/unified" };
	const char *root = NULL, *limit_file = NULL;
	char file[PATH_MAX], num[32];
	unsigned i;
	int err;

	for (i = 0; i < 2 && !root; i++) {
		snprintf(file, sizeof(file), "%s/cgroup.controllers",
			 v2_roots[i]);
		if (has_word(file, "memory")) {
			root = v2_roots[i];
			limit_file = "memory.max";
			/* Children get the controller only when asked. */
			write_file(root, "cgroup.subtree_control", "+memory");
		}
	}
	if (!root && !access("/sys/fs/cgroup/memory/memory.limit_in_bytes",
			     F_OK)) {
		root = "/sys/fs/cgroup/memory";
		limit_file = "memory.limit_in_bytes";
	}
	if (!root) {
		snprintf(why, wlen,
			 "no memory cgroup: neither a v2 memory controller "
			 "nor v1's /sys/fs/cgroup/memory");
		return -ENOENT;
	}
	cgroup_sweep(root);
	snprintf(dir, len, "%s/kvpbench-%d", root, (int)getpid());
	if (mkdir(dir, 0755) && errno != EEXIST) {
		err = -errno;
		snprintf(why, wlen,
			 "cannot create the memory cgroup %s: %s (run as "
			 "root, or give this user a delegated cgroup)",
			 dir, strerror(-err));
		return err;
	}
	snprintf(num, sizeof(num), "%llu", (unsigned long long)limit);
	err = write_file(dir, limit_file, num);
	if (err) {
		snprintf(why, wlen, "cannot set %s/%s: %s", dir, limit_file,
			 strerror(-err));
		rmdir(dir);
		return err;
	}
	return 0;
}

static void cgroup_remove(const char *dir)
{
	/* The last task's exit is noticed asynchronously: retry briefly. */
	for (int i = 0; i < 100 && rmdir(dir) && errno == EBUSY; i++)
		usleep(10000);
}

/* ---- the child program (mmap and preload) ----------------------------- */

struct child_spec {
	const char *prog;
	const char *cgroup; /* join it before exec; NULL: none */
	const char *file;   /* mmap this; NULL: malloc under the preload */
	const char *preload;
	uint64_t size, touches, budget, block;
	unsigned threads;
	const char *pattern, *access, *dir;
	const char *what; /* the progress bar's phase */
	bool quiet;	  /* --quiet: no bar */
};

/* In the child, between fork and exec: only what async-signal-safe
 * enough a single-threaded copy may do. */
static void child_exec(const struct child_spec *s, int out)
{
	char size[32], touches[32], threads[16], num[32];
	char *argv[8];
	int i = 0;

	dup2(out, STDOUT_FILENO);
	if (s->cgroup) {
		snprintf(num, sizeof(num), "%d", (int)getpid());
		if (write_file(s->cgroup, "cgroup.procs", num)) {
			fprintf(stderr, "kvpbench: cannot join %s\n",
				s->cgroup);
			_exit(126);
		}
	}
	if (s->preload) {
		snprintf(num, sizeof(num), "%llu",
			 (unsigned long long)s->budget);
		setenv("KVP_RAM_BUDGET_BYTES", num, 1);
		snprintf(num, sizeof(num), "%llu",
			 (unsigned long long)s->size);
		setenv("KVP_PRELOAD_MIN_BYTES", num, 1);
		setenv("KVP_PRELOAD_STRICT", "1", 1);
		setenv("KVP_BACKING_DIR", s->dir, 1);
		if (s->block) {
			snprintf(num, sizeof(num), "%llu",
				 (unsigned long long)s->block);
			setenv("KVP_PRELOAD_BLOCK_BYTES", num, 1);
		}
		setenv("LD_PRELOAD", s->preload, 1);
	}
	snprintf(size, sizeof(size), "%llu", (unsigned long long)s->size);
	snprintf(touches, sizeof(touches), "%llu",
		 (unsigned long long)s->touches);
	snprintf(threads, sizeof(threads), "%u", s->threads);
	argv[i++] = (char *)s->prog;
	argv[i++] = size;
	argv[i++] = touches;
	argv[i++] = threads;
	argv[i++] = (char *)s->pattern;
	argv[i++] = (char *)s->access;
	if (s->file)
		argv[i++] = (char *)s->file;
	argv[i] = NULL;
	setenv("TOUCH_PAGES_PROGRESS", "1", 1);
	execv(s->prog, argv);
	fprintf(stderr, "kvpbench: cannot run %s: %s\n", s->prog,
		strerror(errno));
	_exit(127);
}

/* A complete line of the child's output: a progress line draws the bar;
 * the result line stays in @line.  Returns bytes consumed from @line. */
static size_t child_line(char *line, size_t got, struct kvp_progress *pg)
{
	char *nl = memchr(line, '\n', got);
	unsigned long long done, total;
	size_t len;

	if (!nl || strncmp(line, "progress ", 9))
		return 0;
	len = (size_t)(nl - line) + 1;
	if (sscanf(line, "progress %llu %llu", &done, &total) == 2)
		kvp_progress_update(pg, done, total, "touches");
	return len;
}

/* Run the child and read its line into @r.  0, or -errno. */
static int child_run(const struct child_spec *s, struct touch_result *r)
{
	char line[512] = "";
	unsigned long long touches, rd, wr, bad;
	size_t got = 0, used;
	int pfd[2], status, err = 0;
	double deadline = kvpb_now() + CHILD_TIMEOUT_S;
	struct kvp_progress pg;
	pid_t pid;

	pid = kvpb_fork_pipe(pfd);
	if (pid < 0)
		return pid;
	if (!pid)
		child_exec(s, pfd[1]);
	close(pfd[1]);
	kvp_progress_start(&pg, "kvpbench", s->what, s->quiet);
	for (;;) {
		struct pollfd p = { .fd = pfd[0], .events = POLLIN };
		ssize_t n;

		if (kvpb_now() > deadline) {
			fprintf(stderr,
				"kvpbench: touch %s: no result in %d s; "
				"killed\n",
				r->mode, CHILD_TIMEOUT_S);
			kill(pid, SIGKILL);
			err = -ETIMEDOUT;
			break;
		}
		if (poll(&p, 1, 1000) <= 0)
			continue;
		n = read(pfd[0], line + got, sizeof(line) - 1 - got);
		if (n <= 0)
			break;
		got += (size_t)n;
		while ((used = child_line(line, got, &pg)) != 0) {
			memmove(line, line + used, got - used);
			got -= used;
		}
		if (got == sizeof(line) - 1)
			break;
	}
	kvp_progress_done(&pg, s->touches, s->touches, "touches");
	line[got] = 0;
	close(pfd[0]);
	waitpid(pid, &status, 0);
	if (err)
		return err;
	if (sscanf(line,
		   "touch seconds=%lf touches=%llu cpu_s=%lf read_bytes=%llu "
		   "write_bytes=%llu bad=%llu",
		   &r->seconds, &touches, &r->cpu_s, &rd, &wr, &bad) != 6) {
		fprintf(stderr,
			"kvpbench: touch %s: %s gave no result line (exit "
			"status %d)\n",
			r->mode, s->prog,
			WIFEXITED(status) ? WEXITSTATUS(status)
					  : 128 + WTERMSIG(status));
		return -EIO;
	}
	r->touches = touches;
	r->read_bytes = (int64_t)rd;
	r->written_bytes = (int64_t)wr;
	r->bad = bad;
	return 0;
}

/* ---- the modes -------------------------------------------------------- */

struct touch_set {
	struct kvpb_ctx *c;
	const char *pattern, *access;
	unsigned threads;
	uint64_t size, pages, touches; /* touches: all threads together */
	uint32_t *pages_order;	       /* per thread, touches / threads */
	uint32_t *blocks_order;	       /* sequential raw: --block units */
	char prog[PATH_MAX], preload[PATH_MAX];
	const char *no_prog, *no_preload; /* why not there; NULL: found */
	char cgroup[PATH_MAX];
	char no_cgroup[PATH_MAX + 160]; /* why not; "" when made */
	char file[64];	     /* the backing file, for a child */
};

/*
 * Run job @j in this process, raw (@install < 0) or through a pager region
 * (install mode @install), and fill @r with its figures and this process's
 * bytes read and written meanwhile.
 */
static int run_here(struct touch_set *s, const struct kvpb_job *j,
		    int install, struct touch_result *r)
{
	struct kvpb_result k;
	int64_t rd0, wr0, rd1, wr1;
	int err;

	kvpb_result_init(&k, j, r->mode);
	io_counts(getpid(), &rd0, &wr0);
	err = install < 0 ? kvpb_raw_run(s->c, j, &k)
			  : kvpb_pager_run(s->c, j, (unsigned)install, &k);
	io_counts(getpid(), &rd1, &wr1);
	r->seconds = k.seconds;
	r->cpu_s = k.cpu_s;
	r->bad = k.bad;
	r->touches = k.bytes / KVPB_PAGE;
	if (k.has_stats)
		r->pager = k;
	if (rd0 >= 0 && rd1 >= rd0)
		r->read_bytes = rd1 - rd0, r->written_bytes = wr1 - wr0;
	return err;
}

static int run_raw(struct touch_set *s, struct touch_result *r)
{
	struct kvpb_opts *o = &s->c->opts;
	bool seq = !strcmp(s->pattern, "sequential");
	uint64_t per = s->touches / s->threads;
	uint64_t block = seq ? o->block : KVPB_PAGE;
	struct kvpb_job j = {
		.scenario = "touch",
		.len = s->size,
		.block = block,
		.threads = s->threads,
		.depth = seq ? o->depth : 1,
		.reads = seq ? per * KVPB_PAGE / block : per,
		.order = seq ? s->blocks_order : s->pages_order,
		.writes = seq && !strcmp(s->access, "rw"),
	};

	return run_here(s, &j, -1, r);
}

static int run_kvpager(struct touch_set *s, struct touch_result *r)
{
	struct kvpb_job j = {
		.scenario = "touch",
		.len = s->size,
		.block = KVPB_PAGE,
		.threads = s->threads,
		.depth = 1,
		.reads = s->touches / s->threads,
		.order = s->pages_order,
		.region_block = r->block,
		.writes = !strcmp(s->access, "rw"),
	};

	if (!kvpb_pager_run) {
		snprintf(r->skipped, sizeof(r->skipped),
			 "not built (no pager_modes.c)");
		return 0;
	}
	return run_here(s, &j, 0, r); /* 0: the pager's own install mode */
}

static int run_child(struct touch_set *s, struct touch_result *r, bool mmap)
{
	struct kvpb_opts *o = &s->c->opts;
	struct child_spec cs = {
		.prog = s->prog,
		.cgroup = mmap ? s->cgroup : NULL,
		.file = mmap ? s->file : NULL,
		.preload = mmap ? NULL : s->preload,
		.size = s->size,
		.touches = s->touches,
		.budget = o->budget,
		.block = mmap ? 0 : o->touch_block,
		.threads = s->threads,
		.pattern = s->pattern,
		.access = s->access,
		.dir = o->dir,
		.what = mmap ? "touch mmap" : "touch preload",
		.quiet = o->quiet,
	};
	int err;

	if (s->no_prog) {
		snprintf(r->skipped, sizeof(r->skipped), "%s", s->no_prog);
		return 0;
	}
	if (mmap && s->no_cgroup[0]) {
		snprintf(r->skipped, sizeof(r->skipped), "%s", s->no_cgroup);
		return 0;
	}
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	if (!mmap) {
		snprintf(r->skipped, sizeof(r->skipped),
			 "a sanitizer build: its runtime must come first and "
			 "owns malloc; the preload line runs in plain builds");
		return 0;
	}
#endif
	if (!mmap && s->no_preload) {
		snprintf(r->skipped, sizeof(r->skipped), "%s", s->no_preload);
		return 0;
	}
	kvpb_drop_cache(&s->c->file);
	err = child_run(&cs, r);
	if (mmap) {
		/* Its dirty pages to the file, then out of the cache: the
		 * next mode starts cold. */
		fsync(s->c->file.fd);
		kvpb_drop_cache(&s->c->file);
	}
	return err;
}

/* ---- the scenario ----------------------------------------------------- */

/* The backing disk's read_ahead_kb (the kernel's mmap read-around and
 * largest readahead window), or -1. */
static long read_ahead_kb(const struct kvpb_file *f)
{
	static const char *const rel[] = { "queue/read_ahead_kb",
					   "../queue/read_ahead_kb" };
	char dir[sizeof(f->disk_stat)], path[PATH_MAX];
	long kb = -1;

	for (unsigned i = 0; i < 2 && kb < 0 && f->disk_stat[0]; i++) {
		FILE *fp;

		snprintf(dir, sizeof(dir), "%s", f->disk_stat);
		snprintf(path, sizeof(path), "%s/%s", dirname(dir), rel[i]);
		fp = fopen(path, "r");
		if (fp) {
			if (fscanf(fp, "%ld", &kb) != 1)
				kb = -1;
			fclose(fp);
		}
	}
	return kb;
}

/* @given, else the first of @rels (NULL-terminated) next to this program,
 * <bin>/../REL; @why set to @remedy when it is not there. */
static const char *find_near(const char *given, const char *const *rels,
			     char *out, size_t len, const char **why,
			     const char *remedy)
{
	char exe[PATH_MAX];
	const char *dir;
	ssize_t n;

	*why = NULL;
	if (given) {
		snprintf(out, len, "%s", given);
		if (access(out, R_OK))
			*why = remedy;
		return out;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n < 0)
		n = 0;
	exe[n] = 0;
	dir = dirname(exe);
	for (unsigned i = 0; rels[i]; i++) {
		snprintf(out, len, "%s/../%s", dir, rels[i]);
		if (!access(out, R_OK))
			return out;
	}
	*why = remedy;
	return out;
}

static int orders_make(struct touch_set *s)
{
	const struct kvpb_opts *o = &s->c->opts;
	bool seq = !strcmp(s->pattern, "sequential");
	uint64_t per = s->touches / s->threads, i, slice, bslice;
	unsigned t;

	free(s->pages_order);
	free(s->blocks_order);
	s->pages_order = malloc(s->touches * sizeof(uint32_t));
	s->blocks_order = malloc((s->size / o->block + 1) * sizeof(uint32_t));
	if (!s->pages_order || !s->blocks_order)
		return -ENOMEM;
	slice = s->pages / s->threads;
	bslice = slice * KVPB_PAGE / o->block;
	for (t = 0; t < s->threads; t++) {
		for (i = 0; i < per; i++)
			s->pages_order[t * per + i] =
			    (uint32_t)(seq ? t * slice + i % slice
					   : touch_page(t, i, s->pages));
		for (i = 0; seq && i < bslice; i++)
			s->blocks_order[t * bslice + i] =
			    (uint32_t)(t * bslice + i);
	}
	return 0;
}

static void run_line(struct touch_set *s)
{
	unsigned m, first = nres;
	struct touch_result *raw = NULL, *mm = NULL;

	for (m = 0; m < TOUCH_MODES && nres < MAX_TOUCH_RESULTS; m++) {
		struct touch_result *r;
		int err = 0;

		if (!(s->c->opts.modes & mode_bits[m]))
			continue;
		r = &res[nres++];
		*r = (struct touch_result){
			.pattern = s->pattern,
			.access = s->access,
			.threads = s->threads,
			.mode = mode_names[m],
			.read_bytes = -1,
			.written_bytes = -1,
			.cpu_s = -1,
			.vs_raw = -1,
			.vs_mmap = -1,
		};
		if (m == M_KVP || (m == M_PRELOAD && s->c->opts.touch_block))
			r->block = s->c->opts.touch_block ? s->c->opts.touch_block
							  : 2u << 20;
		kvpb_progress(s->c, "touch %s %s, %u thread%s: %s", s->pattern,
			      s->access, s->threads, s->threads > 1 ? "s" : "",
			      r->mode);
		switch (m) {
		case M_RAW:
			err = run_raw(s, r);
			break;
		case M_MMAP:
			err = run_child(s, r, true);
			break;
		case M_KVP:
			err = run_kvpager(s, r);
			break;
		case M_PRELOAD:
			err = run_child(s, r, false);
			break;
		}
		if (err && !r->skipped[0])
			snprintf(r->skipped, sizeof(r->skipped), "failed: %s",
				 strerror(-err));
		if (err || r->bad)
			s->c->failures++;
		if (r->bad)
			fprintf(stderr,
				"kvpbench: touch %s %s %s: %llu wrong words\n",
				s->pattern, s->access, r->mode,
				(unsigned long long)r->bad);
		if (!r->skipped[0] && r->seconds > 0)
			r->gb_per_s = (double)r->touches * KVPB_PAGE /
				      r->seconds / 1e9;
	}
	for (m = first; m < nres; m++) {
		if (res[m].skipped[0])
			continue;
		if (!strcmp(res[m].mode, "raw"))
			raw = &res[m];
		if (!strcmp(res[m].mode, "mmap"))
			mm = &res[m];
	}
	for (m = first; m < nres; m++) {
		struct touch_result *r = &res[m];

		if (r->skipped[0] || r == raw)
			continue;
		if (raw && raw->gb_per_s > 0)
			r->vs_raw = r->gb_per_s / raw->gb_per_s;
		if (mm && mm->gb_per_s > 0 && r != mm)
			r->vs_mmap = r->gb_per_s / mm->gb_per_s;
	}
}

static void print_json(const struct touch_result *r, long ra_kb)
{
	double touched = (double)r->touches * KVPB_PAGE;

	printf("{\"scenario\":\"touch\",\"pattern\":\"%s\",\"access\":\"%s\","
	       "\"threads\":%u,\"mode\":\"%s\"",
	       r->pattern, r->access, r->threads, r->mode);
	if (r->skipped[0]) {
		printf(",\"skipped\":\"");
		for (const char *p = r->skipped; *p; p++)
			printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
		printf("\"}\n");
		return;
	}
	if (r->block)
		printf(",\"block_bytes\":%llu", (unsigned long long)r->block);
	printf(",\"touches\":%llu,\"bytes\":%.0f,\"seconds\":%.6f,"
	       "\"gb_per_s\":%.4f,\"verified\":%s",
	       (unsigned long long)r->touches, touched, r->seconds,
	       r->gb_per_s, r->bad ? "false" : "true");
	if (r->read_bytes >= 0)
		printf(",\"read_bytes\":%lld,\"amplification\":%.3f",
		       (long long)r->read_bytes,
		       touched > 0 ? r->read_bytes / touched : 0);
	if (r->written_bytes >= 0)
		printf(",\"written_bytes\":%lld", (long long)r->written_bytes);
	if (r->cpu_s >= 0 && r->touches)
		printf(",\"cpu_s\":%.6f,\"cpu_us_per_touch\":%.2f", r->cpu_s,
		       r->cpu_s * 1e6 / r->touches);
	if (r->vs_raw >= 0)
		printf(",\"ratio_vs_raw\":%.4f", r->vs_raw);
	if (r->vs_mmap >= 0)
		printf(",\"ratio_vs_mmap\":%.4f", r->vs_mmap);
	if (!strcmp(r->mode, "mmap") && ra_kb >= 0)
		printf(",\"read_ahead_kb\":%ld", ra_kb);
	if (r->pager.has_stats) {
		if (r->pager.cpu_pager_s >= 0 && r->touches)
			printf(",\"cpu_pager_s\":%.6f,"
			       "\"cpu_pager_us_per_touch\":%.2f",
			       r->pager.cpu_pager_s,
			       r->pager.cpu_pager_s * 1e6 / r->touches);
		kvpb_print_stats_json(&r->pager);
	}
	printf("}\n");
}

static void print_row(const struct touch_result *r)
{
	double touched = (double)r->touches * KVPB_PAGE;
	char amp[16] = "", rd[16] = "", wr[16] = "", cpu[16] = "";
	char vr[16] = "", vm[16] = "", blk[24] = "";

	printf("%-10s %-2s %3u %-8s ", r->pattern, r->access, r->threads,
	       r->mode);
	if (r->skipped[0]) {
		printf("skipped: %s\n", r->skipped);
		return;
	}
	if (r->read_bytes >= 0 && touched > 0) {
		snprintf(amp, sizeof(amp), "%.2f", r->read_bytes / touched);
		snprintf(rd, sizeof(rd), "%lld",
			 (long long)(r->read_bytes >> 20));
	}
	if (r->written_bytes >= 0)
		snprintf(wr, sizeof(wr), "%lld",
			 (long long)(r->written_bytes >> 20));
	if (r->cpu_s >= 0 && r->touches)
		snprintf(cpu, sizeof(cpu), "%.1fus",
			 r->cpu_s * 1e6 / r->touches);
	if (r->vs_raw >= 0)
		snprintf(vr, sizeof(vr), "%.2fx", r->vs_raw);
	if (r->vs_mmap >= 0)
		snprintf(vm, sizeof(vm), "%.2fx", r->vs_mmap);
	if (r->block)
		snprintf(blk, sizeof(blk), "%lluK",
			 (unsigned long long)(r->block >> 10));
	printf("%7.3f %7s %7s %8s %9s %8s %9s %6s %8.3f%s\n", r->gb_per_s, vr,
	       vm, amp, rd, wr, cpu, blk, r->seconds,
	       r->bad ? "  WRONG DATA" : "");
}

/* The targets, in words under the table. */
static void print_targets(void)
{
	for (unsigned i = 0; i < nres; i++) {
		const struct touch_result *r = &res[i], *m = NULL;

		if (strcmp(r->mode, "kvpager") && strcmp(r->mode, "preload"))
			continue;
		if (r->skipped[0])
			continue;
		if (!strcmp(r->pattern, "sequential") && r->vs_raw >= 0)
			printf("target touch sequential %s %u thr %s: %.2fx "
			       "raw (>= 0.95): %s\n",
			       r->access, r->threads, r->mode, r->vs_raw,
			       r->vs_raw >= 0.95 ? "met" : "MISSED");
		for (unsigned k = 0; k < nres; k++)
			if (!strcmp(res[k].mode, "mmap") &&
			    !res[k].skipped[0] &&
			    res[k].threads == r->threads &&
			    !strcmp(res[k].pattern, r->pattern) &&
			    !strcmp(res[k].access, r->access))
				m = &res[k];
		if (!strcmp(r->pattern, "random") && m && m->read_bytes > 0 &&
		    r->read_bytes >= 0 && r->vs_mmap >= 0) {
			double rr = (double)r->read_bytes / m->read_bytes;

			printf("target touch random %s %u thr %s: read %.2fx "
			       "mmap's (<= 2), %.2fx its GB/s (>= 1): %s\n",
			       r->access, r->threads, r->mode, rr, r->vs_mmap,
			       rr <= 2 && r->vs_mmap >= 1 ? "met" : "MISSED");
		}
	}
}

/* Whether res[i] begins a line of the table (its results are
 * consecutive: pattern, access and threads change between lines). */
static bool line_starts(unsigned i)
{
	return !i || res[i].pattern != res[i - 1].pattern ||
	       res[i].access != res[i - 1].access ||
	       res[i].threads != res[i - 1].threads;
}

/* A panel of the touch chart: @pattern's lines, a cluster each, a bar
 * per mode of @ran, @nmodes of them; @key: this panel shows the key. */
static void touch_panel(FILE *f, const char *pattern, const bool *ran,
			unsigned nmodes, bool key)
{
	static const char *const colors[TOUCH_MODES] = { "#555555", "#d62728",
							 "#1f77b4", "#2ca02c" };
	static const char *const titles[TOUCH_MODES] = {
		"raw (io_uring O_DIRECT)", "mmap (own program, cgroup)",
		"kvpager", "preload (own program, the shim)"
	};
	double w = 0.8 / nmodes;
	unsigned i, m, k, g = 0, first = 0;
	char label[64];

	/* room above the bars for their labels */
	fprintf(f, "set title '%s touches'\nset %skey\nset offsets 0, 0, "
		"graph 0.12, 0\nset xtics (", pattern, key ? "" : "no");
	for (i = 0; i < nres; i++) {
		if (!line_starts(i) || strcmp(res[i].pattern, pattern))
			continue;
		snprintf(label, sizeof(label), "%s, %u thr", res[i].access,
			 res[i].threads);
		fputs(g ? ", " : "", f);
		kvp_plot_str(f, label);
		fprintf(f, " %u", g++);
	}
	fprintf(f, ")\nset xrange [-0.6:%u.6]\n", g ? g - 1 : 0);
	/* $mK: x y width of mode K's bars, its datablock made anew */
	for (m = 0, k = 0; m < TOUCH_MODES; m++) {
		if (!ran[m])
			continue;
		fprintf(f, "$m%u << EOD\n", m);
		for (i = 0, g = 0; i < nres; i++) {
			if (strcmp(res[i].pattern, pattern))
				continue;
			if (line_starts(i) && i && !strcmp(res[i - 1].pattern,
							   pattern))
				g++;
			if (!res[i].skipped[0] &&
			    !strcmp(res[i].mode, mode_names[m]))
				fprintf(f, "%.4f %.5f %.4f\n",
					g - 0.4 + w * (k + 0.5),
					res[i].gb_per_s, w);
		}
		fputs("EOD\n", f);
		k++;
	}
	for (m = 0; m < TOUCH_MODES; m++) {
		if (!ran[m])
			continue;
		fprintf(f, "%s$m%u using 1:2:3 with boxes lc rgb '%s' title ",
			first++ ? ", " : "plot ", m, colors[m]);
		kvp_plot_str(f, titles[m]);
		fprintf(f,
			", $m%u using 1:2:(sprintf('%%.3g', $2)) with labels "
			"rotate by 90 left offset 0,0.3 font ',9' notitle",
			m);
	}
	fputc('\n', f);
}

int kvpb_touch_plot(const struct kvpb_ctx *c, const char *file)
{
	static const char *const patterns[] = { "random", "sequential" };
	bool ran[TOUCH_MODES] = { false }, has[2] = { false };
	unsigned i, m, p, nmodes = 0, npanels = 0, drawn = 0;
	char title[256];
	struct kvp_plot pl;
	FILE *f;
	int err;

	for (i = 0; i < nres; i++) {
		for (m = 0; m < TOUCH_MODES; m++)
			if (!res[i].skipped[0] &&
			    !strcmp(res[i].mode, mode_names[m]))
				ran[m] = true;
		for (p = 0; p < 2; p++)
			if (!res[i].skipped[0] &&
			    !strcmp(res[i].pattern, patterns[p]))
				has[p] = true;
	}
	for (m = 0; m < TOUCH_MODES; m++)
		nmodes += ran[m];
	npanels = has[0] + has[1];
	if (!nmodes) {
		fprintf(stderr, "kvpbench: --plot %s: no touch line ran, "
				"nothing to draw\n", file);
		return -ENODATA;
	}
	snprintf(title, sizeof(title),
		 "kvpbench touch: GB/s of 4 KiB touches per mode; buffer %llu "
		 "MiB, budget %llu MiB",
		 (unsigned long long)(buffer_bytes >> 20),
		 (unsigned long long)(c->opts.budget >> 20));
	err = kvp_plot_begin(&pl, file, title);
	if (err)
		return err;
	f = pl.f;
	/* a panel per pattern, each on its own scale (random's GB/s are
	 * a hundredth of sequential's); the same bottom margin in each,
	 * so that the key under the first leaves their plots one size */
	fputs("set ylabel 'GB/s'\nset bmargin 6\nset multiplot layout 1,", f);
	fprintf(f, "%u title ", npanels);
	kvp_plot_str(f, title);
	fputc('\n', f);
	for (p = 0; p < 2; p++)
		if (has[p])
			touch_panel(f, patterns[p], ran, nmodes, !drawn++);
	fputs("unset multiplot\n", f);
	return kvp_plot_end(&pl, "kvpbench touch");
}

int kvpb_touch(struct kvpb_ctx *c)
{
	static const char *const patterns[] = { "random", "sequential" };
	static const char *const accesses[] = { "ro", "rw" };
	/* the build tree's, then make install's */
	static const char *const prog_rels[] = { "tests/progs/touch_pages",
						 "libexec/kvpager/touch_pages",
						 NULL };
	static const char *const preload_rels[] = {
		"lib/libkvpager-preload.so", NULL
	};
	const struct kvpb_opts *o = &c->opts;
	struct touch_set s = { .c = c };
	uint64_t rand_touches;
	unsigned p, t, a;
	long ra_kb;
	int err = 0;

	nres = 0;
	s.size = 8 * o->budget;
	if (s.size > c->file.size)
		s.size = c->file.size;
	s.size -= s.size % (o->block > (2u << 20) ? o->block : (2u << 20));
	s.pages = s.size / KVPB_PAGE;
	buffer_bytes = s.size;
	if (!s.pages || s.pages > UINT32_MAX) {
		fprintf(stderr, "kvpbench: touch: a buffer of %llu bytes is "
				"out of range (2 MiB .. 16 TiB)\n",
			(unsigned long long)s.size);
		return -EINVAL;
	}
	rand_touches = o->touches ? o->touches : o->short_run ? 2048 : 8192;
	find_near(o->touch_prog, prog_rels, s.prog, sizeof(s.prog),
		  &s.no_prog,
		  "no touch_pages in tests/progs/ or libexec/kvpager/ "
		  "beside bin/ (make, or --touch-prog PATH)");
	find_near(o->preload_lib, preload_rels, s.preload, sizeof(s.preload),
		  &s.no_preload,
		  "no libkvpager-preload.so (make, or --preload-lib PATH)");
	snprintf(s.file, sizeof(s.file), "/proc/%d/fd/%d", (int)getpid(),
		 c->file.fd);
	if (cgroup_make(o->budget + CGROUP_SLACK, s.cgroup, sizeof(s.cgroup), s.no_cgroup,
			sizeof(s.no_cgroup)) == 0)
		s.no_cgroup[0] = 0;
	ra_kb = read_ahead_kb(&c->file);
	if (!o->json)
		printf("kvpbench touch: buffer %llu MiB (8 x the budget), "
		       "%llu random touches per line, sequential: every page; "
		       "mmap in %s (limit: budget + %llu MiB), disk "
		       "read_ahead_kb %ld; kvpager and preload fault-around "
		       "%s\n",
		       (unsigned long long)(s.size >> 20),
		       (unsigned long long)rand_touches,
		       s.no_cgroup[0] ? "no cgroup (skipped)" : s.cgroup,
		       CGROUP_SLACK >> 20, ra_kb,
		       getenv("KVP_FAULT_AROUND_BYTES")
			   ? getenv("KVP_FAULT_AROUND_BYTES")
			   : "64K");
	for (p = 0; p < 2; p++) {
		for (t = 0; t < o->nthreads; t++) {
			s.pattern = patterns[p];
			s.threads = o->threads[t];
			s.touches = p ? s.pages : rand_touches;
			s.touches -= s.touches % s.threads;
			if (!s.touches || s.pages / s.threads * KVPB_PAGE <
						  o->block) {
				fprintf(stderr,
					"kvpbench: touch: %u threads: too "
					"few pages\n",
					s.threads);
				err = -EINVAL;
				continue;
			}
			err = orders_make(&s);
			if (err)
				goto out;
			for (a = 0; a < 2; a++) {
				s.access = accesses[a];
				run_line(&s);
			}
		}
	}
	if (!o->json)
		printf("%-10s %-2s %3s %-8s %7s %7s %7s %8s %9s %8s %9s %6s "
		       "%8s\n",
		       "pattern", "rw", "thr", "mode", "GB/s", "vs_raw",
		       "vs_mmap", "amplif", "read_MiB", "wrote_MiB",
		       "cpu/touch", "block", "seconds");
	for (unsigned i = 0; i < nres; i++) {
		if (o->json)
			print_json(&res[i], ra_kb);
		else
			print_row(&res[i]);
	}
	if (!o->json)
		print_targets();
	fflush(stdout);
out:
	if (!s.no_cgroup[0])
		cgroup_remove(s.cgroup);
	free(s.pages_order);
	free(s.blocks_order);
	return err;
}
