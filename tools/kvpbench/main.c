/*
 * kvpbench - kvpager against raw io_uring and the kernel's mmap, side by
 * side in one run on one file.
 *
 *   kvpbench [options] [stream] [random] [install] [touch] [all]
 *   kvpbench decode [options]
 *   kvpbench compute [options]
 *   kvpbench tier [options]
 *
 * Scenarios (default: stream random):
 *   stream   a sequential scan of a region four times the budget
 *   random   random blocks (each read once), 1 and 4 threads, plus a raw
 *            line at depth 32 (the anchor)
 *   install  install cost of MOVE against COPY per block size, through the
 *            pager, from a memory store (no disk)
 *   touch    4 KiB touches over a buffer 8 x the budget: raw, the kernel's
 *            mmap in a memory cgroup, a kvpager region, the preload shim
 *   decode   the KV decode scenario, with its own options
 *   compute  the synthetic KV's fill rate and CPU attention, no disk
 *   tier     a KV block fetched from RAM, Redis, a Redis Cluster
 *
 * Modes: raw (io_uring O_DIRECT, the limit), mmap (the kernel's page cache,
 * cold), kvpager-move and kvpager-copy (install mode forced).  Ratios are
 * taken between modes of the same run, same bytes, same block size.
 *
 * The backing file (4 x budget, filled once with a pattern) is created in
 * --dir without a name (O_TMPFILE), so that no end of the program, SIGKILL
 * included, leaves it behind.
 */
#include "tools/kvpbench/kvpbench.h"
#include "lib/tunables/tunables.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "kmod-helpers/dio.h"
#include "lib/cli/cli.h"
#include "lib/cli/progress.h"
#include "kmod-helpers/mem.h"

#define FILL_CHUNK   (8u << 20)
#define SPACE_MARGIN (64ull << 20) /* left free beside the file */

/* ---- the backing file ------------------------------------------------- */

/*
 * A file in @dir that never has a name (O_TMPFILE; where the filesystem
 * lacks it, mkstemp and unlink at once), so that nothing is left behind
 * however the program ends, SIGKILL included.  Its /proc/self/fd path goes
 * to @path, for the opens with other flags (O_DIRECT) and the pager's
 * store.  Returns the descriptor (O_RDWR), or -1 and errno.
 */
static int open_unlinked(const char *dir, char *path, size_t len)
{
	int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

	if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR)) {
		snprintf(path, len, "%s/kvpbench-XXXXXX", dir);
		fd = mkostemp(path, O_CLOEXEC);
		if (fd >= 0)
			unlink(path);
	}
	if (fd >= 0)
		snprintf(path, len, "/proc/self/fd/%d", fd);
	return fd;
}

static void no_space(const char *dir, uint64_t need, uint64_t avail)
{
	fprintf(stderr,
		"kvpbench: not enough space in %s for the backing file: "
		"need %llu MiB, %llu MiB free\n"
		"kvpbench: remedy: --dir DIR on a filesystem with space, or a "
		"smaller --budget (the file is 4 x budget) or --short\n",
		dir, (unsigned long long)(need >> 20),
		(unsigned long long)(avail >> 20));
}

