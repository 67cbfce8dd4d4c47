/*
 * kvp-probe - say which kernel facilities the pager can use here.
 *
 * One line per facility: "ok" or "missing", a detail, and the remedy when
 * missing.  --json prints the same as one JSON object per line, ending with
 * the facility "pager" whose "available" says whether the pager can run.
 * --path PATH probes O_DIRECT where the backing file would live: a
 * directory, as kvpager run --path takes (a temporary file is made in it;
 * default $TMPDIR or /tmp).  Exits 0 when the pager can run (a userfaultfd in some
 * mode, io_uring reads, and a usable backing path), 1 otherwise, saying why.
 */
#include <errno.h>
#include <getopt.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kmod-helpers/dio.h"
#include "kmod-helpers/mem.h"
#include "kmod-helpers/uffd.h"
#include "kmod-helpers/uring.h"
#include "lib/cli/cli.h"
#include "pager/pager.h"

static bool json;

/* A JSON string: quotes, backslashes and control bytes escaped. */
static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static void report(const char *name, bool ok, const char *detail,
		   const char *remedy)
{
	if (json) {
		printf("{\"facility\":");
		json_str(name);
		printf(",\"available\":%s,\"detail\":", ok ? "true" : "false");
		json_str(detail);
		printf(",\"remedy\":");
		json_str(ok || !remedy ? "" : remedy);
		printf("}\n");
		return;
	}
	printf("%-26s %-8s %s", name, ok ? "ok" : "missing", detail);
	if (!ok && remedy)
		printf(" (remedy: %s)", remedy);
	printf("\n");
}

static const char *uffd_mode_name;

/* One line for one way of opening a userfaultfd. */
static bool probe_uffd_via(enum kvp_uffd_via via, const char *name,
			   const char *what, const char *remedy)
{
	struct kvp_uffd u;
	char detail[256];
	int err = kvp_uffd_open_via(&u, via);

	if (!err)
		err = kvp_uffd_api(&u, 0, 0);
	kvp_uffd_close(&u);
	if (err)
		snprintf(detail, sizeof(detail), "%s: %s", what,
			 strerror(-err));
	else
		snprintf(detail, sizeof(detail), "%s", what);
	report(name, !err, detail, remedy);
	return !err;
}

static bool probe_uffd(void)
{
	static const struct {
		uint64_t bit;
		const char *label;
		const char *why;
	} bits[] = {
		{ UFFD_FEATURE_MOVE, "MOVE", "zero-copy install of blocks" },
		{ UFFD_FEATURE_POISON, "POISON",
		  "SIGBUS on blocks whose read failed" },
		{ UFFD_FEATURE_PAGEFAULT_FLAG_WP, "WP", "dirty tracking" },
		{ UFFD_FEATURE_WP_ASYNC, "WP_ASYNC",
		  "cheap dirty tracking via pagemap" },
		{ UFFD_FEATURE_MINOR_SHMEM, "MINOR_SHMEM",
		  "minor faults on shmem" },
		{ UFFD_FEATURE_THREAD_ID, "THREAD_ID", "fault thread ids" },
		{ UFFD_FEATURE_EVENT_REMOVE, "EVENT_REMOVE",
		  "MADV_DONTNEED reads zeros" },
		{ UFFD_FEATURE_EVENT_UNMAP, "EVENT_UNMAP",
		  "munmap forgets blocks" },
	};
	const char *full_remedy =
	    "run as root or with CAP_SYS_PTRACE, or sysctl "
	    "vm.unprivileged_userfaultfd=1, or make /dev/userfaultfd "
	    "readable and writable by this user";
	struct kvp_uffd u;
	uint64_t features = 0;
	char detail[256], name[64];
	int err;

	probe_uffd_via(KVP_UFFD_VIA_SYSCALL, "userfaultfd syscall",
		       "userfaultfd(2), full mode", full_remedy);
	probe_uffd_via(KVP_UFFD_VIA_DEVICE, "userfaultfd device",
		       "/dev/userfaultfd, full mode",
		       "chmod or chgrp /dev/userfaultfd for this user "
		       "(Linux 6.1+)");
	probe_uffd_via(KVP_UFFD_VIA_SYSCALL_USER, "userfaultfd user-mode",
		       "userfaultfd(UFFD_USER_MODE_ONLY)",
		       "a kernel with userfaultfd (5.11+ for user-mode-only)");

	/* The mode the pager will get: kvp_uffd_open's own choice. */
	err = kvp_uffd_open(&u, 0);
	if (err) {
		snprintf(detail, sizeof(detail), "none: cannot open: %s",
			 strerror(-err));
		report("userfaultfd mode", false, detail,
		       "run as root, or give CAP_SYS_PTRACE, or chmod "
		       "/dev/userfaultfd, or sysctl "
		       "vm.unprivileged_userfaultfd=1");
		return false;
	}
	if (u.mode == KVP_UFFD_FULL) {
		uffd_mode_name = "full";
		snprintf(detail, sizeof(detail),
			 "full via %s: faults taken inside the kernel "
			 "(read(2), O_DIRECT into a region) are served",
			 u.source);
		report("userfaultfd mode", true, detail, NULL);
	} else {
		uffd_mode_name = "user-mode-only";
		snprintf(detail, sizeof(detail),
			 "user-mode-only via userfaultfd(UFFD_USER_MODE_ONLY): "
			 "costs that kernel accesses to a non-resident page "
			 "(read(2), write(2), O_DIRECT into a region) fail "
			 "with EFAULT instead of faulting it in");
		/* It runs, but say what full mode would take. */
		report("userfaultfd mode", true, detail, NULL);
		report("userfaultfd full mode", false, "not granted",
		       full_remedy);
	}
	kvp_uffd_close(&u);

	err = kvp_uffd_supported(&features, NULL);
	for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++) {
		snprintf(name, sizeof(name), "uffd %s", bits[i].label);
		report(name, !err && (features & bits[i].bit), bits[i].why,
		       "a newer kernel (MOVE 6.8, POISON 6.6, WP_ASYNC 6.7)");
	}
	return true;
}

