/*
 * devpool.c - the device block pool's bookkeeping (devpool.h).
 *
 * Slots not EMPTY sit on one list in order of last use (head: the least
 * recent).  Stages only go forward, so the held slots (last stage not
 * released) are a tail of that list: when the head is held, every slot
 * is, and the pool is full.  Keys find slots through a chained hash.
 */
#include <errno.h>
#include <stdlib.h>

#include "lib/device/devpool.h"

#define NONE KVP_DEVPOOL_NONE

struct slot {
	uint64_t key;	     /* layer << 32 | pblock; valid unless EMPTY */
	uint64_t stage;	     /* last stage that assigned it */
	uint32_t prev, next; /* the use list (or next: the free list) */
	uint32_t chain;	     /* next slot of the same hash bucket */
	bool used;	     /* not EMPTY */
};

struct kvp_devpool {
	struct slot *s;	    /* nslots */
	uint32_t nslots;    /* slots in all */
	uint32_t *bucket;   /* nbuckets chain heads */
	uint32_t nbuckets;  /* a power of two >= 2 * nslots */
	uint32_t head, tail; /* the use list: least, most recent */
	uint32_t free_head;  /* EMPTY slots */
	uint64_t done;	     /* stages below this are released */
	uint64_t top;	     /* the newest stage assigned */
	struct kvp_devpool_stats st;
};

static uint64_t key_of(uint32_t layer, uint32_t pblock)
{
	return (uint64_t)layer << 32 | pblock;
}

static uint32_t hash_of(const struct kvp_devpool *p, uint64_t key)
{
	return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32) &
	       (p->nbuckets - 1);
}

int kvp_devpool_create(uint32_t nslots, struct kvp_devpool **out)
{
	struct kvp_devpool *p;
	uint32_t i;

	if (!nslots || nslots >= NONE / 4)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->nslots = nslots;
	for (p->nbuckets = 16; p->nbuckets < 2 * nslots; p->nbuckets <<= 1)
		;
	p->s = calloc(nslots, sizeof(*p->s));
	p->bucket = malloc(sizeof(uint32_t) * p->nbuckets);
	if (!p->s || !p->bucket) {
		kvp_devpool_destroy(p);
		return -ENOMEM;
	}
	for (i = 0; i < p->nbuckets; i++)
		p->bucket[i] = NONE;
	for (i = 0; i < nslots; i++)
		p->s[i].next = i + 1 < nslots ? i + 1 : NONE;
	p->free_head = 0;
	p->head = p->tail = NONE;
	*out = p;
	return 0;
}

void kvp_devpool_destroy(struct kvp_devpool *p)
{
	if (!p)
		return;
	free(p->s);
	free(p->bucket);
	free(p);
}

static void list_unlink(struct kvp_devpool *p, uint32_t i)
{
	struct slot *s = &p->s[i];

	if (s->prev != NONE)
		p->s[s->prev].next = s->next;
	else
		p->head = s->next;
	if (s->next != NONE)
		p->s[s->next].prev = s->prev;
	else
		p->tail = s->prev;
}

static void list_append(struct kvp_devpool *p, uint32_t i)
{
	struct slot *s = &p->s[i];

	s->prev = p->tail;
	s->next = NONE;
	if (p->tail != NONE)
		p->s[p->tail].next = i;
	else
		p->head = i;
	p->tail = i;
}

static void hash_remove(struct kvp_devpool *p, uint32_t i)
{
	uint32_t *link = &p->bucket[hash_of(p, p->s[i].key)];

	while (*link != i)
		link = &p->s[*link].chain;
	*link = p->s[i].chain;
}

static void hash_insert(struct kvp_devpool *p, uint32_t i)
{
	uint32_t b = hash_of(p, p->s[i].key);

	p->s[i].chain = p->bucket[b];
	p->bucket[b] = i;
}

static uint32_t find(const struct kvp_devpool *p, uint64_t key)
{
	uint32_t i = p->bucket[hash_of(p, key)];

	while (i != NONE && p->s[i].key != key)
		i = p->s[i].chain;
	return i;
}

/* Slot i becomes EMPTY. */
static void empty_slot(struct kvp_devpool *p, uint32_t i)
{
	hash_remove(p, i);
	list_unlink(p, i);
	p->s[i].used = false;
	p->s[i].next = p->free_head;
	p->free_head = i;
}

int kvp_devpool_assign(struct kvp_devpool *p, uint32_t layer, uint32_t pblock,
		       uint64_t stage, uint32_t *slot)
{
	uint64_t key = key_of(layer, pblock);
	uint32_t i;

	if (stage < p->top || stage < p->done)
		return -EINVAL;
	i = find(p, key);
	if (i != NONE) {
		list_unlink(p, i);
		list_append(p, i);
		p->s[i].stage = stage;
		p->top = stage;
		p->st.reused++;
		*slot = i;
		return 0;
	}
	if (p->free_head != NONE) {
		i = p->free_head;
		p->free_head = p->s[i].next;
	} else {
		i = p->head;
		if (p->s[i].stage >= p->done)
			return -ENOSPC; /* the least recent is held: all are */
		empty_slot(p, i);
		p->free_head = p->s[i].next;
		p->st.evicted++;
	}
	p->s[i].used = true;
	p->s[i].key = key;
	p->s[i].stage = stage;
	hash_insert(p, i);
	list_append(p, i);
	p->top = stage;
	p->st.copied++;
	*slot = i;
	return 1;
}

void kvp_devpool_unassign(struct kvp_devpool *p, uint32_t slot)
{
	if (slot < p->nslots && p->s[slot].used) {
		empty_slot(p, slot);
		p->st.copied--;
	}
}

void kvp_devpool_release(struct kvp_devpool *p, uint64_t stage)
{
	if (stage + 1 > p->done)
		p->done = stage + 1;
}

bool kvp_devpool_forget(struct kvp_devpool *p, uint32_t layer,
			uint32_t pblock)
{
	uint32_t i = find(p, key_of(layer, pblock));

	if (i == NONE)
		return true;
	if (p->s[i].stage >= p->done)
		return false;
	empty_slot(p, i);
	p->st.forgot++;
	return true;
}

void kvp_devpool_forget_all(struct kvp_devpool *p)
{
	/* the held slots are a tail of the use list: empty from the head */
	while (p->head != NONE && p->s[p->head].stage < p->done) {
		empty_slot(p, p->head);
		p->st.forgot++;
	}
}

uint32_t kvp_devpool_lookup(const struct kvp_devpool *p, uint32_t layer,
			    uint32_t pblock)
{
	return find(p, key_of(layer, pblock));
}

uint32_t kvp_devpool_held(const struct kvp_devpool *p)
{
	uint32_t i, n = 0;

	for (i = p->tail; i != NONE && p->s[i].stage >= p->done;
	     i = p->s[i].prev)
		n++;
	return n;
}

uint32_t kvp_devpool_slots(const struct kvp_devpool *p)
{
	return p->nslots;
}

void kvp_devpool_stats(const struct kvp_devpool *p,
		       struct kvp_devpool_stats *out)
{
	*out = p->st;
}
