/*
 * config.h - the pager engine's tunables, declared once.
 *
 * KVP_PAGER_TUNABLES is the single declaration of every engine tunable.  The
 * config struct, its defaults (kvp_config_defaults), and lib/'s tunables
 * registry (KVP_<NAME> environment variables, the FUSE tunables/ files,
 * kvpctl list) are all generated from it; add a tunable here and nowhere
 * else.  Units are in the name, as sysfs does.
 *
 * X(name, type, min, max, default, runtime, choices, doc)
 *   type     KVP_T_BYTES (accepts 512M, 4G), KVP_T_UINT, KVP_T_BOOL or
 *            KVP_T_CHOICE (value is an index into the space-separated
 *            @choices)
 *   runtime  true if kvp_pager_reconfigure may change it on a live pager
 */
#ifndef KVP_CONFIG_H
#define KVP_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

enum kvp_tunable_type {
	KVP_T_BYTES,
	KVP_T_UINT,
	KVP_T_BOOL,
	KVP_T_CHOICE,
};

/* install_mode choices, in the order of its choices string. */
enum kvp_install_mode {
	KVP_INSTALL_AUTO = 0, /* per block size, from measurement */
	KVP_INSTALL_MOVE = 1, /* UFFDIO_MOVE: zero copy */
	KVP_INSTALL_COPY = 2, /* UFFDIO_COPY */
};

#define KVP_PAGER_TUNABLES(X)                                                  \
	X(ram_budget_bytes, KVP_T_BYTES, 1ULL << 21, 1ULL << 50, 1ULL << 30,   \
	  true, NULL, "RAM the pager may hold resident, over all regions")     \
	X(service_threads, KVP_T_UINT, 1, 64, 2, false, NULL,                  \
	  "threads that read the userfaultfd and serve faults")                \
	X(io_depth, KVP_T_UINT, 1, 4096, 64, false, NULL,                      \
	  "io_uring submission queue depth of each ring")                      \
	X(io_batch, KVP_T_UINT, 1, 1024, 16, true, NULL,                       \
	  "reads gathered before one io_uring submit")                         \
	X(pool_prefault_bytes, KVP_T_BYTES, 0, 1ULL << 50, 256ULL << 20,       \
	  false, NULL,                                                         \
	  "frame memory touched at open, up to the budget (first touch "       \
	  "of fresh memory is slow)")                                          \
	X(readahead_bytes, KVP_T_BYTES, 0, 1ULL << 30, 32ULL << 20, true,      \
	  NULL,                                                                \
	  "most bytes loaded ahead of a sequential run of faults (0: none)")   \
	X(fault_around_bytes, KVP_T_BYTES, 0, 1ULL << 22, 0, true, NULL,       \
	  "bytes a read fault loads around itself when faults do not run "    \
	  "on from the last (0: the whole block; a power of two from 4K)")   \
	X(install_mode, KVP_T_CHOICE, 0, 2, KVP_INSTALL_AUTO, true,            \
	  "auto move copy",                                                    \
	  "how a loaded block enters the region: UFFDIO_MOVE or UFFDIO_COPY " \
	  "(auto: copy, and move for blocks of 2 MiB and more where a "     \
	  "page's first touch costs more than copying it)")                 \
	X(evict_high_watermark_percent, KVP_T_UINT, 50, 100, 95, true, NULL,   \
	  "resident share of the budget that starts eviction")                 \
	X(evict_low_watermark_percent, KVP_T_UINT, 10, 99, 85, true, NULL,     \
	  "resident share of the budget that eviction brings it back to")     \
	X(zap_follow_reader, KVP_T_BOOL, 0, 1, 1, true, NULL,                  \
	  "run the zapper on the CPU of the service thread that reads its "   \
	  "REMOVE events (a switch there, not a cross-CPU wake-up per range)") \
	X(service_priority, KVP_T_UINT, 0, 19, 10, false, NULL,                \
	  "nice levels the pager's threads run above the process's (they "    \
	  "serve faults its other threads wait on; needs CAP_SYS_NICE or "     \
	  "RLIMIT_NICE, else they stay, with a note)")

#define KVP_CONFIG_FIELD(name, type, min, max, def, runtime, choices, doc)     \
	uint64_t name;

/* The engine's configuration; every field is one tunable above. */
struct kvp_config {
	KVP_PAGER_TUNABLES(KVP_CONFIG_FIELD)
};

#undef KVP_CONFIG_FIELD

/* fault_around_bytes for memory a program touches as it likes (the preload
 * shim's default; kvpbench touch's region follows it): a 4 KiB page at
 * random reads 64 KiB, as the kernel's mmap read-around reads 128 KiB. */
#define KVP_FAULT_AROUND_PROGRAM (64u << 10)

/* kvp_config_defaults - fill @cfg with every tunable's default. */
void kvp_config_defaults(struct kvp_config *cfg);

/*
 * kvp_config_check - 0 if every field of @cfg is within its range and the
 * watermarks are ordered (low < high); else -EINVAL, and *bad (if not NULL)
 * names the first offending tunable.
 */
int kvp_config_check(const struct kvp_config *cfg, const char **bad);

#endif /* KVP_CONFIG_H */
