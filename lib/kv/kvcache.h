/*
 * kvcache.h - a KV cache on a pager region: the decode loop of kvpager.
 *
 * A cache holds the K and V of up to max_seqs sequences of one geometry in
 * one region laid out by kv_geometry.h (layer-major; a pager block holds a
 * whole number of KV blocks of one layer).  Block tables (block_table.h)
 * map each sequence's logical KV blocks to physical ones; forks share
 * prefixes by reference count.  A predictor (predictor.h) chooses, per
 * layer and sequence, the blocks one decode step reads; they are
 * prefetched prefetch_depth layers ahead (kvp_prefetch_submit), waited for
 * and pinned while the layer computes, unpinned afterwards (and, for the
 * exact predictor, advised COLD: a full scan will not come back to them
 * before everything else).
 *
 * Backends (enum kvp_kvcache_backend; one file each behind the ops of
 * kv_backend_i.h): the pager region (backend_pager.c, the product), all in
 * RAM (backend_ram.c: the compute bound, and the bit-for-bit reference),
 * and the kernel's mmap of a file with an emulated RAM budget
 * (backend_mmap.c: the baselines of kvpbench decode, without or with
 * MADV_WILLNEED from the same predictor).
 *
 * THE ROLLING BUFFER.  The newest, partly filled KV block of each sequence
 * and layer lives in RAM outside the region (rb).  Attention reads it from
 * there; the block is written once, when full, after the layer that filled
 * it has computed.  On the pager backend the write goes to the store with
 * kvp_store_pwrite when the region's pager block is ABSENT and in the store
 * (kvp_region_block_info): the region (KVP_REGION_FROM_STORE) then reads it
 * from the store on its first use, so each byte is written once and read
 * at most once per residency, and the block is never faulted in only to be
 * overwritten.  When the pager block is resident (or loading, evicting, or
 * zeroed by DISCARD), the block is copied through the region's memory
 * instead, and eviction writes it back once; no store write races with a
 * resident copy.  This happens only when a pager block holds several KV
 * blocks (large pager blocks for the exact predictor), and then costs the
 * write-back of the other, unchanged, KV blocks of that pager block.  With
 * one KV block per pager block (the sparse predictors' default) the flush
 * is always a single store write.  Prefill writes whole runs of KV blocks
 * the same way, so it faults nothing in and reads nothing.
 *
 * READING INTO SLOTS (opts reuse_slots, the default, with a sparse
 * predictor on the pager backend and CPU attention): a plan's chosen
 * blocks that are absent from the region and clean in the store are read
 * from the store into reuse slots, pager blocks of memory the cache owns
 * and touched once at creation, rather than faulted into the region;
 * attention reads them there.  Faulting a sparse choice in costs a
 * userfaultfd install per block and, where the host shadows the guest's
 * page tables, a first touch per page of each install (kvp-probe's `page
 * first touch`), which can exceed the block's read; a read into a slot
 * maps nothing.  A block chosen again while its slot holds it is not read
 * again (reuse; KVSwap keeps such a buffer).  The budget's frames are
 * split: the region keeps a floor (2 MiB or four pager blocks, for
 * the rolling flushes and the blocks the slots do not take, plus the
 * rolling blocks' pinned pager blocks), the slots the rest, in whole huge
 * pages; kvp_kvcache_ram counts both as frames.  A retune that turns
 * prefetch off or picks the exact predictor gives the slots' frames to
 * the region, and one that turns them back takes them again (a cache
 * created with the exact predictor has none).  A read that fails, or
 * a block written while its read is in flight, leaves the slot unused:
 * that block is read through the region, so a stale or failed slot is
 * never served.  slots.c has the states.
 *
 * Freeing a sequence drops its block table; physical blocks that became
 * free and fill whole pager blocks are DISCARDed (kvp_region_advise), so
 * they are not written back.
 *
 * THE KV IS WHATEVER THE SOURCE GIVES (kv_source.h, which says when each
 * of its ops is called): kvpager's tools use the synthetic one
 * (lib/synth/kv_synth.h, kvp_kv_source_synth).
 *
 * Locking: none.  One thread drives a cache (every call below); the
 * cache's own threads are the attention pool, the prefill helpers and,
 * for the pager backend with prefetch, one waiter thread that records when
 * each layer's prefetch completes.  kvp_kvcache_format_block_table may be
 * called from another thread only while the driver is not inside a call;
 * the view's hook (kvp_kvcache_view_*) is synchronised.  The files and
 * their lock rules are in kvcache_i.h.
 *
 * ON A DEVICE (opts device "cuda", or "emu" to run the same path on the
 * CPU): each layer's chosen blocks, prefetched into frames as above, are
 * copied from the frames into page-locked staging and from there to a
 * device block pool on their own stream; blocks already in the pool are
 * not copied again (reuse, in kvp_kvcache_device_stats); each sequence's
 * device block table names the slots; layer l+1's copies are issued
 * while layer l's kernel runs (lib/device/devattn.h says how, and why
 * staging rather than registering the region with the driver).  The
 * step's queries of one layer are all asked before its kernel and the
 * outputs all given after it (still query before attended per
 * sequence).  A pool too small for one layer's blocks fails the step
 * with -E2BIG (kvp_kvcache_device_stats gives the smallest that does); a
 * retune to the exact predictor may need a larger pool.
 */
