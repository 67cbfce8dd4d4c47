/*
 * uffd.c - userfaultfd wrappers; the conventions are in uffd.h.
 */
#include "kmod-helpers/uffd.h"
#include "kmod-helpers/fdset.h"
#include "kmod-helpers/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef __NR_userfaultfd
#error "this architecture has no userfaultfd syscall number"
#endif

static int uffd_syscall(int flags)
{
	long fd = syscall(__NR_userfaultfd, flags);

	return fd < 0 ? -errno : (int)fd;
}

static int uffd_from_device(int flags)
{
	int dev, fd, err;

	dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		return -errno;
	fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags);
	err = fd < 0 ? -errno : fd;
	close(dev);
	return err;
}

int kvp_uffd_open(struct kvp_uffd *u, unsigned flags)
{
	const int oflags = O_CLOEXEC | O_NONBLOCK;
	int fd, first_err;

	memset(u, 0, sizeof(*u));
	u->fd = -1;

	fd = uffd_syscall(oflags);
	if (fd >= 0) {
		u->source = "syscall";
		goto out_full;
	}
	first_err = fd;
	fd = uffd_from_device(oflags);
	if (fd >= 0) {
		u->source = "/dev/userfaultfd";
		goto out_full;
	}
	if (flags & KVP_UFFD_REQUIRE_FULL)
		return first_err == -ENOSYS ? -ENOSYS : -EPERM;
	fd = uffd_syscall(oflags | UFFD_USER_MODE_ONLY);
	if (fd < 0)
		return first_err == -ENOSYS ? -ENOSYS : fd;
	u->mode = KVP_UFFD_USER_ONLY;
	u->source = "syscall (user-mode-only)";
	goto out;
out_full:
	u->mode = KVP_UFFD_FULL;
out:
	fd = kvp_fd_own(fd);
	if (fd < 0)
		return fd;
	u->fd = fd;
	return 0;
}

int kvp_uffd_open_via(struct kvp_uffd *u, enum kvp_uffd_via via)
{
	const int oflags = O_CLOEXEC | O_NONBLOCK;
	int fd;

	memset(u, 0, sizeof(*u));
	u->fd = -1;
	switch (via) {
	case KVP_UFFD_VIA_SYSCALL:
		fd = uffd_syscall(oflags);
		u->source = "syscall";
		break;
	case KVP_UFFD_VIA_DEVICE:
		fd = uffd_from_device(oflags);
		u->source = "/dev/userfaultfd";
		break;
	case KVP_UFFD_VIA_SYSCALL_USER:
		fd = uffd_syscall(oflags | UFFD_USER_MODE_ONLY);
		u->source = "syscall (user-mode-only)";
		u->mode = KVP_UFFD_USER_ONLY;
		break;
	default:
		fd = -EINVAL;
	}
	if (fd < 0) {
		memset(u, 0, sizeof(*u));
		u->fd = -1;
		return fd;
	}
	u->fd = fd;
	return 0;
}

int kvp_uffd_supported(uint64_t *features, uint64_t *ioctls)
{
	struct uffdio_api api = { .api = UFFD_API, .features = 0 };
	struct kvp_uffd u;
	int err;

	err = kvp_uffd_open(&u, 0);
	if (err)
		return err;
	err = 0;
	if (ioctl(u.fd, UFFDIO_API, &api))
		err = -errno;
	kvp_uffd_close(&u);
	if (err)
		return err;
	if (features)
		*features = api.features;
	if (ioctls)
		*ioctls = api.ioctls;
	return 0;
}

int kvp_uffd_api(struct kvp_uffd *u, uint64_t wanted, uint64_t required)
{
	struct uffdio_api api = { .api = UFFD_API };
	uint64_t supported;
	int err;

	err = kvp_uffd_supported(&supported, NULL);
	if (err)
		return err;
	if ((required & supported) != required)
		return -EOPNOTSUPP;
	api.features = (wanted | required) & supported;
	if (ioctl(u->fd, UFFDIO_API, &api))
		return -errno;
	/*
	 * The kernel answers with every feature it offers, not the ones this
	 * descriptor was given; what was asked for and accepted is granted.
	 */
	u->features = (wanted | required) & supported;
	u->ioctls = api.ioctls;
	return 0;
}

void kvp_uffd_close(struct kvp_uffd *u)
{
	if (u->fd >= 0)
		kvp_fd_close(u->fd);
	u->fd = -1;
}

int kvp_uffd_register(struct kvp_uffd *u, void *addr, size_t len, uint64_t mode,
		      uint64_t *ioctls)
{
	struct uffdio_register reg = {
		.range = { .start = (uintptr_t)addr, .len = len },
		.mode = mode,
	};

	if (ioctl(u->fd, UFFDIO_REGISTER, &reg))
		return -errno;
	if (ioctls)
		*ioctls = reg.ioctls;
	return 0;
}

