/*
 * synth_source.c - the synthetic generator as a KV source (kv_source.h):
 * what the tools and tests decode.
 *
 * Its K, V and queries depend only on (seed, seq, layer, token), so every
 * op is pure: fills of any layers may run at once (no
 * KVP_KV_SOURCE_LAYER_ORDER), a query is exact ahead of time (no
 * plan_query), and the attention output feeds nothing back (no attended).
 */
#include "lib/synth/kv_synth.h"

static int synth_fill(void *arg, uint32_t seq, uint32_t layer, uint64_t token,
		      uint32_t ntokens, void *kvblock)
{
	return kvp_kv_synth_fill(arg, seq, layer, token, ntokens, kvblock);
}

static int synth_query(void *arg, uint32_t seq, uint32_t layer, uint64_t pos,
		       float *q)
{
	kvp_kv_synth_query(arg, seq, layer, pos, q);
	return 0;
}

static const struct kvp_kv_source_ops synth_source_ops = {
	.fill = synth_fill,
	.query = synth_query,
};

void kvp_kv_source_synth(struct kvp_kv_source *src,
			 const struct kvp_kv_synth *s)
{
	src->ops = &synth_source_ops;
	src->arg = (void *)s;
	src->flags = 0;
}
