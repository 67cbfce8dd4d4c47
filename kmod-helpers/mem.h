/*
 * mem.h - address-space helpers: aligned reservations, THP, memfd, madvise.
 *
 * All calls return 0 or -errno.  No locks are taken.
 */
#ifndef KVP_MEM_H
#define KVP_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define KVP_PAGE_SIZE 4096UL
#define KVP_HUGE_SIZE (2UL << 20) /* PMD size on x86-64 */

/*
 * kvp_mem_reserve - map @len bytes of private anonymous memory (read/write,
 * MAP_NORESERVE, nothing populated and not locked, also under
 * mlockall(MCL_FUTURE)) whose start is a multiple of @align (a power of two
 * >= 4 KiB).  With @huge, the range is madvised MADV_HUGEPAGE.  On success
 * *addr is the start; on failure nothing stays mapped.
 */
int kvp_mem_reserve(size_t len, size_t align, bool huge, void **addr);

/*
 * kvp_mem_sys_mmap - mmap(2) by its system call, never through a symbol
 * an LD_PRELOAD shim interposes.  As mmap(2): the address, or MAP_FAILED
 * with errno set (ENOMEM for an address-space limit, not EPERM).
 */
void *kvp_mem_sys_mmap(void *addr, size_t len, int prot, int flags, int fd,
		       off_t off);

/* kvp_mem_release - unmap a range from kvp_mem_reserve. */
int kvp_mem_release(void *addr, size_t len);

/*
 * kvp_mem_populate - fault the range in for writing now (MADV_POPULATE_WRITE,
 * or a touch per page where the kernel lacks it), so that its first use does
 * not pay the page faults.  (In a guest that shadows page tables the first
 * access to each page still traps once: kvp-probe's `page first touch`.)
 */
int kvp_mem_populate(void *addr, size_t len);

/*
 * kvp_mem_page_resident - is the 4 KiB page at @page (aligned) present in
 * memory (mincore)?  False too when it is not mapped.
 */
bool kvp_mem_page_resident(const void *page);

/*
 * kvp_mem_range_mapped - is all of [@addr, @addr + @len) (page aligned)
 * mapped, whatever is present (mincore)?
 */
bool kvp_mem_range_mapped(const void *addr, size_t len);

/*
 * kvp_mem_range_resident - is every page of [@addr, @addr + @len) (page
 * aligned) present in memory now (mincore)?
 */
bool kvp_mem_range_resident(const void *addr, size_t len);

/*
 * kvp_mem_any_resident - is any page of [@addr, @addr + @len) (page
 * aligned) present, the parts not mapped aside (mincore, page by page)?
 */
bool kvp_mem_any_resident(const void *addr, size_t len);

/*
 * kvp_mem_resident_bits - for each page of [@addr, @addr + @len) (page
 * aligned) present in memory, set its bit in @bits, counting from bit
 * @bit (mincore; a page not mapped is not present).
 */
void kvp_mem_resident_bits(const void *addr, size_t len, uint64_t *bits,
			   size_t bit);

/*
 * kvp_mem_io_alloc - a buffer for O_DIRECT I/O of @len bytes, released
 * with kvp_mem_io_free(p, @len), of kvp_mem_io_bytes(@len) bytes: page
 * aligned, and from 2 MiB on a mapping of whole huge pages (2 MiB
 * aligned, MADV_HUGEPAGE) where the kernel grants them.  virtio-blk
 * splits I/O from small pages into requests of 254 pages, and a device
 * without indirect descriptors (Firecracker's) takes one such request at
 * a time: 16 MiB O_DIRECT writes ran at 2.0 GB/s from small pages and
 * 3.0 from huge ones, reads at 1.2 and 2.2.  NULL when out of memory.
 */
void *kvp_mem_io_alloc(size_t len);
/* kvp_mem_io_free - release kvp_mem_io_alloc(@len)'s @p (NULL: nothing);
 * @len may also be the kvp_mem_io_bytes it took. */
void kvp_mem_io_free(void *p, size_t len);
size_t kvp_mem_io_bytes(size_t len);

