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
 *
 * The event lock (p->evlock) lives here for the same reason.  madvise
 * returns once its REMOVE is read, and the kernel zaps the range after
 * that read, not before: from the read until the drop is handled
 * (events.c), the pager does not know of it, and a page it installs
 * there meanwhile may land after the zap and keep the bytes the program
 * dropped (a load's, or the pages of a move put back).  So a reader holds
 * the lock's write side from its read until it has handled the drops it
 * read, and an install holds the read side (kvp_install_guard) from the
 * look at its block's drops to its last ioctl: it lands before the read,
 * and the zap after it takes the page, or after the drop was handled, and
 * puts zeros there.  Installs go on side by side; only readers wait.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>

#include "pager/pager_i.h"

/* The service thread running on this thread, and its reader. */
static _Thread_local struct kvp_service *bound_service;
static _Thread_local size_t (*bound_reader)(struct kvp_service *s);
/* This thread holds evlock's write side (a reader, and the reads nested
 * in its ioctls' retries), or its read side (guard_depth installs). */
static _Thread_local bool ev_writer;
static _Thread_local unsigned guard_depth;

bool kvp_evlock_read_events(struct kvp_pager *p, bool try)
{
	if (try ? pthread_rwlock_trywrlock(&p->evlock) != 0
		: pthread_rwlock_wrlock(&p->evlock) != 0)
		return false;
	ev_writer = true;
	return true;
}

void kvp_evlock_read_done(struct kvp_pager *p)
{
	ev_writer = false;
	pthread_rwlock_unlock(&p->evlock);
}

bool kvp_evlock_nested(void)
{
	return ev_writer;
}

void kvp_install_guard(struct kvp_pager *p)
{
	if (!ev_writer && guard_depth++ == 0)
		pthread_rwlock_rdlock(&p->evlock);
}

void kvp_install_unguard(struct kvp_pager *p)
{
	if (!ev_writer && --guard_depth == 0)
		pthread_rwlock_unlock(&p->evlock);
}

void kvp_uffd_bind_reader(struct kvp_service *s,
			  size_t (*reader)(struct kvp_service *s))
{
	bound_service = s;
	bound_reader = reader;
}

void kvp_uffd_unblock(struct kvp_pager *p)
{
	struct kvp_service *s = bound_service;
	bool ours = s && s->p == p;

	size_t got = 0;

	if (guard_depth && !ev_writer) {
		/* A guarded install lets a reader in, and the caller looks
		 * at its block's drops again.  It waits for the write side
		 * rather than try it: two installs retrying side by side
		 * would each find the other's read side held. */
		pthread_rwlock_unlock(&p->evlock);
		if (ours && kvp_evlock_read_events(p, false)) {
			got = bound_reader(s);
			kvp_evlock_read_done(p);
		}
		if (!got)
			sched_yield();
		pthread_rwlock_rdlock(&p->evlock);
		return;
	}
	if (ours)
		got = bound_reader(s);
	/* Nothing read: another thread holds the event, or the one read
	 * has yet to wake its madvise (the kernel refuses installs until
	 * that thread runs): let it run. */
	if (!got)
		sched_yield();
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
