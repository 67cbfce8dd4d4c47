/*
 * test_mem.c - kmod-helpers/mem.c: aligned reservations, populate,
 * madvise, memfd, the THP mode.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kmod-helpers/mem.h"
#include "tests/helpers/helpers.h"

#define PG   KVP_PAGE_SIZE
#define HUGE KVP_HUGE_SIZE
#define GIG  (1UL << 30)

/* The value of field @key ("AnonHugePages:", "VmFlags:") of the VMA at @addr. */
static bool smaps_field(void *addr, const char *key, char *out, size_t len)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	char line[512];
	bool in = false, found = false;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char *sp = strchr(line, ' ');

		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && sp &&
		    strchr(line, '-') < sp) {
			in = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
			continue;
		}
		if (in && !strncmp(line, key, strlen(key))) {
			snprintf(out, len, "%s", line + strlen(key));
			found = true;
			break;
		}
	}
	fclose(f);
	return found;
}

static bool is_mapped(void *addr)
{
	unsigned char v;

	return mincore(addr, PG, &v) == 0;
}

static void check_reserve(size_t len, size_t align, bool huge)
{
	char *p = NULL;

	ck_assert_int_eq(kvp_mem_reserve(len, align, huge, (void **)&p), 0);
	ck_assert_ptr_nonnull(p);
	ck_assert_uint_eq((uintptr_t)p % align, 0);
	/* Nothing populated; reads zeros; writable end to end. */
	ck_assert_uint_eq(kvp_test_resident_pages(p, len), 0);
	ck_assert_int_eq(p[0], 0);
	ck_assert_int_eq(p[len - 1], 0);
	p[0] = 1;
	p[len - 1] = 2;
	ck_assert_int_eq(p[0] + p[len - 1], 3);
	ck_assert(is_mapped(p + len - PG));
	ck_assert_int_eq(kvp_mem_release(p, len), 0);
	ck_assert(!is_mapped(p));
	ck_assert(!is_mapped(p + len - PG));
}

START_TEST(test_reserve_4k)
{
	check_reserve(PG, PG, false);
	check_reserve(10 * PG, PG, false);
}
END_TEST

START_TEST(test_reserve_2m)
{
	check_reserve(HUGE, HUGE, false);
	check_reserve(3 * HUGE + 5 * PG, HUGE, true);
}
END_TEST

START_TEST(test_reserve_1g)
{
	/* Address space only (MAP_NORESERVE): cheap even at 1 GiB. */
	check_reserve(4 * PG, GIG, false);
	check_reserve(GIG, GIG, true);
}
END_TEST

START_TEST(test_reserve_trims)
{
	/*
	 * The over-reservation is trimmed: a second reservation of the same
	 * size fits where a leak would have been, and many in a row do not
	 * exhaust anything.  The pages just past the end are not ours.
	 */
	for (int i = 0; i < 64; i++) {
		char *p;

		ck_assert_int_eq(
		    kvp_mem_reserve(HUGE, HUGE, false, (void **)&p), 0);
		ck_assert_uint_eq((uintptr_t)p % HUGE, 0);
		ck_assert_int_eq(kvp_mem_release(p, HUGE), 0);
		ck_assert(!is_mapped(p));
	}
}
END_TEST

START_TEST(test_reserve_huge_flag)
{
	char mode[32], flags[256];
	char *p;

	if (kvp_thp_mode(mode, sizeof(mode))) {
		printf("reserve_huge_flag: skipped: no THP in this kernel\n");
		return;
	}
	ck_assert_int_eq(kvp_mem_reserve(2 * HUGE, HUGE, true, (void **)&p), 0);
	ck_assert(smaps_field(p, "VmFlags:", flags, sizeof(flags)));
	ck_assert_msg(strstr(flags, " hg"), "VmFlags:%s", flags);
	ck_assert_int_eq(kvp_mem_release(p, 2 * HUGE), 0);

	ck_assert_int_eq(kvp_mem_reserve(2 * HUGE, HUGE, false, (void **)&p),
			 0);
	ck_assert(smaps_field(p, "VmFlags:", flags, sizeof(flags)));
	ck_assert_msg(!strstr(flags, " hg"), "VmFlags:%s", flags);
	ck_assert_int_eq(kvp_mem_release(p, 2 * HUGE), 0);
}
END_TEST

/*
 * I/O buffers: page aligned, and from 2 MiB on whole huge pages, 2 MiB
 * aligned and advised MADV_HUGEPAGE (from small pages virtio-blk without
 * indirect descriptors runs one request of 254 pages at a time).
 */
