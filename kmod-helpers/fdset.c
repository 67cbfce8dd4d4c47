/*
 * fdset.c - the descriptors the engine owns; see fdset.h.
 */
#include "kmod-helpers/fdset.h"

#include <limits.h>
#include <unistd.h>

#define WORD_BITS (sizeof(unsigned long) * CHAR_BIT)

static unsigned long owned[KVP_FDSET_MAX / WORD_BITS]; /* atomic words */

void kvp_fd_own(int fd)
{
	if (fd >= 0 && fd < KVP_FDSET_MAX)
		__atomic_or_fetch(&owned[fd / WORD_BITS],
				  1ul << (fd % WORD_BITS), __ATOMIC_RELEASE);
}

void kvp_fd_disown(int fd)
{
	if (fd >= 0 && fd < KVP_FDSET_MAX)
		__atomic_and_fetch(&owned[fd / WORD_BITS],
				   ~(1ul << (fd % WORD_BITS)), __ATOMIC_RELEASE);
}

/* Disowned first: once closed, the number may be the program's next file's,
 * which must close as any other. */
int kvp_fd_close(int fd)
{
	kvp_fd_disown(fd);
	return close(fd);
}

bool kvp_fd_owned(int fd)
{
	return fd >= 0 && fd < KVP_FDSET_MAX &&
	       (__atomic_load_n(&owned[fd / WORD_BITS], __ATOMIC_ACQUIRE) &
		(1ul << (fd % WORD_BITS)));
}
