/*
 * block_table.h - PagedAttention block tables and the physical allocator.
 *
 * A sequence's tokens live in logical KV blocks 0, 1, ... of G tokens each;
 * its block table maps each logical block to a physical KV block, a number
 * below the allocator's capacity.  The number is shared by all layers: the
 * bytes of (layer, physical block) are found with kv_geometry.h's layout.
 *
 * Physical blocks carry reference counts.  A fork shares a prefix of its
 * parent's blocks (each gains a reference); the first write into a shared,
 * partly filled block copies it (copy on write): the writer gets a fresh
 * block and the copy to perform (src -> dst, the first ntokens slots, every
 * layer) is reported, or performed through the allocator's copy callback.
 * Full blocks are never written again, so only a sequence's last block can
 * need a copy.  Destroying a table drops its references and reports the
 * physical blocks that became free, so that the caller can tell the pager to
 * drop their contents without write-back (kvp_region_advise DISCARD; see
 * kvp_block_alloc_free_spans for whole pager blocks).
 *
 * Locking: none.  An allocator and every table that uses it must be used by
 * one thread at a time (the caller serialises); read-only calls
 * (kvp_block_table_map, _tokens, ...) may run concurrently with each other.
 */
#ifndef KVP_BLOCK_TABLE_H
#define KVP_BLOCK_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_BLOCK_NONE UINT32_MAX /* no physical block */

struct kvp_block_alloc;
struct kvp_block_table;

/*
 * A copy that a copy-on-write asks for: physical block src's first ntokens
 * slots (K and V, every layer) must be copied to physical block dst before
 * dst is written.  Slots past ntokens in dst are garbage.
 */
struct kvp_block_copy {
	uint32_t src;	  /* shared block, still referenced by others */
	uint32_t dst;	  /* fresh block, now the writer's */
	uint32_t ntokens; /* valid slots to copy */
};

/*
 * Copy callback: perform *c (for every layer) and return 0, or -errno to
 * make the append that asked for it fail and leave nothing changed.
 */
typedef int (*kvp_block_copy_fn)(void *arg, const struct kvp_block_copy *c);

/*
 * kvp_block_alloc_create - an allocator of nblocks physical KV blocks
 * (normally kvp_kv_layout.capacity_blocks), all free.
 * Returns 0 and *out, -EINVAL (nblocks 0 or >= KVP_BLOCK_NONE), -ENOMEM.
 */
int kvp_block_alloc_create(uint32_t nblocks, struct kvp_block_alloc **out);

/* Free the allocator; every table using it must be destroyed first. */
void kvp_block_alloc_destroy(struct kvp_block_alloc *a);

/*
 * Set (fn non-NULL) or clear the copy callback used by copy on write.
 * Without one, kvp_block_table_append needs a place to report the copy.
 */
void kvp_block_alloc_set_copy(struct kvp_block_alloc *a, kvp_block_copy_fn fn,
			      void *arg);

/*
 * kvp_block_alloc_get - take the lowest-numbered free block, refcount 1.
 * (Lowest first keeps one sequence's blocks, appended in order, adjacent,
 * hence in few pager blocks.)  Returns 0 and *out, or -ENOSPC.
 */
int kvp_block_alloc_get(struct kvp_block_alloc *a, uint32_t *out);

/* Add a reference to an allocated block; -EINVAL if b is free or out of range. */
int kvp_block_alloc_ref(struct kvp_block_alloc *a, uint32_t b);

/*
 * Drop a reference; *freed (may be NULL) tells whether b became free.
 * -EINVAL if b is free or out of range (nothing changed).
 */
int kvp_block_alloc_put(struct kvp_block_alloc *a, uint32_t b, bool *freed);

uint32_t kvp_block_alloc_refcount(const struct kvp_block_alloc *a, uint32_t b);
bool kvp_block_alloc_is_free(const struct kvp_block_alloc *a, uint32_t b);
uint32_t kvp_block_alloc_capacity(const struct kvp_block_alloc *a);
uint32_t kvp_block_alloc_free_count(const struct kvp_block_alloc *a);

/*
 * kvp_block_alloc_free_spans - which pager blocks may be discarded.
 *
 * Given physical blocks just freed (freed[0..n)) and per_pager blocks per
 * pager block (kvp_kv_layout.blocks_per_pager_block), writes to spans the
 * distinct first physical block of each aligned span of per_pager blocks
 * that is now wholly free, in ascending order; spans must hold n entries.
 * The caller discards, for every layer, the pager block
 * kvp_kv_layout_pager_block(l, layer, span).  Returns the number written.
 */
