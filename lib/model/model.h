/*
 * model.h - a Llama-architecture transformer whose K and V live in kvpager.
 *
 * The network is llama2.c's (Karpathy): token embedding; per layer an
 * attention RMSNorm, wq / wk / wv, rotary embeddings (theta 10000, adjacent
 * pairs), grouped-query attention, wo, an FFN RMSNorm and a SwiGLU FFN
 * (w2 (silu(w1 x) * w3 x)); a final RMSNorm and the classifier.  Matrices
 * are float32, row-major [out][in].
 *
 * WEIGHTS come from a llama2.c checkpoint (kvp_model_load_file: mapped read
 * only, never copied) or are drawn from a seed at the attention shape of a
 * kv_geometry preset (kvp_model_random: "random:llama3-8b").  A random
 * model's residual width (dim) is small and independent of q_heads *
 * head_dim, so that the weights fit in RAM while the attention and its KV
 * have the preset's real size.  A random model's prompt attends only to
 * itself in prefill (prefill_window 1): the prompt's full attention at
 * 32K tokens is hours of CPU, and its K and V are still the network's
 * projections; decode attends to everything, as with a checkpoint.
 *
 * THE MODEL IS A KV SOURCE (lib/kv/kv_source.h's struct kvp_kv_source).  A
 * kvp_model_seq runs one sequence: kvp_model_prefill computes the prompt's
 * forward pass in RAM (its own causal attention) and hands each layer's K
 * and V to kvp_kvcache_prefill; kvp_model_step runs one decode step
 * through kvp_kvcache_step, whose attention reads K and V through the
 * block tables and the pager, with the cache's predictor choosing blocks.
 * Inside the step, the cache calls, per layer l in order, the source's
 * fill (layer l's K and V of the new token: it first finishes layer l-1 from
 * the attention output the cache wrote for it, then projects), then the
 * source's query (layer l's real query), then attention into the step's
 * output row of layer l.  A query asked ahead of its layer (a predictor
 * planning prefetch) is speculative: the latest residual stream through
 * that layer's norm and wq (InfiniGen's estimate); the attention itself
 * always uses the real query.
 *
 * Determinism: the math runs in a fixed order whatever the thread count
 * (threads split output rows, never a sum), so two runs that give the
 * attention the same K and V give bit-identical logits: the pager backend
 * against the all-in-RAM one is the project's token-for-token test.
 *
 * Threads: a model is read-only after it is made and may be shared; a
 * kvp_model_seq is driven by one thread and owns a small pool of workers
 * for its matrix products.
 */
#ifndef KVP_MODEL_H
#define KVP_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/kv/kv_geometry.h"
#include "lib/kv/kvcache.h"

/* Limits of a checkpoint header, checked by kvp_model_load_file. */
#define KVP_MODEL_MAX_DIM     65536u
#define KVP_MODEL_MAX_HIDDEN  262144u
#define KVP_MODEL_MAX_LAYERS  1024u
#define KVP_MODEL_MAX_VOCAB   1048576u
#define KVP_MODEL_MAX_SEQ_LEN 16777216u

struct kvp_model_config {
	uint32_t dim;		 /* residual stream width */
	uint32_t hidden_dim;	 /* SwiGLU FFN width */
	uint32_t layers;	 /* transformer layers */
	uint32_t q_heads;	 /* query heads */
	uint32_t kv_heads;	 /* KV heads, dividing q_heads */
	uint32_t head_dim;	 /* per head; dim / q_heads in a checkpoint */
	uint32_t vocab;		 /* tokens */
	uint32_t seq_len;	 /* trained context; 0: no limit (random) */
	uint32_t prefill_window; /* prefill: tokens a prompt token attends
				    to, itself included; 0: all */
	bool shared_classifier;	 /* classifier is the embedding (tied) */
};

struct kvp_model;

