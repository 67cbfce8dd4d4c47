/*
 * kvcache_i.h - private: the KV cache's state and the calls between its
 * files.
 *
 *   kvcache.c        create, destroy, totals, the block table text and
 *                    the view's hook, accessors
 *   kv_backend_i.h   the backend ops; backend_pager.c, backend_ram.c,
 *                    backend_mmap.c
 *   plan.c           the prefetch plans (a ring of depth + 1) and the
 *                    waiter thread that records their completion
 *   slots.c          reuse slots: the sparse decode's chosen blocks read
 *                    from the store into the cache's own memory
 *   seq.c            sequences, the rolling buffer, prefill
 *   step.c           the decode step
 *   quality.c        quality samples and their scoring
 *
 * A decode step, from the top: step.c's kvp_kvcache_step plans layers
 * ahead (plan.c: the predictor's choice, the backend's prefetch), appends
 * the new token (seq.c: the rolling buffer, from the source), waits for
 * and pins its plan, computes attention, unpins, flushes full rolling
 * blocks (seq.c, the backend's write).
 *
 * Locks (see kvcache.h for the callers' side): one thread drives a cache
 * and owns everything here but
 *   mu     the waiter's queue (wq, wq_head, wq_len), each queued plan's
 *          done / t_done / err, and busy_end / busy_s;
 *   tlock  the block tables and seqs[].live against the view's reads
 *          (kvp_kvcache_view_*): taken around every change of either.
 * Neither lock is held across a call into the pager or the source.
 */
#ifndef KVP_KVCACHE_I_H
#define KVP_KVCACHE_I_H

#include <pthread.h>
#include <time.h>

#include "lib/kv/kv_backend_i.h"
#include "pager/store.h"
#include "lib/device/devattn.h"
#include "lib/kv/kvcache.h"

struct kvc_seq {
	bool live;		    /* in use (changed under tlock) */
	struct kvp_block_table *bt; /* logical -> physical KV blocks */
	uint64_t *fill;		    /* per layer: tokens written */
	char *rb;	 /* layers x stride: the rolling block of each layer */
	uint64_t *rbpin; /* per layer: pager block pinned for it, or ~0 */
};

/* What one layer of one step reads: chosen, mapped, maybe prefetched. */
struct kvc_plan {
	bool used;		 /* holds a plan (else free) */
	uint64_t gl;		 /* global layer index: step * layers + layer */
	uint32_t layer;		 /* gl % layers */
	uint32_t nseq;		 /* sequences, as c->step_seqs */
	uint32_t *lb;		 /* chosen region blocks, per sequence */
	size_t *off;		 /* nseq + 1 offsets into lb */
	size_t lb_cap;		 /* entries allocated in lb */
	size_t off_cap;		 /* entries allocated in off */
	uint64_t *pb;		 /* distinct pager blocks, ascending */
	bool *res;		 /* pb[i] was resident at plan time */
	size_t npb;		 /* entries of pb and res */
	size_t pb_cap;		 /* entries allocated in pb */
	uint64_t chosen;	 /* KV blocks chosen (lb entries) */
	uint64_t reused;	 /* of those, resident at plan time */
	struct kvp_prefetch *pf; /* the backend's async prefetch, or NULL */
	double t_submit;	 /* when pf was submitted */
	double t_done;		 /* when the waiter saw pf complete (mu) */
	bool queued;		 /* handed to the waiter */
	bool done;		 /* the waiter is done with it (mu) */
	bool pinned;		 /* pb pinned for the compute */
	int err;		 /* pf's result (mu) */
	/* reuse slots (slots.c), when the cache has them */
	int32_t *slot;	     /* per pb: its slot, or -1 (the region) */
	struct kvp_io *io;   /* the slots' reads this plan started */
	size_t nio, io_cap;  /* entries of io, allocated */
	size_t io_sub;	     /* of io, submitted (waiter) */
	size_t io_done;	     /* of io, completed (waiter; mu for others) */
	bool settled;	     /* io's results are in the slots' states */
};

/* A reuse slot (slots.c): one pager block of c->sl_mem. */
struct kvc_slot {
	uint64_t pb;   /* the pager block it holds or loads, or ~0 */
	uint32_t refs; /* plans holding it */
	uint8_t state; /* slots.c: FREE, LOADING, VALID, DEAD */
	uint8_t used;  /* CLOCK's count: chosen again, up to SLOT_USE_MAX */
};

