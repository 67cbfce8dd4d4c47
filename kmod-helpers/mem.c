/*
 * mem.c - address-space helpers; contracts in mem.h.
 */
#include "kmod-helpers/mem.h"
#include "kmod-helpers/uapi_compat.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/*
 * Raw syscalls, not libc's mmap/munmap: under the LD_PRELOAD shim those
 * symbols are interposed, and the pager's own reservations must not be
 * turned into regions.  syscall(2) itself returns -1 and sets errno.
 */
void *kvp_mem_sys_mmap(void *addr, size_t len, int prot, int flags, int fd,
		       off_t off)
{
	return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

static int raw_munmap(void *addr, size_t len)
{
	return (int)syscall(SYS_munmap, addr, len);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

int kvp_mem_reserve(size_t len, size_t align, bool huge, void **addr)
{
	uintptr_t start, aligned;
	size_t span;
	void *p;

	if (!len || align < KVP_PAGE_SIZE || (align & (align - 1)) ||
	    len % KVP_PAGE_SIZE)
		return -EINVAL;
	/* Over-reserve by one alignment and trim both ends. */
	span = len + align - KVP_PAGE_SIZE;
	if (span < len)
		return -EOVERFLOW;
	/*
	 * Inaccessible first: under mlockall(MCL_FUTURE) a new mapping is
	 * locked and filled at once, which for a region means zero pages
	 * that no fault ever brings to the pager (it read all zeros), and
	 * for the frame arena gigabytes.  mlock fills no PROT_NONE mapping;
	 * unlocked, then opened, it stays empty.
	 */
	p = kvp_mem_sys_mmap(NULL, span, PROT_NONE,
			     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
			     0);
	if (p == MAP_FAILED)
		return -errno;
	if (munlock(p, span) || mprotect(p, span, PROT_READ | PROT_WRITE)) {
		int err = -errno;

		raw_munmap(p, span);
		return err;
	}
	start = (uintptr_t)p;
	aligned = (start + align - 1) & ~(uintptr_t)(align - 1);
	if (aligned > start)
		raw_munmap(p, aligned - start);
	if (aligned + len < start + span)
		raw_munmap((void *)(aligned + len),
			   start + span - (aligned + len));
	if (huge)
		(void)madvise((void *)aligned, len, MADV_HUGEPAGE);
	*addr = (void *)aligned;
	return 0;
}

int kvp_mem_release(void *addr, size_t len)
{
	return raw_munmap(addr, len) ? -errno : 0;
}

int kvp_mem_populate(void *addr, size_t len)
{
	volatile char *p = addr;

	if (!madvise(addr, len, MADV_POPULATE_WRITE))
		return 0;
	if (errno != EINVAL)
		return -errno;
	for (size_t off = 0; off < len; off += KVP_PAGE_SIZE)
		p[off] = p[off];
	return 0;
}

bool kvp_mem_page_resident(const void *page)
{
	unsigned char v = 0;

	return !mincore((void *)page, KVP_PAGE_SIZE, &v) && (v & 1);
}

/* Is all of the range mapped, and (@present) every page present? */
static bool range_mincore(const void *addr, size_t len, bool present)
{
	unsigned char vec[512];
	size_t step = sizeof(vec) * KVP_PAGE_SIZE;

	for (size_t off = 0; off < len; off += step) {
		size_t n = len - off < step ? len - off : step;

		if (mincore((char *)addr + off, n, vec))
			return false;
		for (size_t i = 0; present && i < n / KVP_PAGE_SIZE; i++)
			if (!(vec[i] & 1))
				return false;
	}
	return true;
}

bool kvp_mem_range_mapped(const void *addr, size_t len)
{
	return range_mincore(addr, len, false);
}

bool kvp_mem_range_resident(const void *addr, size_t len)
{
	return range_mincore(addr, len, true);
}

bool kvp_mem_any_resident(const void *addr, size_t len)
{
	for (size_t off = 0; off < len; off += KVP_PAGE_SIZE)
		if (kvp_mem_page_resident((const char *)addr + off))
			return true;
	return false;
}

void kvp_mem_resident_bits(const void *addr, size_t len, uint64_t *bits,
			   size_t bit)
{
	unsigned char vec[512];
	size_t step = sizeof(vec) * KVP_PAGE_SIZE;

	for (size_t off = 0; off < len; off += step) {
		size_t n = len - off < step ? len - off : step;
		const char *at = (const char *)addr + off;

		/* ENOMEM: a part not mapped; then page by page. */
		bool whole = !mincore((void *)at, n, vec);

		for (size_t i = 0; i < n / KVP_PAGE_SIZE; i++, bit++)
			if (whole ? (vec[i] & 1)
				  : kvp_mem_page_resident(at + i * KVP_PAGE_SIZE))
				bits[bit / 64] |= 1ull << (bit % 64);
	}
}

size_t kvp_mem_io_bytes(size_t len)
{
	size_t unit = len >= KVP_HUGE_SIZE ? KVP_HUGE_SIZE : KVP_PAGE_SIZE;

	return len ? (len + unit - 1) & ~(unit - 1) : unit;
}

void *kvp_mem_io_alloc(size_t len)
{
	size_t bytes = kvp_mem_io_bytes(len);
	void *p;

	if (bytes < len)
		return NULL;
	if (bytes < KVP_HUGE_SIZE)
		return posix_memalign(&p, KVP_PAGE_SIZE, bytes) ? NULL : p;
	/* A mapping of its own: malloc serves a large request from its
	 * heap once a freed one has raised its mmap threshold, and there
	 * gets pages touched before in 4 KiB ones
	 * (test_mem io_alloc_after_churn). */
	return kvp_mem_reserve(bytes, KVP_HUGE_SIZE, true, &p) ? NULL : p;
}

void kvp_mem_io_free(void *p, size_t len)
{
	size_t bytes = kvp_mem_io_bytes(len);

	if (!p)
		return;
	if (bytes < KVP_HUGE_SIZE)
		free(p);
	else
		(void)kvp_mem_release(p, bytes);
}

int kvp_mem_advise(void *addr, size_t len, int advice)
{
	return madvise(addr, len, advice) ? -errno : 0;
}

int kvp_mem_drop(void *addr, size_t len)
{
	int err = kvp_mem_advise(addr, len, MADV_DONTNEED_LOCKED);

	/* EINVAL: a kernel without it (or a range it refuses anyway). */
	return err == -EINVAL ? kvp_mem_advise(addr, len, MADV_DONTNEED) : err;
}

int kvp_mem_self_pidfd(void)
{
	long fd = syscall(SYS_pidfd_open, getpid(), 0);

	return fd < 0 ? -errno : (int)fd;
}

int kvp_mem_advise_batch(int pidfd, const struct iovec *iov, size_t n,
			 int advice, size_t *done)
{
	size_t want = 0;
	long r;

	for (size_t i = 0; i < n; i++)
		want += iov[i].iov_len;
	r = syscall(SYS_process_madvise, pidfd, iov, n, advice, 0);
	*done = r > 0 ? (size_t)r : 0;
	if (r < 0)
		return -errno;
	return (size_t)r == want ? 0 : -EAGAIN;
}

int kvp_mem_batch_dontneed_works(int pidfd)
{
	struct iovec iov = { .iov_len = 4096 };
	size_t done;
	int err;

	iov.iov_base = mmap(NULL, iov.iov_len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (iov.iov_base == MAP_FAILED)
		return -errno;
	err = kvp_mem_advise_batch(pidfd, &iov, 1, MADV_DONTNEED_LOCKED, &done);
	munmap(iov.iov_base, iov.iov_len);
	return err;
}

int kvp_mem_vma_open(void)
{
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

int kvp_mem_vma_at(int fd, const void *addr, uintptr_t *start,
		   uintptr_t *end)
{
	struct procmap_query q = { .size = sizeof(q),
				   .query_addr = (uintptr_t)addr };

	if (ioctl(fd, PROCMAP_QUERY, &q))
		return -errno;
	*start = (uintptr_t)q.vma_start;
	*end = (uintptr_t)q.vma_end;
	return 0;
}

int kvp_mem_memfd(const char *name, size_t len, int *fd)
{
	int f = memfd_create(name, MFD_CLOEXEC);

	if (f < 0)
		return -errno;
	if (ftruncate(f, (off_t)len)) {
		int err = -errno;

		close(f);
		return err;
	}
	*fd = f;
	return 0;
}

int kvp_thp_mode(char *buf, size_t len)
{
	char line[128], *open_br, *close_br;
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "re");
	size_t n;

	if (!f)
		return -errno;
	if (!fgets(line, sizeof(line), f)) {
		fclose(f);
		return -EIO;
	}
	fclose(f);
	open_br = strchr(line, '[');
	close_br = open_br ? strchr(open_br, ']') : NULL;
	if (!close_br)
		return -EIO;
	n = (size_t)(close_br - open_br - 1);
	if (n + 1 > len)
		return -ENAMETOOLONG;
	memcpy(buf, open_br + 1, n);
	buf[n] = '\0';
	return 0;
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Read one word of each page of [mem, mem + len) into *sink (volatile:
 * the reads stay): the us it took. */
static double read_pages(const void *mem, size_t len, volatile uint64_t *sink)
{
	const volatile uint64_t *w = mem;
	uint64_t sum = 0;
	double t0 = now_us();

	for (size_t off = 0; off < len; off += KVP_PAGE_SIZE)
		sum += w[off / sizeof(*w)];
	*sink = sum;
	return now_us() - t0;
}

/*
 * One try of kvp_mem_touch_cost: two halves of @pages each, both read for
 * the first time and again, the second half written (a hypervisor may map
 * a page read-only until its first write), then the first copied over the
 * second.  The copy runs cache-hot, so it is a floor of what a copy out of
 * a buffer just read from a store costs: the two kinds of guest are an
 * order of magnitude and more apart, which it does not blur.
 */
static int touch_try(unsigned pages, struct kvp_mem_touch_cost *c)
{
	size_t len = (size_t)pages * KVP_PAGE_SIZE;
	volatile uint64_t sink;
	char *mem;
	double t0;
	int err;

	err = kvp_mem_reserve(2 * len, KVP_PAGE_SIZE, false, (void **)&mem);
	if (err)
		return err;
	/* 4 KiB pages, as a copy installs them; a kernel without THP has
	 * none to refuse (EINVAL) */
	err = kvp_mem_advise(mem, 2 * len, MADV_NOHUGEPAGE);
	if (!err || err == -EINVAL)
		err = kvp_mem_populate(mem, 2 * len);
	if (!err) {
		c->first_us = read_pages(mem, 2 * len, &sink) / (2.0 * pages);
		c->again_us = read_pages(mem, 2 * len, &sink) / (2.0 * pages);
		for (size_t off = len; off < 2 * len; off += KVP_PAGE_SIZE)
			((volatile char *)mem)[off] = 1;
		t0 = now_us();
		memcpy(mem + len, mem, len);
		c->copy_us = (now_us() - t0) / pages;
		sink = (uint64_t)((volatile char *)mem)[len];
	}
	kvp_mem_release(mem, 2 * len);
	return err;
}

int kvp_mem_touch_cost(unsigned pages, struct kvp_mem_touch_cost *out)
{
	struct kvp_mem_touch_cost best = { 0 }, c;
	int err;

	for (int i = 0; i < 3; i++) {
		err = touch_try(pages ? pages : 1, &c);
		if (err)
			return err;
		if (!i || c.first_us < best.first_us)
			best.first_us = c.first_us;
		if (!i || c.again_us < best.again_us)
			best.again_us = c.again_us;
		if (!i || c.copy_us < best.copy_us)
			best.copy_us = c.copy_us;
	}
	*out = best;
	return 0;
}