#ifndef KVP_KVCACHE_H
#define KVP_KVCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/kv/attention.h"
#include "lib/kv/block_table.h"
#include "lib/kv/kv_geometry.h"
#include "lib/kv/kv_source.h"
#include "lib/predict/predictor.h"
#include "pager/pager.h"

struct kvp_kvcache;

enum kvp_kvcache_backend {
	KVP_KVCACHE_PAGER = 0, /* a pager region backed by a store */
	KVP_KVCACHE_RAM = 1,   /* anonymous memory, everything resident */
	KVP_KVCACHE_MMAP = 2,  /* the kernel's mmap of a file */
};

struct kvp_kvcache_opts {
	struct kvp_kv_geometry geo;
	uint32_t max_seqs;	  /* sequence ids 0 .. max_seqs-1 */
	uint64_t capacity_tokens; /* physical room, all sequences: tokens */
	size_t pager_block_bytes; /* 0: one KV block (rounded to 4 KiB) */
	enum kvp_kvcache_backend backend;
	/* pager backend */
	struct kvp_pager *pager;      /* NULL: the cache opens one with cfg;
					 with reuse slots, its budget drops
					 to the region's floor (the slots
					 take the rest) */
	const struct kvp_config *cfg; /* NULL: defaults; budget_bytes set */
	struct kvp_store *store;      /* NULL: kvp_store_file_temp(dir) */
	uint64_t store_offset;
	const char *region_name; /* NULL: "kv" */
	/* pager and mmap */
	const char *dir;	 /* backing file's directory (NULL: $TMPDIR) */
	uint64_t budget_bytes;	 /* RAM budget: the pager's (if it opens
				      one); mmap: emulated; 0: KV / 4 */
	bool prefetch;		 /* prefetch (pager) / MADV_WILLNEED (mmap) */
	uint32_t prefetch_depth; /* layers ahead, 1 .. layers-1 */
	bool cross_step;	 /* prefetch the next step's first layers
				      during this step's last ones */
	int cold_after;		 /* advise COLD after compute: 1 yes, 0 no,
				      -1 auto (exact predictor only) */
	struct kvp_predictor_opts pred;
	unsigned attn_threads; /* 0: all CPUs */
	/* quality sampling (see kvp_kvcache_quality) */
	uint32_t sample_every;	/* record every N-th step (0: never) */
	uint32_t sample_layers; /* layers recorded per sampled step */
	uint32_t max_samples;	/* cap on recorded samples */
	/* attention on a device (see ON A DEVICE); NULL or "cpu": the CPU */
	const char *device;	    /* "cuda"; "emu": a CPU emulation */
	uint64_t device_pool_bytes; /* the device block pool; 0: room for
				       two layers' chosen blocks */
	bool reuse_slots; /* READING INTO SLOTS above (default true) */
};

/*
 * The prefetch depth the tools give a sparse predictor when none is set:
 * its plans read into reuse slots (READING INTO SLOTS), where a layer
 * ahead costs only its chosen blocks, and a scattered layer's reads need
 * several layers of compute to hide behind (at 2, a lowrank decode at 128
 * MiB waited on loads for half its step).
 */
#define KVP_KVCACHE_SPARSE_DEPTH 8

/* Defaults: one sequence, exact predictor, pager backend, depth from the
 * kv tunables (2), cross_step, cold_after auto, sampling off. */
