/*
 * block_table.c - fuzz lib/kv/block_table.c against a model.
 *
 * Input: the allocator's capacity and G, then a sequence of operations
 * (create, fork, append, destroy, copy callback on/off/failing, raw
 * get/ref/put of blocks, free spans), each decoded from a few bytes.  The
 * model keeps, per physical block, its expected reference count and the
 * token values written into its slots, and per sequence the values of its
 * tokens.  After every operation, checked:
 *   - every refcount, the free count and which blocks are free;
 *   - each table's length, map, valid counts, shared flags and slots;
 *   - every token of every sequence reads back the value written for it:
 *     no sequence sees another's write (copy on write, forks, frees);
 *   - a new block is the lowest free one; a copy on write is reported
 *     exactly when the last block is partly filled and shared;
 *   - an operation that fails returns an error its contract names for that
 *     state and changes nothing (the model is not updated, and compared).
 */
#include <errno.h>
#include <string.h>

#include "lib/kv/block_table.h"
#include "tests/fuzz/fuzz.h"

#define MAX_TABLES 6
#define MAX_BLOCKS 48
#define MAX_G 8
#define MAX_TOKENS (MAX_BLOCKS * MAX_G) /* a table's blocks are distinct */

enum copy_mode { COPY_NONE, COPY_OK, COPY_FAIL };

struct seq {
	struct kvp_block_table *bt; /* NULL: slot unused */
	uint64_t tokens;	    /* expected length */
	uint32_t map[MAX_BLOCKS];   /* expected logical -> physical */
	uint32_t values[MAX_TOKENS]; /* value written for each token */
};

struct model {
	struct kvp_block_alloc *a;
	uint32_t nblocks, g;
	uint32_t refs[MAX_BLOCKS];		 /* expected refcounts */
	uint32_t raw_refs[MAX_BLOCKS];		 /* held by the harness */
	uint32_t content[MAX_BLOCKS][MAX_G];	 /* value in each slot */
	struct seq seqs[MAX_TABLES];
	uint32_t next_value;			 /* values are unique */
	enum copy_mode copy;			 /* callback installed */
	unsigned copies;			 /* callback calls seen */
	struct kvp_block_copy last_copy;	 /* the callback's argument */
	uint32_t freed[MAX_BLOCKS];		 /* last destroy's */
	size_t nfreed;
};

static uint32_t blocks_for(uint64_t tokens, uint32_t g)
{
	return (uint32_t)((tokens + g - 1) / g);
}

static uint32_t lowest_free(const struct model *m, uint32_t from)
{
	uint32_t b;

	for (b = from; b < m->nblocks; b++)
		if (!m->refs[b])
			return b;
	return KVP_BLOCK_NONE;
}

static uint32_t model_free_count(const struct model *m)
{
	uint32_t b, n = 0;

	for (b = 0; b < m->nblocks; b++)
		n += !m->refs[b];
	return n;
}

/* A free block holds garbage: poison it in the model. */
static void model_poison(struct model *m, uint32_t b)
{
	for (uint32_t s = 0; s < MAX_G; s++)
		m->content[b][s] = 0xdead0000u | b;
}

/* One reference less on @b; true if it became free. */
static bool model_drop(struct model *m, uint32_t b)
{
	if (--m->refs[b])
		return false;
	model_poison(m, b);
	return true;
}

static int copy_cb(void *arg, const struct kvp_block_copy *c)
{
	struct model *m = arg;

	m->copies++;
	m->last_copy = *c;
	FUZZ_CHECK(c->src < m->nblocks && c->dst < m->nblocks &&
		       c->ntokens > 0 && c->ntokens < m->g,
		   "copy %u -> %u of %u tokens", c->src, c->dst, c->ntokens);
	FUZZ_CHECK(kvp_block_alloc_refcount(m->a, c->dst) == 1 &&
		       !m->refs[c->dst],
		   "copy into block %u, not a fresh one", c->dst);
	FUZZ_CHECK(kvp_block_alloc_refcount(m->a, c->src) > 1,
		   "copy from block %u, which is not shared", c->src);
	if (m->copy == COPY_FAIL)
		return -EIO;
	memcpy(m->content[c->dst], m->content[c->src],
	       c->ntokens * sizeof(uint32_t));
	return 0;
}