int kvp_uffd_unregister(struct kvp_uffd *u, void *addr, size_t len)
{
	struct uffdio_range range = { .start = (uintptr_t)addr, .len = len };

	return ioctl(u->fd, UFFDIO_UNREGISTER, &range) ? -errno : 0;
}

/*
 * The kernel reports progress in a signed field: bytes done, or -errno when
 * nothing was done.  Fold it into the convention of uffd.h.
 */
static int resolve_result(int rc, int64_t progress, size_t *done)
{
	int err = rc ? -errno : 0;

	if (done)
		*done = progress > 0 ? (size_t)progress : 0;
	return err;
}

int kvp_uffd_copy(struct kvp_uffd *u, void *dst, const void *src, size_t len,
		  bool wp, bool dontwake, size_t *done)
{
	struct uffdio_copy c = {
		.dst = (uintptr_t)dst,
		.src = (uintptr_t)src,
		.len = len,
		.mode = (wp ? UFFDIO_COPY_MODE_WP : 0) |
			(dontwake ? UFFDIO_COPY_MODE_DONTWAKE : 0),
	};
	int rc = ioctl(u->fd, UFFDIO_COPY, &c);

	return resolve_result(rc, c.copy, done);
}

int kvp_uffd_zeropage(struct kvp_uffd *u, void *dst, size_t len, bool dontwake,
		      size_t *done)
{
	struct uffdio_zeropage z = {
		.range = { .start = (uintptr_t)dst, .len = len },
		.mode = dontwake ? UFFDIO_ZEROPAGE_MODE_DONTWAKE : 0,
	};
	int rc = ioctl(u->fd, UFFDIO_ZEROPAGE, &z);

	return resolve_result(rc, z.zeropage, done);
}

/*
 * Bytes from @dst/@src (page-aligned, @len of them) in the run of pages
 * that are present at @dst and absent at @src: 0 when mincore fails.
 */
static size_t moved_run(const char *dst, const char *src, size_t len)
{
	unsigned char d[256], s[256];
	size_t run = 0;

	while (run + KVP_PAGE_SIZE <= len) {
		size_t n = (len - run) / KVP_PAGE_SIZE;

		if (n > sizeof(d))
			n = sizeof(d);
		if (mincore((void *)(dst + run), n * KVP_PAGE_SIZE, d) ||
		    mincore((void *)(src + run), n * KVP_PAGE_SIZE, s))
			return run;
		for (size_t i = 0; i < n; i++, run += KVP_PAGE_SIZE)
			if (!(d[i] & 1) || (s[i] & 1))
				return run;
	}
	return run;
}

/* One UFFDIO_MOVE, its uncounted pages counted (below). */
static int move_once(struct kvp_uffd *u, void *dst, void *src, size_t len,
		     uint64_t mode, size_t *done)
{
	struct uffdio_move m = {
		.dst = (uintptr_t)dst,
		.src = (uintptr_t)src,
		.len = len,
		.mode = mode,
	};
	int rc = ioctl(u->fd, UFFDIO_MOVE, &m);
	size_t did, more;
	int err = resolve_result(rc, m.move, &did);

	/*
	 * Linux 6.18 can move pages and then fail with EEXIST without
	 * counting them: it retries a batch of ptes that met contention
	 * after moving part of it, and the retry finds its own work at dst.
	 * Count them here, from what the page tables show: a page now at
	 * dst and gone from src has moved (or there was nothing to move).
	 * Taking the call for a failure would leave the caller with pages
	 * it does not know it holds.  Any rest is for another call.
	 */
	if (err == -EEXIST &&
	    (more = moved_run((char *)dst + did, (char *)src + did,
			      len - did))) {
		did += more;
		err = did == len ? 0 : -EAGAIN;
	}
	*done = did;
	return err;
}

/* The page at @src, where a move stopped with ENOENT, is a hole: mapped,
 * nothing there, and @dst mapped (else the kernel's ENOENT stands).  One
 * page only: past it, a page swapped out is not resident either, and only
 * the kernel can move it. */
static bool src_hole(const char *dst, const char *src)
{
	return !kvp_mem_page_resident(src) &&
	       kvp_mem_range_mapped(src, KVP_PAGE_SIZE) &&
	       kvp_mem_range_mapped(dst, KVP_PAGE_SIZE);
}