static int file_create(struct kvpb_ctx *c)
{
	struct kvpb_file *f = &c->file;
	const char *dir = c->opts.dir;
	struct kvp_progress pg;
	struct kvp_dio_align al;
	struct statvfs sv;
	uint64_t off, avail;
	void *buf = NULL;
	bool direct;
	double t0;
	int fd, wfd = -1, err;

	f->fd = f->dfd = -1;
	if (statvfs(dir, &sv)) {
		err = -errno;
		fprintf(stderr, "kvpbench: cannot use --dir %s: %s\n", dir,
			strerror(-err));
		return err;
	}
	avail = (uint64_t)sv.f_bavail * sv.f_frsize;
	if (avail < f->size + SPACE_MARGIN) {
		no_space(dir, f->size + SPACE_MARGIN, avail);
		return -ENOSPC;
	}
	fd = open_unlinked(dir, f->path, sizeof(f->path));
	if (fd < 0) {
		err = -errno;
		fprintf(stderr, "kvpbench: cannot create a file in %s: %s\n",
			dir, strerror(-err));
		return err;
	}

	/* Reserve it all now, so that a full disk fails here. */
	if (fallocate(fd, 0, 0, (off_t)f->size)) {
		err = -errno;
		if (err == -ENOSPC) {
			no_space(dir, f->size, avail);
			goto out;
		}
		if (ftruncate(fd, (off_t)f->size)) {
			err = -errno;
			fprintf(stderr,
				"kvpbench: cannot size the file in %s: %s\n",
				dir, strerror(-err));
			goto out;
		}
	}
	wfd = kvp_dio_open(f->path, O_WRONLY, 0600, &direct);
	if (wfd < 0) {
		err = wfd;
		fprintf(stderr, "kvpbench: cannot open the file in %s: %s\n",
			dir, strerror(-err));
		goto out;
	}
	err = kvp_mem_reserve(FILL_CHUNK, KVP_HUGE_SIZE, false, &buf);
	if (err)
		goto out;
	kvpb_progress(c, "filling a file in %s (%llu MiB) with the pattern%s",
		      dir, (unsigned long long)(f->size >> 20),
		      direct ? "" : " (buffered: O_DIRECT refused)");
	t0 = kvpb_now();
	kvp_progress_start(&pg, "kvpbench", "fill", c->opts.quiet);
	for (off = 0; off < f->size; off += FILL_CHUNK) {
		uint64_t n =
		    f->size - off < FILL_CHUNK ? f->size - off : FILL_CHUNK;
		ssize_t w;

		kvp_progress_update(&pg, off >> 20, f->size >> 20, "MiB");

		kvpb_fill(buf, off, n);
		w = pwrite(wfd, buf, n, (off_t)off);
		if (w != (ssize_t)n) {
			err = w < 0 ? -errno : -EIO;
			if (err == -ENOSPC)
				no_space(dir, f->size, avail);
			else
				fprintf(stderr,
					"kvpbench: cannot write the file in "
					"%s: %s\n",
					dir, strerror(-err));
			goto out;
		}
	}
	kvp_progress_update(&pg, f->size >> 20, f->size >> 20, "MiB");
	if (fsync(wfd)) {
		err = -errno;
		fprintf(stderr, "kvpbench: cannot sync the file in %s: %s\n",
			dir, strerror(-err));
		goto out;
	}
	kvpb_progress(c, "filled in %.2f s", kvpb_now() - t0);

	f->fd = fd; /* keeps the file: it has no other name */
	fd = -1;
	/* Read-write: raw's rw lines write their blocks back. */
	f->dfd = kvp_dio_open(f->path, O_RDWR | O_CLOEXEC, 0, &f->direct);
	if (f->dfd < 0) {
		err = f->dfd;
		f->dfd = -1;
		goto out;
	}
	err = kvp_dio_alignment(f->dfd, &al);
	if (err)
		goto out;
	f->mem_align = al.mem_align;
	f->offset_align = al.offset_align;
	if (!f->direct)
		fprintf(stderr,
			"kvpbench: warning: %s refuses O_DIRECT: raw and "
			"kvpager read through the page cache and the ratios "
			"mean little; remedy: --dir on a disk filesystem\n",
			dir);
	if (f->size % f->offset_align || c->opts.block % f->offset_align ||
	    c->opts.rblock % f->offset_align) {
		fprintf(stderr,
			"kvpbench: block sizes must be multiples of "
			"the file's O_DIRECT alignment (%u)\n",
			f->offset_align);
		err = -EINVAL;
		goto out;
	}
	{
		struct stat st;

		if (!fstat(f->fd, &st))
			snprintf(f->disk_stat, sizeof(f->disk_stat),
				 "/sys/dev/block/%u:%u/stat", major(st.st_dev),
				 minor(st.st_dev));
		if (kvpb_disk_read_bytes(f) < 0)
			f->disk_stat[0] = 0;
	}
	kvpb_drop_cache(f);
	err = 0;
out:
	if (buf)
		kvp_mem_release(buf, FILL_CHUNK);
	if (wfd >= 0)
		close(wfd);
	if (fd >= 0)
		close(fd);
	if (err) {
		if (f->fd >= 0)
			close(f->fd);
		if (f->dfd >= 0 && f->dfd != f->fd)
			close(f->dfd);
		f->fd = f->dfd = -1;
		if (err != -ENOSPC && err != -EINVAL)
			fprintf(stderr, "kvpbench: backing file: %s\n",
				strerror(-err));
	}
	return err;
}

static void file_close(struct kvpb_file *f)
{
	if (f->dfd >= 0 && f->dfd != f->fd)
		close(f->dfd);
	if (f->fd >= 0)
		close(f->fd);
	f->fd = f->dfd = -1;
}

/* ---- output ----------------------------------------------------------- */

static const struct kvpb_result *find(const struct kvpb_ctx *c,
				      const struct kvpb_result *r,
				      const char *mode, bool reference)
{
	unsigned i;

	for (i = 0; i < c->nresults; i++) {
		const struct kvpb_result *q = &c->results[i];

		if (strcmp(q->scenario, r->scenario) || strcmp(q->mode, mode) ||
		    q->reference != reference || q->gb_per_s <= 0)
			continue;
		if (reference ? q->block_bytes == r->block_bytes
			      : q->group == r->group)
			return q;
	}
	return NULL;
}

