/*
 * devattn.h - decode attention on a device, fed from host memory: the
 * device block pool, the device block tables, and the overlap schedule.
 *
 * THE POOL.  nslots slots in device memory hold KV blocks of the region,
 * named (layer, physical block); devpool.h decides which block goes to
 * which slot: a block already there is not copied again (reused, counted),
 * the least recently used slot not held by a stage in flight is reused
 * for a new one.  Besides those, two slots per sequence hold its rolling
 * block (the newest, partly filled one, which changes every step), one
 * for each of two stages in flight.
 *
 * A STAGE is one layer of one decode step, numbered in increasing order.
 * Its life, driven by the caller:
 *
 *   kvp_devattn_stage(s)   the chosen region blocks get slots; those not
 *                          on the device are copied by the host into a
 *                          page-locked staging buffer (s % 2), then one
 *                          asynchronous copy moves the buffer to the
 *                          device and a scatter puts each block in its
 *                          slot, both on the COPY stream, then event
 *                          COPIED(s % 2).
 *   kvp_devattn_launch(s)  the rolling blocks, queries and tables go up
 *                          on the COMPUTE stream, which waits for
 *                          COPIED(s % 2); the attention kernel; the
 *                          output back; event DONE(s % 2).
 *   kvp_devattn_finish(s)  the host waits for DONE(s % 2), takes the
 *                          output; the pool releases stage s's slots.
 *
 * THE OVERLAP: the caller stages s+1 between launch(s) and finish(s), so
 * layer l+1's copies run while layer l's kernel does:
 *
 *   stage(0) launch(0) stage(1) finish(0) launch(1) stage(2) finish(1) ...
 *
 * Stage s+1's copies never touch what kernel s reads: its slots are held
 * until finish(s), and it uses the other staging buffer.  A staging
 * buffer is refilled by stage s+2 only after COPIED(s % 2) (the host waits
 * for it, which is at once in the order above).  At most two stages are
 * in flight: staging s+2 before finish(s) is -EBUSY.
 *
 * WHY STAGING, and not cudaHostRegister on the region: registering host
 * memory pins its pages (the kernel's get_user_pages, long-term), which on
 * a userfaultfd region faults every page in, whatever the budget, and
 * breaks the pager's eviction (a pinned page cannot be moved back or
 * zapped).  So the host copies each block from its frame (prefetched and
 * pinned in the pager by the caller) into staging: one memcpy per block
 * copied, counted in t_stage_s.
 *
 * Locking: none; one thread drives an engine.
 */
#ifndef KVP_DEVATTN_H
#define KVP_DEVATTN_H

#include <stdint.h>

#include "lib/cuda/paged_attn.h"
#include "lib/device/device.h"

struct kvp_devattn;

struct kvp_devattn_opts {
	struct kvp_paged_shape shape; /* slot_bytes 0: the block bytes */
	uint32_t nslots;      /* pool slots for region blocks, >= 1 */
	uint32_t max_seqs;    /* sequences per stage, >= 1 */
	uint32_t max_entries; /* region blocks per sequence per stage */
	uint32_t max_copies;  /* blocks one stage may copy (the staging
				 buffers' size); 0: min(nslots,
				 max_seqs * max_entries) */
	uint32_t splits;      /* shares per head; 0: from the table size */
};

struct kvp_devattn_stats {
	uint64_t stages;	 /* stages launched */
	uint64_t reused;	 /* region blocks found on the device */
	uint64_t copied;	 /* region blocks copied to the device */
	uint64_t evicted;	 /* of those, slots that held another block */
	uint64_t rolling;	 /* rolling blocks copied */
	uint64_t bytes_to_dev;	 /* host -> device bytes, all kinds */
	uint64_t retries;	 /* stages refused -ENOSPC (pool full) */
	double t_stage_s;	 /* host memcpy from frames into staging */
	double t_sync_s;	 /* the host waiting for a kernel */
};