void kvp_kvcache_opts_default(struct kvp_kvcache_opts *o,
			      const struct kvp_kv_geometry *g);

/* Per-step figures (kvp_kvcache_step) and totals (kvp_kvcache_stats). */
struct kvp_kvcache_step_stats {
	uint64_t steps;		/* 1 for a step, else steps summed */
	uint64_t tokens;	/* tokens decoded (sequences x steps) */
	double t_step_s;	/* wall time of the step */
	double t_compute_s;	/* attention kernels */
	double t_predict_s;	/* predictor select and observe */
	double t_wait_s;	/* blocked on prefetch completion */
	double t_fill_s;	/* the source's new K/V (the "model") */
	uint64_t bytes_read;	/* pager: bytes_read_total; mmap:
				      /proc/self/io read_bytes */
	uint64_t bytes_written; /* pager write-back + rolling flushes */
	uint64_t demand_faults; /* pager: demand_faults_total; mmap:
				      major faults */
	uint64_t prefetch_issued;
	uint64_t prefetch_hit;
	uint64_t prefetch_late;
	uint64_t prefetch_wasted;
	uint64_t chosen_blocks; /* KV blocks the predictor chose, out of
				      the region (the rolling block excluded) */
	uint64_t reused_blocks; /* of those, resident before the step */
	uint64_t flush_store;	/* rolling blocks written by store pwrite */
	uint64_t flush_region;	/* rolling blocks copied through the region */
};

struct kvp_kvcache_stats {
	struct kvp_kvcache_step_stats sum; /* over every step */
	double t_load_busy_s; /* time with some prefetch outstanding
				      (the union of [submit, done] over all
				      layers' prefetches): T_load in total */
	double t_prefill_s;   /* kvp_kvcache_prefill, all calls */
	uint64_t prefill_tokens;
	uint64_t prefill_bytes; /* KV bytes written by prefill */
	uint64_t cow_copies;	/* copy-on-write of a shared last block */
	uint64_t discarded_pager_blocks; /* DISCARDed on free */
	uint64_t pin_failures;	     /* pins refused (-ENOSPC): unpinned run */
	uint64_t mmap_dropped_bytes; /* mmap: dropped to keep the budget */
	uint64_t slot_reads;	     /* blocks read into reuse slots */
	uint64_t slot_read_errors;   /* of those, failed: the region read them */
	uint64_t slot_ios; /* the I/Os those took: blocks adjacent in the
			      store, read as one */
};

/*
 * kvp_kvcache_create - the region (or memory, or file mapping), the
 * physical block allocator of capacity_tokens / G blocks per layer (+1 per
 * sequence), the predictor, the attention pool.  Returns 0 and *out, or
 * -EINVAL (bad geometry or options), -ENOMEM, the pager's or store's
 * error; nothing is left behind on failure.
 */
int kvp_kvcache_create(const struct kvp_kvcache_opts *o,
		       struct kvp_kvcache **out);

/*
 * kvp_kvcache_destroy - free every sequence, stop threads, destroy the
 * region, the store and the pager if the cache made them.  Safe with NULL.
 */
void kvp_kvcache_destroy(struct kvp_kvcache *c);

/* An empty sequence; its id in *id.  -ENOSPC when max_seqs are live. */
int kvp_kvcache_seq_create(struct kvp_kvcache *c, uint32_t *id);

/*
 * kvp_kvcache_seq_fork - a new sequence sharing the first ntokens tokens
 * of parent (UINT64_MAX: all) by reference; its rolling buffer starts as a
 * copy of the shared part of the last block.  The first append into a
 * shared, partly filled block copies on write (counted in cow_copies).
 * Returns 0 and *id, -EINVAL, -ENOSPC, -ENOMEM.
 */
int kvp_kvcache_seq_fork(struct kvp_kvcache *c, uint32_t parent,
			 uint64_t ntokens, uint32_t *id);

/*
 * kvp_kvcache_seq_free - drop a sequence: its table's references, its
 * rolling buffer and what the predictor kept of it; pager blocks wholly
 * freed are DISCARDed.  -EINVAL for an unknown id.
 */
int kvp_kvcache_seq_free(struct kvp_kvcache *c, uint32_t id);

