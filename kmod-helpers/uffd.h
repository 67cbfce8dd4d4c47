/*
 * uffd.h - userfaultfd: opening, the API handshake and the resolving ioctls.
 *
 * This is the only interface to userfaultfd in kvpager.  Every call returns 0
 * or a negative errno and never leaves the result in errno.  The resolving
 * calls (copy, zeropage, move, continue, poison) share one convention,
 * written once here:
 *
 *   0        the whole range was resolved (and woken unless DONTWAKE);
 *   -EEXIST  the first page of the range was already present: another
 *            thread or an earlier call resolved it.  *done is 0; the caller
 *            wakes the range (or retries past that page).
 *   -EAGAIN  the kernel stopped part-way: the mm is changing, a signal, or
 *            a later page of the range was already present (the kernel
 *            reports a partial EEXIST this way); *done bytes were resolved
 *            and woken, retry the rest.
 *   -ENOENT  the mapping changed under us (unmapped or remapped); forget it.
 *   -ESRCH   the process that owns the mm is gone.
 *   other    a real error: -EINVAL for a bad range, -ENOMEM, -EFAULT ...
 *
 * Locks: none taken; these calls are safe from any thread.
 */
#ifndef KVP_UFFD_H
#define KVP_UFFD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmod-helpers/uapi_compat.h"

/* How the descriptor was obtained; decides which faults it sees. */
enum kvp_uffd_mode {
	KVP_UFFD_FULL = 0,  /* sees faults taken inside the kernel too */
	KVP_UFFD_USER_ONLY, /* UFFD_USER_MODE_ONLY: kernel faults get EFAULT */
};

struct kvp_uffd {
	int fd;			 /* the userfaultfd, O_CLOEXEC|O_NONBLOCK */
	enum kvp_uffd_mode mode; /* full or user-mode-only */
	const char *source;	 /* "syscall", "/dev/userfaultfd", ... */
	uint64_t features;	 /* features granted by UFFDIO_API */
	uint64_t ioctls;	 /* ioctls the handshake advertised */
};

/* Open flags. */
#define KVP_UFFD_REQUIRE_FULL (1u << 0) /* fail rather than fall back */

/*
 * kvp_uffd_open - open a userfaultfd, preferring full mode.
 *
 * Tries, in order: the syscall without UFFD_USER_MODE_ONLY (root,
 * CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1), /dev/userfaultfd with
 * USERFAULTFD_IOC_NEW, then the syscall with UFFD_USER_MODE_ONLY (unless
 * KVP_UFFD_REQUIRE_FULL).  The descriptor is non-blocking and close-on-exec.
 * No handshake is done.  Returns 0, or -EPERM / -ENOSYS / ... with *u left
 * closed (fd = -1).
 */
int kvp_uffd_open(struct kvp_uffd *u, unsigned flags);

/* The ways of obtaining a userfaultfd, for kvp_uffd_open_via. */
enum kvp_uffd_via {
	KVP_UFFD_VIA_SYSCALL = 0,  /* userfaultfd(2), full mode */
	KVP_UFFD_VIA_DEVICE,	   /* /dev/userfaultfd + USERFAULTFD_IOC_NEW */
	KVP_UFFD_VIA_SYSCALL_USER, /* userfaultfd(UFFD_USER_MODE_ONLY) */
};

/*
 * kvp_uffd_open_via - open a userfaultfd in exactly one way, with no
 * fallback (for probes and tests; the pager uses kvp_uffd_open).  Returns 0,
 * or -errno with *u left closed (fd = -1): -EPERM where the syscall is
 * refused (vm.unprivileged_userfaultfd=0 without CAP_SYS_PTRACE), -ENOENT or
 * -EACCES for the device, -ENOSYS without userfaultfd.
 */
int kvp_uffd_open_via(struct kvp_uffd *u, enum kvp_uffd_via via);