static void ratios(struct kvpb_ctx *c, unsigned first)
{
	unsigned i;

	for (i = first; i < c->nresults; i++) {
		struct kvpb_result *r = &c->results[i];
		const struct kvpb_result *q;

		if (strncmp(r->mode, "kvpager", 7))
			continue;
		q = find(c, r, "raw", false);
		if (q)
			r->ratio_vs_raw = r->gb_per_s / q->gb_per_s;
		q = find(c, r, "mmap", false);
		if (q)
			r->ratio_vs_mmap = r->gb_per_s / q->gb_per_s;
		q = find(c, r, "raw", true);
		if (q)
			r->ratio_vs_raw_ref = r->gb_per_s / q->gb_per_s;
	}
}

static bool thp_off;

/* Microseconds of this process's CPU per block read, or -1 (cpu.c). */
static double cpu_us_per_block(const struct kvpb_result *r)
{
	if (r->cpu_s < 0 || !r->bytes)
		return -1;
	return r->cpu_s * 1e6 / ((double)r->bytes / (double)r->block_bytes);
}

static void print_json(const struct kvpb_result *r)
{
	printf("{\"scenario\":\"%s\",\"block_bytes\":%llu,\"threads\":%u,"
	       "\"depth\":%u,\"mode\":\"%s\",\"bytes\":%llu,\"seconds\":%.6f,"
	       "\"gb_per_s\":%.4f,\"verified\":%s",
	       r->scenario, (unsigned long long)r->block_bytes, r->threads,
	       r->depth, r->mode, (unsigned long long)r->bytes, r->seconds,
	       r->gb_per_s, r->bad ? "false" : "true");
	if (thp_off)
		printf(",\"thp\":false");
	printf(",\"runs\":%u,\"gb_per_s_min\":%.4f,\"gb_per_s_max\":%.4f",
	       r->runs, r->gb_per_s_min, r->gb_per_s_max);
	if (r->reference)
		printf(",\"reference\":true");
	if (r->disk_bytes >= 0)
		printf(",\"disk_bytes\":%lld", (long long)r->disk_bytes);
	if (r->ratio_vs_raw >= 0)
		printf(",\"ratio_vs_raw\":%.4f", r->ratio_vs_raw);
	if (r->ratio_vs_mmap >= 0)
		printf(",\"ratio_vs_mmap\":%.4f", r->ratio_vs_mmap);
	if (r->ratio_vs_raw_ref >= 0)
		printf(",\"ratio_vs_raw_depth32\":%.4f", r->ratio_vs_raw_ref);
	if (cpu_us_per_block(r) >= 0)
		printf(",\"cpu_s\":%.6f,\"cpu_us_per_block\":%.1f", r->cpu_s,
		       cpu_us_per_block(r));
	if (r->busy_threads)
		printf(",\"busy_threads\":%u", r->busy_threads);
	if (r->machine_busy >= 0)
		printf(",\"machine_busy\":%.3f", r->machine_busy);
	if (r->has_stats) {
		if (r->cpu_pager_s >= 0 && r->bytes)
			printf(",\"cpu_pager_s\":%.6f,"
			       "\"cpu_pager_us_per_block\":%.1f",
			       r->cpu_pager_s,
			       r->cpu_pager_s * 1e6 /
				   ((double)r->bytes / (double)r->block_bytes));
		kvpb_print_stats_json(r);
	}
	printf("}\n");
}

static const char *size_str(uint64_t b, char *buf, size_t len)
{
	if (b >= (1ull << 20) && !(b % (1ull << 20)))
		snprintf(buf, len, "%lluM", (unsigned long long)(b >> 20));
	else
		snprintf(buf, len, "%lluK", (unsigned long long)(b >> 10));
	return buf;
}

static void print_header(void)
{
	printf("%-8s %6s %3s %5s %-16s %7s %11s %8s %7s %7s %7s %5s %8s %8s "
	       "%8s %s\n",
	       "scenario", "block", "thr", "depth", "mode", "GB/s", "min-max",
	       "seconds", "vs_raw", "vs_mmap", "cpu/blk", "busy", "disk_MiB",
	       "faults", "read_MiB", "installs m/c");
}