static bool probe_uring(void)
{
	static const struct {
		int op;
		const char *name;
	} ops[] = {
		{ IORING_OP_READ, "READ" },
		{ IORING_OP_WRITE, "WRITE" },
		{ IORING_OP_READ_FIXED, "READ_FIXED" },
		{ IORING_OP_WRITE_FIXED, "WRITE_FIXED" },
		{ IORING_OP_FSYNC, "FSYNC" },
	};
	char name[64];
	bool read_ok = kvp_uring_supports(IORING_OP_READ);

	report("io_uring", read_ok, "store reads and writes",
	       "a kernel with io_uring enabled (sysctl "
	       "kernel.io_uring_disabled=0)");
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		snprintf(name, sizeof(name), "io_uring op %s", ops[i].name);
		report(name, kvp_uring_supports(ops[i].op), "",
		       "a newer kernel");
	}
	return read_ok;
}

/* A name for the filesystem holding @fd, for the O_DIRECT line. */
static const char *fs_name(int fd)
{
	static const struct {
		long magic;
		const char *name;
	} fs[] = {
		{ 0xEF53, "ext4" },	 { 0x58465342, "xfs" },
		{ 0x9123683E, "btrfs" }, { 0x01021994, "tmpfs" },
		{ 0x858458F6, "ramfs" }, { 0x9FA0, "proc" },
		{ 0x62656572, "sysfs" }, { 0x794C7630, "overlayfs" },
		{ 0x65735546, "fuse" },	 { 0x6969, "nfs" },
		{ 0x1021994, "tmpfs" },	 { 0x01021997, "9p" },
		{ 0xF2F52010, "f2fs" },	 { 0x2FC12FC1, "zfs" },
	};
	struct statfs st;

	if (fstatfs(fd, &st))
		return "unknown";
	for (size_t i = 0; i < sizeof(fs) / sizeof(fs[0]); i++)
		if ((long)st.f_type == fs[i].magic)
			return fs[i].name;
	return "unknown";
}

/*
 * O_DIRECT where the backing file would live: @where is a directory (a
 * temporary file is made there).  Returns false when the path cannot hold
 * a backing file at all (missing, not a directory, not writable); a
 * filesystem that refuses O_DIRECT still works, buffered.
 */