/* kvp_mem_advise - madvise(2) returning -errno. */
int kvp_mem_advise(void *addr, size_t len, int advice);

/*
 * kvp_mem_drop - drop the pages of a range (MADV_DONTNEED), those the
 * program mlocked too (MADV_DONTNEED_LOCKED, Linux 5.18: a plain one
 * stops at a locked VMA); 0 or -errno.
 */
int kvp_mem_drop(void *addr, size_t len);

/*
 * kvp_mem_self_pidfd - a pidfd for this process (pidfd_open), for
 * kvp_mem_advise_batch.  Returns the descriptor (close it) or -errno.
 */
int kvp_mem_self_pidfd(void);

/*
 * kvp_mem_advise_batch - process_madvise(2) of @n ranges of this process
 * (@pidfd from kvp_mem_self_pidfd) with one @advice: one call, and for
 * MADV_DONTNEED one TLB flush for the whole batch on kernels that batch it
 * (6.16 and later).  The kernel stops at the first range it fails on:
 * *done receives the bytes advised, in range order.  Returns 0 when every
 * range was advised, -EAGAIN when only the first *done bytes were (the
 * kernel does not say why), else -errno (-EINVAL: the kernel does not take
 * @advice from process_madvise).
 */
int kvp_mem_advise_batch(int pidfd, const struct iovec *iov, size_t n,
			 int advice, size_t *done);

/*
 * kvp_mem_batch_dontneed_works - does this kernel take MADV_DONTNEED_LOCKED
 * (MADV_DONTNEED that drops pages the program mlocked as well, which the
 * pager's zapper uses) from process_madvise (tried on a page of our own)?
 * @pidfd from kvp_mem_self_pidfd.  Returns 0 when it does, else -errno
 * (-EINVAL: it does not take that advice there).
 */
int kvp_mem_batch_dontneed_works(int pidfd);

/*
 * kvp_mem_vma_open - a descriptor for kvp_mem_vma_at (/proc/self/maps).
 * Returns it (close it) or -errno.
 */
int kvp_mem_vma_open(void);

/*
 * kvp_mem_vma_at - the bounds of this process's VMA that holds @addr, now
 * (PROCMAP_QUERY, Linux 6.11), into *start and *end.  @fd from
 * kvp_mem_vma_open.  Returns 0, -ENOENT when no VMA holds @addr, or
 * -ENOTTY on older kernels.
 */
int kvp_mem_vma_at(int fd, const void *addr, uintptr_t *start,
		   uintptr_t *end);

/* kvp_mem_memfd - memfd_create(@name, MFD_CLOEXEC) sized to @len. */
int kvp_mem_memfd(const char *name, size_t len, int *fd);

/*
 * kvp_thp_mode - the transparent huge page mode of
 * /sys/kernel/mm/transparent_hugepage/enabled: "always", "madvise" or
 * "never", copied into @buf.  Returns 0 or -errno (-ENOENT without THP).
 */
int kvp_thp_mode(char *buf, size_t len);

/* What a 4 KiB page costs this machine, in microseconds (kvp_mem_touch_cost). */
struct kvp_mem_touch_cost {
	double first_us; /* reading it the first time after it was mapped */
	double again_us; /* reading it again */
	double copy_us;	 /* copying it whole into another mapped page */
};

/* The pages the pager measures at open, and kvp-probe with it. */
#define KVP_MEM_TOUCH_COST_PAGES 64

/*
 * kvp_mem_touch_cost - measure *out now, on @pages 4 KiB pages mapped and
 * populated for the purpose (no huge pages), the least of three tries (a
 * try preempted halfway says nothing of the machine).  In a guest whose
 * hypervisor shadows page tables the first read of each new mapping traps
 * (microseconds); with nested paging it costs nothing more than a second
 * read.  Takes well under a millisecond there and a few where first
 * touches are slow.  Returns 0 or -errno (-ENOMEM: no memory to map).
 */
int kvp_mem_touch_cost(unsigned pages, struct kvp_mem_touch_cost *out);

#endif /* KVP_MEM_H */