uint64_t kvp_kvcache_seq_tokens(const struct kvp_kvcache *c, uint32_t id);
const struct kvp_block_table *kvp_kvcache_seq_table(const struct kvp_kvcache *c,
						    uint32_t id);

/* Progress of a long call: done of total units (bytes in the cache's
 * calls; kvp_model_seq_set_progress counts tokens). */
typedef void (*kvp_kvcache_progress_fn)(void *arg, uint64_t done,
					uint64_t total);

/*
 * kvp_kvcache_prefill_stored - append ntokens tokens of seq whose K and V
 * the store already holds, without passing them through the cache (a
 * prefix cache's hit: lib/cache/cache_store.h).  The cache takes their
 * physical blocks and calls bind(arg, offs, n) once with the store offset
 * of each of their n = layers * ntokens / G KV blocks, layer by layer and
 * in token order within a layer, each kvp_kv_layout's block_stride bytes
 * in the layout's block format; bind must make the store hold those bytes
 * there before it returns 0.  The pager reads them when they are used.
 * Only on the pager backend, with seq's tokens and ntokens multiples of
 * G, a predictor that keeps no keys (not lowrank: it would not observe
 * them), and every pager block of those KV blocks absent and clean (no
 * frame hides what the store holds).  Returns 0; -EOPNOTSUPP (one of
 * those is not so; nothing changed: write the tokens with
 * kvp_kvcache_prefill); -EINVAL; -ENOSPC; -ENOMEM; or bind's error
 * (nothing changed).
 */
int kvp_kvcache_prefill_stored(struct kvp_kvcache *c, uint32_t seq,
			       uint64_t ntokens,
			       int (*bind)(void *arg, const uint64_t *offs,
					   size_t n),
			       void *arg);

/*
 * kvp_kvcache_read_blocks - the K and V of tokens [first, first +
 * ntokens) of seq as the cache holds them: for each layer in order, the
 * tokens' ntokens / G KV blocks in token order, kvp_kv_layout's
 * block_stride bytes each (the block format, padding included), into dst
 * (layers * ntokens / G * block_stride bytes, 4096-aligned: a store with
 * O_DIRECT reads into it).  The format kvp_kvcache_prefill_stored's bind
 * takes, so a chunk computed once can be stored as the cache has it.
 * Leaves residency alone: absent blocks are read from the store,
 * resident ones copied from their frames.  first and ntokens multiples
 * of G, the tokens' blocks full in every layer (not the rolling one).
 * 0; -EINVAL (no such sequence, a range not so, dst not aligned);
 * -ENOMEM; the store's error.
 */
int kvp_kvcache_read_blocks(struct kvp_kvcache *c, uint32_t seq,
			    uint64_t first, uint64_t ntokens, void *dst);

/*
 * kvp_kvcache_snap - tokens [first, first + ntokens) of seq, as
 * kvp_kvcache_read_blocks takes them, for kvp_kvcache_snap_read on ANY
 * thread while the driver goes on (a prefix cache reads a prefill's
 * chunks back while the decode runs).  Called on the driver: names the
 * tokens' physical blocks and waits for the writes in flight.  Full
 * blocks are never written again, so what the reader gets is what was
 * written, as long as the caller keeps the sequence (and the cache)
 * until kvp_kvcache_snap_free: freeing it would let other tokens take
 * the blocks.  0 and *out; -EOPNOTSUPP (a backend that cannot be read
 * beside its driver: kvp_kvcache_read_blocks instead; the mmap one);
 * -EINVAL as kvp_kvcache_read_blocks; -ENOMEM; a write's error.
 */
struct kvp_kvcache_snap;
int kvp_kvcache_snap(struct kvp_kvcache *c, uint32_t seq, uint64_t first,
		     uint64_t ntokens, struct kvp_kvcache_snap **out);

/* kvp_kvcache_read_blocks of tokens [first, first + ntokens) of the snap
 * (within its range, multiples of G; dst 4096-aligned), from one thread
 * at a time.  0, -EINVAL, the store's error. */
int kvp_kvcache_snap_read(struct kvp_kvcache_snap *sn, uint64_t first,
			  uint64_t ntokens, void *dst);

/* NULL is a no-op. */
void kvp_kvcache_snap_free(struct kvp_kvcache_snap *sn);