/* One recorded (sequence, layer) of a sampled step, for quality. */
struct kvc_sample {
	uint32_t seq, layer; /* which */
	uint64_t npos;	     /* tokens attended */
	float *q, *out;	     /* q_heads * head_dim each */
	uint32_t *lb;	     /* blocks attended, logical */
	size_t n;	     /* entries of lb */
};

struct kvp_kvcache {
	struct kvp_kvcache_opts o;	  /* copy, depth adjusted */
	struct kvp_kv_geometry g;	  /* o.geo */
	struct kvp_kv_layout l;		  /* where each KV block is */
	const struct kvc_backend_ops *be; /* o.backend's ops */
	void *bs;			  /* the backend's own state */
	size_t stride;			  /* KV block stride in the region */
	size_t bb;			  /* KV block bytes */
	size_t qfloats;			  /* q_heads * head_dim */
	uint64_t npb;			  /* pager blocks in the region */
	uint64_t budget;		  /* RAM budget in force */
	char *base;			  /* region / memory / mapping */
	struct kvp_pager *pager;	  /* kvpager backend: its pager */
	struct kvp_region *region;	  /* kvpager backend: the region */
	/* KV */
	struct kvp_block_alloc *alloc;	    /* physical KV blocks */
	struct kvp_predictor *pred;	    /* chooses each step's blocks */
	enum kvp_predictor_kind pred_kind0; /* created with (what it keeps) */
	struct kvp_attn_pool *pool;	    /* attention threads */
	struct kvc_seq *seqs;		    /* max_seqs slots */
	bool *fitted;			    /* per layer: lowrank fitted */
	bool cold;			    /* advise COLD after compute */
	/* step state */
	uint64_t gstep;		  /* steps done */
	struct kvc_plan *plans;	  /* ring of depth + 1 */
	uint32_t nplans;	  /* depth + 1 */
	uint32_t plans_cap;	  /* plans and wq allocated: the deepest ring */
	uint32_t *step_seqs;	  /* the sequences the plans are for */
	uint32_t nstep_seqs;	  /* entries of step_seqs */
	bool plans_valid;	  /* plans ahead are for step_seqs */
	struct kvp_kv_source src; /* the step's (plan queries) */
	uint32_t *sel;		  /* predictor output scratch */
	size_t sel_cap;		  /* entries allocated in sel */
	const void **ptrs;	  /* attention's block pointers */
	uint32_t *ntok;		  /* attention's tokens per block */
	size_t ptr_cap;		  /* entries allocated in ptrs, ntok */
	float *qbuf;		  /* a query */
	float *obuf;		  /* an output nobody asked for */
	char *stage;		  /* prefill staging (mmap) */
	size_t stage_cap;	  /* bytes of stage */
	char *pbbuf;		  /* one pager block (reads, fork) */
	/* waiter thread (asynchronous prefetch) */
	pthread_t waiter;     /* its thread */
	bool waiter_on;	      /* started */
	bool waiter_stop;     /* asked to end (mu) */
	pthread_mutex_t mu;   /* see Locks above */
	pthread_cond_t cv;    /* signals wq and plan done changes */
	struct kvc_plan **wq; /* queue of plans to wait for (mu) */
	uint32_t wq_head;     /* first queued (mu) */
	uint32_t wq_len;      /* queued (mu) */
	double busy_end;      /* end of the union of loads so far (mu) */
	double busy_s;	      /* that union's length (mu) */
	/* reuse slots (slots.c); sl_of NULL: none */
	struct kvc_slot *sl;	    /* sl_n of them */
	uint32_t sl_n;		    /* slots */
	uint32_t sl_hand;	    /* CLOCK's hand */
	char *sl_mem;		    /* sl_n pager blocks */
	int32_t *sl_of;		    /* per pager block: its slot, or -1 */
	struct kvp_store *sl_store; /* read from (the region's store) */
	struct kvp_store_queue *sl_q; /* its queue: the waiter's */
	unsigned sl_inflight;	      /* reads in flight (waiter) */
	/* samples */
	struct kvc_sample *samples; /* recorded */
	uint32_t nsamples;	    /* entries of samples */
	/* the view */
	pthread_mutex_t tlock; /* block tables against the view's reads */
	/* the device path (step_dev.c), when o.device names one */
	struct kvp_device *dev;	  /* opened by create */
	struct kvp_devattn *da;	  /* its pool, staging and schedule */
	uint32_t *d_off;	  /* max_seqs + 1: a stage's table offsets */
	uint32_t *d_pb;		  /* its physical blocks */
	const void **d_host;	  /* where they are in the region */
	size_t d_cap;		  /* entries of d_pb and d_host */
	const void **d_roll;	  /* max_seqs rolling blocks */
	uint32_t *d_rntok;	  /* their valid tokens */
	float *d_q, *d_out;	  /* max_seqs queries, outputs */
	bool d_staged;		  /* a stage is in flight: */
	uint64_t d_stage;	  /* its number (devattn.h), */
	uint64_t d_stage_gl;	  /* the global layer index it is for */
	uint64_t d_next;	  /* the next stage's number */
	uint64_t d_misses;	  /* stages not overlapped: pool full */
	/* stats */
	struct kvp_kvcache_stats st;	   /* totals */
	struct kvp_kvcache_step_stats cur; /* the step being run */
};

