/*
 * fdset.c - the descriptors the engine owns; see fdset.h.
 */
#include "kmod-helpers/fdset.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define WORD_BITS (sizeof(unsigned long) * CHAR_BIT)
#define FIRST_FDS 65536u /* numbers below: a static range, no allocation */

/* The bits of the numbers [base, base + nfds); the next range up, as large
 * as all below it together, is added on the first note of a number above. */
struct fd_range {
	unsigned base, nfds;
	struct fd_range *next; /* atomic; set once, never freed */
	unsigned long *words;  /* atomic words */
};

static unsigned long first_words[FIRST_FDS / WORD_BITS];
static struct fd_range first = { 0, FIRST_FDS, NULL, first_words };

static struct fd_range *range_new(const struct fd_range *below)
{
	unsigned base = below->base + below->nfds;
	struct fd_range *r;

	r = calloc(1, sizeof(*r) + base / WORD_BITS * sizeof(unsigned long));
	if (!r)
		return NULL;
	r->base = base;
	r->nfds = base;
	r->words = (unsigned long *)(r + 1);
	return r;
}

/* The range holding @fd; with @grow the missing ranges are added (NULL
 * when out of memory), without it NULL means not noted. */
static struct fd_range *range_of(unsigned fd, bool grow)
{
	struct fd_range *r = &first, *next;

	while (fd - r->base >= r->nfds) {
		next = __atomic_load_n(&r->next, __ATOMIC_ACQUIRE);
		if (!next) {
			struct fd_range *none = NULL;

			if (!grow || !(next = range_new(r)))
				return NULL;
			/* Another thread may have added it first: theirs. */
			if (!__atomic_compare_exchange_n(&r->next, &none, next,
							 false, __ATOMIC_ACQ_REL,
							 __ATOMIC_ACQUIRE)) {
				free(next);
				next = none;
			}
		}
		r = next;
	}
	return r;
}

static unsigned long bit_of(const struct fd_range *r, unsigned fd)
{
	return 1ul << ((fd - r->base) % WORD_BITS);
}

static unsigned long *word_of(const struct fd_range *r, unsigned fd)
{
	return &r->words[(fd - r->base) / WORD_BITS];
}

int kvp_fd_note(int fd)
{
	struct fd_range *r;

	if (fd < 0)
		return -EBADF;
	r = range_of((unsigned)fd, true);
	if (!r)
		return -ENOMEM;
	__atomic_or_fetch(word_of(r, (unsigned)fd), bit_of(r, (unsigned)fd),
			  __ATOMIC_RELEASE);
	return 0;
}

/* @fd's open file at 3 or above, @fd closed; -errno (@fd closed too). */
static int move_above_std(int fd)
{
	int moved = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
	/* EINVAL: RLIMIT_NOFILE is 3 or less, no number to move to */
	int err = moved >= 0 ? 0 : errno == EINVAL ? -EMFILE : -errno;

	close(fd);
	return err ? err : moved;
}

int kvp_fd_own(int fd)
{
	int err;

	if (fd <= STDERR_FILENO && fd >= 0)
		fd = move_above_std(fd);
	if (fd < 0)
		return fd;
	err = kvp_fd_note(fd);
	if (err) {
		close(fd);
		return err;
	}
	return fd;
}

unsigned kvp_fd_hold_std(void)
{
	unsigned held = 0;
	int fd;

	while ((fd = eventfd(0, EFD_CLOEXEC)) >= 0 && fd <= STDERR_FILENO)
		held |= 1u << fd;
	if (fd >= 0)
		close(fd);
	return held;
}

void kvp_fd_release_std(unsigned held)
{
	for (int fd = 0; fd <= STDERR_FILENO; fd++)
		if (held & (1u << fd))
			close(fd);
}

void kvp_fd_disown(int fd)
{
	struct fd_range *r = fd < 0 ? NULL : range_of((unsigned)fd, false);

	if (r)
		__atomic_and_fetch(word_of(r, (unsigned)fd),
				   ~bit_of(r, (unsigned)fd), __ATOMIC_RELEASE);
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
	struct fd_range *r = fd < 0 ? NULL : range_of((unsigned)fd, false);

	return r && (__atomic_load_n(word_of(r, (unsigned)fd),
				     __ATOMIC_ACQUIRE) &
		     bit_of(r, (unsigned)fd));
}

int kvp_fd_next_owned(unsigned from)
{
	struct fd_range *r = range_of(from, false);

	for (; r; r = __atomic_load_n(&r->next, __ATOMIC_ACQUIRE)) {
		unsigned at = from > r->base ? from : r->base;
		unsigned long *w = word_of(r, at);
		unsigned long *end = r->words + r->nfds / WORD_BITS;
		/* the numbers below @at in its word are not asked for */
		unsigned long bits = __atomic_load_n(w, __ATOMIC_ACQUIRE) &
				     ~(bit_of(r, at) - 1);

		for (;;) {
			if (bits)
				return (int)(r->base +
					     (unsigned)(w - r->words) * WORD_BITS +
					     (unsigned)__builtin_ctzl(bits));
			if (++w == end)
				break;
			bits = __atomic_load_n(w, __ATOMIC_ACQUIRE);
		}
	}
	return -1;
}