/*
 * kvp_kvcache_layout_for - the layout kvp_kvcache_create(o) makes (its
 * region's bytes, its KV block stride), for a caller that brings its own
 * store (o->store) and must size it first.  0, -EINVAL, -EOVERFLOW.
 */
int kvp_kvcache_layout_for(const struct kvp_kvcache_opts *o,
			   struct kvp_kv_layout *out);

/*
 * kvp_kvcache_prefill - append ntokens tokens of seq from src (all
 * layers).  Full KV blocks are written to the backing (see THE ROLLING
 * BUFFER), the last partial one stays in the rolling buffer.  The lowrank
 * predictor is fitted per layer from the first prefill of at least 64
 * tokens (its largest keys and an even sample), then observes every token.
 * progress (may be NULL) is called between layers.  src's ops are called
 * as kv_source.h says (THE CALLS OF A PREFILL).  Returns 0, -ENOSPC (no
 * physical room), -EINVAL (no such sequence; src without fill or query),
 * the source's or store's error.  When prefill_begin fails nothing is
 * appended; on any later failure the sequence may hold part of the
 * tokens: free it.
 */
int kvp_kvcache_prefill(struct kvp_kvcache *c, uint32_t seq, uint64_t ntokens,
			const struct kvp_kv_source *src,
			kvp_kvcache_progress_fn progress, void *parg);

/*
 * kvp_kvcache_step - one decode step of sequences seqs[0..n): append one
 * token to each (every layer, from src), and compute every layer's
 * attention over the predictor's blocks plus the rolling block; src's ops
 * are called as kv_source.h says (THE CALLS OF ONE DECODE STEP).  out (may
 * be NULL) gets n * layers * q_heads * head_dim floats: [seq i][layer][h]
 * [d].  *st (may be NULL) gets the step's figures.  Returns 0, -EINVAL,
 * -ENOSPC, -EIO (a prefetch failed), the source's or another error from
 * below; after a failure the cache is consistent but the step is half
 * done.
 */
int kvp_kvcache_step(struct kvp_kvcache *c, const uint32_t *seqs, uint32_t n,
		     const struct kvp_kv_source *src, float *out,
		     struct kvp_kvcache_step_stats *st);

/* Wait for and release prefetches planned ahead for the next step. */
void kvp_kvcache_drain(struct kvp_kvcache *c);

/*
 * kvp_kvcache_retune - take up the runtime KV tunables of @kv between two
 * steps: predictor (exact and window always; lowrank only on a cache
 * created lowrank, whose predictor keeps observing keys meanwhile),
 * predict_budget_tokens, sink_tokens and prefetch_depth_layers (0: no
 * prefetch; at most layers - 1).  The pager block size stays what create
 * chose.  The other fields of @kv must equal the cache's (they are fixed
 * at create).  Plans made ahead are drained first.  Driving thread only.
 * Returns 0; -EINVAL, -EOPNOTSUPP (lowrank on a cache that kept no
 * keys) or -E2BIG (on a device, a predictor or budget choosing more
 * blocks a layer than the one the cache was created with: the device
 * path holds those, and a step's plan that does not fit fails) with *bad
 * (if not NULL) naming the tunable, nothing changed; or an error of
 * pthread_create (a waiter thread for prefetch).
 */
int kvp_kvcache_retune(struct kvp_kvcache *c, const struct kvp_kv_config *kv,
		       const char **bad);

/* kvp_kvcache_retune_check - kvp_kvcache_retune's checks alone.  Reads
 * only what create fixed, so any thread may call it while the driving
 * thread decodes (a view's thread, to refuse a change at once). */
int kvp_kvcache_retune_check(const struct kvp_kvcache *c,
			     const struct kvp_kv_config *kv, const char **bad);

/*
 * kvp_kvcache_device_probe - can device be opened here?  0; -EINVAL when
 * @device is not a device's name (msg lists the names); else -ENODEV (or
 * another -errno) with msg (len bytes) naming what is missing (a kvpager
 * built without nvcc, no CUDA driver, no GPU) and the remedy.  For a
 * clear message before kvp_kvcache_create, which returns the same code.
 */
int kvp_kvcache_device_probe(const char *device, char *msg, size_t len);