static bool probe_dio(const char *where, char *why, size_t whylen)
{
	char path[4096], detail[640];
	struct kvp_dio_align a;
	bool direct = false;
	struct stat st;
	int fd;

	if (stat(where, &st)) {
		snprintf(detail, sizeof(detail), "%s: %s", where,
			 errno == ENOENT ? "no such file or directory"
					 : strerror(errno));
		report("O_DIRECT", false, detail,
		       "pass --path an existing directory on the disk that "
		       "will hold the backing file");
		snprintf(why, whylen, "the backing path %s: %s", where,
			 strerror(errno));
		return false;
	}
	/* kvpager run --path makes its backing file in a directory */
	if (!S_ISDIR(st.st_mode)) {
		snprintf(detail, sizeof(detail), "%s: not a directory", where);
		report("O_DIRECT", false, detail,
		       "pass --path the directory that will hold the backing "
		       "file, as kvpager run --path takes");
		snprintf(why, whylen, "the backing path %s: %s", where,
			 strerror(ENOTDIR));
		return false;
	}
	snprintf(path, sizeof(path), "%s/kvp-probe-XXXXXX", where);
	fd = mkstemp(path);
	if (fd < 0) {
		snprintf(detail, sizeof(detail), "cannot create a file in %s: %s",
			 where, strerror(errno));
		report("O_DIRECT", false, detail,
		       "pass --path a writable directory");
		snprintf(why, whylen, "cannot create a backing file in %s: %s",
			 where, strerror(errno));
		return false;
	}
	close(fd);
	fd = kvp_dio_open(path, O_RDWR, 0600, &direct);
	unlink(path);
	if (fd < 0) {
		snprintf(detail, sizeof(detail), "cannot open %s: %s", where,
			 strerror(-fd));
		report("O_DIRECT", false, detail,
		       "pass --path a readable and writable directory");
		snprintf(why, whylen, "cannot open %s: %s", where,
			 strerror(-fd));
		return false;
	}
	if (!direct) {
		snprintf(detail, sizeof(detail),
			 "%s: this filesystem (%s) refuses O_DIRECT; the "
			 "pager falls back to buffered I/O",
			 where, fs_name(fd));
	} else if (kvp_dio_alignment(fd, &a) == 0) {
		direct = a.direct;
		snprintf(detail, sizeof(detail),
			 "%s (%s): memory align %u, offset align %u (%s)",
			 where, fs_name(fd), a.mem_align, a.offset_align,
			 a.source);
	} else {
		snprintf(detail, sizeof(detail), "%s (%s)", where, fs_name(fd));
	}
	close(fd);
	report("O_DIRECT", direct, detail,
	       "put the backing file on a disk filesystem (ext4, xfs) with "
	       "--path");
	return true;
}