/*
 * kvp_model_load_file - map a llama2.c checkpoint.
 *
 * The header (seven little-endian int32: dim, hidden_dim, n_layers,
 * n_heads, n_kv_heads, vocab_size (negative: untied classifier), seq_len)
 * is checked against the limits above and against the KV geometry's (head
 * size a multiple of 8, 8 .. 512; q heads up to 256), and the file's size
 * must be exactly the header plus the weights it implies: a truncated
 * file, trailing bytes, or an absurd field is refused.  Returns 0 and
 * *out, or -ENOENT / -EACCES / ... (open), -EINVAL (a bad field: the
 * message in err names it), -EFBIG (size mismatch), -ENOMEM.  err (may be
 * NULL) gets a one-line, lowercase message on failure.  Nothing is left
 * behind on failure.
 */
int kvp_model_load_file(const char *path, struct kvp_model **out, char *err,
			size_t errlen);

/* Options of a random model (kvp_model_random). */
struct kvp_model_random_opts {
	uint64_t seed;	     /* weights; 1 */
	uint32_t dim;	     /* residual width; 32 */
	uint32_t hidden_dim; /* FFN width; 64 */
	uint32_t vocab;	     /* 512 */
};

void kvp_model_random_opts_default(struct kvp_model_random_opts *o);

/*
 * kvp_model_random - a model with weights drawn from o->seed (uniform,
 * variance 1 / fan-in; norms 1) at the attention shape of preset (a
 * kv_geometry preset name): its layers, q heads, KV heads and head dim;
 * prefill_window 1.
 * Returns 0 and *out, -ENOENT (unknown preset), -EINVAL (o out of range),
 * -ENOMEM; err as above.
 */
int kvp_model_random(const char *preset, const struct kvp_model_random_opts *o,
		     struct kvp_model **out, char *err, size_t errlen);

/*
 * kvp_model_open - "random:PRESET" (kvp_model_random with o, NULL:
 * defaults) or a checkpoint path (kvp_model_load_file).  Same returns.
 */
int kvp_model_open(const char *spec, const struct kvp_model_random_opts *o,
		   struct kvp_model **out, char *err, size_t errlen);

/* Unmap or free.  NULL is a no-op.  No kvp_model_seq may use it. */
void kvp_model_close(struct kvp_model *m);

const struct kvp_model_config *kvp_model_config(const struct kvp_model *m);
/* The name it was opened with (path or "random:PRESET"). */
const char *kvp_model_name(const struct kvp_model *m);
/* Bytes of weights (mapped or allocated). */
size_t kvp_model_weight_bytes(const struct kvp_model *m);

/*
 * kvp_model_geometry - the KV geometry of m's attention, with element type
 * dtype and G = block_tokens.  Returns 0 or -EINVAL (kvp_kv_geometry_check
 * refuses it).
 */
int kvp_model_geometry(const struct kvp_model *m, enum kvp_kv_dtype dtype,
		       uint32_t block_tokens, struct kvp_kv_geometry *out);

/* ---- running a sequence ------------------------------------------------- */

struct kvp_model_seq;

/*
 * kvp_model_seq_create - the forward state of one sequence (seq, an id of
 * cache c, created by the caller and empty) of model m, whose KV geometry
 * c was made with (kvp_model_geometry).  nthreads: workers for the matrix
 * products, counting the caller (0: one per online CPU).  Returns 0 and
 * *out, -EINVAL (geometry differs from m's, seq not empty), -ENOMEM,
 * -EAGAIN (threads).
 */
int kvp_model_seq_create(struct kvp_model *m, struct kvp_kvcache *c,
			 uint32_t seq, unsigned nthreads,
			 struct kvp_model_seq **out);
void kvp_model_seq_destroy(struct kvp_model_seq *s);

/*
 * kvp_model_prefill - run the forward pass over tokens[0..n) appended to
 * the sequence (in chunks), put their K and V into the cache
 * (kvp_kvcache_prefill), and leave the logits of the last token.  The
 * prompt's own attention runs in RAM over its K and V in fp32, over the
 * config's prefill_window.  The sequence must be empty (a prompt comes
 * first).  Returns 0, -EINVAL (a token >= vocab; n = 0; more than the
 * model's seq_len; the sequence not empty), -ENOMEM, the cache's error.
 * On failure the cache's sequence may hold part of the tokens: free it.
 */
