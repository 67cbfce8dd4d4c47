/*
 * stats.c - the statistics' atomics: snapshots, sums, and the totals a
 * destroyed region leaves to its pager.
 */
#include <time.h>

#include "pager/pager_i.h"

uint64_t kvp_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct timespec kvp_deadline_ms(long ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return ts;
}

void kvp_stats_snapshot(const struct kvp_astats *a, struct kvp_stats *out)
{
#define SNAP(name, kind, doc)                                                  \
	out->name = atomic_load_explicit(&a->name, memory_order_relaxed);
	KVP_STATS(SNAP)
#undef SNAP
	for (int i = 0; i < KVP_LATENCY_BUCKETS; i++)
		out->io_latency_us[i] = atomic_load_explicit(
		    &a->io_latency_us[i], memory_order_relaxed);
	out->io_latency_sum_ns =
	    atomic_load_explicit(&a->io_latency_sum_ns, memory_order_relaxed);
}

void kvp_stats_add(struct kvp_stats *sum, const struct kvp_stats *s)
{
#define ADD(name, kind, doc) sum->name += s->name;
	KVP_STATS(ADD)
#undef ADD
	for (int i = 0; i < KVP_LATENCY_BUCKETS; i++)
		sum->io_latency_us[i] += s->io_latency_us[i];
	sum->io_latency_sum_ns += s->io_latency_sum_ns;
}

void kvp_astats_fold(struct kvp_astats *into, const struct kvp_astats *a)
{
	/* Gauges describe live regions only: a destroyed one adds none. */
#define FOLD(name, kind, doc)                                                  \
	if (kind == KVP_COUNTER)                                               \
		atomic_fetch_add_explicit(                                     \
		    &into->name,                                               \
		    atomic_load_explicit(&a->name, memory_order_relaxed),      \
		    memory_order_relaxed);
	KVP_STATS(FOLD)
#undef FOLD
	for (int i = 0; i < KVP_LATENCY_BUCKETS; i++)
		atomic_fetch_add_explicit(
		    &into->io_latency_us[i],
		    atomic_load_explicit(&a->io_latency_us[i],
					 memory_order_relaxed),
		    memory_order_relaxed);
	atomic_fetch_add_explicit(
	    &into->io_latency_sum_ns,
	    atomic_load_explicit(&a->io_latency_sum_ns, memory_order_relaxed),
	    memory_order_relaxed);
}
