/*
 * uapi_compat.h - kernel interface definitions newer than the installed
 * headers.
 *
 * Debian 12 ships Linux 6.1 headers while the running kernel is newer.  The
 * values below are the kernel's ABI (include/uapi/linux/userfaultfd.h and
 * fs.h of Linux 6.8+); each is defined only when the headers lack it, so a
 * newer header set wins.  Nothing outside kmod-helpers/ includes this file.
 */
#ifndef KVP_UAPI_COMPAT_H
#define KVP_UAPI_COMPAT_H

#include <linux/types.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

#ifndef USERFAULTFD_IOC
#define USERFAULTFD_IOC 0xAA
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(USERFAULTFD_IOC, 0x00)
#endif

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

/* Feature bits added after 6.1. */
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif

/* UFFDIO_MOVE (Linux 6.8). */
#ifndef _UFFDIO_MOVE
#define _UFFDIO_MOVE (0x05)
#endif
#ifndef UFFDIO_MOVE
struct uffdio_move {
	__u64 dst;
	__u64 src;
	__u64 len;
#define UFFDIO_MOVE_MODE_DONTWAKE	 ((__u64)1 << 0)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((__u64)1 << 1)
	__u64 mode;
	/* Bytes moved, or a negative errno; written by the kernel. */
	__s64 move;
};
#define UFFDIO_MOVE _IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#endif

/* UFFDIO_POISON (Linux 6.6). */
#ifndef _UFFDIO_POISON
#define _UFFDIO_POISON (0x08)
#endif
#ifndef UFFDIO_POISON
struct uffdio_poison {
	struct uffdio_range range;
#define UFFDIO_POISON_MODE_DONTWAKE ((__u64)1 << 0)
	__u64 mode;
	/* Bytes poisoned, or a negative errno; written by the kernel. */
	__s64 updated;
};
#define UFFDIO_POISON _IOWR(UFFDIO, _UFFDIO_POISON, struct uffdio_poison)
#endif

#ifndef UFFDIO_COPY_MODE_WP
#define UFFDIO_COPY_MODE_WP ((__u64)1 << 1)
#endif
#ifndef UFFDIO_CONTINUE_MODE_WP
#define UFFDIO_CONTINUE_MODE_WP ((__u64)1 << 1)
#endif

/* PAGEMAP_SCAN (Linux 6.7), used with WP_ASYNC to find written pages. */
#ifndef PAGEMAP_SCAN
#include <linux/fs.h>
#define PAGE_IS_WPALLOWED  (1 << 0)
#define PAGE_IS_WRITTEN	   (1 << 1)
#define PAGE_IS_FILE	   (1 << 2)
#define PAGE_IS_PRESENT	   (1 << 3)
#define PAGE_IS_SWAPPED	   (1 << 4)
#define PAGE_IS_PFNZERO	   (1 << 5)
#define PAGE_IS_HUGE	   (1 << 6)
#define PAGE_IS_SOFT_DIRTY (1 << 7)
struct page_region {
	__u64 start;
	__u64 end;
	__u64 categories;
};
#define PM_SCAN_WP_MATCHING   (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)
struct pm_scan_arg {
	__u64 size;
	__u64 flags;
	__u64 start;
	__u64 end;
	__u64 walk_end;
	__u64 vec;
	__u64 vec_len;
	__u64 max_pages;
	__u64 category_inverted;
	__u64 category_mask;
	__u64 category_anyof_mask;
	__u64 return_mask;
};
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#endif

/* madvise: MADV_DONTNEED that drops mlocked pages too (5.18; glibc 2.36). */
#ifndef MADV_DONTNEED_LOCKED
#define MADV_DONTNEED_LOCKED 24
#endif

/* PROCMAP_QUERY (Linux 6.11): one VMA of /proc/PID/maps by ioctl. */
#ifndef PROCMAP_QUERY
#include <linux/fs.h>
struct procmap_query {
	__u64 size;
	__u64 query_flags;
	__u64 query_addr;
	__u64 vma_start;
	__u64 vma_end;
	__u64 vma_flags;
	__u64 vma_page_size;
	__u64 vma_offset;
	__u64 inode;
	__u32 dev_major;
	__u32 dev_minor;
	__u32 vma_name_size;
	__u32 build_id_size;
	__u64 vma_name_addr;
	__u64 build_id_addr;
};
#define PROCMAP_QUERY _IOWR('f', 17, struct procmap_query)
#endif

#endif /* KVP_UAPI_COMPAT_H */
