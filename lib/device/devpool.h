/*
 * devpool.h - the device block pool's bookkeeping: which KV block is in
 * which slot, which slots a stage still needs, and which to reuse.
 *
 * Pure host logic (no device calls), so the CPU tests cover it whole.
 * A slot holds one KV block, named by its key (layer, physical block).
 * A stage is one layer of one decode step, numbered in increasing order;
 * the slots a stage reads are HELD until the stage is released (its kernel
 * finished), so a later stage's copies never overwrite them.
 *
 * Slot states:
 *
 *   EMPTY --assign (copy needed)--> HELD(stage) --release(>= stage)--> KEPT
 *   KEPT  --assign, same key (reuse: no copy)--> HELD(new stage)
 *   KEPT  --assign, other key: the least recently used (evict)--> HELD
 *   KEPT  --forget (the block's bytes changed)--> EMPTY
 *
 * A key is in at most one slot.  A block assigned again in the stage that
 * holds it is a reuse too (two sequences sharing a prefix block).
 *
 * Locking: none; one thread at a time.
 */
#ifndef KVP_DEVPOOL_H
#define KVP_DEVPOOL_H

#include <stdbool.h>
#include <stdint.h>

#define KVP_DEVPOOL_NONE UINT32_MAX

struct kvp_devpool;

struct kvp_devpool_stats {
	uint64_t reused;  /* assigns that found their block in a slot */
	uint64_t copied;  /* assigns that took a slot: a copy to make */
	uint64_t evicted; /* of those, slots that held another block */
	uint64_t forgot;  /* slots emptied by kvp_devpool_forget */
};

/* A pool of nslots slots, all EMPTY.  0 and *out, -EINVAL (nslots 0 or
 * >= KVP_DEVPOOL_NONE), -ENOMEM; nothing left on failure. */
int kvp_devpool_create(uint32_t nslots, struct kvp_devpool **out);
/* NULL is a no-op. */
void kvp_devpool_destroy(struct kvp_devpool *p);

/*
 * kvp_devpool_assign - the slot of (layer, pblock) for stage, held until
 * stage is released.  Returns 0 (the block is there already: reuse, no
 * copy), 1 (a slot was taken for it: the caller copies the block in
 * before stage's kernel runs), -ENOSPC (every slot is held by a stage not
 * yet released: nothing changed), -EINVAL (stage older than one already
 * assigned: stages only go forward).
 */
int kvp_devpool_assign(struct kvp_devpool *p, uint32_t layer, uint32_t pblock,
		       uint64_t stage, uint32_t *slot);

/* Undo the last assign that returned 1 for this slot (its copy could not
 * be made): the slot goes back EMPTY. */
void kvp_devpool_unassign(struct kvp_devpool *p, uint32_t slot);

/* Every stage <= stage has finished: their slots are KEPT, free to be
 * reused or evicted. */
void kvp_devpool_release(struct kvp_devpool *p, uint64_t stage);

/* The block's bytes changed (written, or freed and reused): drop its
 * slot, if any, unless held (then false: the caller must not write the
 * block while a stage reads it).  True if nothing is left of it. */
bool kvp_devpool_forget(struct kvp_devpool *p, uint32_t layer,
			uint32_t pblock);

/* kvp_devpool_forget for every block not held. */
void kvp_devpool_forget_all(struct kvp_devpool *p);

/* The slot of (layer, pblock), or KVP_DEVPOOL_NONE. */
uint32_t kvp_devpool_lookup(const struct kvp_devpool *p, uint32_t layer,
			    uint32_t pblock);
/* Slots held by stages not released. */
uint32_t kvp_devpool_held(const struct kvp_devpool *p);
uint32_t kvp_devpool_slots(const struct kvp_devpool *p);
void kvp_devpool_stats(const struct kvp_devpool *p,
		       struct kvp_devpool_stats *out);

#endif /* KVP_DEVPOOL_H */
