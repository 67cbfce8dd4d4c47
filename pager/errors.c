/*
 * errors.c - what a kvpager return code means, and what to do about it.
 */
#include <errno.h>
#include <string.h>

#include "pager/pager.h"

const char *kvp_strerror(int err)
{
	switch (err < 0 ? -err : err) {
	case 0:
		return "success";
	case EINVAL:
		return "invalid argument: a size, block size, alignment, range "
		       "or tunable value is out of bounds (see pager.h and "
		       "kvpctl list)";
	case EPERM:
	case EACCES:
		return "no permission to use userfaultfd: run as root, with "
		       "CAP_SYS_PTRACE, with read-write access to "
		       "/dev/userfaultfd, or set vm.unprivileged_userfaultfd=1";
	case ENOMEM:
		return "out of memory or address space (or vm.max_map_count "
		       "regions reached; a pager reserves 4.5 times its "
		       "budget of address space): free regions, raise "
		       "vm.max_map_count, the memory limit or ulimit -v";
	case ENOSPC:
		return "no space: the backing store is full, or more would "
		       "be pinned than the RAM budget holds";
	case EEXIST:
		return "already exists: a region of that name is open";
	case EIO:
		return "I/O error: the store failed a read or write (a read "
		       "error poisons the block: accesses get SIGBUS)";
	case ETIMEDOUT:
		return "timed out: the prefetch is still in flight";
	case EOPNOTSUPP:
		return "the kernel lacks a userfaultfd feature the pager "
		       "needs (UFFDIO_MOVE and EVENT_REMOVE/UNMAP, Linux 6.8 "
		       "or later): run kvp-probe to see what is missing";
	case EBUSY:
		return "busy: the block is pinned, or more is pinned than "
		       "the new budget";
	case ENOSYS:
		return "userfaultfd or io_uring is not built into this "
		       "kernel: run kvp-probe";
	case EOVERFLOW:
		return "too many nested pins on one block";
	default:
		return strerror(err < 0 ? -err : err);
	}
}