int kvp_model_prefill(struct kvp_model_seq *s, const uint32_t *tokens,
		      uint32_t n);

/*
 * kvp_model_seq_set_progress - the next prefills of s call fn(arg, done,
 * n) as they go (after the prefix store's tokens, after each chunk
 * computed): done of the prompt's n tokens in the cache.  A long prompt
 * computes for minutes.  fn NULL: none.
 */
void kvp_model_seq_set_progress(struct kvp_model_seq *s,
				kvp_kvcache_progress_fn fn, void *arg);

/*
 * A prefix store for kvp_model_prefill (kvp_model_seq_set_prefix): the
 * prompt's K and V in chunks of chunk_tokens tokens (a power of two, 1 ..
 * 256), chunk i holding tokens [i * chunk_tokens, (i + 1) * chunk_tokens).
 * A chunk's payload (kvp_model_prefix_bytes), when chunk_tokens is a
 * multiple of the cache's G, is its KV blocks in the cache's block format
 * (kv_geometry.h), each kvp_kv_block_stride bytes (padding zeroed),
 * layer by layer and in token order within a layer: the bytes the KV
 * cache's region holds for them.  Otherwise it is, for each layer and
 * each of its tokens, that token's K then V (kv_heads * head_dim
 * elements each).  Both in the cache's dtype.  The store names chunks by
 * the prompt's tokens (lib/cache/prefix.h does, with chained keys); the
 * model only numbers them.
 *   get:  chunk i's payload into buf (len bytes): 0, or any error (a
 *         miss: the prefill computes from there on);
 *   put:  chunk i, computed, may be stored (payload valid for the call);
 *   bind: optional, with bind_arg: make the KV cache's store hold chunk
 *         i's payload at the n KV blocks' store offsets offs (in the
 *         payload's order) without reading it now, as
 *         kvp_kvcache_prefill_stored's bind does (lib/cache/cache_store.h
 *         maps the chunk's file): 0, or any error (the chunk is read
 *         with get instead, and so are the chunks after it).
 *   put_later: offer the computed chunks not during the prefill but at
 *         kvp_model_seq_offer, read back from the KV cache
 *         (kvp_kvcache_read_blocks: the bytes the cache holds, which are
 *         the payload's), so that no chunk is copied before the first
 *         token.  Only for payloads in whole KV blocks; otherwise, and
 *         when false, each chunk is offered as it is computed.
 *   later_max: with put_later, at most this many chunks held back, the
 *         last computed (0: all); the earlier ones are offered as they
 *         are computed (a long prefill's, which a bounded queue could
 *         not take at once after it).
 * hit_tokens is set by each prefill: the tokens taken from the store;
 * mapped_tokens: those of them bound, not read and copied.
 * later_seq, later_from, later_to are the model's (zero them at first):
 * the sequence whose chunks [later_from, later_to) are held back for
 * kvp_model_seq_offer.  They live here, not in the sequence, because the
 * keys a put stores under are the prefix's current prompt's: a prefill,
 * a sequence set to another prefix or destroyed drops what is held back,
 * so that nothing is ever offered under a later prompt's keys.
 */
struct kvp_model_prefix {
	uint32_t chunk_tokens;
	int (*get)(void *arg, uint32_t chunk, void *buf, size_t len);
	void (*put)(void *arg, uint32_t chunk, const void *payload, size_t len);
	void *arg;
	int (*bind)(void *bind_arg, uint32_t chunk, const uint64_t *offs,
		    size_t n);
	void *bind_arg;
	bool put_later;
	uint32_t later_max;
	uint64_t hit_tokens;
	uint64_t mapped_tokens;
	struct kvp_model_seq *later_seq;
	uint32_t later_from, later_to;
};

/* Forget the chunks held back on px (its later_seq's): before px goes
 * while a sequence may still hold some back, or before its keys change.
 * An offer in flight (kvp_model_seq_offer_async) is waited for first. */