static void verify(const struct model *m)
{
	uint32_t b;

	for (b = 0; b < m->nblocks; b++) {
		FUZZ_CHECK(kvp_block_alloc_refcount(m->a, b) == m->refs[b],
			   "block %u: refcount %u, expected %u", b,
			   kvp_block_alloc_refcount(m->a, b), m->refs[b]);
		FUZZ_CHECK(kvp_block_alloc_is_free(m->a, b) == !m->refs[b],
			   "block %u: free flag wrong", b);
	}
	FUZZ_CHECK(!kvp_block_alloc_is_free(m->a, m->nblocks) &&
		       kvp_block_alloc_refcount(m->a, m->nblocks) == 0,
		   "block past the capacity looks like a block");
	FUZZ_CHECK(kvp_block_alloc_free_count(m->a) == model_free_count(m),
		   "free count %u, expected %u",
		   kvp_block_alloc_free_count(m->a), model_free_count(m));
	FUZZ_CHECK(kvp_block_alloc_capacity(m->a) == m->nblocks, "capacity");

	for (int i = 0; i < MAX_TABLES; i++) {
		const struct seq *s = &m->seqs[i];
		uint32_t nb = blocks_for(s->tokens, m->g), lb, pb, slot;
		const uint32_t *map;

		if (!s->bt)
			continue;
		FUZZ_CHECK(kvp_block_table_tokens(s->bt) == s->tokens &&
			       kvp_block_table_blocks(s->bt) == nb &&
			       kvp_block_table_block_tokens(s->bt) == m->g,
			   "table %d: %llu tokens in %u blocks, expected %llu "
			   "in %u",
			   i, (unsigned long long)kvp_block_table_tokens(s->bt),
			   kvp_block_table_blocks(s->bt),
			   (unsigned long long)s->tokens, nb);
		map = kvp_block_table_map(s->bt);
		for (lb = 0; lb < nb; lb++) {
			uint32_t want = lb + 1 < nb || s->tokens % m->g == 0
						? m->g
						: (uint32_t)(s->tokens % m->g);

			FUZZ_CHECK(map[lb] == s->map[lb] &&
				       kvp_block_table_physical(s->bt, lb) ==
					   s->map[lb],
				   "table %d block %u: physical %u, expected %u",
				   i, lb, map[lb], s->map[lb]);
			FUZZ_CHECK(kvp_block_table_valid(s->bt, lb) == want,
				   "table %d block %u: %u valid, expected %u",
				   i, lb, kvp_block_table_valid(s->bt, lb),
				   want);
			FUZZ_CHECK(kvp_block_table_shared(s->bt, lb) ==
				       (m->refs[s->map[lb]] > 1),
				   "table %d block %u: shared flag wrong", i,
				   lb);
		}
		FUZZ_CHECK(kvp_block_table_physical(s->bt, nb) ==
				   KVP_BLOCK_NONE &&
			       kvp_block_table_valid(s->bt, nb) == 0 &&
			       !kvp_block_table_shared(s->bt, nb),
			   "table %d: a block past its end", i);
		for (uint64_t t = 0; t < s->tokens; t++) {
			FUZZ_CHECK(kvp_block_table_slot(s->bt, t, &pb,
							&slot) == 0 &&
				       pb == s->map[t / m->g] &&
				       slot == t % m->g,
				   "table %d token %llu: slot", i,
				   (unsigned long long)t);
			FUZZ_CHECK(m->content[pb][slot] == s->values[t],
				   "table %d token %llu reads %#x from block "
				   "%u slot %u, wrote %#x",
				   i, (unsigned long long)t,
				   m->content[pb][slot], pb, slot,
				   s->values[t]);
		}
		FUZZ_CHECK(kvp_block_table_slot(s->bt, s->tokens, &pb,
						&slot) == -ERANGE,
			   "table %d: a slot past its end", i);
	}
}