static void print_row(const struct kvpb_result *r)
{
	char b[24], rr[16] = "", rm[16] = "", tag[40], disk[24] = "";
	char range[32], cpu[16] = "", busy[16] = "";

	if (r->ratio_vs_raw >= 0)
		snprintf(rr, sizeof(rr), "%.2fx", r->ratio_vs_raw);
	if (r->ratio_vs_mmap >= 0)
		snprintf(rm, sizeof(rm), "%.2fx", r->ratio_vs_mmap);
	if (r->disk_bytes >= 0)
		snprintf(disk, sizeof(disk), "%lld",
			 (long long)(r->disk_bytes >> 20));
	if (cpu_us_per_block(r) >= 0)
		snprintf(cpu, sizeof(cpu), "%.0fus", cpu_us_per_block(r));
	if (r->machine_busy >= 0)
		snprintf(busy, sizeof(busy), "%.0f%%", r->machine_busy * 100);
	snprintf(tag, sizeof(tag), "%s%s", r->mode,
		 r->reference ? " (ref)" : "");
	snprintf(range, sizeof(range), "%.2f-%.2f", r->gb_per_s_min,
		 r->gb_per_s_max);
	printf("%-8s %6s %3u %5u %-16s %7.3f %11s %8.3f %7s %7s %7s %5s %8s",
	       r->scenario, size_str(r->block_bytes, b, sizeof(b)), r->threads,
	       r->depth, tag, r->gb_per_s, range, r->seconds, rr, rm, cpu, busy,
	       disk);
	if (r->has_stats)
		printf(" %8llu %8llu %llu/%llu",
		       (unsigned long long)r->stats.demand_faults_total,
		       (unsigned long long)(r->stats.bytes_read_total >> 20),
		       (unsigned long long)r->stats.installs_move_total,
		       (unsigned long long)r->stats.installs_copy_total);
	if (r->bad)
		printf("  WRONG DATA (%llu)", (unsigned long long)r->bad);
	printf("\n");
}

/* The targets, said in words under the table; install's
 * move/copy ratios. */
static void print_targets(const struct kvpb_ctx *c)
{
	unsigned i, k;

	for (i = 0; i < c->nresults; i++) {
		const struct kvpb_result *r = &c->results[i];

		if (!strcmp(r->scenario, "install") &&
		    !strcmp(r->mode, "kvpager-move")) {
			for (k = 0; k < c->nresults; k++) {
				const struct kvpb_result *q = &c->results[k];

				if (!strcmp(q->scenario, "install") &&
				    !strcmp(q->mode, "kvpager-copy") &&
				    q->block_bytes == r->block_bytes &&
				    q->gb_per_s > 0)
					printf(
					    "install %lluK: move %.3f GB/s, "
					    "copy %.3f GB/s: move/copy "
					    "%.2fx\n",
					    (unsigned long long)(r->block_bytes >>
								 10),
					    r->gb_per_s, q->gb_per_s,
					    r->gb_per_s / q->gb_per_s);
			}
		}

		if (strncmp(r->mode, "kvpager", 7) || r->ratio_vs_raw < 0)
			continue;
		if (!strcmp(r->scenario, "stream") &&
		    r->block_bytes == (2u << 20) && r->ratio_vs_mmap >= 0)
			printf("target stream 2M %s: %.2fx raw (>= 0.9), "
			       "%.2fx mmap (>= 1.2): %s\n",
			       r->mode, r->ratio_vs_raw, r->ratio_vs_mmap,
			       r->ratio_vs_raw >= 0.9 && r->ratio_vs_mmap >= 1.2
				   ? "met"
				   : "MISSED");
		if (!strcmp(r->scenario, "random") &&
		    r->block_bytes == (64u << 10) && r->threads == 4)
			printf("target random 64K 4 threads %s%s: %.2fx raw "
			       "at depth 4 (>= 0.6): %s; pager CPU %.0f us "
			       "per block\n",
			       r->mode, r->busy_threads ? " under load" : "",
			       r->ratio_vs_raw,
			       r->ratio_vs_raw >= 0.6 ? "met" : "MISSED",
			       r->cpu_pager_s >= 0 && r->bytes
				   ? r->cpu_pager_s * 1e6 /
					 ((double)r->bytes / r->block_bytes)
				   : -1.0);
	}
}

static void report(struct kvpb_ctx *c, unsigned first)
{
	unsigned i;

	ratios(c, first);
	for (i = first; i < c->nresults; i++) {
		if (c->opts.json)
			print_json(&c->results[i]);
		else
			print_row(&c->results[i]);
	}
	fflush(stdout);
}

/* ---- options ---------------------------------------------------------- */

