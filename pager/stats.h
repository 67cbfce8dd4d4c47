/*
 * stats.h - the pager's statistics, declared once.
 *
 * KVP_STATS is the single declaration of every statistic; struct kvp_stats,
 * the FUSE stats/ files, kvpctl and the Prometheus text are generated from
 * it.  Counters end in _total and only grow; gauges are instantaneous.
 *
 * X(name, kind, doc)   kind: KVP_COUNTER or KVP_GAUGE
 */
#ifndef KVP_STATS_H
#define KVP_STATS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum kvp_stat_kind { KVP_COUNTER, KVP_GAUGE };

/*
 * One figure of a table declared as KVP_STATS is (the pager's here, the
 * prefix cache's and the remote tier's in lib/): what a view, Prometheus
 * text and kvpctl show of it.
 */
struct kvp_stat_desc {
	const char *name;	 /* demand_faults_total */
	enum kvp_stat_kind kind; /* counter or gauge */
	const char *doc;	 /* one line */
	size_t offset;		 /* of its uint64_t field in the stats struct */
};

/* The value @d describes in @stats (the struct its table declares). */
static inline uint64_t kvp_stat_desc_value(const void *stats,
					   const struct kvp_stat_desc *d)
{
	uint64_t v;

	memcpy(&v, (const char *)stats + d->offset, sizeof(v));
	return v;
}

#define KVP_STATS(X)                                                           \
	X(demand_faults_total, KVP_COUNTER, "missing faults served by a load") \
	X(zero_fills_total, KVP_COUNTER,                                       \
	  "missing faults served with zeros, no read (never-written blocks)")  \
	X(wp_faults_total, KVP_COUNTER,                                        \
	  "first writes to a clean block, or window of one resident in part")  \
	X(coalesced_faults_total, KVP_COUNTER,                                 \
	  "faults that joined a load already in flight")                       \
	X(prefetch_issued_total, KVP_COUNTER, "blocks asked for by prefetch")  \
	X(prefetch_hit_total, KVP_COUNTER,                                     \
	  "prefetched blocks used after they were installed")                  \
	X(prefetch_late_total, KVP_COUNTER,                                    \
	  "prefetched blocks the program faulted on before install")           \
	X(prefetch_wasted_total, KVP_COUNTER,                                  \
	  "prefetched blocks evicted without being used")                      \
	X(readahead_blocks_total, KVP_COUNTER,                                 \
	  "blocks loaded ahead of a sequential run of faults")                 \
	X(readahead_wasted_total, KVP_COUNTER,                                 \
	  "read-ahead blocks dropped before the program asked for them")       \
	X(bytes_read_total, KVP_COUNTER, "bytes read from stores")             \
	X(bytes_written_total, KVP_COUNTER, "bytes written back to stores")    \
	X(evictions_clean_total, KVP_COUNTER, "clean blocks evicted")          \
	X(evictions_dirty_total, KVP_COUNTER,                                  \
	  "dirty blocks written and evicted")                                  \
	X(evictions_zap_total, KVP_COUNTER,                                    \
	  "clean evictions by batched MADV_DONTNEED (the others move out)")   \
	X(zap_repeats_total, KVP_COUNTER,                                      \
	  "REMOVE events the kernel raised again for a zap whose mapping the " \
	  "program split meanwhile (not the program's drops)")                \
	X(installs_move_total, KVP_COUNTER, "blocks installed by UFFDIO_MOVE") \
	X(installs_copy_total, KVP_COUNTER, "blocks installed by UFFDIO_COPY") \
	X(read_errors_total, KVP_COUNTER, "failed or short store reads")       \
	X(write_errors_total, KVP_COUNTER, "failed store writes")              \
	X(overdraft_loads_total, KVP_COUNTER,                                  \
	  "loads given a frame past the budget (its overdraft) because every " \
	  "resident block's write-back had failed")                            \
	X(unservable_faults_total, KVP_COUNTER,                                \
	  "faults answered with SIGBUS: the budget and its overdraft held "    \
	  "only blocks whose write-back had failed")                           \
	X(buffered_io_total, KVP_COUNTER,                                      \
	  "I/Os done buffered because the store refused O_DIRECT")             \
	X(removed_bytes_total, KVP_COUNTER,                                    \
	  "bytes the program dropped (MADV_DONTNEED, munmap)")                 \
	X(resident_bytes, KVP_GAUGE, "bytes of blocks resident now")           \
	X(poisoned_blocks, KVP_GAUGE, "blocks whose load failed")             \
	X(unwritten_bytes, KVP_GAUGE,                                          \
	  "dirty bytes kept resident because their write-back failed "        \
	  "(retried with back-off)")

/* I/O latency histogram: bucket i counts I/Os of [2^i, 2^(i+1)) us. */
#define KVP_LATENCY_BUCKETS 24

#define KVP_STATS_FIELD(name, kind, doc) uint64_t name;
struct kvp_stats {
	KVP_STATS(KVP_STATS_FIELD)
	uint64_t io_latency_us[KVP_LATENCY_BUCKETS]; /* read latency buckets */
	uint64_t io_latency_sum_ns; /* the reads' latencies summed (a
				       histogram's _sum) */
};
#undef KVP_STATS_FIELD

#endif /* KVP_STATS_H */