size_t kvp_block_alloc_free_spans(const struct kvp_block_alloc *a,
				  uint32_t per_pager, const uint32_t *freed,
				  size_t n, uint32_t *spans);

/*
 * kvp_block_table_create - an empty sequence of G = block_tokens tokens per
 * block, allocating from a.  Returns 0 and *out, -EINVAL, -ENOMEM.
 */
int kvp_block_table_create(struct kvp_block_alloc *a, uint32_t block_tokens,
			   struct kvp_block_table **out);

/*
 * kvp_block_table_fork - a new sequence whose first ntokens tokens are
 * src's (ntokens <= kvp_block_table_tokens(src); UINT64_MAX: all).  The
 * blocks covering them are shared (one more reference each); nothing is
 * copied now.  Returns 0 and *out, -EINVAL (ntokens too large), -ENOMEM.
 */
int kvp_block_table_fork(const struct kvp_block_table *src, uint64_t ntokens,
			 struct kvp_block_table **out);

/*
 * kvp_block_table_append - make room for ntokens more tokens at the end.
 *
 * Allocates the blocks the new tokens need.  If the last block is partly
 * filled and shared, it is first replaced by a fresh block (copy on
 * write): the copy is performed by the allocator's callback if one is set,
 * and also reported in *cow if cow is non-NULL, with *copied = true
 * (copied may be NULL; it is set false when no copy was needed).  The
 * caller writes the new tokens' K and V at kvp_block_table_slot().
 *
 * Returns 0; -ENOSPC (not enough free blocks), -EINVAL (a copy is needed
 * but there is neither a callback nor cow), the callback's error, or
 * -ENOMEM.  On failure nothing is changed.
 */
int kvp_block_table_append(struct kvp_block_table *bt, uint32_t ntokens,
			   struct kvp_block_copy *cow, bool *copied);

/*
 * kvp_block_table_truncate - shorten the sequence to ntokens tokens, a
 * multiple of G (an append undone): the blocks past them lose this
 * table's reference.  0, or -EINVAL (ntokens past the end or not a
 * multiple of G; nothing changed).
 */
int kvp_block_table_truncate(struct kvp_block_table *bt, uint64_t ntokens);

/*
 * kvp_block_table_destroy - free a sequence.
 *
 * Drops the table's reference on each of its blocks.  The blocks that
 * became free are written to freed (may be NULL; else it must hold
 * kvp_block_table_blocks(bt) entries) in logical order, and their number
 * to *nfreed (may be NULL).  Always succeeds.  NULL bt is a no-op.
 */
void kvp_block_table_destroy(struct kvp_block_table *bt, uint32_t *freed,
			     size_t *nfreed);

/* Tokens in the sequence. */
uint64_t kvp_block_table_tokens(const struct kvp_block_table *bt);
/* Logical blocks in use: ceil(tokens / G). */
uint32_t kvp_block_table_blocks(const struct kvp_block_table *bt);
/* G of the table. */
uint32_t kvp_block_table_block_tokens(const struct kvp_block_table *bt);
/*
 * The logical -> physical map: kvp_block_table_blocks(bt) entries, valid
 * until the next append or destroy of bt.
 */
const uint32_t *kvp_block_table_map(const struct kvp_block_table *bt);
/* Physical block of logical block lb, KVP_BLOCK_NONE if lb is past the end. */
uint32_t kvp_block_table_physical(const struct kvp_block_table *bt,
				  uint32_t lb);
/* Valid tokens in logical block lb: G, or fewer for the last; 0 past the end. */
uint32_t kvp_block_table_valid(const struct kvp_block_table *bt, uint32_t lb);
/*
 * Where token `token` lives: physical block and slot (token % G).
 * 0, or -ERANGE if token >= kvp_block_table_tokens(bt).
 */
int kvp_block_table_slot(const struct kvp_block_table *bt, uint64_t token,
			 uint32_t *pblock, uint32_t *slot);
/* True if logical block lb's physical block has other references. */
bool kvp_block_table_shared(const struct kvp_block_table *bt, uint32_t lb);

#endif /* KVP_BLOCK_TABLE_H */
