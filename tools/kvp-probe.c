/*
 * kvp-probe - say which kernel facilities the pager can use here.
 *
 * One line per facility: "ok" or "missing", a detail, and the remedy when
 * missing.  --json prints one JSON object per line.  --path DIR probes
 * O_DIRECT where the backing file would live (default $TMPDIR or /tmp).
 * Exits 0 when the pager can run (a userfaultfd in some mode and io_uring
 * reads), 1 otherwise, saying why.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kmod-helpers/dio.h"
#include "kmod-helpers/mem.h"
#include "kmod-helpers/uffd.h"
#include "kmod-helpers/uring.h"

static bool json;

static void report(const char *name, bool ok, const char *detail,
		   const char *remedy)
{
	if (json) {
		printf("{\"facility\":\"%s\",\"available\":%s,\"detail\":\"%s\","
		       "\"remedy\":\"%s\"}\n",
		       name, ok ? "true" : "false", detail,
		       ok ? "" : (remedy ? remedy : ""));
		return;
	}
	printf("%-26s %-8s %s", name, ok ? "ok" : "missing", detail);
	if (!ok && remedy)
		printf(" (remedy: %s)", remedy);
	printf("\n");
}

static bool probe_uffd(void)
{
	static const struct {
		uint64_t bit;
		const char *why;
	} bits[] = {
		{ UFFD_FEATURE_MOVE, "zero-copy install of blocks" },
		{ UFFD_FEATURE_POISON, "SIGBUS on blocks whose read failed" },
		{ UFFD_FEATURE_PAGEFAULT_FLAG_WP, "dirty tracking" },
		{ UFFD_FEATURE_WP_ASYNC, "cheap dirty tracking via pagemap" },
		{ UFFD_FEATURE_MINOR_SHMEM, "minor faults on shmem" },
		{ UFFD_FEATURE_THREAD_ID, "fault thread ids" },
		{ UFFD_FEATURE_EVENT_REMOVE, "MADV_DONTNEED reads zeros" },
		{ UFFD_FEATURE_EVENT_UNMAP, "munmap forgets blocks" },
	};
	struct kvp_uffd u;
	uint64_t features = 0;
	char detail[256], name[64];
	int err;

	err = kvp_uffd_open(&u, 0);
	if (err) {
		snprintf(detail, sizeof(detail), "cannot open: %s",
			 strerror(-err));
		report("userfaultfd", false, detail,
		       "run as root, or give CAP_SYS_PTRACE, or chmod "
		       "/dev/userfaultfd, or sysctl vm.unprivileged_userfaultfd=1");
		return false;
	}
	if (u.mode == KVP_UFFD_FULL)
		snprintf(detail, sizeof(detail),
			 "full mode via %s: faults taken inside the kernel "
			 "(read(2), O_DIRECT into a region) are served",
			 u.source);
	else
		snprintf(detail, sizeof(detail),
			 "user-mode-only via %s: read(2) or O_DIRECT I/O into "
			 "a non-resident page fails with EFAULT",
			 u.source);
	report("userfaultfd", true, detail, NULL);
	kvp_uffd_close(&u);
	if (u.mode != KVP_UFFD_FULL)
		report("userfaultfd full mode", false, "not granted",
		       "run as root or with CAP_SYS_PTRACE, or make "
		       "/dev/userfaultfd readable and writable");

	err = kvp_uffd_supported(&features, NULL);
	for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++) {
		snprintf(name, sizeof(name), "uffd %s",
			 kvp_uffd_feature_name(bits[i].bit));
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
	       "a kernel with io_uring enabled (sysctl kernel.io_uring_disabled=0)");
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		snprintf(name, sizeof(name), "io_uring op %s", ops[i].name);
		report(name, kvp_uring_supports(ops[i].op), "", "a newer kernel");
	}
	return read_ok;
}

static void probe_dio(const char *dir)
{
	char path[4096], detail[512];
	struct kvp_dio_align a;
	bool direct = false;
	int fd;

	snprintf(path, sizeof(path), "%s/kvp-probe-XXXXXX", dir);
	fd = mkstemp(path);
	if (fd < 0) {
		snprintf(detail, sizeof(detail), "cannot create a file in %s: %s",
			 dir, strerror(errno));
		report("O_DIRECT", false, detail, "pass --path a writable dir");
		return;
	}
	close(fd);
	fd = kvp_dio_open(path, O_RDWR, 0600, &direct);
	unlink(path);
	if (fd < 0) {
		snprintf(detail, sizeof(detail), "cannot open in %s: %s", dir,
			 strerror(-fd));
		report("O_DIRECT", false, detail, "pass --path a writable dir");
		return;
	}
	if (kvp_dio_alignment(fd, &a) == 0)
		snprintf(detail, sizeof(detail),
			 "%s: memory align %u, offset align %u (%s)", dir,
			 a.mem_align, a.offset_align, a.source);
	else
		snprintf(detail, sizeof(detail), "%s", dir);
	close(fd);
	report("O_DIRECT", direct, detail,
	       "this filesystem refuses O_DIRECT (tmpfs?): the pager falls "
	       "back to buffered I/O; put the backing file on a disk");
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
		       detail, "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled");
	} else {
		report("transparent hugepages", false, "not in this kernel",
		       "2 MiB blocks are installed as 4 KiB pages");
	}
	report("/dev/fuse", access("/dev/fuse", R_OK | W_OK) == 0,
	       "the debug view", "modprobe fuse, or run with /dev/fuse");
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

int main(int argc, char **argv)
{
	const char *dir = getenv("TMPDIR");
	bool uffd_ok, uring_ok;

	if (!dir || !*dir)
		dir = "/tmp";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = true;
		} else if (!strcmp(argv[i], "--path") && i + 1 < argc) {
			dir = argv[++i];
		} else {
			fprintf(stderr,
				"usage: kvp-probe [--json] [--path DIR]\n");
			return 2;
		}
	}
	uffd_ok = probe_uffd();
	uring_ok = probe_uring();
	probe_dio(dir);
	probe_misc();
	if (!uffd_ok || !uring_ok) {
		fprintf(stderr, "kvp-probe: the pager cannot run here: %s\n",
			!uffd_ok ? "no userfaultfd" : "no io_uring reads");
		return 1;
	}
	if (!json)
		printf("kvp-probe: the pager can run here\n");
	return 0;
}
