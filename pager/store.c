/*
 * store.c - the generic store calls: thin wrappers over a store's ops.
 *
 * The contract is in store.h.  Synchronous calls move the whole range or
 * fail: the ops return 0 or -errno, and a short transfer is already -EIO in
 * every store; a range outside the store is refused here, once, for all.
 */
#include "pager/store.h"

#include <errno.h>

static bool store_range_ok(const struct kvp_store *s, size_t len, uint64_t off)
{
	return off <= s->size && len <= s->size - off;
}

int kvp_store_pread(struct kvp_store *s, void *buf, size_t len, uint64_t off)
{
	if (!s || !s->ops || !s->ops->pread || (!buf && len))
		return -EINVAL;
	if (!store_range_ok(s, len, off))
		return -EINVAL;
	if (!len)
		return 0;
	return s->ops->pread(s, buf, len, off);
}

int kvp_store_pwrite(struct kvp_store *s, const void *buf, size_t len,
		     uint64_t off)
{
	if (!s || !s->ops || !s->ops->pwrite || (!buf && len))
		return -EINVAL;
	if (!store_range_ok(s, len, off))
		return -EINVAL;
	if (!len)
		return 0;
	return s->ops->pwrite(s, buf, len, off);
}

void kvp_store_destroy(struct kvp_store *s)
{
	if (s && s->ops && s->ops->destroy)
		s->ops->destroy(s);
}
