/*
 * table.c - the served allocations; see preload_i.h.
 *
 * A fixed array under one mutex: served allocations are few (each is at
 * least KVP_PRELOAD_MIN_BYTES) and the table never allocates, so it is safe
 * from inside any hook.  [lo, hi) bounds every record ever inserted since
 * the table was last empty and lets free() and munmap() of ordinary
 * memory skip the lock.  The lock is never held across a call into the
 * engine.
 */
#include "lib/preload/preload_i.h"

#include <errno.h>
#include <string.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct kvp_rec recs[KVP_PRELOAD_MAX_RECS];
static unsigned count;	 /* records in use; atomic for readers */
static uintptr_t lo, hi; /* atomic: bounds of the records */

bool kvp_table_maybe(const void *p)
{
	uintptr_t a = (uintptr_t)p;

	if (!__atomic_load_n(&count, __ATOMIC_ACQUIRE))
		return false;
	return a >= __atomic_load_n(&lo, __ATOMIC_RELAXED) &&
	       a < __atomic_load_n(&hi, __ATOMIC_RELAXED);
}

int kvp_table_insert(const struct kvp_rec *r)
{
	int err = -ENOSPC;

	pthread_mutex_lock(&lock);
	for (unsigned i = 0; i < KVP_PRELOAD_MAX_RECS; i++) {
		if (recs[i].used)
			continue;
		recs[i] = *r;
		recs[i].used = true;
		if (!count || r->start < lo)
			__atomic_store_n(&lo, r->start, __ATOMIC_RELAXED);
		if (!count || r->start + r->len > hi)
			__atomic_store_n(&hi, r->start + r->len,
					 __ATOMIC_RELAXED);
		__atomic_store_n(&count, count + 1, __ATOMIC_RELEASE);
		err = 0;
		break;
	}
	pthread_mutex_unlock(&lock);
	return err;
}

static struct kvp_rec *find_locked(uintptr_t a, bool containing)
{
	for (unsigned i = 0; i < KVP_PRELOAD_MAX_RECS; i++) {
		struct kvp_rec *r = &recs[i];

		if (!r->used)
			continue;
		if (a == r->start ||
		    (containing && a > r->start && a < r->start + r->len))
			return r;
	}
	return NULL;
}

bool kvp_table_find(const void *p, struct kvp_rec *out)
{
	struct kvp_rec *r;

	if (!kvp_table_maybe(p))
		return false;
	pthread_mutex_lock(&lock);
	r = find_locked((uintptr_t)p, false);
	if (r)
		*out = *r;
	pthread_mutex_unlock(&lock);
	return r != NULL;
}

bool kvp_table_find_containing(const void *p, struct kvp_rec *out)
{
	struct kvp_rec *r;

	if (!kvp_table_maybe(p))
		return false;
	pthread_mutex_lock(&lock);
	r = find_locked((uintptr_t)p, true);
	if (r)
		*out = *r;
	pthread_mutex_unlock(&lock);
	return r != NULL;
}

bool kvp_table_take(const void *p, int kind, struct kvp_rec *out)
{
	struct kvp_rec *r;

	if (!kvp_table_maybe(p))
		return false;
	pthread_mutex_lock(&lock);
	r = find_locked((uintptr_t)p, false);
	if (r && kind >= 0 && r->kind != (enum kvp_rec_kind)kind)
		r = NULL;
	if (r) {
		*out = *r;
		memset(r, 0, sizeof(*r));
		__atomic_store_n(&count, count - 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&lock);
	return r != NULL;
}

bool kvp_table_update(const struct kvp_rec *nr)
{
	struct kvp_rec *r;

	pthread_mutex_lock(&lock);
	r = find_locked(nr->start, false);
	if (r)
		*r = *nr;
	pthread_mutex_unlock(&lock);
	return r != NULL;
}

unsigned kvp_table_overlapping(uintptr_t a, uintptr_t b, struct kvp_rec *out,
			       unsigned max)
{
	unsigned n = 0;

	if (!__atomic_load_n(&count, __ATOMIC_ACQUIRE) ||
	    b <= __atomic_load_n(&lo, __ATOMIC_RELAXED) ||
	    a >= __atomic_load_n(&hi, __ATOMIC_RELAXED))
		return 0;
	pthread_mutex_lock(&lock);
	for (unsigned i = 0; i < KVP_PRELOAD_MAX_RECS; i++) {
		struct kvp_rec *r = &recs[i];

		if (!r->used || b <= r->start || a >= r->start + r->len)
			continue;
		if (n < max)
			out[n] = *r;
		n++;
	}
	pthread_mutex_unlock(&lock);
	return n;
}

void kvp_table_lock(void)
{
	pthread_mutex_lock(&lock);
}

void kvp_table_unlock(void)
{
	pthread_mutex_unlock(&lock);
}

/* Called in a forked child, single-threaded, with the lock not held. */
void kvp_table_orphan_all(void)
{
	for (unsigned i = 0; i < KVP_PRELOAD_MAX_RECS; i++) {
		if (!recs[i].used)
			continue;
		recs[i].orphan = true;
		recs[i].region = NULL;
		recs[i].store = NULL;
	}
}

unsigned kvp_table_count(void)
{
	return __atomic_load_n(&count, __ATOMIC_ACQUIRE);
}
