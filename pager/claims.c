/*
 * claims.c - which bytes of a store live regions hold, across pagers.
 *
 * A region writes its blocks back to its own bytes of its store.  Two
 * regions over overlapping bytes of one store, of one pager or of two,
 * would each write their blocks over the other's: the next read of either
 * gets the other's data.  So a region claims its range when it is made
 * and gives it back once destroyed (after its last write-back); a claim
 * over a range held already is refused.  One process-wide table: pagers
 * share nothing else, and a store may be handed to several.  Its lock is
 * a leaf, taken under a pager's locks and never around them.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "pager/pager_i.h"

struct claim {
	const struct kvp_store *store;
	uint64_t off, len;
	const void *owner;
};

static pthread_mutex_t claims_lock = PTHREAD_MUTEX_INITIALIZER;
static struct claim *claims;
static size_t nclaims, claims_room;

int kvp_store_claim(const struct kvp_store *st, uint64_t off, uint64_t len,
		    const void *owner)
{
	int err = 0;

	pthread_mutex_lock(&claims_lock);
	for (size_t i = 0; i < nclaims && !err; i++)
		if (claims[i].store == st && claims[i].off < off + len &&
		    off < claims[i].off + claims[i].len)
			err = -EBUSY;
	if (!err && nclaims == claims_room) {
		size_t room = claims_room ? 2 * claims_room : 16;
		struct claim *c = realloc(claims, room * sizeof(*c));

		if (c) {
			claims = c;
			claims_room = room;
		} else {
			err = -ENOMEM;
		}
	}
	if (!err)
		claims[nclaims++] = (struct claim){ st, off, len, owner };
	pthread_mutex_unlock(&claims_lock);
	return err;
}

void kvp_store_unclaim(const void *owner)
{
	pthread_mutex_lock(&claims_lock);
	for (size_t i = 0; i < nclaims; i++)
		if (claims[i].owner == owner) {
			claims[i] = claims[--nclaims];
			break;
		}
	pthread_mutex_unlock(&claims_lock);
}
