/*
 * block_table.c - PagedAttention block tables over a refcounted allocator.
 *
 * Invariants (checked by table_sane() in debug builds):
 *   1. refs[b] == 0 exactly when bit b of used[] is clear;
 *   2. every entry of every live table's map is an allocated block, and
 *      refs[b] counts the table entries naming b;
 *   3. a table holds ceil(tokens / G) entries;
 *   4. hint <= the lowest free block.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/kv/block_table.h"

struct kvp_block_alloc {
	uint32_t nblocks;	/* capacity */
	uint32_t nfree;		/* free blocks */
	uint32_t hint;		/* no free block below this */
	uint32_t *refs;		/* reference count per block */
	uint64_t *used;		/* bit set: allocated */
	kvp_block_copy_fn copy; /* copy-on-write callback or NULL */
	void *copy_arg;
};

struct kvp_block_table {
	struct kvp_block_alloc *a;
	uint32_t g;	 /* tokens per block */
	uint64_t tokens; /* tokens in the sequence */
	uint32_t nmap;	 /* entries in use */
	uint32_t capmap; /* entries allocated */
	uint32_t *map;	 /* logical -> physical */
};

int kvp_block_alloc_create(uint32_t nblocks, struct kvp_block_alloc **out)
{
	struct kvp_block_alloc *a;
	size_t words = ((size_t)nblocks + 63) / 64;

	if (nblocks == 0 || nblocks >= KVP_BLOCK_NONE)
		return -EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->refs = calloc(nblocks, sizeof(*a->refs));
	a->used = calloc(words, sizeof(*a->used));
	if (!a->refs || !a->used) {
		free(a->refs);
		free(a->used);
		free(a);
		return -ENOMEM;
	}
	a->nblocks = nblocks;
	a->nfree = nblocks;
	*out = a;
	return 0;
}

void kvp_block_alloc_destroy(struct kvp_block_alloc *a)
{
	if (!a)
		return;
	free(a->refs);
	free(a->used);
	free(a);
}

void kvp_block_alloc_set_copy(struct kvp_block_alloc *a, kvp_block_copy_fn fn,
			      void *arg)
{
	a->copy = fn;
	a->copy_arg = fn ? arg : NULL;
}

int kvp_block_alloc_get(struct kvp_block_alloc *a, uint32_t *out)
{
	size_t w, words = ((size_t)a->nblocks + 63) / 64;

	if (a->nfree == 0)
		return -ENOSPC;
	for (w = a->hint / 64; w < words; w++) {
		uint64_t freebits = ~a->used[w];
		uint32_t b;

		if (w == a->hint / 64)
			freebits &= ~0ULL << (a->hint % 64);
		if (!freebits)
			continue;
		b = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(freebits));
		if (b >= a->nblocks)
			break;
		a->used[w] |= 1ULL << (b % 64);
		a->refs[b] = 1;
		a->nfree--;
		a->hint = b + 1;
		*out = b;
		return 0;
	}
	return -ENOSPC; /* unreachable while nfree is right */
}

static bool valid_used(const struct kvp_block_alloc *a, uint32_t b)
{
	return b < a->nblocks && a->refs[b] > 0;
}

int kvp_block_alloc_ref(struct kvp_block_alloc *a, uint32_t b)
{
	if (!valid_used(a, b) || a->refs[b] == UINT32_MAX)
		return -EINVAL;
	a->refs[b]++;
	return 0;
}

int kvp_block_alloc_put(struct kvp_block_alloc *a, uint32_t b, bool *freed)
{
	if (!valid_used(a, b))
		return -EINVAL;
	if (--a->refs[b] == 0) {
		a->used[b / 64] &= ~(1ULL << (b % 64));
		a->nfree++;
		if (b < a->hint)
			a->hint = b;
	}
	if (freed)
		*freed = a->refs[b] == 0;
	return 0;
}

uint32_t kvp_block_alloc_refcount(const struct kvp_block_alloc *a, uint32_t b)
{
	return b < a->nblocks ? a->refs[b] : 0;
}

