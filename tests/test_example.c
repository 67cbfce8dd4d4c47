/*
 * test_example.c - the README's minimal kvpager program (make check runs it).
 *
 * Compile with: cc example.c $(pkg-config --cflags --libs kvpager)
 * (installed, include <kvpager.h> instead of "lib/kvpager.h")
 *
 * A 32 MiB region served from a temporary file under an 8 MiB RAM budget:
 * written (so that most of it is evicted to the file), its first 4 blocks
 * prefetched back and read without a fault, then all of it read back.
 * Exit 0 when the data is intact, 77 when this machine cannot run a pager.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "lib/kvpager.h"

#define SIZE  (32u << 20)
#define BLOCK (1u << 20)

static void check(int err, const char *what)
{
	if (err) {
		printf("cannot %s: %s\n", what, kvp_strerror(err));
		exit(err == -EPERM || err == -ENOSYS ? 77 : 1);
	}
}

static unsigned char pattern(size_t i)
{
	return (unsigned char)(i * 7 + i / BLOCK);
}

static uint64_t faults(struct kvp_region *r)
{
	struct kvp_stats st;

	kvp_region_stats(r, &st);
	return st.demand_faults_total;
}

int main(void)
{
	uint64_t first[4] = { 0, 1, 2, 3 }, before;
	struct kvp_config cfg;
	struct kvp_pager *pager;
	struct kvp_store *store;
	struct kvp_region *region;
	struct kvp_prefetch *pf;
	struct kvp_stats st;
	unsigned char *mem;
	size_t bad = 0;

	kvp_config_defaults(&cfg);
	cfg.ram_budget_bytes = 8u << 20;
	check(kvp_pager_open(&cfg, &pager), "open a pager");
	check(kvp_store_file_temp(NULL, SIZE, &store), "create a backing file");
	struct kvp_region_opts opts = {
		.name = "example",
		.size = SIZE,
		.block_bytes = BLOCK,
		.store = store,
	};
	check(kvp_region_create(pager, &opts, &region), "create a region");

	mem = kvp_region_addr(region); /* ordinary memory from here on */
	for (size_t i = 0; i < SIZE; i++)
		mem[i] = pattern(i);

	/* Blocks 0-3 were evicted to the file: bring them back... */
	check(kvp_prefetch_submit(region, first, 4, &pf), "prefetch");
	check(kvp_prefetch_wait(pf, -1), "wait for the prefetch");
	kvp_prefetch_release(pf);
	/* ... so that reading them takes no fault. */
	before = faults(region);
	for (size_t i = 0; i < 4 * BLOCK; i++)
		bad += mem[i] != pattern(i);
	printf("faults reading the prefetched blocks: %llu\n",
	       (unsigned long long)(faults(region) - before));
	if (faults(region) != before)
		bad++;

	for (size_t i = 0; i < SIZE; i++)
		bad += mem[i] != pattern(i);
	kvp_region_stats(region, &st);
	printf(
	    "install %s: %llu faults, %llu blocks prefetched, %llu MiB read, "
	    "%llu MiB written, %llu MiB resident; %zu bad bytes\n",
	    kvp_region_install_mode(region),
	    (unsigned long long)st.demand_faults_total,
	    (unsigned long long)st.prefetch_issued_total,
	    (unsigned long long)(st.bytes_read_total >> 20),
	    (unsigned long long)(st.bytes_written_total >> 20),
	    (unsigned long long)(st.resident_bytes >> 20), bad);

	check(kvp_region_destroy(region), "destroy the region");
	kvp_pager_close(pager);
	kvp_store_destroy(store); /* the store outlives the pager */
	return bad ? 1 : 0;
}