static void op_create(struct model *m, struct fuzz_input *in)
{
	struct seq *s = &m->seqs[fuzz_u8(in) % MAX_TABLES];

	if (s->bt)
		return;
	FUZZ_CHECK(kvp_block_table_create(m->a, m->g, &s->bt) == 0, "create");
	s->tokens = 0;
}

static void op_fork(struct model *m, struct fuzz_input *in)
{
	struct seq *src = &m->seqs[fuzz_u8(in) % MAX_TABLES];
	struct seq *dst = &m->seqs[fuzz_u8(in) % MAX_TABLES];
	uint8_t k = fuzz_u8(in);
	uint64_t n, arg;
	uint32_t i, nb;
	int r;

	if (!src->bt || dst->bt)
		return;
	if (k == 255)
		arg = UINT64_MAX, n = src->tokens;
	else if (k % 8 == 7)
		arg = n = src->tokens + 1 + k; /* too long */
	else
		arg = n = k % (src->tokens + 1);
	r = kvp_block_table_fork(src->bt, arg, &dst->bt);
	if (n > src->tokens) {
		FUZZ_CHECK(r == -EINVAL, "fork of %llu of %llu tokens: %d",
			   (unsigned long long)n,
			   (unsigned long long)src->tokens, r);
		dst->bt = NULL;
		return;
	}
	FUZZ_CHECK(r == 0, "fork: %d", r);
	nb = blocks_for(n, m->g);
	for (i = 0; i < nb; i++) {
		dst->map[i] = src->map[i];
		m->refs[src->map[i]]++;
	}
	memcpy(dst->values, src->values, n * sizeof(uint32_t));
	dst->tokens = n;
}

static void op_append(struct model *m, struct fuzz_input *in)
{
	struct seq *s = &m->seqs[fuzz_u8(in) % MAX_TABLES];
	uint8_t k = fuzz_u8(in), how = fuzz_u8(in);
	struct kvp_block_copy cow = { 7, 7, 7 }, *cowp = how & 1 ? &cow : NULL;
	bool copied = true, *copiedp = how & 2 ? &copied : NULL;
	uint32_t n, have, want, need, i;
	uint64_t newtok;
	bool do_cow, einval, enospc, efail;
	unsigned copies = m->copies;
	int r;

	if (!s->bt)
		return;
	n = k >= 250 ? UINT32_MAX - (uint32_t)(255 - k) * 1000 : k % (3 * m->g);
	newtok = s->tokens + n;
	have = blocks_for(s->tokens, m->g);
	do_cow = n && s->tokens % m->g && m->refs[s->map[have - 1]] > 1;
	einval = newtok / m->g >= KVP_BLOCK_NONE ||
		 (do_cow && m->copy == COPY_NONE && !cowp);
	want = einval ? have : blocks_for(newtok, m->g);
	need = want - have;
	enospc = (uint64_t)need + do_cow > model_free_count(m);
	efail = do_cow && m->copy == COPY_FAIL;

	r = kvp_block_table_append(s->bt, n, cowp, copiedp);
	if (r) {
		FUZZ_CHECK((r == -EINVAL && einval) ||
			       (r == -ENOSPC && enospc) ||
			       (r == -EIO && efail),
			   "append %u to %llu tokens: %d, expected%s%s%s", n,
			   (unsigned long long)s->tokens, r,
			   einval ? " -EINVAL" : "", enospc ? " -ENOSPC" : "",
			   efail ? " -EIO" : "");
		FUZZ_CHECK(!copiedp || !copied, "failed, yet copied");
		FUZZ_CHECK(cow.src == 7 && cow.dst == 7 && cow.ntokens == 7,
			   "failed, yet *cow was written");
		return; /* verify() checks that nothing changed */
	}
	FUZZ_CHECK(!einval && !enospc && !efail,
		   "append %u to %llu tokens succeeded, expected%s%s%s", n,
		   (unsigned long long)s->tokens, einval ? " -EINVAL" : "",
		   enospc ? " -ENOSPC" : "", efail ? " -EIO" : "");
	FUZZ_CHECK(!copiedp || copied == do_cow, "copied %d, expected %d",
		   copied, do_cow);
	FUZZ_CHECK(m->copies - copies == (do_cow && m->copy != COPY_NONE),
		   "callback called %u times", m->copies - copies);
	if (do_cow) {
		struct kvp_block_copy want_copy = {
			.src = s->map[have - 1],
			.dst = lowest_free(m, 0),
			.ntokens = (uint32_t)(s->tokens % m->g),
		};
		const struct kvp_block_copy *c = cowp ? &cow : &m->last_copy;

		FUZZ_CHECK(c->src == want_copy.src && c->dst == want_copy.dst &&
			       c->ntokens == want_copy.ntokens,
			   "copy %u -> %u (%u tokens), expected %u -> %u (%u)",
			   c->src, c->dst, c->ntokens, want_copy.src,
			   want_copy.dst, want_copy.ntokens);
		if (m->copy == COPY_NONE) /* the caller copies */
			memcpy(m->content[c->dst], m->content[c->src],
			       c->ntokens * sizeof(uint32_t));
		else
			FUZZ_CHECK(!cowp || !memcmp(&cow, &m->last_copy,
						    sizeof(cow)),
				   "reported copy differs from the callback's");
		m->refs[c->src]--; /* others keep it */
		m->refs[c->dst] = 1;
		s->map[have - 1] = c->dst;
	} else if (cowp) {
		FUZZ_CHECK(cow.src == 7 && cow.dst == 7 && cow.ntokens == 7,
			   "no copy, yet *cow was written");
	}
	for (i = have; i < want; i++) {
		s->map[i] = lowest_free(m, 0);
		FUZZ_CHECK(s->map[i] != KVP_BLOCK_NONE, "model out of blocks");
		m->refs[s->map[i]] = 1;
	}
	/* The caller writes the new tokens where the table says. */
	for (uint64_t t = s->tokens; t < newtok; t++) {
		uint32_t pb, slot;

		FUZZ_CHECK(kvp_block_table_slot(s->bt, t, &pb, &slot) == 0,
			   "slot of new token %llu", (unsigned long long)t);
		s->values[t] = ++m->next_value;
		m->content[pb][slot] = s->values[t];
	}
	s->tokens = newtok;
}