/*
 * kvp_devattn_create - the pool (nslots + 2 * max_seqs slots), staging
 * and launch buffers on device d.  0 and *out, -EINVAL (bad shape:
 * head_dim not a multiple of 8 or over KVP_DEV_MAX_DIM, q_heads not a
 * multiple of kv_heads; a zero count), -ENOMEM (host or device memory);
 * nothing left on failure.
 */
int kvp_devattn_create(struct kvp_device *d, const struct kvp_devattn_opts *o,
		       struct kvp_devattn **out);
/* Waits for what is in flight, frees everything.  NULL is a no-op. */
void kvp_devattn_destroy(struct kvp_devattn *a);

/*
 * kvp_devattn_stage - stage `stage` (greater than every earlier one) of
 * `layer`: sequence i reads region blocks pblocks[off[i] .. off[i+1]),
 * whose bytes are at host[...] (resident: read by the host now).
 * Returns 0; -EBUSY (two stages in flight), -ENOSPC (the pool's free
 * slots are held by the stage in flight: finish it and retry; nothing
 * changed), -E2BIG (more entries or copies than the options allow, or
 * than the whole pool: nothing changed), -EINVAL, a device error.
 */
int kvp_devattn_stage(struct kvp_devattn *a, uint64_t stage, uint32_t layer,
		      uint32_t nseq, const uint32_t *off,
		      const uint32_t *pblocks, const void *const *host);

/*
 * kvp_devattn_launch - the kernel of stage: sequence i also reads its
 * rolling block rolling[i] (NULL: none) of rolling_ntok[i] valid tokens,
 * with query q + i * q_heads * head_dim (fp32, unscaled).  rolling and q
 * are copied before the call returns.  0, -EINVAL (stage not staged,
 * or a sequence with no block at all), a device error.
 */
int kvp_devattn_launch(struct kvp_devattn *a, uint64_t stage,
		       const void *const *rolling, const uint32_t *rolling_ntok,
		       const float *q);

/* kvp_devattn_finish - wait for stage's kernel; out gets nseq * q_heads *
 * head_dim floats.  0, -EINVAL (not launched), a device error. */
int kvp_devattn_finish(struct kvp_devattn *a, uint64_t stage, float *out);

/* kvp_devattn_abandon - end stage whatever its state (after a failure
 * between stage and finish): waits for what it queued, drops its output,
 * releases its slots.  No-op for a stage not in flight. */
void kvp_devattn_abandon(struct kvp_devattn *a, uint64_t stage);

/* The block's bytes changed (a rolling block flushed into it, or a block
 * freed and reused): its slot is dropped.  -EBUSY if a stage in flight
 * reads it (the caller orders writes after finish). */
int kvp_devattn_forget(struct kvp_devattn *a, uint32_t layer, uint32_t pblock);

/* Every block not held by a stage in flight is dropped (when the caller
 * cannot tell which changed). */
void kvp_devattn_forget_all(struct kvp_devattn *a);

/* Slot of (layer, pblock) (test), or KVP_DEVPOOL_NONE. */
uint32_t kvp_devattn_slot(const struct kvp_devattn *a, uint32_t layer,
			  uint32_t pblock);

/* The device block table of sequence i of the last stage staged: n
 * entries (region blocks, in the order given), slots. */
const uint32_t *kvp_devattn_table(const struct kvp_devattn *a, uint32_t i,
				  uint32_t *n);

void kvp_devattn_stats(const struct kvp_devattn *a,
		       struct kvp_devattn_stats *out);

/* Region-block slots and bytes of device memory in all. */
uint32_t kvp_devattn_slots(const struct kvp_devattn *a);
uint64_t kvp_devattn_device_bytes(const struct kvp_devattn *a);
/* Page-locked host bytes (staging and launch buffers). */
uint64_t kvp_devattn_host_bytes(const struct kvp_devattn *a);

#endif /* KVP_DEVATTN_H */