/* CLOCK_MONOTONIC in seconds: the one clock of the KV layer. */
static inline double kvc_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* kvcache.c: scratch */
/* Grow *p to at least need elements of elem bytes (doubling): 0, -ENOMEM
 * (*p and *cap unchanged). */
int kvc_grow(void **p, size_t *cap, size_t need, size_t elem);
/* Anonymous, private memory for large buffers (munmap it); NULL: none. */
void *kvc_big_alloc(size_t bytes);

/* plan.c */
/* The ring and the queue; the waiter thread if the backend prefetches
 * asynchronously.  0 or -ENOMEM / pthread_create's error. */
int kvc_plans_init(struct kvp_kvcache *c);
/* Drain, stop the waiter, free the ring.  Safe on a partial init. */
void kvc_plans_fini(struct kvp_kvcache *c);
/* Start the waiter thread if it is not running: 0 or -errno. */
int kvc_waiter_start(struct kvp_kvcache *c);
/* Plan global layer gl (releasing what its ring slot held): 0 or the
 * predictor's, the source's or the backend's error. */
int kvc_plan_make(struct kvp_kvcache *c, uint64_t gl);
/* The plan of gl, made now if it was not made ahead; NULL and *err. */
struct kvc_plan *kvc_plan_get(struct kvp_kvcache *c, uint64_t gl, int *err);
/* Until the waiter has seen pl's prefetch complete (pl->err then). */
void kvc_plan_wait(struct kvp_kvcache *c, struct kvc_plan *pl);
/* Whether kvc_plan_wait(pl) would return at once. */
bool kvc_plan_done(struct kvp_kvcache *c, struct kvc_plan *pl);
/* The index of pager block pb in pl->pb, or pl->npb if it is not there. */
size_t kvc_plan_find(const struct kvc_plan *pl, uint64_t pb);
/* Pin (all or none: -ENOSPC) or unpin (and advise cold) pl's blocks. */
int kvc_plan_pin(struct kvp_kvcache *c, struct kvc_plan *pl, bool pin);
/* Wait, unpin and free pl's prefetch; the slot is free again. */
void kvc_plan_release(struct kvp_kvcache *c, struct kvc_plan *pl);

/* slots.c */
/* Should c read its plans into reuse slots (opts, backend, predictor,
 * prefetch as they are now)? */
bool kvc_slots_wanted(const struct kvp_kvcache *c);
/* Slots exist and are wanted now: plans use them. */
bool kvc_slots_on(const struct kvp_kvcache *c);
/* The region's budget when slots take the rest of the frames: 2 MiB or
 * four pager blocks, and the rolling blocks' pinned pager blocks. */
uint64_t kvc_slots_region_floor(const struct kvp_kvcache *c);
/* Slots wanted and the backend's store has a queue: the slots' table and
 * queue, and the frames (c->budget) split by kvc_slots_refit; else
 * nothing.  0 or -ENOMEM / the queue's / the pager's error. */