static void destroy(struct model *m, struct seq *s)
{
	uint32_t want[MAX_BLOCKS], nb, lb;
	size_t nwant = 0;

	nb = blocks_for(s->tokens, m->g);
	for (lb = 0; lb < nb; lb++)
		if (model_drop(m, s->map[lb]))
			want[nwant++] = s->map[lb];
	memset(m->freed, 0xff, sizeof(m->freed));
	kvp_block_table_destroy(s->bt, m->freed, &m->nfreed);
	s->bt = NULL;
	FUZZ_CHECK(m->nfreed == nwant &&
		       !memcmp(m->freed, want, nwant * sizeof(uint32_t)),
		   "destroy freed %zu blocks, expected %zu", m->nfreed, nwant);
}

static void op_destroy(struct model *m, struct fuzz_input *in)
{
	struct seq *s = &m->seqs[fuzz_u8(in) % MAX_TABLES];

	if (s->bt)
		destroy(m, s);
}

static void op_copy_mode(struct model *m, struct fuzz_input *in)
{
	m->copy = (enum copy_mode)(fuzz_u8(in) % 3);
	kvp_block_alloc_set_copy(m->a, m->copy == COPY_NONE ? NULL : copy_cb,
				 m);
}

/* The allocator used directly, valid and invalid block numbers alike. */
static void op_raw(struct model *m, struct fuzz_input *in)
{
	uint8_t k = fuzz_u8(in);
	uint32_t b = fuzz_u8(in) % (m->nblocks + 2), got = KVP_BLOCK_NONE;
	bool freed = false;
	int r;

	if (k & 128) /* a number far past the capacity */
		b = UINT32_MAX - b;
	switch (k % 3) {
	case 0:
		r = kvp_block_alloc_get(m->a, &got);
		if (!model_free_count(m)) {
			FUZZ_CHECK(r == -ENOSPC, "get from a full allocator");
			return;
		}
		FUZZ_CHECK(r == 0 && got == lowest_free(m, 0),
			   "get: %d, block %u, lowest free %u", r, got,
			   lowest_free(m, 0));
		m->refs[got] = 1;
		m->raw_refs[got]++;
		return;
	case 1:
		r = kvp_block_alloc_ref(m->a, b);
		if (b >= m->nblocks || !m->refs[b]) {
			FUZZ_CHECK(r == -EINVAL, "ref of free block %u: %d", b,
				   r);
			return;
		}
		FUZZ_CHECK(r == 0, "ref of block %u: %d", b, r);
		m->refs[b]++;
		m->raw_refs[b]++;
		return;
	default:
		/* Dropping a table's reference would be the caller's bug. */
		if (b < m->nblocks && m->refs[b] && !m->raw_refs[b])
			return;
		r = kvp_block_alloc_put(m->a, b, &freed);
		if (b >= m->nblocks || !m->refs[b]) {
			FUZZ_CHECK(r == -EINVAL, "put of free block %u: %d", b,
				   r);
			return;
		}
		m->raw_refs[b]--;
		FUZZ_CHECK(r == 0 && freed == model_drop(m, b),
			   "put of block %u: %d, freed %d", b, r, freed);
	}
}

