/*
 * rtab.c - from an address to its region: the table of regions sorted by
 * address, rebuilt when a region comes or goes.  Under p->lock.
 */
#include <errno.h>
#include <stdlib.h>

#include "pager/pager_i.h"

static int region_cmp(const void *a, const void *b)
{
	const struct kvp_region *x = *(struct kvp_region *const *)a;
	const struct kvp_region *y = *(struct kvp_region *const *)b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

int kvp_rtab_rebuild(struct kvp_pager *p)
{
	struct kvp_region **t = NULL;
	unsigned n = 0;

	if (p->nregions) {
		t = malloc(p->nregions * sizeof(*t));
		if (!t)
			return -ENOMEM;
		for (struct kvp_region *r = p->regions; r; r = r->next)
			t[n++] = r;
		qsort(t, n, sizeof(*t), region_cmp);
	}
	free(p->rtab);
	p->rtab = t;
	return 0;
}

struct kvp_region *kvp_region_find(struct kvp_pager *p, uintptr_t addr)
{
	unsigned lo = 0, hi = p->nregions;

	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;
		struct kvp_region *r = p->rtab[mid];

		if (addr < (uintptr_t)r->addr)
			hi = mid;
		else if (addr >= (uintptr_t)r->addr + r->size)
			lo = mid + 1;
		else
			return r;
	}
	return NULL;
}
