/*
 * device_pool.c - --device-pool checked before a run (device_pool.h).
 */
#include "lib/kv/device_pool.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "lib/cli/cli.h"

int kvp_kv_device_pool_check(const char *prog,
			     const struct kvp_kvcache_opts *o, uint64_t tokens)
{
	uint64_t min = kvp_kvcache_device_pool_min(o, tokens);
	char h[32];

	if (!o->device || !strcmp(o->device, "cpu") || !o->device_pool_bytes ||
	    o->device_pool_bytes >= min)
		return 0; /* no pool, or the default's two layers */
	fprintf(stderr,
		"%s: --device-pool %" PRIu64 " bytes cannot hold one layer's "
		"chosen blocks; the smallest pool that holds them at every "
		"step is %" PRIu64 " bytes (%s): give at least that, or leave "
		"--device-pool out (two layers' blocks); that is what the %s "
		"predictor may choose in one layer of %" PRIu32
		" sequence(s) of %" PRIu64 " tokens, this run's longest\n",
		prog, o->device_pool_bytes, min,
		kvp_cli_human((double)min, h, sizeof(h)),
		kvp_predictor_kind_name(o->pred.kind), o->max_seqs, tokens);
	return -E2BIG;
}
