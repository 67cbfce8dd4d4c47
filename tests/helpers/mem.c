/* mem.c - aligned buffers, resident pages and huge ones. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tests/helpers/helpers.h"

void *kvp_test_xalloc(size_t len)
{
	void *p = NULL;

	ck_assert_int_eq(posix_memalign(&p, 4096, len), 0);
	return p;
}

size_t kvp_test_resident_pages(void *addr, size_t len)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	size_t n = (len + pg - 1) / pg, count = 0;
	unsigned char *vec = malloc(n ? n : 1);

	ck_assert_ptr_nonnull(vec);
	ck_assert_int_eq(mincore(addr, len, vec), 0);
	for (size_t i = 0; i < n; i++)
		count += vec[i] & 1;
	free(vec);
	return count;
}

int kvp_test_mlock(const void *addr, size_t len)
{
	return (int)syscall(SYS_mlock, addr, len);
}

int kvp_test_munlock(const void *addr, size_t len)
{
	return (int)syscall(SYS_munlock, addr, len);
}

/* Is [a, a + 2 MiB) one huge page: present, its frame numbers
 * (/proc/self/pagemap) running on from a 2 MiB-aligned one?  -1 where
 * they are hidden from this process (no CAP_SYS_ADMIN). */
int kvp_test_one_huge_page(const void *a)
{
	const uint64_t pfn_mask = (1ull << 55) - 1, present = 1ull << 63;
	uint64_t e[(2u << 20) / 4096], pfn0;
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	ssize_t got;

	if (fd < 0)
		return -1;
	got = pread(fd, e, sizeof(e), (off_t)((uintptr_t)a / 4096 * 8));
	close(fd);
	if (got != (ssize_t)sizeof(e))
		return -1;
	pfn0 = e[0] & pfn_mask;
	if ((e[0] & present) && !pfn0)
		return -1;
	if (!(e[0] & present) || pfn0 % ((2u << 20) / 4096))
		return 0;
	for (size_t i = 1; i < (2u << 20) / 4096; i++)
		if (!(e[i] & present) || (e[i] & pfn_mask) != pfn0 + i)
			return 0;
	return 1;
}