bool kvp_block_alloc_is_free(const struct kvp_block_alloc *a, uint32_t b)
{
	return b < a->nblocks && a->refs[b] == 0;
}

uint32_t kvp_block_alloc_capacity(const struct kvp_block_alloc *a)
{
	return a->nblocks;
}

uint32_t kvp_block_alloc_free_count(const struct kvp_block_alloc *a)
{
	return a->nfree;
}

static int cmp_u32(const void *x, const void *y)
{
	uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;

	return a < b ? -1 : a > b;
}

size_t kvp_block_alloc_free_spans(const struct kvp_block_alloc *a,
				  uint32_t per_pager, const uint32_t *freed,
				  size_t n, uint32_t *spans)
{
	size_t i, out = 0;

	if (per_pager == 0 || n == 0)
		return 0;
	for (i = 0; i < n; i++)
		spans[i] = freed[i] / per_pager * per_pager;
	qsort(spans, n, sizeof(*spans), cmp_u32);
	/* out <= i throughout, so compacting in place is safe */
	for (i = 0; i < n; i++) {
		uint32_t s = spans[i], j;
		bool all = true;

		if (i && spans[i - 1] == s)
			continue;
		for (j = 0; j < per_pager && all; j++) {
			uint64_t b = (uint64_t)s + j;

			/* blocks past the capacity do not exist: count free */
			if (b < a->nblocks && a->refs[b])
				all = false;
		}
		if (all)
			spans[out++] = s;
	}
	return out;
}

/* ---- tables ---- */

static uint32_t blocks_for(uint64_t tokens, uint32_t g)
{
	return (uint32_t)((tokens + g - 1) / g);
}

static int map_reserve(struct kvp_block_table *bt, uint32_t want)
{
	uint32_t cap = bt->capmap ? bt->capmap : 16;
	uint32_t *m;

	if (want <= bt->capmap)
		return 0;
	while (cap < want)
		cap = cap > UINT32_MAX / 2 ? want : cap * 2;
	m = realloc(bt->map, (size_t)cap * sizeof(*m));
	if (!m)
		return -ENOMEM;
	bt->map = m;
	bt->capmap = cap;
	return 0;
}

int kvp_block_table_create(struct kvp_block_alloc *a, uint32_t block_tokens,
			   struct kvp_block_table **out)
{
	struct kvp_block_table *bt;

	if (!a || block_tokens == 0)
		return -EINVAL;
	bt = calloc(1, sizeof(*bt));
	if (!bt)
		return -ENOMEM;
	bt->a = a;
	bt->g = block_tokens;
	*out = bt;
	return 0;
}

int kvp_block_table_fork(const struct kvp_block_table *src, uint64_t ntokens,
			 struct kvp_block_table **out)
{
	struct kvp_block_table *bt;
	uint32_t i, nb;
	int err;

	if (ntokens == UINT64_MAX)
		ntokens = src->tokens;
	if (ntokens > src->tokens)
		return -EINVAL;
	err = kvp_block_table_create(src->a, src->g, &bt);
	if (err)
		return err;
	nb = blocks_for(ntokens, src->g);
	err = map_reserve(bt, nb);
	if (err) {
		kvp_block_table_destroy(bt, NULL, NULL);
		return err;
	}
	for (i = 0; i < nb; i++) {
		bt->map[i] = src->map[i];
		src->a->refs[src->map[i]]++;
	}
	bt->nmap = nb;
	bt->tokens = ntokens;
	*out = bt;
	return 0;
}

int kvp_block_table_append(struct kvp_block_table *bt, uint32_t ntokens,
			   struct kvp_block_copy *cow, bool *copied)
{
	struct kvp_block_alloc *a = bt->a;
	uint64_t newtok = bt->tokens + ntokens;
	uint32_t have = bt->nmap, want = blocks_for(newtok, bt->g), i;
	uint32_t need = want - have;
	bool do_cow = false;
	struct kvp_block_copy c = { KVP_BLOCK_NONE, KVP_BLOCK_NONE, 0 };
	int err;