int kvc_slots_init(struct kvp_kvcache *c);
void kvc_slots_fini(struct kvp_kvcache *c);
/* Split frames bytes between the region (the pager's budget, c->budget)
 * and the slots: the floor and the rest when slots are wanted, all to the
 * region when not.  Drains the plans.  0, -EOPNOTSUPP (no slots' table),
 * the pager's error (-EBUSY: more pinned), -ENOMEM (the region got the
 * slots' share). */
int kvc_slots_refit(struct kvp_kvcache *c, uint64_t frames);
uint64_t kvc_slots_bytes(const struct kvp_kvcache *c);
/* Give pl's pager blocks slots (pl->slot, pl->res, the reads in pl->io). */
int kvc_slots_plan(struct kvp_kvcache *c, struct kvc_plan *pl);
/* The waiter: until pl's reads completed, submitting the queue's. */
void kvc_slots_wait(struct kvp_kvcache *c, struct kvc_plan *pl);
/* After the wait: pl's read results into the slots' states. */
void kvc_slots_settle(struct kvp_kvcache *c, struct kvc_plan *pl);
/* pl lets go of its slots (settling first). */
void kvc_slots_release(struct kvp_kvcache *c, struct kvc_plan *pl);
/* Where pl's pager block pb is in a VALID slot, or NULL (the region). */
const char *kvc_slots_addr(const struct kvp_kvcache *c,
			   const struct kvc_plan *pl, uint64_t pb);
/* Pager blocks [pb, pb + n) change in the region or the store. */
void kvc_slots_forget(struct kvp_kvcache *c, uint64_t pb, uint64_t n);
/* seq.c */
/* A source with fill and query. */
bool kvc_source_ok(const struct kvp_kv_source *src);
/* id is a live sequence of c (c may be NULL). */
bool kvc_seq_ok(const struct kvp_kvcache *c, uint32_t id);
/* Free sequence id; discard: DISCARD its wholly freed pager blocks. */
void kvc_seq_drop(struct kvp_kvcache *c, uint32_t id, bool discard);
/* n tokens from src into the rolling block of (id, layer), observed. */
int kvc_rb_append(struct kvp_kvcache *c, uint32_t id, uint32_t layer,
		  const struct kvp_kv_source *src, uint32_t n);
/* Write the rolling block of (id, layer) to the backend if it is full. */
int kvc_rb_flush(struct kvp_kvcache *c, uint32_t id, uint32_t layer);
/* Logical block lb of s in layer as it is now (rolling or backing). */
int kvc_read_logical(struct kvp_kvcache *c, struct kvc_seq *s, uint32_t layer,
		     uint32_t lb, char *dst);

/* step_dev.c */
/* Open o.device and make its engine: 0, -ENODEV, -ENOMEM, -EINVAL. */
int kvc_dev_init(struct kvp_kvcache *c);
void kvc_dev_fini(struct kvp_kvcache *c);
/* Plan pl's attention on the device; next (may be NULL): the plan of the
 * following layer of this step, waited for and staged during pl's kernel
 * when its prefetch is done. */
int kvc_dev_compute(struct kvp_kvcache *c, struct kvc_plan *pl,
		    struct kvc_plan *next, const struct kvp_kv_source *src,
		    float *out);
/* End a stage left in flight by a failed step. */
void kvc_dev_abandon(struct kvp_kvcache *c);
/* Physical blocks freed[0..n) may be rewritten: drop their slots. */
void kvc_dev_forget(struct kvp_kvcache *c, const uint32_t *freed, size_t n);

/* quality.c */
/* Does this step record layer (opts sample_every, sample_layers)? */
bool kvc_layer_sampled(struct kvp_kvcache *c, uint32_t layer);
/* Record sequence i of plan pl at layer: its query q, output o, the
 * blocks it read and the rolling block rblb (no room: not recorded). */
void kvc_sample_record(struct kvp_kvcache *c, uint32_t id, uint32_t layer,
		       uint64_t npos, const float *q, const float *o,
		       const struct kvc_plan *pl, size_t i, uint32_t rblb);
void kvc_samples_free(struct kvp_kvcache *c);

#endif /* KVP_KVCACHE_I_H */