/* The options: --help, getopt, the man page and the completion. */
static const struct kvp_cli_opt opts[] = {
	{ "dir", 'd', 0, "DIR", "backing file directory ($TMPDIR or /tmp)" },
	{ "budget", 'b', 0, "BYTES", "RAM budget (256M; --short 64M)" },
	{ "file-size", 'F', 0, "BYTES", "backing file size (4 x budget)" },
	{ "block", 'B', 0, "BYTES", "stream block (2M)" },
	{ "random-block", 'R', 0, "BYTES", "random block (64K)" },
	{ "depth", 'D', 0, "N",
	  "stream: reads in flight, raw's depth and\n"
	  "kvpager's readahead window (16)" },
	{ "ref-depth", 'r', 0, "N",
	  "random: depth of the raw anchor line (32;\n0: none)" },
	{ "reads", 'n', 0, "N", "random: reads per thread (file blocks / 4)" },
	{ "threads", 't', 0, "LIST", "random: thread counts (1,4)" },
	{ "modes", 'm', 0, "LIST",
	  "raw,mmap,kvpager-move,kvpager-copy (all);\n"
	  "touch: raw,mmap,kvpager,preload" },
	{ "pager-threads", 'P', 0, "N", "the pager's service_threads (its default)" },
	{ "prefetch", 'N', 0, NULL,
	  "kvpager stream: also prefetch the window\n"
	  "ahead (kvp_prefetch_submit); default:\n"
	  "demand faults and the pager's readahead" },
	{ "json", 'j', 'j', NULL, "one JSON object per line, no table" },
	{ "short", 's', 's', NULL, "smaller sizes (make bench)" },
	{ "repeat", 'k', 0, "N",
	  "runs per mode, interleaved; the median is\n"
	  "shown, with min and max in JSON (3)" },
	{ "timeout", 'T', 0, "S",
	  "a run with no progress for S seconds ends\n"
	  "the program (exit 3), saying where (60)" },
	{ "no-thp", 'H', 0, NULL,
	  "prctl(PR_SET_THP_DISABLE) for the whole\n"
	  "process (raw, mmap and the pager alike)" },
	{ "touches", 'u', 0, "N",
	  "touch: random touches per line, threads\n"
	  "together (8192; --short 2048)" },
	{ "touch-block", 'K', 0, "BYTES",
	  "touch: the kvpager region's block (2M)\n"
	  "and the shim's (its default if unset)" },
	{ "touch-prog", 'p', 0, "PATH",
	  "touch: touch_pages (found beside bin/:\n"
	  "tests/progs/, else libexec/kvpager/)" },
	{ "preload-lib", 'L', 0, "PATH",
	  "touch: libkvpager-preload.so (likewise)" },
	{ "busy", 'y', 0, NULL,
	  "random: a competing process spins one\n"
	  "thread on every CPU meanwhile (load)" },
	{ "plot", 'G', 0, "FILE",
	  "also draw the GB/s per mode into FILE,\n"
	  "an .svg or a .png (gnuplot); touch's\n"
	  "into FILE-touch.svg (.png) when it ran\n"
	  "with other scenarios" },
	{ "quiet", 'q', 'q', NULL, "no progress on stderr" },
	{ "help", 'h', 'h', NULL, "this text" },
	{ 0 },
};

static const struct kvp_cli_cmd scenarios[] = {
	{ "stream", "sequential reads (a default scenario)" },
	{ "random", "random reads (a default scenario)" },
	{ "install", "the pager's install modes, move and copy" },
	{ "touch", "4 KiB touches: raw, mmap in a cgroup, kvpager, preload" },
	{ "all", "stream, random, install and touch" },
	{ "decode", "decode through each backend, with its own options" },
	{ "compute", "the CPU-bound parts' rates, with its own options" },
	{ "tier", "a KV block from RAM, Redis and a cluster, own options" },
	{ NULL, NULL },
};

static void usage(FILE *out)
{
	fprintf(
	    out,
	    "usage: kvpbench [options] [stream] [random] [install] [touch] "
	    "[all]\n"
	    "       kvpbench decode [options]\n"
	    "       kvpbench compute [options]\n"
	    "       kvpbench tier [options]\n"
	    "\n"
	    "Runs raw io_uring O_DIRECT, the kernel's mmap (cold) and kvpager\n"
	    "(install by move and by copy) side by side on one backing file\n"
	    "and prints GB/s and ratios.  Default scenarios: stream random.\n"
	    "\n");
	kvp_cli_usage(out, opts);
	fprintf(out,
		"Environment: KVP_<TUNABLE>=value sets any pager tunable "
		"(kvpctl list);\nbudget and install_mode are forced.\n");
}

/* The numeric options (kvpb_num_opt_set): the field each sets. */
#define FIELD(f) KVPB_FIELD(struct kvpb_opts, f)
static const struct kvpb_num_opt num_opts[] = {
	{ 'b', "budget", true, 2u << 20, 1ull << 50, FIELD(budget) },
	{ 'F', "file-size", true, KVPB_PAGE, 1ull << 50, FIELD(file_bytes) },
	{ 'B', "block", true, KVPB_PAGE, 1u << 30, FIELD(block) },
	{ 'R', "random-block", true, KVPB_PAGE, 1u << 30, FIELD(rblock) },
	{ 'D', "depth", false, 1, 4096, FIELD(depth) },
	{ 'r', "ref-depth", false, 0, 4096, FIELD(ref_depth) },
	{ 'n', "reads", false, 1, 1u << 30, FIELD(reads) },
	{ 'P', "pager-threads", false, 1, 64, FIELD(pager_threads) },
	{ 'T', "timeout", false, 1, 86400, FIELD(timeout_s) },
	{ 'k', "repeat", false, 1, KVPB_MAX_REPEAT, FIELD(repeat) },
	{ 'u', "touches", false, 1, 1u << 30, FIELD(touches) },
	{ 'K', "touch-block", true, KVPB_PAGE, 2u << 20, FIELD(touch_block) },
	{ 0, NULL, false, 0, 0, 0, 0 },
};
#undef FIELD