static void op_spans(struct model *m, struct fuzz_input *in)
{
	uint32_t per = fuzz_u8(in) % 6, spans[MAX_BLOCKS], want[MAX_BLOCKS];
	size_t n, nwant = 0;

	memset(spans, 0xff, sizeof(spans));
	n = kvp_block_alloc_free_spans(m->a, per, m->freed, m->nfreed, spans);
	if (per)
		for (uint32_t s = 0; s < m->nblocks; s += per) {
			bool hit = false, all = true;

			for (size_t i = 0; i < m->nfreed; i++)
				hit |= m->freed[i] / per * per == s;
			for (uint32_t b = s; b < s + per && b < m->nblocks; b++)
				all &= !m->refs[b];
			if (hit && all)
				want[nwant++] = s;
		}
	FUZZ_CHECK(n == nwant && !memcmp(spans, want, n * sizeof(uint32_t)),
		   "free spans of %zu freed blocks, %u per pager block: %zu, "
		   "expected %zu",
		   m->nfreed, per, n, nwant);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static void (*const ops[])(struct model *, struct fuzz_input *) = {
		op_create, op_fork,	op_append, op_append, op_destroy,
		op_copy_mode, op_raw, op_spans,
	};
	struct fuzz_input in = { data, size };
	struct model *m = calloc(1, sizeof(*m));
	uint32_t b;

	FUZZ_CHECK(m, "out of memory");
	m->nblocks = 1 + fuzz_u8(&in) % MAX_BLOCKS;
	m->g = 1 + fuzz_u8(&in) % MAX_G;
	FUZZ_CHECK(kvp_block_alloc_create(m->nblocks, &m->a) == 0, "create");
	for (b = 0; b < m->nblocks; b++)
		model_poison(m, b);
	verify(m);
	while (in.left) {
		ops[fuzz_u8(&in) % (sizeof(ops) / sizeof(ops[0]))](m, &in);
		verify(m);
	}
	for (int i = 0; i < MAX_TABLES; i++)
		if (m->seqs[i].bt)
			destroy(m, &m->seqs[i]);
	for (b = 0; b < m->nblocks; b++) {
		FUZZ_CHECK(m->refs[b] == m->raw_refs[b],
			   "block %u: %u references left, %u held", b,
			   m->refs[b], m->raw_refs[b]);
		for (; m->raw_refs[b]; m->raw_refs[b]--)
			FUZZ_CHECK(kvp_block_alloc_put(m->a, b, NULL) == 0,
				   "put");
	}
	FUZZ_CHECK(kvp_block_alloc_free_count(m->a) == m->nblocks,
		   "%u of %u blocks free at the end",
		   kvp_block_alloc_free_count(m->a), m->nblocks);
	kvp_block_alloc_destroy(m->a);
	free(m);
	return 0;
}
