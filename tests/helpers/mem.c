/* mem.c - aligned buffers and resident pages. */
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