/*
 * kvp_uffd_supported - the features and ioctls this kernel offers, learnt
 * from a handshake on a throw-away descriptor.  Returns 0 or -errno.
 */
int kvp_uffd_supported(uint64_t *features, uint64_t *ioctls);

/*
 * kvp_uffd_api - the UFFDIO_API handshake.
 *
 * Asks for (@wanted | @required) & what the kernel supports.  Fails with
 * -EOPNOTSUPP, before touching the descriptor, if any bit of @required is
 * not supported; the descriptor can then still be handshaken with fewer
 * features.  A successful handshake happens once per descriptor: a second
 * one fails with -EINVAL.  The features granted (those asked for that the
 * kernel supports, not everything the kernel offers) are left in
 * u->features, the ioctls in u->ioctls.
 */
int kvp_uffd_api(struct kvp_uffd *u, uint64_t wanted, uint64_t required);

/* kvp_uffd_close - close the descriptor; safe on a closed one. */
void kvp_uffd_close(struct kvp_uffd *u);

/*
 * kvp_uffd_register - register [addr, addr+len) with @mode
 * (UFFDIO_REGISTER_MODE_MISSING | _WP | _MINOR).  *ioctls, if not NULL,
 * receives the ioctls allowed on the range.  Returns 0 or -errno (-EINVAL
 * for misalignment or an unsupported mode, -ENOMEM when the kernel cannot
 * split more VMAs: see vm.max_map_count).
 */
int kvp_uffd_register(struct kvp_uffd *u, void *addr, size_t len, uint64_t mode,
		      uint64_t *ioctls);
int kvp_uffd_unregister(struct kvp_uffd *u, void *addr, size_t len);

/* The resolving ioctls; see the convention above.  @done may be NULL. */
int kvp_uffd_copy(struct kvp_uffd *u, void *dst, const void *src, size_t len,
		  bool wp, bool dontwake, size_t *done);
int kvp_uffd_zeropage(struct kvp_uffd *u, void *dst, size_t len, bool dontwake,
		      size_t *done);
/*
 * @mode: UFFDIO_MOVE_MODE_DONTWAKE | UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES.
 * Some kernels (6.18 seen) fail with EEXIST after moving pages they do not
 * count; kvp_uffd_move counts them itself, as the run of pages present at
 * dst and absent at src from where the kernel stopped, and returns 0 or
 * -EAGAIN with *done past them.  A dst page that was there before the call
 * over a src hole is counted too: neither needs moving.  ALLOW_SRC_HOLES is
 * done here, never by the kernel (6.18 can spin for ever in it: uffd.c);
 * with it, -ENOENT (a page or range unmapped) may come with *done > 0.
 */
int kvp_uffd_move(struct kvp_uffd *u, void *dst, void *src, size_t len,
		  uint64_t mode, size_t *done);
int kvp_uffd_continue(struct kvp_uffd *u, void *addr, size_t len, bool wp,
		      bool dontwake, size_t *done);
int kvp_uffd_poison(struct kvp_uffd *u, void *addr, size_t len, bool dontwake,
		    size_t *done);

/* Set (@wp true) or clear write protection; clearing wakes unless DONTWAKE. */
int kvp_uffd_writeprotect(struct kvp_uffd *u, void *addr, size_t len, bool wp,
			  bool dontwake);

/* Wake threads waiting on faults in the range. */
int kvp_uffd_wake(struct kvp_uffd *u, void *addr, size_t len);

/*
 * kvp_uffd_read - read up to @max messages without blocking.  Returns 0 with
 * *n >= 1, or -EAGAIN when none is queued (POLLIN can be spurious after
 * another thread read the message), or -errno.
 */
int kvp_uffd_read(struct kvp_uffd *u, struct uffd_msg *msgs, size_t max,
		  size_t *n);

/* Name of one UFFD_FEATURE_* bit ("MOVE", "POISON", ...), or NULL. */
const char *kvp_uffd_feature_name(uint64_t bit);

#endif /* KVP_UFFD_H */