/* How clean blocks of copy-mode regions leave (pager/zap.c). */
static void probe_zap(void)
{
	char detail[256];
	int pidfd = kvp_mem_self_pidfd(), err;

	err = pidfd < 0 ? pidfd : kvp_mem_batch_dontneed_works(pidfd);
	if (pidfd >= 0)
		close(pidfd);
	if (!err) {
		report("process_madvise DONTNEED", true,
		       "clean evictions drop blocks in batches, one TLB flush "
		       "per batch",
		       NULL);
		return;
	}
	snprintf(detail, sizeof(detail),
		 "%s: every eviction moves its pages back, one TLB flush per "
		 "page (slower random reads in copy mode)",
		 strerror(-err));
	report("process_madvise DONTNEED", false, detail,
	       "a kernel whose process_madvise takes MADV_DONTNEED");
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/*
 * Map @len bytes of 4 KiB pages, populated, for a measuring probe.  On
 * failure the probe's line @name says why, and NULL is returned.
 */
static void *measure_range(const char *name, size_t len)
{
	char detail[256];
	void *mem;
	int err;

	err = kvp_mem_reserve(len, KVP_PAGE_SIZE, false, &mem);
	if (!err) {
		err = kvp_mem_advise(mem, len, MADV_NOHUGEPAGE);
		if (!err)
			err = kvp_mem_populate(mem, len);
		if (err)
			kvp_mem_release(mem, len);
	}
	if (!err)
		return mem;
	snprintf(detail, sizeof(detail), "cannot map a %zu KiB test range: %s",
		 len >> 10, strerror(-err));
	report(name, false, detail, "none needed: this line only measures");
	return NULL;
}

/*
 * What the program pays the first time it touches a page the pager has
 * just mapped.  In a guest whose hypervisor shadows page tables that is a
 * trap per 4 KiB mapping, however the page got there (here: populated in
 * advance, then read twice); a huge page is one mapping.  Each block
 * installed from 4 KiB pages pays it once per page, on the program's CPU.
 * The pager measures the same at open and picks how blocks of a huge page
 * go in from it (install_mode auto): the second line says what it picks.
 */
static void probe_first_touch(void)
{
	enum { BLOCK_PAGES = (64 << 10) / KVP_PAGE_SIZE };
	struct kvp_mem_touch_cost c;
	char detail[256];
	bool moves;
	int err = kvp_mem_touch_cost(KVP_MEM_TOUCH_COST_PAGES, &c);

	if (err) {
		snprintf(detail, sizeof(detail),
			 "cannot map a %u KiB test range: %s",
			 2 * KVP_MEM_TOUCH_COST_PAGES * 4, strerror(-err));
		report("page first touch", false, detail,
		       "none needed: this line only measures");
		snprintf(detail, sizeof(detail),
			 "2 MiB blocks go in by move (not measured: %s); "
			 "smaller ones by copy",
			 strerror(-err));
		report("install auto", true, detail, NULL);
		return;
	}
	snprintf(detail, sizeof(detail),
		 "%.2f us per 4 KiB page the first time it is read after "
		 "being mapped (%.2f us after): %.0f us per 64 KiB block "
		 "installed, on the program's CPU",
		 c.first_us, c.again_us, c.first_us * BLOCK_PAGES);
	report("page first touch", true, detail, NULL);
	moves = kvp_install_auto_moves(KVP_HUGE_SIZE, c.first_us, c.copy_us);
	snprintf(detail, sizeof(detail),
		 "2 MiB blocks go in by %s: a page's first touch costs %s "
		 "than copying it (%.2f us); smaller ones by copy",
		 moves ? "move" : "copy", moves ? "no less" : "less",
		 c.copy_us);
	report("install auto", true, detail, NULL);
}

/*
 * What dropping a 64 KiB block's pages costs, alone and in a batch.  The
 * kernel flushes a range of up to 33 pages page by page, and a guest pays
 * a trap for each flush: that is why a 64 KiB block installed or evicted
 * by UFFDIO_MOVE (a flush per page) is slow here, and why clean blocks
 * leave in batches of process_madvise (one flush for all).
 */
static void probe_tlb_flush(void)
{
	enum { RANGES = 64, RANGE = 64 << 10, BATCH = 16 };
	size_t len = (size_t)RANGES * RANGE, done;
	struct iovec iov[BATCH];
	double t0, t1, t2 = 0, t3 = 0;
	char detail[256], batch[96] = "";
	void *mem = measure_range("tlb flush", len);
	int pidfd;

	if (!mem)
		return;
	/* Half the ranges one call each, half in batches of BATCH. */
	t0 = now_us();
	for (int i = 0; i < RANGES / 2; i++)
		(void)kvp_mem_advise((char *)mem + (size_t)i * RANGE, RANGE,
				     MADV_DONTNEED);
	t1 = now_us();
	pidfd = kvp_mem_self_pidfd();
	if (pidfd >= 0 && kvp_mem_batch_dontneed_works(pidfd) == 0) {
		t2 = now_us();
		for (int i = RANGES / 2; i < RANGES; i += BATCH) {
			for (int k = 0; k < BATCH; k++) {
				iov[k].iov_base =
				    (char *)mem + (size_t)(i + k) * RANGE;
				iov[k].iov_len = RANGE;
			}
			(void)kvp_mem_advise_batch(pidfd, iov, BATCH,
						   MADV_DONTNEED, &done);
		}
		t3 = now_us();
		snprintf(batch, sizeof(batch),
			 "; in batches of %d, %.1f us each", BATCH,
			 (t3 - t2) / (RANGES / 2));
	}
	if (pidfd >= 0)
		close(pidfd);
	kvp_mem_release(mem, len);
	snprintf(detail, sizeof(detail),
		 "a 64 KiB range dropped alone: %.1f us (%.2f us per page "
		 "flushed)%s",
		 (t1 - t0) / (RANGES / 2),
		 (t1 - t0) / (RANGES / 2) / (RANGE / KVP_PAGE_SIZE), batch);
	report("tlb flush", true, detail, NULL);
}

static void probe_misc(void)
{
	char buf[64], detail[256];
	struct rlimit rl;
	FILE *f;
	long maps = -1;

	if (kvp_thp_mode(buf, sizeof(buf)) == 0) {
		snprintf(detail, sizeof(detail), "mode %s", buf);
		report("transparent hugepages", strcmp(buf, "never") != 0,
		       detail,
		       "echo madvise > "
		       "/sys/kernel/mm/transparent_hugepage/enabled");
	} else {
		report("transparent hugepages", false, "not in this kernel",
		       "2 MiB blocks are installed as 4 KiB pages");
	}
	probe_zap();
	probe_first_touch();
	probe_tlb_flush();
	if (access("/dev/fuse", F_OK))
		report("/dev/fuse", false, "the debug view: no such device",
		       "modprobe fuse, or give the container /dev/fuse");
	else
		report("/dev/fuse", access("/dev/fuse", R_OK | W_OK) == 0,
		       "the debug view",
		       "chmod 0666 /dev/fuse (its usual mode) for this user");
	report("fusermount3",
	       system("command -v fusermount3 >/dev/null 2>&1") == 0,
	       "mounting the debug view", "apt-get install fuse3");
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
		snprintf(detail, sizeof(detail), "%llu bytes",
			 (unsigned long long)rl.rlim_cur);
		report("RLIMIT_MEMLOCK", true, detail, NULL);
	}
	f = fopen("/proc/sys/vm/max_map_count", "re");
	if (f) {
		if (fscanf(f, "%ld", &maps) != 1)
			maps = -1;
		fclose(f);
	}
	snprintf(detail, sizeof(detail), "%ld mappings (bounds the regions)",
		 maps);
	report("vm.max_map_count", maps > 0, detail, "sysctl vm.max_map_count");
	report("CUDA device", access("/dev/nvidia0", F_OK) == 0,
	       "the GPU attention path (optional)",
	       "none here; the CPU path is used");
}