void kvp_model_prefix_drop_later(struct kvp_model_prefix *px);

/* Wait for an offer in flight on px (kvp_model_seq_offer_async), if
 * any: its chunks are all put then.  Chunks held back and not yet being
 * offered stay held back. */
void kvp_model_prefix_offer_wait(struct kvp_model_prefix *px);

/* Bytes of one chunk's payload of chunk_tokens tokens for s's model. */
size_t kvp_model_prefix_bytes(const struct kvp_model_seq *s,
			      uint32_t chunk_tokens);

/*
 * The chunk format's one definition, for every writer and reader of
 * chunks (the model, lib/model/model_cache.c, the Python binding's
 * PrefixCache, which calls these rather than restating them):
 *
 * kvp_model_chunk_in_blocks - true when chunk_tokens is a multiple of g's
 * G: the payload is then whole KV blocks (above), else per token.
 * kvp_model_chunk_bytes - bytes of one chunk's payload (all g->layers).
 * kvp_model_chunk_keygeo - the geometry words of a chunk key's context
 * (struct kvp_rec_keyctx's geo, lib/cache/block_record.h): layers,
 * q_heads, kv_heads, head_dim, dtype, G, chunk_tokens with
 * KVP_MODEL_CHUNK_BLOCKS when in blocks, prefill_window.  A change of the
 * payload's format changes the keys, so that chunks in another format are
 * misses, never read in the wrong order.
 */
#define KVP_MODEL_CHUNK_BLOCKS (1u << 16)

bool kvp_model_chunk_in_blocks(const struct kvp_kv_geometry *g,
			       uint32_t chunk_tokens);
size_t kvp_model_chunk_bytes(const struct kvp_kv_geometry *g,
			     uint32_t chunk_tokens);
void kvp_model_chunk_keygeo(const struct kvp_kv_geometry *g,
			    uint32_t chunk_tokens, uint32_t prefill_window,
			    uint32_t geo[8]);

/*
 * kvp_model_seq_set_prefix - the next prefills of s read the prompt's
 * leading chunks from px (as long as every one is there, and never the
 * chunk of the prompt's last token, whose logits must be computed)
 * instead of computing them, and offer px every full chunk they compute.
 * The tokens read give the same K and V, and the same logits bit for
 * bit, when the KV is fp32 or the prompt attends to itself alone
 * (prefill_window 1): the store holds what the computation made.  px
 * (NULL: none) must live while s prefills.  -EINVAL: chunk_tokens not a
 * power of two in 1 .. 256, or no get.
 */
int kvp_model_seq_set_prefix(struct kvp_model_seq *s,
			     struct kvp_model_prefix *px);

/*
 * kvp_model_seq_offer - offer the prefix store's put the chunks that the
 * last prefill computed and held back (put_later), each read back from
 * the KV cache into one buffer of a chunk: after the first token, off
 * its path.  A chunk already offered is not offered again, nor one
 * dropped since (see struct kvp_model_prefix's later_seq).  0 (also when
 * none is pending), -ENOMEM, or the KV cache's read error (the chunks
 * from there on are not offered: a miss next time, computed again).
 */
int kvp_model_seq_offer(struct kvp_model_seq *s);

/*
 * kvp_model_seq_offer_async - kvp_model_seq_offer on a thread of its own,
 * so that the decode (kvp_model_step) goes on meanwhile: the held-back
 * chunks' KV blocks are named now (kvp_kvcache_snap: full blocks, never
 * written again) and read and put by the thread, one chunk's buffer at a
 * time (the put waits for room in its queue: bounded memory).  px's put
 * must take calls from another thread.  Whatever would free the blocks
 * or change the keys of px's puts waits for the thread first: the
 * sequence's destroy, kvp_model_seq_set_prefix, a prefill,
 * kvp_model_prefix_drop_later, kvp_model_seq_offer (which returns the
 * thread's read error) and kvp_model_prefix_offer_wait; the caller must
 * not free the sequence's tokens from the KV cache before one of those.
 * On a backend that cannot be read beside its driver (mmap), or without
 * a thread, it is kvp_model_seq_offer.  0 (also when none is pending),
 * or kvp_model_seq_offer's errors (nothing started).
 */
