/*
 * prom.h - a live pager's statistics as Prometheus text (the text
 * exposition format 0.0.4), rendered into a buffer: what the view's
 * metrics file shows, and what any other endpoint can serve as is.
 *
 * Every series carries pid="<this process>"; per-region series add
 * region="<name>" (escaped as the format asks).  The families:
 *   kvpager_info{uffd_mode}                 gauge, 1
 *   kvpager_<stat>                           every KVP_STATS statistic
 *   kvpager_io_latency_seconds               histogram of store reads
 *   kvpager_tunable{name}                    every tunable's value (a
 *                                            choice: its index)
 *   kvpager_region_size_bytes, kvpager_region_block_size_bytes,
 *   kvpager_region_<stat>                    per region
 *   kvpager_cache_<stat>                     the prefix cache's figures
 *                                            (KVP_CACHE_STATS), when one
 *                                            is shown (appended)
 *   kvpager_remote_<stat>,                   the remote tier's
 *   kvpager_remote_fetch_latency_seconds     (KVP_REMOTE_STATS), when one
 *                                            is shown (appended)
 *
 * Also the table of statistics with their kinds and docs, which the view
 * uses for its stats/ folders.
 */
#ifndef KVP_PROM_H
#define KVP_PROM_H

#include <stddef.h>
#include <stdint.h>

#include "lib/cache/cache_dir.h"
#include "lib/kv/kv_tunables.h"
#include "lib/remote/remote.h"
#include "pager/pager.h"
#include "pager/stats.h"

/* Every statistic of KVP_STATS (struct kvp_stat_desc: pager/stats.h), in
 * declaration order, and how many there are. */
extern const struct kvp_stat_desc kvp_stat_descs[];
extern const size_t kvp_stat_count;

/* The value of statistic @i (< kvp_stat_count) in @s. */
uint64_t kvp_stat_value(const struct kvp_stats *s, size_t i);

/*
 * kvp_prom_render - the exposition of @p now, with @kv the KV tunables'
 * values (NULL: their defaults), into a malloc'd, NUL-terminated *buf of
 * *len bytes (free with free(3)).  Takes the pager's region list lock
 * while it reads the regions.  Returns 0, or -ENOMEM with nothing
 * allocated.
 */
int kvp_prom_render(struct kvp_pager *p, const struct kvp_kv_config *kv,
		    char **buf, size_t *len);

/*
 * kvp_prom_append_cache - append the kvpager_cache_* families of @st to
 * *buf (*len bytes, from kvp_prom_render), reallocating it.  0, or
 * -ENOMEM with *buf as it was.
 */
int kvp_prom_append_cache(const struct kvp_cache_stats *st, char **buf,
			  size_t *len);

/*
 * kvp_prom_append_remote - the same for the remote tier: the
 * kvpager_remote_* families of @st (KVP_REMOTE_STATS) and the histogram
 * kvpager_remote_fetch_latency_seconds.
 */
int kvp_prom_append_remote(const struct kvp_remote_stats *st, char **buf,
			   size_t *len);

#endif /* KVP_PROM_H */