/* The options: --help, the man page and the completion. */
static const struct kvp_cli_opt opts[] = {
	{ "json", 'j', 0, NULL, "one JSON object per check, on stdout" },
	{ "path", 'p', 0, "PATH",
	  "the directory whose O_DIRECT support is tested\n"
	  "(where the backing file would go; $TMPDIR or /tmp)" },
	{ "help", 'h', 0, NULL, "this text" },
	{ 0 },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: kvp-probe [--json] [--path PATH]\n"
		   "Checks what the pager needs of this machine and says "
		   "whether it can run.\n");
	kvp_cli_usage(f, opts);
}

int main(int argc, char **argv)
{
	struct option lo[sizeof(opts) / sizeof(opts[0])];
	char shorts[3 * sizeof(opts) / sizeof(opts[0]) + 1];
	int c;
	const char *dir = getenv("TMPDIR");
	bool uffd_ok, uring_ok, path_ok;
	char why[512] = "", path_why[4200] = "";

	if (kvp_cli_table_asked(argc, argv)) {
		kvp_cli_table_print(stdout, NULL, opts);
		return 0;
	}
	if (!dir || !*dir)
		dir = "/tmp";
	kvp_cli_getopt(opts, "", lo, shorts);
	while ((c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
		switch (c) {
		case 'j':
			json = true;
			break;
		case 'p':
			dir = optarg;
			if (!*dir) {
				fprintf(stderr, "kvp-probe: --path: empty "
						"value; accepted: a directory "
						"to test\n");
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvp-probe: unexpected argument '%s'\n",
			argv[optind]);
		usage(stderr);
		return 2;
	}
	uffd_ok = probe_uffd();
	uring_ok = probe_uring();
	path_ok = probe_dio(dir, path_why, sizeof(path_why));
	probe_misc();
	if (!uffd_ok)
		snprintf(why, sizeof(why), "no userfaultfd");
	else if (!uring_ok)
		snprintf(why, sizeof(why), "no io_uring reads");
	else if (!path_ok)
		snprintf(why, sizeof(why), "%.500s", path_why);
	if (json) {
		char detail[600];

		snprintf(detail, sizeof(detail), "userfaultfd mode %s%s%s",
			 uffd_mode_name ? uffd_mode_name : "none",
			 *why ? "; cannot run: " : "", why);
		report("pager", !*why, detail, *why ? why : NULL);
	}
	if (*why) {
		fprintf(stderr, "kvp-probe: the pager cannot run here: %s\n",
			why);
		return 1;
	}
	if (!json)
		printf("kvp-probe: the pager can run here (userfaultfd %s)\n",
		       uffd_mode_name);
	return 0;
}