START_TEST(test_io_alloc)
{
	static const size_t lens[] = { 1, PG, PG + 1, HUGE - 1, HUGE,
				       HUGE + 1, 3 * HUGE };
	char mode[32], flags[256];
	bool thp = !kvp_thp_mode(mode, sizeof(mode)) && strcmp(mode, "never");

	ck_assert_uint_eq(kvp_mem_io_bytes(0), PG);
	ck_assert_uint_eq(kvp_mem_io_bytes(PG + 1), 2 * PG);
	ck_assert_uint_eq(kvp_mem_io_bytes(HUGE - 1), HUGE);
	ck_assert_uint_eq(kvp_mem_io_bytes(HUGE + 1), 2 * HUGE);
	ck_assert_ptr_null(kvp_mem_io_alloc(SIZE_MAX - PG));
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		size_t len = lens[i], bytes = kvp_mem_io_bytes(len);
		char *p = kvp_mem_io_alloc(len);

		ck_assert_ptr_nonnull(p);
		ck_assert_uint_ge(bytes, len);
		ck_assert_uint_eq((uintptr_t)p % (bytes >= HUGE ? HUGE : PG),
				  0);
		memset(p, 0x5a, bytes);
		if (bytes >= HUGE && thp) {
			ck_assert(smaps_field(p, "VmFlags:", flags,
					      sizeof(flags)));
			ck_assert_msg(strstr(flags, " hg"), "%zu bytes: "
				      "VmFlags:%s", len, flags);
		}
		kvp_mem_io_free(p, len);
	}
}
END_TEST

/*
 * An I/O buffer of 2 MiB or more is huge pages in a process whose heap
 * has churned: malloc, once a freed large buffer raised its mmap
 * threshold, served the next from heap memory touched before in 4 KiB
 * pages (0 of 4 huge pages here).
 */
START_TEST(test_io_alloc_after_churn)
{
	const size_t len = 4 * HUGE;
	enum { SMALL = 3000 };
	char mode[32], *p;
	void **small;
	int first = 0, after = 0;

	if (kvp_thp_mode(mode, sizeof(mode)) || !strcmp(mode, "never")) {
		printf("io_alloc_after_churn: THP off, nothing to check\n");
		return;
	}
	p = kvp_mem_io_alloc(len);
	ck_assert_ptr_nonnull(p);
	memset(p, 1, len);
	for (size_t off = 0; off < len; off += HUGE)
		first += kvp_test_one_huge_page(p + off) == 1;
	if (kvp_test_one_huge_page(p) < 0 || first < 4) {
		printf("io_alloc_after_churn: frame numbers hidden or THP "
		       "short, nothing to check\n");
		kvp_mem_io_free(p, len);
		return;
	}
	kvp_mem_io_free(p, len);
	small = malloc(SMALL * sizeof(*small));
	ck_assert_ptr_nonnull(small);
	for (int i = 0; i < SMALL; i++) {
		small[i] = malloc(PG);
		ck_assert_ptr_nonnull(small[i]);
		memset(small[i], 2, PG);
	}
	for (int i = 0; i < SMALL; i++)
		free(small[i]);
	p = kvp_mem_io_alloc(len);
	ck_assert_ptr_nonnull(p);
	memset(p, 3, len);
	for (size_t off = 0; off < len; off += HUGE)
		after += kvp_test_one_huge_page(p + off) == 1;
	kvp_mem_io_free(p, len);
	free(small);
	ck_assert_msg(after == 4, "%d of 4 huge pages after the heap churned",
		      after);
}
END_TEST

START_TEST(test_reserve_errors)
{
	void *p = (void *)0x1234;

	ck_assert_int_eq(kvp_mem_reserve(0, PG, false, &p), -EINVAL);
	ck_assert_int_eq(kvp_mem_reserve(PG, 0, false, &p), -EINVAL);
	ck_assert_int_eq(kvp_mem_reserve(PG, 2048, false, &p), -EINVAL);
	ck_assert_int_eq(kvp_mem_reserve(PG, 3 * PG, false, &p), -EINVAL);
	ck_assert_int_eq(kvp_mem_reserve(PG, HUGE + PG, false, &p), -EINVAL);
	ck_assert_int_eq(kvp_mem_reserve(PG + 1, PG, false, &p), -EINVAL);
	/* Too large to reserve at all. */
	ck_assert_int_lt(kvp_mem_reserve(SIZE_MAX & ~(PG - 1), HUGE, false, &p),
			 0);
	ck_assert_int_lt(kvp_mem_reserve(1UL << 62, PG, false, &p), 0);
	ck_assert_ptr_eq(p, (void *)0x1234); /* untouched on failure */
}
END_TEST

/*
 * Under an address-space limit (ulimit -v) a reservation fails with
 * ENOMEM, its real cause: the raw mmap used to turn every failure into
 * EPERM ("no permission to use userfaultfd").  The limit is set in a
 * child, so that this process keeps its own.
 */