/*
 * kvp_kvcache_device_pool_min - the smallest device_pool_bytes with which
 * a cache created from @o runs every step while none of its sequences
 * holds more than @tokens tokens.  A step stages one layer's chosen
 * blocks of all its sequences at once (a pool that cannot hold them
 * fails the step, -E2BIG); a sequence's are its full blocks when its
 * last token lands, (@tokens - 1) / block_tokens (the block that token
 * lands in is the rolling one, sent apart), all of which the exact
 * predictor chooses: for it this is the least that works.  The sparse
 * ones choose at most the budget's blocks and one more of them
 * (kvp_predictor_opts_max_blocks), a bound a block or two over what they
 * take.  It is what the run's longest step needs, not the cache's
 * capacity (rounded up to whole pager blocks, and any one sequence's
 * for all: pool_min_bytes); a retune to a predictor or budget choosing
 * more needs more.
 */
uint64_t kvp_kvcache_device_pool_min(const struct kvp_kvcache_opts *o,
				     uint64_t tokens);

/* The device path's totals (ON A DEVICE). */
struct kvp_kvcache_device_stats {
	char name[160];		/* the device, as its driver says */
	uint32_t pool_slots;	/* KV blocks the pool holds */
	uint64_t pool_min_bytes; /* the smallest device_pool_bytes that
				    holds one layer's chosen blocks with the
				    cache full (kvp_kvcache_device_pool_min:
				    for a run's length) */
	uint64_t device_bytes;	/* device memory in all */
	uint64_t staging_bytes; /* page-locked host memory in all */
	uint64_t stages;	/* kernels launched (layers x steps) */
	uint64_t reused;	/* blocks found in the pool: not copied */
	uint64_t copied;	/* blocks copied to the pool */
	uint64_t evicted;	/* of those, over another block */
	uint64_t rolling;	/* rolling blocks copied (every layer, step) */
	uint64_t bytes_to_device; /* all host -> device bytes */
	uint64_t overlap_misses;  /* next layer's copies that waited for
				     this layer's kernel (its prefetch was
				     not done, or the pool was full) */
	double t_stage_s;	/* host memcpy, frames -> staging */
	double t_sync_s;	/* waiting for kernels */
};

/*
 * kvp_kvcache_device_preload - copy every full block of every live
 * sequence into the device pool now (as if all had been chosen once),
 * so that steps copy only rolling blocks: the all-on-device bound, when
 * the pool holds the whole KV (device_pool_bytes).  Faults the blocks in
 * on the pager backend.  0 (a pool smaller than the KV keeps the blocks
 * copied last); -ENODEV (no device); a device error.
 */
int kvp_kvcache_device_preload(struct kvp_kvcache *c);

/* 0 and *out, or -ENODEV when the cache computes on the CPU. */
int kvp_kvcache_device_stats(const struct kvp_kvcache *c,
			     struct kvp_kvcache_device_stats *out);

/* Totals since create. */
void kvp_kvcache_stats(const struct kvp_kvcache *c,
		       struct kvp_kvcache_stats *out);

/*
 * kvp_kvcache_quality - score the samples recorded by steps (opts
 * sample_every, sample_layers): for each, read that layer's blocks of the
 * sequence as they were at that step (without faulting blocks in: frames
 * by kvp_region_peek, the rest from the store), compute exact attention
 * and the blocks' attention mass, and compare with what the step chose
 * and output.  *recall: mean of kvp_attn_recall (the chosen blocks' mass
 * over the oracle's with as many blocks); *rel_error: mean relative error
 * of the output; *mass: mean absolute chosen mass (may be NULL).
 * *nsamples gets the count (0: all set to 0).  Samples are kept.
 * Returns 0 or -ENOMEM / a read error.
 */
int kvp_kvcache_quality(struct kvp_kvcache *c, double *recall,
			double *rel_error, double *mass, uint32_t *nsamples);

/*
 * kvp_kvcache_sample_info - recorded sample k (0-based): its sequence,
 * layer, tokens attended and the logical blocks the step read (*lb valid
 * until the cache is destroyed).  0, or -ENOENT past the last.
 */
int kvp_kvcache_sample_info(const struct kvp_kvcache *c, uint32_t k,
			    uint32_t *seq, uint32_t *layer, uint64_t *npos,
			    const uint32_t **lb, size_t *n);

/*
 * kvp_kvcache_format_block_table - the block table of seq as text, one
 * line per logical block:
 *   "<logical> <physical> <valid tokens> <refcount> <where>\n"
 * where is "rolling" (the partial block, in RAM), or the pager block's
 * state (kvp_block_state_name) on the pager backend, "ram" / "file"
 * otherwise.  Writes at most len bytes (NUL-terminated); returns the
 * length the full text needs (as snprintf), or -EINVAL.
 */
