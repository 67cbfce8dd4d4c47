/*
 * dio.h - O_DIRECT support and alignment of a file.
 */
#ifndef KVP_DIO_H
#define KVP_DIO_H

#include <stdbool.h>
#include <stdint.h>

struct kvp_dio_align {
	bool direct;	       /* the file accepts O_DIRECT */
	uint32_t mem_align;    /* buffer address alignment in bytes */
	uint32_t offset_align; /* file offset and length alignment in bytes */
	const char *source;    /* "statx", "probe" or "fallback" */
};

/*
 * kvp_dio_alignment - the O_DIRECT alignment of the open file @fd, from
 * statx(STATX_DIOALIGN); where the kernel or filesystem does not report it,
 * from a probe (a 512-byte then 4 KiB aligned read), else 4096 for both.
 * @fd need not be open with O_DIRECT.  Returns 0 or -errno.
 */
int kvp_dio_alignment(int fd, struct kvp_dio_align *out);

/*
 * kvp_dio_open - open(@path, @flags | O_DIRECT, @mode); when the filesystem
 * refuses O_DIRECT (EINVAL, as tmpfs does), opens it buffered and sets
 * *direct to false.  Returns the descriptor or -errno.
 */
int kvp_dio_open(const char *path, int flags, int mode, bool *direct);

#endif /* KVP_DIO_H */
