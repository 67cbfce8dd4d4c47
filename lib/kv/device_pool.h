/*
 * device_pool.h - the tools' check of --device-pool before a run, so that
 * kvpager run and kvpbench decode refuse the same pools with the same
 * words.
 */
#ifndef KVP_KV_DEVICE_POOL_H
#define KVP_KV_DEVICE_POOL_H

#include <stdint.h>

#include "lib/kv/kvcache.h"

/*
 * kvp_kv_device_pool_check - whether @o's device_pool_bytes (0: the
 * default, always enough; no device: unused) holds one layer's chosen
 * blocks at every step of a run whose sequences reach @tokens tokens
 * (kvp_kvcache_device_pool_min).  0, or -E2BIG said on stderr, naming
 * @prog, with the smallest pool that does.
 */
int kvp_kv_device_pool_check(const char *prog,
			     const struct kvp_kvcache_opts *o,
			     uint64_t tokens);

#endif /* KVP_KV_DEVICE_POOL_H */