START_TEST(test_reserve_address_limit)
{
	pid_t pid = fork();
	int status;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct rlimit rl = { 256u << 20, 256u << 20 };
		void *a = NULL;

		if (setrlimit(RLIMIT_AS, &rl))
			_exit(10);
		if (kvp_mem_reserve(1ul << 30, 4096, false, &a) != -ENOMEM)
			_exit(11);
		errno = 0;
		if (kvp_mem_sys_mmap(NULL, 1ul << 30, PROT_READ,
				     MAP_PRIVATE | MAP_ANONYMOUS, -1,
				     0) != MAP_FAILED ||
		    errno != ENOMEM)
			_exit(12);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "child status %d (11: reserve, 12: sys_mmap not ENOMEM)",
		      status);
}
END_TEST

START_TEST(test_populate)
{
	char mode[32], huge_kb[64];
	char *p;

	ck_assert_int_eq(kvp_mem_reserve(64 * PG, PG, false, (void **)&p), 0);
	ck_assert_int_eq(kvp_mem_populate(p + 8 * PG, 16 * PG), 0);
	ck_assert_uint_eq(kvp_test_resident_pages(p, 64 * PG), 16);
	ck_assert_uint_eq(kvp_test_resident_pages(p + 8 * PG, 16 * PG), 16);
	ck_assert_int_eq(p[8 * PG], 0); /* populated pages are zero */
	ck_assert_int_eq(kvp_mem_release(p, 64 * PG), 0);
	/* An unmapped range is an error, not a crash. */
	ck_assert_int_lt(kvp_mem_populate(p, 4 * PG), 0);

	/* A THP range populates as huge pages where THP is on. */
	ck_assert_int_eq(kvp_mem_reserve(2 * HUGE, HUGE, true, (void **)&p), 0);
	ck_assert_int_eq(kvp_mem_populate(p, 2 * HUGE), 0);
	ck_assert_uint_eq(kvp_test_resident_pages(p, 2 * HUGE), 2 * HUGE / PG);
	if (kvp_thp_mode(mode, sizeof(mode)) == 0 && strcmp(mode, "never") &&
	    smaps_field(p, "AnonHugePages:", huge_kb, sizeof(huge_kb)))
		ck_assert_msg(atol(huge_kb) > 0, "AnonHugePages:%s", huge_kb);
	ck_assert_int_eq(kvp_mem_release(p, 2 * HUGE), 0);
}
END_TEST

START_TEST(test_advise)
{
	char *p;

	ck_assert_int_eq(kvp_mem_reserve(8 * PG, PG, false, (void **)&p), 0);
	memset(p, 0xab, 8 * PG);
	ck_assert_uint_eq(kvp_test_resident_pages(p, 8 * PG), 8);
	/* DONTNEED drops private anonymous pages: zeros after. */
	ck_assert_int_eq(kvp_mem_advise(p + 2 * PG, 4 * PG, MADV_DONTNEED), 0);
	ck_assert_uint_eq(kvp_test_resident_pages(p, 8 * PG), 4);
	ck_assert_int_eq(p[3 * PG], 0);
	ck_assert_int_eq((unsigned char)p[PG], 0xab);
	ck_assert_int_eq(kvp_mem_advise(p, 8 * PG, MADV_NOHUGEPAGE), 0);
	ck_assert_int_eq(kvp_mem_advise(p, 8 * PG, MADV_WILLNEED), 0);
	/* Errors come back as -errno. */
	ck_assert_int_eq(kvp_mem_advise(p + 1, PG, MADV_DONTNEED), -EINVAL);
	ck_assert_int_eq(kvp_mem_advise(p, PG, 12345), -EINVAL);
	ck_assert_int_eq(kvp_mem_release(p, 8 * PG), 0);
	ck_assert_int_eq(kvp_mem_advise(p, PG, MADV_WILLNEED), -ENOMEM);
}
END_TEST

/* process_madvise of scattered ranges: each dropped, the rest kept; a
 * range that is not mapped stops the call there, with *done saying how far
 * it got. */
