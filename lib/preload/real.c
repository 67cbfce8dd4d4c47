/*
 * real.c - the real allocation and mapping functions, and the bootstrap
 * arena; see preload_i.h.
 *
 * The real functions are found with dlsym(RTLD_NEXT).  dlsym itself may
 * allocate (glibc's dlerror buffer, the first lookup's scope arrays): those
 * calls arrive back in the hooks on the resolving thread, which then takes
 * memory from a static bump arena.  Arena blocks are never returned; free()
 * of one is ignored and realloc() of one copies it out.  Other threads wait
 * in pthread_once until resolution is done.
 */
#include "lib/preload/preload_i.h"

#include "kmod-helpers/mem.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdalign.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

struct kvp_real kvp_real;

static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;
static bool resolved; /* atomic: kvp_real is complete */
static __thread int resolving __attribute__((tls_model("initial-exec")));

#define ARENA_BYTES (256u << 10)
/* Each block is preceded by a 16-byte header holding its size. */
#define ARENA_HDR 16u

static alignas(64) unsigned char arena[ARENA_BYTES];
static size_t arena_used; /* bump pointer, atomic */

void *kvp_arena_alloc(size_t n, size_t align)
{
	size_t start, old, end;

	if (align < 16)
		align = 16;
	if (n > ARENA_BYTES || align > 4096)
		return NULL;
	old = __atomic_load_n(&arena_used, __ATOMIC_RELAXED);
	do {
		start = (old + ARENA_HDR + align - 1) & ~(align - 1);
		end = start + ((n + 15) & ~(size_t)15);
		if (end > ARENA_BYTES)
			return NULL;
	} while (!__atomic_compare_exchange_n(
	    &arena_used, &old, end, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
	memcpy(arena + start - ARENA_HDR, &n, sizeof(n));
	return arena + start; /* static storage: already zero */
}

bool kvp_arena_owns(const void *p)
{
	const unsigned char *c = p;

	return c >= arena && c < arena + ARENA_BYTES;
}

size_t kvp_arena_size(const void *p)
{
	size_t n;

	memcpy(&n, (const unsigned char *)p - ARENA_HDR, sizeof(n));
	return n;
}

void *kvp_sys_mmap(void *addr, size_t len, int prot, int flags, int fd,
		   off_t off)
{
	return kvp_mem_sys_mmap(addr, len, prot, flags, fd, off);
}

int kvp_sys_munmap(void *addr, size_t len)
{
	return (int)syscall(SYS_munmap, addr, len);
}

int kvp_sys_madvise(void *addr, size_t len, int advice)
{
	return (int)syscall(SYS_madvise, addr, len, advice);
}

#define RESOLVE(name) (*(void **)&kvp_real.name = dlsym(RTLD_NEXT, #name))

static void resolve_all(void)
{
	resolving = 1;
	RESOLVE(malloc);
	RESOLVE(free);
	RESOLVE(calloc);
	RESOLVE(realloc);
	RESOLVE(posix_memalign);
	RESOLVE(aligned_alloc);
	RESOLVE(memalign);
	RESOLVE(valloc);
	RESOLVE(pvalloc);
	RESOLVE(malloc_usable_size);
	RESOLVE(mmap);
	RESOLVE(mmap64);
	RESOLVE(munmap);
	RESOLVE(mremap);
	RESOLVE(madvise);
	RESOLVE(pthread_create);
	RESOLVE(close);
	RESOLVE(dup2);
	RESOLVE(dup3);
	__atomic_store_n(&resolved, true, __ATOMIC_RELEASE);
	resolving = 0;
}

bool kvp_preload_resolve(void)
{
	if (resolving)
		return false;
	if (__atomic_load_n(&resolved, __ATOMIC_ACQUIRE))
		return true;
	pthread_once(&resolve_once, resolve_all);
	return true;
}