int kvp_uffd_move(struct kvp_uffd *u, void *dst, void *src, size_t len,
		  uint64_t mode, size_t *done)
{
	bool holes = mode & UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES;
	size_t did = 0, n;
	int err;

	/*
	 * Linux 6.18's batched move keeps a transient EAGAIN (a pte that
	 * changed under it) for the rest of its loop and retries the same
	 * address: where that address is a hole by then (the program
	 * dropping the page) and ALLOW_SRC_HOLES is set, each retry
	 * "moves" the hole and loops again, for ever, in the kernel; only a
	 * fatal signal ends it, and a pager stuck there hangs every fault.
	 * So the mode is never passed: a hole is ENOENT there (at the
	 * first page, nothing moved: after a move the call stops there
	 * with EAGAIN, and goes on here), and is counted here as the mode
	 * counts it, moved.
	 */
	mode &= ~(uint64_t)UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES;
	for (;;) {
		n = 0;
		err = move_once(u, (char *)dst + did, (char *)src + did,
				len - did, mode, &n);
		did += n;
		if (holes && err == -EAGAIN && n && did < len)
			continue;
		if (err != -ENOENT || !holes ||
		    !src_hole((char *)dst + did, (char *)src + did))
			break;
		did += KVP_PAGE_SIZE;
		if (did == len) {
			err = 0;
			break;
		}
	}
	if (done)
		*done = did;
	return err;
}

int kvp_uffd_continue(struct kvp_uffd *u, void *addr, size_t len, bool wp,
		      bool dontwake, size_t *done)
{
	struct uffdio_continue c = {
		.range = { .start = (uintptr_t)addr, .len = len },
		.mode = (wp ? UFFDIO_CONTINUE_MODE_WP : 0) |
			(dontwake ? UFFDIO_CONTINUE_MODE_DONTWAKE : 0),
	};
	int rc = ioctl(u->fd, UFFDIO_CONTINUE, &c);

	return resolve_result(rc, c.mapped, done);
}

int kvp_uffd_poison(struct kvp_uffd *u, void *addr, size_t len, bool dontwake,
		    size_t *done)
{
	struct uffdio_poison p = {
		.range = { .start = (uintptr_t)addr, .len = len },
		.mode = dontwake ? UFFDIO_POISON_MODE_DONTWAKE : 0,
	};
	int rc = ioctl(u->fd, UFFDIO_POISON, &p);

	return resolve_result(rc, p.updated, done);
}

int kvp_uffd_writeprotect(struct kvp_uffd *u, void *addr, size_t len, bool wp,
			  bool dontwake)
{
	struct uffdio_writeprotect w = {
		.range = { .start = (uintptr_t)addr, .len = len },
		.mode = (wp ? UFFDIO_WRITEPROTECT_MODE_WP : 0) |
			(dontwake ? UFFDIO_WRITEPROTECT_MODE_DONTWAKE : 0),
	};

	return ioctl(u->fd, UFFDIO_WRITEPROTECT, &w) ? -errno : 0;
}

int kvp_uffd_wake(struct kvp_uffd *u, void *addr, size_t len)
{
	struct uffdio_range r = { .start = (uintptr_t)addr, .len = len };

	return ioctl(u->fd, UFFDIO_WAKE, &r) ? -errno : 0;
}

int kvp_uffd_read(struct kvp_uffd *u, struct uffd_msg *msgs, size_t max,
		  size_t *n)
{
	ssize_t r;

	*n = 0;
	do {
		r = read(u->fd, msgs, max * sizeof(*msgs));
	} while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	if (r == 0 || (size_t)r % sizeof(*msgs))
		return -EIO;
	*n = (size_t)r / sizeof(*msgs);
	return 0;
}

const char *kvp_uffd_feature_name(uint64_t bit)
{
	static const struct {
		uint64_t bit;
		const char *name;
	} names[] = {
		{ UFFD_FEATURE_PAGEFAULT_FLAG_WP, "PAGEFAULT_FLAG_WP" },
		{ UFFD_FEATURE_EVENT_FORK, "EVENT_FORK" },
		{ UFFD_FEATURE_EVENT_REMAP, "EVENT_REMAP" },
		{ UFFD_FEATURE_EVENT_REMOVE, "EVENT_REMOVE" },
		{ UFFD_FEATURE_MISSING_HUGETLBFS, "MISSING_HUGETLBFS" },
		{ UFFD_FEATURE_MISSING_SHMEM, "MISSING_SHMEM" },
		{ UFFD_FEATURE_EVENT_UNMAP, "EVENT_UNMAP" },
		{ UFFD_FEATURE_SIGBUS, "SIGBUS" },
		{ UFFD_FEATURE_THREAD_ID, "THREAD_ID" },
		{ UFFD_FEATURE_MINOR_HUGETLBFS, "MINOR_HUGETLBFS" },
		{ UFFD_FEATURE_MINOR_SHMEM, "MINOR_SHMEM" },
		{ UFFD_FEATURE_EXACT_ADDRESS, "EXACT_ADDRESS" },
		{ UFFD_FEATURE_WP_HUGETLBFS_SHMEM, "WP_HUGETLBFS_SHMEM" },
		{ UFFD_FEATURE_WP_UNPOPULATED, "WP_UNPOPULATED" },
		{ UFFD_FEATURE_POISON, "POISON" },
		{ UFFD_FEATURE_WP_ASYNC, "WP_ASYNC" },
		{ UFFD_FEATURE_MOVE, "MOVE" },
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (names[i].bit == bit)
			return names[i].name;
	return NULL;
}