START_TEST(test_advise_batch)
{
	int pidfd = kvp_mem_self_pidfd();
	struct iovec iov[3];
	size_t done = 99;
	char *p;

	ck_assert_int_ge(pidfd, 0);
	ck_assert_int_eq(kvp_mem_reserve(8 * PG, PG, false, (void **)&p), 0);
	memset(p, 0xab, 8 * PG);
	iov[0] = (struct iovec){ p + 1 * PG, PG };
	iov[1] = (struct iovec){ p + 4 * PG, 2 * PG };
	ck_assert_int_eq(
	    kvp_mem_advise_batch(pidfd, iov, 2, MADV_DONTNEED, &done), 0);
	ck_assert_uint_eq(done, 3 * PG);
	ck_assert_uint_eq(kvp_test_resident_pages(p, 8 * PG), 5);
	ck_assert_int_eq(p[PG], 0);
	ck_assert_int_eq(p[5 * PG], 0);
	ck_assert_int_eq((unsigned char)p[0], 0xab);
	ck_assert_int_eq((unsigned char)p[7 * PG], 0xab);
	/* The second range is unmapped: the first is done, then it stops. */
	memset(p, 0xab, 8 * PG);
	ck_assert_int_eq(kvp_mem_release(p + 4 * PG, 4 * PG), 0);
	iov[2] = (struct iovec){ p + 2 * PG, PG };
	ck_assert_int_eq(
	    kvp_mem_advise_batch(pidfd, iov, 3, MADV_DONTNEED, &done), -EAGAIN);
	ck_assert_uint_eq(done, PG);
	ck_assert_int_eq(p[PG], 0);
	ck_assert_int_eq((unsigned char)p[2 * PG], 0xab);
	ck_assert_int_eq(kvp_mem_advise_batch(pidfd, iov, 1, 12345, &done),
			 -EINVAL);
	ck_assert_uint_eq(done, 0);
	ck_assert_int_eq(kvp_mem_release(p, 4 * PG), 0);
	close(pidfd);
}
END_TEST

START_TEST(test_memfd)
{
	struct stat st;
	char link[64], target[256];
	ssize_t n;
	char *a, *b;
	int fd = -1;

	ck_assert_int_eq(kvp_mem_memfd("kvp-test", 16 * PG, &fd), 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(st.st_size, 16 * PG);
	ck_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	ck_assert_int_gt(n, 0);
	target[n] = '\0';
	ck_assert_msg(strstr(target, "memfd:kvp-test"), "%s", target);
	/* Two shared mappings see the same pages. */
	a = mmap(NULL, 16 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	b = mmap(NULL, 16 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert(a != MAP_FAILED && b != MAP_FAILED);
	a[5 * PG + 3] = 42;
	ck_assert_int_eq(b[5 * PG + 3], 42);
	munmap(a, 16 * PG);
	munmap(b, 16 * PG);
	close(fd);

	ck_assert_int_eq(kvp_mem_memfd("kvp-empty", 0, &fd), 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(st.st_size, 0);
	close(fd);
	/* A name too long for memfd_create (249 bytes max). */
	{
		char name[400];
		int keep = -7;

		memset(name, 'n', sizeof(name) - 1);
		name[sizeof(name) - 1] = '\0';
		ck_assert_int_eq(kvp_mem_memfd(name, PG, &keep), -EINVAL);
		ck_assert_int_eq(keep, -7);
	}
}
END_TEST

START_TEST(test_thp_mode)
{
	char mode[32], tiny[3];
	int rc = kvp_thp_mode(mode, sizeof(mode));

	if (rc == -ENOENT) {
		printf("thp_mode: skipped: no THP in this kernel\n");
		return;
	}
	ck_assert_int_eq(rc, 0);
	ck_assert_msg(!strcmp(mode, "always") || !strcmp(mode, "madvise") ||
			  !strcmp(mode, "never"),
		      "mode '%s'", mode);
	/* The sysfs file says the same, the selected one in brackets. */
	{
		char line[128], want[40];
		FILE *f =
		    fopen("/sys/kernel/mm/transparent_hugepage/enabled", "re");

		ck_assert_ptr_nonnull(f);
		ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
		fclose(f);
		snprintf(want, sizeof(want), "[%s]", mode);
		ck_assert_ptr_nonnull(strstr(line, want));
	}
	ck_assert_int_eq(kvp_thp_mode(tiny, sizeof(tiny)), -ENAMETOOLONG);
}
END_TEST

static Suite *mem_suite(void)
{
	Suite *s = suite_create("mem");
	TCase *tc = kvp_test_tcase(s, "core", 20);

	tcase_add_test(tc, test_reserve_4k);
	tcase_add_test(tc, test_reserve_2m);
	tcase_add_test(tc, test_reserve_1g);
	tcase_add_test(tc, test_reserve_trims);
	tcase_add_test(tc, test_reserve_huge_flag);
	tcase_add_test(tc, test_reserve_errors);
	tcase_add_test(tc, test_io_alloc);
	tcase_add_test(tc, test_io_alloc_after_churn);
	tcase_add_test(tc, test_reserve_address_limit);
	tcase_add_test(tc, test_populate);
	tcase_add_test(tc, test_advise);
	tcase_add_test(tc, test_advise_batch);
	tcase_add_test(tc, test_memfd);
	tcase_add_test(tc, test_thp_mode);
	return s;
}

int main(void)
{
	return kvp_test_run(mem_suite());
}
