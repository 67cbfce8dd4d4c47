/*
 * config.c - defaults and range checks generated from KVP_PAGER_TUNABLES.
 */
#include "pager/config.h"

#include <errno.h>
#include <stddef.h>

void kvp_config_defaults(struct kvp_config *cfg)
{
#define X(name, type, min, max, def, runtime, choices, doc) cfg->name = (def);
	KVP_PAGER_TUNABLES(X)
#undef X
}

int kvp_config_check(const struct kvp_config *cfg, const char **bad)
{
	const char *dummy;

	if (!bad)
		bad = &dummy;
#define X(name, type, min, max, def, runtime, choices, doc)                    \
	if (cfg->name < (uint64_t)(min) || cfg->name > (uint64_t)(max)) {      \
		*bad = #name;                                                  \
		return -EINVAL;                                                \
	}
	KVP_PAGER_TUNABLES(X)
#undef X
	if (cfg->fault_around_bytes &&
	    (cfg->fault_around_bytes < 4096 ||
	     (cfg->fault_around_bytes & (cfg->fault_around_bytes - 1)))) {
		*bad = "fault_around_bytes";
		return -EINVAL;
	}
	if (cfg->evict_low_watermark_percent >=
	    cfg->evict_high_watermark_percent) {
		*bad = "evict_low_watermark_percent";
		return -EINVAL;
	}
	return 0;
}
