/*
 * kv_tunables.h - the KV layer's tunables, declared once.
 *
 * Same form as KVP_PAGER_TUNABLES in pager/config.h:
 * X(name, type, min, max, default, runtime, choices, doc).  lib/'s
 * tunables registry merges both lists; struct kvp_kv_config is generated.
 */
#ifndef KVP_KV_TUNABLES_H
#define KVP_KV_TUNABLES_H

#include "pager/config.h"

enum kvp_predictor_kind {
	KVP_PREDICTOR_EXACT = 0,
	KVP_PREDICTOR_WINDOW = 1,
	KVP_PREDICTOR_LOWRANK = 2,
};

#define KVP_KV_TUNABLES(X)                                                     \
	X(prefetch_depth_layers, KVP_T_UINT, 0, 16, 2, true, NULL,             \
	  "layers ahead whose KV blocks are prefetched while one computes")    \
	X(predictor, KVP_T_CHOICE, 0, 2, KVP_PREDICTOR_EXACT, true,            \
	  "exact window lowrank",                                              \
	  "how the blocks of the next step are chosen")                        \
	X(predict_budget_tokens, KVP_T_UINT, 16, 1u << 20, 400, true, NULL,    \
	  "tokens per layer and sequence a sparse predictor may select (M)")   \
	X(sink_tokens, KVP_T_UINT, 0, 1024, 4, true, NULL,                     \
	  "leading tokens the window predictor always keeps")                  \
	X(lowrank_rank, KVP_T_UINT, 4, 512, 128, false, NULL,                  \
	  "rank r of the low-rank key projection")                             \
	X(lowrank_fit_tokens, KVP_T_UINT, 64, 1u << 20, 1024, false, NULL,     \
	  "prefill keys the low-rank projection is learnt from")               \
	X(kv_block_tokens, KVP_T_UINT, 1, 1024, 4, false, NULL,                \
	  "tokens per KV block (G), the unit of prediction and of reads")      \
	X(attention_threads, KVP_T_UINT, 0, 256, 0, false, NULL,               \
	  "threads of the CPU attention, counting the caller (0: all CPUs)")

#define KVP_KV_CONFIG_FIELD(name, type, min, max, def, runtime, choices, doc)  \
	uint64_t name;
struct kvp_kv_config {
	KVP_KV_TUNABLES(KVP_KV_CONFIG_FIELD)
};
#undef KVP_KV_CONFIG_FIELD

#endif /* KVP_KV_TUNABLES_H */