/* --threads 1,4: each count whole, 1..KVPB_MAX_THREADS, at most @max. */
static int parse_threads(const char *s, unsigned *out, unsigned max,
			 unsigned *n)
{
	char buf[256], *rest = buf, *tok;
	uint64_t v;

	snprintf(buf, sizeof(buf), "%s", s);
	*n = 0;
	/* strsep, not strtok: "1,,4" has an empty count, refused. */
	while ((tok = strsep(&rest, ","))) {
		if (kvpb_parse_opt("threads", tok, false, 1, KVPB_MAX_THREADS,
				   &v))
			return -EINVAL;
		if (*n == max) {
			fprintf(stderr,
				"kvpbench: --threads: more than %u counts in "
				"'%s'\n",
				max, s);
			return -EINVAL;
		}
		out[(*n)++] = (unsigned)v;
	}
	return 0;
}

static int parse_modes(const char *s, unsigned *out)
{
	char buf[256], *tok, *save;

	snprintf(buf, sizeof(buf), "%s", s);
	*out = 0;
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (!strcmp(tok, "raw"))
			*out |= KVPB_RAW;
		else if (!strcmp(tok, "mmap"))
			*out |= KVPB_MMAP;
		else if (!strcmp(tok, "kvpager-move"))
			*out |= KVPB_KVP_MOVE;
		else if (!strcmp(tok, "kvpager-copy"))
			*out |= KVPB_KVP_COPY;
		else if (!strcmp(tok, "kvpager"))
			*out |= KVPB_KVP_MOVE | KVPB_KVP_COPY;
		else if (!strcmp(tok, "preload"))
			*out |= KVPB_PRELOAD;
		else
			return -EINVAL;
	}
	return *out ? 0 : -EINVAL;
}

enum { SC_STREAM = 1, SC_RANDOM = 2, SC_INSTALL = 4, SC_TOUCH = 8 };

/*
 * The smallest backing file each scenario of @scen can run on, checked
 * before the file is made: stream reads whole --blocks of at most 4 x
 * the budget; random gives each of its threads (4 with the raw anchor
 * line) --reads (1 by default) --random-blocks, none read twice; touch
 * a buffer of at most 8 x the budget, in units of 2 MiB (or --block), a
 * --block per thread.  0, or 2 (refused, with the size that works).
 */
static int sizes_check(const struct kvpb_opts *o, unsigned scen,
		       uint64_t file)
{
	static const char *const names[3] = { "stream", "random", "touch" };
	static const unsigned cap[3] = { 4, 0, 8 }; /* x the budget; 0: all */
	uint64_t need[3] = { 0 }, unit, x;
	unsigned maxt = 1, k, big;
	char why[3][160], h1[32], h2[32];

	for (k = 0; k < o->nthreads; k++)
		if (o->threads[k] > maxt)
			maxt = o->threads[k];
	kvp_format_bytes(o->block, h1, sizeof(h1));
	if (scen & SC_STREAM) {
		need[0] = o->block;
		snprintf(why[0], sizeof(why[0]), "whole --blocks of %s", h1);
	}
	if (scen & SC_TOUCH) {
		unit = o->block > (2u << 20) ? o->block : (2u << 20);
		x = (uint64_t)maxt * o->block;
		need[2] = (x + unit - 1) / unit * unit;
		kvp_format_bytes(unit, h2, sizeof(h2));
		snprintf(why[2], sizeof(why[2]),
			 "%u thread%s x a --block of %s, in units of %s", maxt,
			 maxt > 1 ? "s" : "", h1, h2);
	}
	if ((scen & SC_RANDOM) && maxt < 4 && o->ref_depth)
		maxt = 4; /* the anchor reads what 4 threads read */
	if (scen & SC_RANDOM) {
		x = o->reads ? o->reads : 1;
		need[1] = maxt * x * o->rblock;
		kvp_format_bytes(o->rblock, h1, sizeof(h1));
		snprintf(why[1], sizeof(why[1]),
			 "%u thread%s x %llu read%s of a --random-block of "
			 "%s, no block read twice",
			 maxt, maxt > 1 ? "s" : "", (unsigned long long)x, x > 1 ? "s" : "", h1);
	}
	for (k = 0, big = 0; k < 3; k++) {
		if (need[k] > need[big])
			big = k;
		if (need[k] && cap[k] && cap[k] * o->budget < need[k]) {
			x = (need[k] + cap[k] * (1ull << 20) - 1) /
			    (cap[k] * (1ull << 20)) << 20;
			kvp_format_bytes(o->budget, h1, sizeof(h1));
			kvp_format_bytes(x, h2, sizeof(h2));
			fprintf(stderr,
				"kvpbench: %s: it reads at most %u x the "
				"budget of %s, too little for %s: use --budget "
				"%s or more\n",
				names[k], cap[k], h1, why[k], h2);
			return 2;
		}
	}
	/* the largest need, which every scenario's fits in */
	if (need[big] > file) {
		kvp_format_bytes(file, h1, sizeof(h1));
		kvp_format_bytes(need[big], h2, sizeof(h2));
		fprintf(stderr,
			"kvpbench: %s: a backing file of %s is too small for "
			"%s: use --file-size %s or more\n",
			names[big], h1, why[big], h2);
		return 2;
	}
	return 0;
}

