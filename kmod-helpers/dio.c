/*
 * dio.c - O_DIRECT support and alignment; the contract is in dio.h.
 */
#include "kmod-helpers/dio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIO_FALLBACK_ALIGN 4096u

/*
 * A read of @len bytes at offset 0 into a buffer aligned to @len but not to
 * twice @len: succeeds only if both alignments are enough.  Returns the
 * bytes read (0 at end of file says nothing), or -errno.
 */
static int dio_probe_read(int dfd, char *area, size_t len)
{
	char *buf = area + len; /* area is 8 KiB aligned: buf is len aligned */
	ssize_t n = pread(dfd, buf, len, 0);

	return n < 0 ? -errno : (int)n;
}

static int dio_probe(int fd, struct kvp_dio_align *out)
{
	char proc[64];
	void *area = NULL;
	int dfd, n;

	/* Reopen through /proc so that an unlinked (O_TMPFILE) file works. */
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	dfd = open(proc, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (dfd < 0) {
		if (errno == EINVAL) {
			out->direct = false;
			out->source = "probe";
		}
		return 0; /* else: unknown, keep the fallback */
	}
	out->direct = true;
	if (posix_memalign(&area, 2 * DIO_FALLBACK_ALIGN,
			   3 * DIO_FALLBACK_ALIGN))
		goto out;
	n = dio_probe_read(dfd, area, 512);
	if (n > 0) {
		out->mem_align = out->offset_align = 512;
		out->source = "probe";
		goto out;
	}
	n = dio_probe_read(dfd, area, DIO_FALLBACK_ALIGN);
	if (n > 0)
		out->source = "probe";
out:
	free(area);
	close(dfd);
	return 0;
}

int kvp_dio_alignment(int fd, struct kvp_dio_align *out)
{
	struct statx stx;

	if (!out || fd < 0)
		return -EINVAL;
	out->direct = true;
	out->mem_align = DIO_FALLBACK_ALIGN;
	out->offset_align = DIO_FALLBACK_ALIGN;
	out->source = "fallback";

	if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx))
		return errno == EBADF ? -EBADF : dio_probe(fd, out);
	if (!(stx.stx_mask & STATX_DIOALIGN))
		return dio_probe(fd, out);
	out->source = "statx";
	if (!stx.stx_dio_mem_align || !stx.stx_dio_offset_align) {
		/* The filesystem says it has no direct I/O on this file. */
		out->direct = false;
		return 0;
	}
	out->mem_align = stx.stx_dio_mem_align;
	out->offset_align = stx.stx_dio_offset_align;
	return 0;
}

int kvp_dio_open(const char *path, int flags, int mode, bool *direct)
{
	int fd;

	if (!path || !direct)
		return -EINVAL;
	fd = open(path, flags | O_DIRECT, mode);
	if (fd >= 0) {
		*direct = true;
		return fd;
	}
	if (errno != EINVAL)
		return -errno;
	fd = open(path, flags & ~O_DIRECT, mode);
	/* The refused open may have created the file already. */
	if (fd < 0 && errno == EEXIST && (flags & O_CREAT))
		fd = open(path, flags & ~(O_DIRECT | O_EXCL), mode);
	if (fd < 0)
		return -errno;
	*direct = false;
	return fd;
}