int kvp_model_seq_offer_async(struct kvp_model_seq *s);

/*
 * kvp_model_step - append token (the sequence's next) with one decode step
 * through the cache, and leave its logits.  st (may be NULL) gets the
 * step's figures (kvp_kvcache_step; t_fill_s is the model's own compute
 * before each layer's attention).  Returns 0, -EINVAL (token >= vocab;
 * past seq_len), or the cache's error.
 */
int kvp_model_step(struct kvp_model_seq *s, uint32_t token,
		   struct kvp_kvcache_step_stats *st);

/* The logits of the last token (vocab floats), valid until the next call. */
const float *kvp_model_logits(const struct kvp_model_seq *s);
/* Tokens in the sequence. */
uint64_t kvp_model_seq_tokens(const struct kvp_model_seq *s);
/* Seconds spent in the model's own math (matmuls, norms, FFN, prefill
 * attention), not in the cache's attention. */
double kvp_model_seq_compute_s(const struct kvp_model_seq *s);

/*
 * Where the last kvp_model_prefill's time went (its wall time is their
 * sum, but for allocation): what a prefix cache's hit costs beside the
 * tokens it leaves to compute.
 */
struct kvp_model_prefill_times {
	double restore_s;	/* taking the stored chunks (bind or read) */
	double math_s;		/* the model's math over computed tokens */
	double offer_s;		/* computed chunks copied and queued */
	double offer_after_s;	/* kvp_model_seq_offer's, after the prefill
				   (put_later): read back and queued; an
				   async one's (its thread's time) once
				   waited for */
	double kv_s;		/* computed tokens into the KV cache */
	uint32_t restored_tokens; /* taken from the store */
	uint32_t computed_tokens; /* computed */
};

void kvp_model_seq_prefill_times(const struct kvp_model_seq *s,
				 struct kvp_model_prefill_times *out);

/*
 * kvp_model_text - n tokens of the model's own text: BOS (1), then tokens
 * sampled at temperature from seed (a xorshift state, 0 taken as 1), with
 * the KV all in RAM.  A prompt with the attention of what the model was
 * trained on, where token ids are all there is.  Returns 0, -EINVAL (n 0
 * or past seq_len), -ENOMEM.
 */
int kvp_model_text(struct kvp_model *m, uint32_t n, float temperature,
		   uint64_t seed, uint32_t *out);

/*
 * kvp_model_sample - the next token from logits: the argmax (lowest index
 * on ties) when temperature <= 0, else a draw from softmax(logits /
 * temperature) with *rng (a xorshift state, advanced; never 0).
 */
uint32_t kvp_model_sample(const float *logits, uint32_t vocab,
			  float temperature, uint64_t *rng);

/* ---- token text (llama2.c tokenizer.bin) -------------------------------- */

struct kvp_tokenizer;

/*
 * kvp_tokenizer_load - a llama2.c tokenizer.bin (int32 max_token_length,
 * then per token: float score, int32 length, the bytes) for vocab tokens.
 * Returns 0 and *out, -errno (open), -EINVAL (a length out of range or a
 * short file: err says which token); err as kvp_model_load_file's.
 */
int kvp_tokenizer_load(const char *path, uint32_t vocab,
		       struct kvp_tokenizer **out, char *err, size_t errlen);
void kvp_tokenizer_free(struct kvp_tokenizer *t);

/*
 * kvp_tokenizer_piece - the text of token after token prev (llama2.c's
 * rule: a leading space is dropped after BOS (1); "<0xHH>" is that byte).
 * The string lives as long as t; "" for a token out of range.
 */
const char *kvp_tokenizer_piece(const struct kvp_tokenizer *t, uint32_t prev,
				uint32_t token);

#endif /* KVP_MODEL_H */