/* The scenarios that run alone, with options of their own. */
struct alone {
	const char *name;
	int (*run)(int argc, char **argv); /* NULL: its file not linked */
};

static const struct alone *alone_scenario(const char *name)
{
	static const struct alone alone[] = {
		{ "decode", kvpbench_decode },
		{ "compute", kvpbench_compute },
		{ "tier", kvpbench_tier },
	};

	for (size_t i = 0; i < sizeof(alone) / sizeof(alone[0]); i++)
		if (!strcmp(name, alone[i].name))
			return &alone[i];
	return NULL;
}

static int run_alone(const struct alone *a, int argc, char **argv)
{
	if (!a->run) {
		fprintf(stderr,
			"kvpbench: %s scenario not built (no "
			"tools/kvpbench/%s.c)\n",
			a->name, a->name);
		return 2;
	}
	return a->run(argc, argv);
}

int main(int argc, char **argv)
{
	struct option lopts[sizeof(opts) / sizeof(opts[0])];
	char shorts[3 * sizeof(opts) / sizeof(opts[0]) + 1];
	static struct kvpb_ctx ctx;
	struct kvpb_ctx *c = &ctx;
	struct kvpb_opts *o = &c->opts;
	bool budget_set = false;
	unsigned scen = 0, first;
	const char *tmp;
	int opt, i, err;

	if (kvp_cli_table_asked(argc, argv)) {
		kvp_cli_cmds_print(stdout, NULL, scenarios);
		kvp_cli_table_print(stdout, NULL, opts);
		if (kvpbench_decode)
			kvpbench_decode(argc, argv);
		if (kvpbench_compute)
			kvpbench_compute(argc, argv);
		if (kvpbench_tier)
			kvpbench_tier(argc, argv);
		return 0;
	}
	if (argc > 1 && alone_scenario(argv[1]))
		return run_alone(alone_scenario(argv[1]), argc - 1, argv + 1);

	tmp = getenv("TMPDIR");
	o->dir = tmp && *tmp ? tmp : "/tmp";
	o->budget = 256ull << 20;
	o->block = 2u << 20;
	o->rblock = 64u << 10;
	o->depth = 16;
	o->ref_depth = 32;
	o->repeat = 3;
	o->timeout_s = 60;
	o->threads[0] = 1;
	o->threads[1] = 4;
	o->nthreads = 2;
	o->modes = KVPB_RAW | KVPB_MMAP | KVPB_KVP_MOVE | KVPB_KVP_COPY |
		   KVPB_PRELOAD;

	kvp_cli_getopt(opts, "", lopts, shorts);
	while ((opt = getopt_long(argc, argv, shorts, lopts, NULL)) != -1) {
		err = kvpb_num_opt_set(num_opts, opt, optarg, o);
		if (err == -EINVAL)
			return 2;
		if (!err) {
			budget_set |= opt == 'b';
			continue;
		}
		switch (opt) {
		case 'd':
			o->dir = optarg;
			break;
		case 't':
			if (parse_threads(optarg, o->threads, 8, &o->nthreads))
				return 2;
			break;
		case 'm':
			if (parse_modes(optarg, &o->modes)) {
				fprintf(stderr,
					"kvpbench: bad value for --modes: "
					"'%s' (a comma-separated list of raw, "
					"mmap, kvpager-move, kvpager-copy, "
					"kvpager, preload)\n",
					optarg);
				return 2;
			}
			break;
		case 'p':
			o->touch_prog = optarg;
			break;
		case 'L':
			o->preload_lib = optarg;
			break;
		case 'y':
			o->busy = true;
			break;
		case 'N':
			o->prefetch = true;
			break;
		case 'j':
			o->json = true;
			break;
		case 's':
			o->short_run = true;
			break;
		case 'q':
			o->quiet = true;
			break;
		case 'H':
			o->no_thp = true;
			break;
		case 'G':
			o->plot = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	for (i = optind; i < argc; i++) {
		if (!strcmp(argv[i], "stream"))
			scen |= SC_STREAM;
		else if (!strcmp(argv[i], "random"))
			scen |= SC_RANDOM;
		else if (!strcmp(argv[i], "install"))
			scen |= SC_INSTALL;
		else if (!strcmp(argv[i], "touch"))
			scen |= SC_TOUCH;
		else if (!strcmp(argv[i], "all"))
			scen |= SC_STREAM | SC_RANDOM | SC_INSTALL | SC_TOUCH;
		else if (alone_scenario(argv[i])) {
			fprintf(stderr,
				"kvpbench: %s runs alone, with its own "
				"options: kvpbench %s ...\n",
				argv[i], argv[i]);
			return 2;
		} else {
			fprintf(stderr, "kvpbench: unknown scenario '%s'\n",
				argv[i]);
			usage(stderr);
			return 2;
		}
	}
	if (!scen)
		scen = SC_STREAM | SC_RANDOM;
	/* before the runs: a plot that cannot be made is said now */
	if (o->plot && kvp_plot_check("kvpbench", o->plot))
		return 2;
	thp_off = o->no_thp;
	if (o->no_thp && prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)) {
		fprintf(stderr, "kvpbench: --no-thp: prctl: %s\n",
			strerror(errno));
		return 1;
	}
	if ((o->block & (o->block - 1)) || (o->rblock & (o->rblock - 1)) ||
	    (o->touch_block & (o->touch_block - 1))) {
		fprintf(stderr, "kvpbench: --block, --random-block and "
				"--touch-block take a power of two\n");
		return 2;
	}
	if (o->short_run && !budget_set)
		o->budget = 64ull << 20;
	/* touch's buffer is 8 x the budget; the others use 4 x. */
	c->file.size = o->file_bytes		 ? o->file_bytes
		       : (scen & SC_TOUCH) ? 8 * o->budget
					   : 4 * o->budget;
	c->file.fd = c->file.dfd = -1;
	if (sizes_check(o, scen, c->file.size))
		return 2;

	if ((scen & SC_INSTALL) && !kvpb_install) {
		fprintf(stderr, "kvpbench: install scenario not built (no "
				"pager_modes.c)\n");
		scen &= ~SC_INSTALL;
		c->failures++;
	}
	if (scen & (SC_STREAM | SC_RANDOM | SC_TOUCH)) {
		err = file_create(c);
		if (err)
			return 1;
		if (!o->json)
			printf("kvpbench: backing file %llu MiB in %s (%s), "
			       "budget %llu MiB%s%s\n",
			       (unsigned long long)(c->file.size >> 20), o->dir,
			       c->file.direct ? "O_DIRECT" : "buffered",
			       (unsigned long long)(o->budget >> 20),
			       o->short_run ? ", short run" : "",
			       o->no_thp ? ", THP disabled" : "");
	}
	if (!o->json && (scen & ~SC_TOUCH))
		print_header();
	if (scen & SC_STREAM) {
		first = c->nresults;
		if (kvpb_stream(c))
			c->failures++;
		report(c, first);
	}
	if (scen & SC_RANDOM) {
		first = c->nresults;
		if (kvpb_random(c))
			c->failures++;
		report(c, first);
	}
	if ((scen & SC_TOUCH) && kvpb_touch(c))
		c->failures++;
	file_close(&c->file);
	if (scen & SC_INSTALL) {
		first = c->nresults;
		if (kvpb_install(c))
			c->failures++;
		report(c, first);
	}
	if (!o->json)
		print_targets(c);
	/* a plot that failed says so; the figures above stand */
	err = o->plot && (scen & ~SC_TOUCH) ? kvpb_plot_results(c, o->plot)
					     : 0;
	if (o->plot && (scen & SC_TOUCH)) {
		/* touch's lines are a chart of their own: FILE when touch
		 * ran alone, else FILE-touch.svg (kvp_plot_check took only
		 * names ending in .svg or .png) */
		size_t n = strlen(o->plot) - 4;
		char tf[PATH_MAX];

		snprintf(tf, sizeof(tf), "%.*s%s%s", (int)n, o->plot,
			 scen == SC_TOUCH ? "" : "-touch", o->plot + n);
		err = kvpb_touch_plot(c, tf) || err;
	}
	if (c->failures)
		fprintf(stderr,
			"kvpbench: %d mode%s failed or read wrong "
			"data\n",
			c->failures, c->failures > 1 ? "s" : "");
	return c->failures || err ? 1 : 0;
}
