/*
 * ioctl.c - the resolving userfaultfd ioctls, retried through EAGAIN.
 *
 * The kernel refuses UFFDIO_COPY, MOVE, WRITEPROTECT and POISON with
 * EAGAIN while an event (REMOVE, UNMAP) waits to be read from the
 * userfaultfd, and the thread that must read it may be the very thread
 * retrying.  kvp_uffd_unblock breaks that knot: on a service thread it
 * runs the reader that thread bound at start (the service loop binds the
 * event decoder, events.c, which handles the drops now and keeps the
 * faults for later); on any other thread it yields to the service threads.
 * The binding is a function pointer so that this file, which every layer
 * that resolves faults calls, calls no layer above it.
 */
#include <errno.h>
#include <sched.h>

#include "pager/pager_i.h"

/* The service thread running on this thread, and its reader. */
static _Thread_local struct kvp_service *bound_service;
static _Thread_local size_t (*bound_reader)(struct kvp_service *s);

void kvp_uffd_bind_reader(struct kvp_service *s,
			  size_t (*reader)(struct kvp_service *s))
{
	bound_service = s;
	bound_reader = reader;
}

void kvp_uffd_unblock(struct kvp_pager *p)
{
	struct kvp_service *s = bound_service;

	if (s && s->p == p && bound_reader(s))
		return;
	sched_yield(); /* another thread holds the event: let it run */
}

static int protect(struct kvp_pager *p, void *addr, size_t len, bool wp,
		   bool dontwake)
{
	int err;

	while ((err = kvp_uffd_writeprotect(&p->uffd, addr, len, wp,
					    dontwake)) == -EAGAIN)
		kvp_uffd_unblock(p);
	return err;
}

int kvp_uffd_protect(struct kvp_pager *p, void *addr, size_t len, bool wp)
{
	return protect(p, addr, len, wp, false);
}

int kvp_uffd_unprotect_quiet(struct kvp_pager *p, void *addr, size_t len)
{
	return protect(p, addr, len, false, true);
}

void kvp_uffd_poison_range(struct kvp_pager *p, void *addr, size_t len)
{
	size_t off = 0;

	while (off < len) {
		size_t done = 0;
		int err = kvp_uffd_poison(&p->uffd, (char *)addr + off,
					  len - off, false, &done);

		off += done;
		if (err == -EEXIST || err == -ENOENT)
			off += KVP_PAGE_BYTES; /* mapped or unmapped: skip */
		else if (err == -EAGAIN && done == 0)
			kvp_uffd_unblock(p);
		else if (err && err != -EAGAIN)
			break;
	}
}

void kvp_uffd_fill_zeros(struct kvp_pager *p, char *page)
{
	size_t done;
	int err;

	while ((err = kvp_uffd_copy(&p->uffd, page, p->zero_page,
				    KVP_PAGE_BYTES, false, false, &done)) ==
	       -EAGAIN)
		kvp_uffd_unblock(p);
	/* there already, or unmapped meanwhile: either way, its fault is
	 * woken to find what is there */
	if (err == -EEXIST || err == -ENOENT)
		(void)kvp_uffd_wake(&p->uffd, page, KVP_PAGE_BYTES);
}