	if (copied)
		*copied = false;
	if (ntokens == 0)
		return 0;
	if (newtok / bt->g >= KVP_BLOCK_NONE)
		return -EINVAL;
	/* the last block is partly filled, shared, and about to be written */
	if (bt->tokens % bt->g && a->refs[bt->map[have - 1]] > 1) {
		do_cow = true;
		if (!a->copy && !cow)
			return -EINVAL;
	}
	if (need + do_cow > a->nfree)
		return -ENOSPC;
	err = map_reserve(bt, want);
	if (err)
		return err;
	if (do_cow) {
		c.src = bt->map[have - 1];
		c.ntokens = (uint32_t)(bt->tokens % bt->g);
		kvp_block_alloc_get(a, &c.dst);
		if (a->copy) {
			err = a->copy(a->copy_arg, &c);
			if (err) {
				kvp_block_alloc_put(a, c.dst, NULL);
				return err;
			}
		}
		kvp_block_alloc_put(a, c.src, NULL); /* others keep it */
		bt->map[have - 1] = c.dst;
		if (cow)
			*cow = c;
		if (copied)
			*copied = true;
	}
	for (i = have; i < want; i++)
		kvp_block_alloc_get(a, &bt->map[i]); /* cannot fail: counted */
	bt->nmap = want;
	bt->tokens = newtok;
	return 0;
}

int kvp_block_table_truncate(struct kvp_block_table *bt, uint64_t ntokens)
{
	uint32_t want;

	if (ntokens > bt->tokens || ntokens % bt->g)
		return -EINVAL;
	want = blocks_for(ntokens, bt->g);
	while (bt->nmap > want)
		kvp_block_alloc_put(bt->a, bt->map[--bt->nmap], NULL);
	bt->tokens = ntokens;
	return 0;
}

void kvp_block_table_destroy(struct kvp_block_table *bt, uint32_t *freed,
			     size_t *nfreed)
{
	size_t n = 0;
	uint32_t i;

	if (!bt)
		return;
	for (i = 0; i < bt->nmap; i++) {
		bool f = false;

		kvp_block_alloc_put(bt->a, bt->map[i], &f);
		if (f && freed)
			freed[n] = bt->map[i];
		n += f;
	}
	if (nfreed)
		*nfreed = n;
	free(bt->map);
	free(bt);
}

uint64_t kvp_block_table_tokens(const struct kvp_block_table *bt)
{
	return bt->tokens;
}

uint32_t kvp_block_table_blocks(const struct kvp_block_table *bt)
{
	return bt->nmap;
}

uint32_t kvp_block_table_block_tokens(const struct kvp_block_table *bt)
{
	return bt->g;
}

const uint32_t *kvp_block_table_map(const struct kvp_block_table *bt)
{
	return bt->map;
}

uint32_t kvp_block_table_physical(const struct kvp_block_table *bt, uint32_t lb)
{
	return lb < bt->nmap ? bt->map[lb] : KVP_BLOCK_NONE;
}

uint32_t kvp_block_table_valid(const struct kvp_block_table *bt, uint32_t lb)
{
	if (lb >= bt->nmap)
		return 0;
	if (lb + 1 < bt->nmap || bt->tokens % bt->g == 0)
		return bt->g;
	return (uint32_t)(bt->tokens % bt->g);
}

int kvp_block_table_slot(const struct kvp_block_table *bt, uint64_t token,
			 uint32_t *pblock, uint32_t *slot)
{
	if (token >= bt->tokens)
		return -ERANGE;
	*pblock = bt->map[token / bt->g];
	*slot = (uint32_t)(token % bt->g);
	return 0;
}

bool kvp_block_table_shared(const struct kvp_block_table *bt, uint32_t lb)
{
	return lb < bt->nmap && bt->a->refs[bt->map[lb]] > 1;
}