int kvp_kvcache_format_block_table(struct kvp_kvcache *c, uint32_t seq,
				   char *buf, size_t len);

/*
 * The debug view's hook: seqs/<id>/block_table of the view
 * (lib/view/view_tree.h) is served by these two, which have the shape of
 * its struct kvp_view_seq_ops and take the cache as @cache; the caller
 * registers them (kvp_view_set_seqs(tree, &ops, cache)) and unregisters
 * before destroying the cache.  Both take the lock the cache holds around
 * every block table change, so the view's thread may call them while the
 * driving thread decodes.
 *   list: kvp_kvcache_seq_list.
 *   block_table: kvp_kvcache_format_block_table, or -ENOENT for a
 *   sequence that is not live.
 */
uint32_t kvp_kvcache_view_list(void *cache, uint32_t *ids, uint32_t max);
int kvp_kvcache_view_block_table(void *cache, uint32_t id, char *buf,
				 size_t len);

/* Live sequence ids, in order, into ids[0..max); returns how many live. */
uint32_t kvp_kvcache_seq_list(const struct kvp_kvcache *c, uint32_t *ids,
			      uint32_t max);

/* What the cache uses. */
const struct kvp_kv_layout *kvp_kvcache_layout(const struct kvp_kvcache *c);
struct kvp_region *kvp_kvcache_region(const struct kvp_kvcache *c);
struct kvp_pager *kvp_kvcache_pager(const struct kvp_kvcache *c);
struct kvp_predictor *kvp_kvcache_predictor(const struct kvp_kvcache *c);
uint64_t kvp_kvcache_budget_bytes(const struct kvp_kvcache *c);

/*
 * What the cache holds in RAM now, part by part.  frames: the blocks'
 * budget (pager: the pager's RAM budget, which only its frames count, and
 * the reuse slots, also in slots;
 * mmap: the emulated budget; RAM backend: the whole region).  The rest is
 * outside that budget: metadata, the predictor's
 * (kvp_predictor_metadata_bytes); rolling, the rolling buffers of the live
 * sequences; staging, the prefill's staging area (kept for the next
 * prefill) and the pager-block buffer of the rolling flushes.  total is
 * their sum.
 */
struct kvp_kvcache_ram {
	uint64_t frames, metadata, rolling, staging, total;
	uint64_t slots; /* of frames, reuse slots (READING INTO SLOTS) */
};
void kvp_kvcache_ram(const struct kvp_kvcache *c, struct kvp_kvcache_ram *out);
/*
 * kvp_kvcache_fit_ram - make the cache's RAM, all parts counted, @total
 * bytes, through @steps more tokens of each live sequence: the prefill's
 * staging area is given back (the next prefill takes it again), and the
 * frames become what the rolling buffers, staging and the predictor's
 * metadata leave of it, the metadata as it will be after those tokens
 * (kvp_kvcache_metadata_peak: it grows by a token's worth a step), so that
 * the total stays within @total all along (with reuse slots: the region
 * its floor, the slots the rest; plans ahead are drained).  That room is
 * allocated here (kvp_predictor_reserve), after the frames are made
 * smaller, so that the decode allocates none.  Call after a prefill,
 * with the decode steps to come.  Pager backend only (-EINVAL else);
 * -ENOSPC when the rest leaves less than 2 MiB for frames (nothing
 * changes); -EBUSY when more is pinned than that; -ENOMEM.
 */
int kvp_kvcache_fit_ram(struct kvp_kvcache *c, uint64_t total, uint64_t steps);
/* The most the predictor's metadata reaches over @steps more tokens of
 * each live sequence, the room for them reserved (kvp_predictor_metadata_
 * peak); UINT64_MAX out of memory. */
uint64_t kvp_kvcache_metadata_peak(const struct kvp_kvcache *c, uint64_t steps);
/* Bytes of K and V held by live sequences (full and partial blocks). */
uint64_t kvp_kvcache_kv_bytes(const struct kvp_kvcache *c);
const char *kvp_kvcache_backend_name(enum kvp_kvcache_backend b);

#endif /* KVP_KVCACHE_H */
