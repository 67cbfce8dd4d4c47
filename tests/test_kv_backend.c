/*
 * test_kv_backend.c - what differs between the KV cache's backends
 * (lib/kv/backend_*.c) and must still hold for each: a create that
 * fails leaves nothing behind and says why, the block table text names
 * where each block is, and the same decode gives the same output on
 * every backend (the bit-for-bit runs with forks and eviction are in
 * test_kvcache).
 *
 * Every case runs over the table of backends.  Each opens its pager in
 * the test (CK_FORK: in the child), so no userfaultfd crosses a fork.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/kv/kvcache.h"
#include "lib/synth/kv_synth.h"
#include "tests/helpers/helpers.h"
#include "tests/helpers/pager_fx.h"

static const struct {
	enum kvp_kvcache_backend be;
	const char *name;  /* kvp_kvcache_backend_name */
	const char *where; /* a full block's place in the table text */
} backends[] = {
	{ KVP_KVCACHE_PAGER, "kvpager", NULL /* a block state */ },
	{ KVP_KVCACHE_RAM, "ram", "ram" },
	{ KVP_KVCACHE_MMAP, "mmap", "file" },
};
#define NBACKENDS (sizeof(backends) / sizeof(backends[0]))

static const struct kvp_kv_geometry G4 = { 2, 4, 2, 64, KVP_KV_FP32, 4 };

static void opts(struct kvp_kvcache_opts *o, enum kvp_kvcache_backend be)
{
	kvp_kvcache_opts_default(o, &G4);
	o->backend = be;
	o->capacity_tokens = 512;
	o->budget_bytes = 2u << 20;
	o->attn_threads = 2;
	o->prefetch_depth = 1;
}

/* A backing directory that does not exist: the error, nothing made. */
START_TEST(create_fails_cleanly)
{
	struct kvp_kvcache_opts o;
	struct kvp_kvcache *c = (struct kvp_kvcache *)&o;

	opts(&o, backends[_i].be);
	o.dir = "/nonexistent-kvpager-dir";
	if (backends[_i].be == KVP_KVCACHE_RAM) {
		/* no file: the directory is not used */
		ck_assert_int_eq(kvp_kvcache_create(&o, &c), 0);
		kvp_kvcache_destroy(c);
		return;
	}
	ck_assert_int_eq(kvp_kvcache_create(&o, &c), -ENOENT);
	ck_assert_ptr_eq(c, (struct kvp_kvcache *)&o); /* *out untouched */
}
END_TEST

START_TEST(name_and_where)
{
	struct kvp_kv_synth_opts so;
	struct kvp_kv_synth *sy;
	struct kvp_kv_source src;
	struct kvp_kvcache_opts o;
	struct kvp_kvcache *c;
	char buf[4096], *line, *save = NULL;
	uint32_t id;
	int lines = 0;

	ck_assert_str_eq(kvp_kvcache_backend_name(backends[_i].be),
			 backends[_i].name);
	ck_assert_str_eq(kvp_kvcache_backend_name((enum kvp_kvcache_backend)7),
			 "?");
	kvp_kv_synth_opts_default(&so);
	ck_assert_int_eq(kvp_kv_synth_create(&G4, &so, &sy), 0);
	kvp_kv_source_synth(&src, sy);
	opts(&o, backends[_i].be);
	ck_assert_int_eq(kvp_kvcache_create(&o, &c), 0);
	ck_assert_int_eq(kvp_kvcache_seq_create(c, &id), 0);
	ck_assert_int_eq(kvp_kvcache_prefill(c, id, 10, &src, NULL, NULL), 0);
	ck_assert_int_gt(
	    kvp_kvcache_format_block_table(c, id, buf, sizeof(buf)), 0);
	/* "<logical> <physical> <valid> <refcount> <where>": 2 full, 1
	 * rolling */
	for (line = strtok_r(buf, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save), lines++) {
		const char *where = strrchr(line, ' ') + 1;

		if (lines == 2)
			ck_assert_str_eq(where, "rolling");
		else if (backends[_i].where)
			ck_assert_str_eq(where, backends[_i].where);
		else
			ck_assert_msg(!strcmp(where, "absent") ||
					  !strcmp(where, "resident"),
				      "where: %s", where);
	}
	ck_assert_int_eq(lines, 3);
	kvp_kvcache_destroy(c);
	kvp_kv_synth_destroy(sy);
}
END_TEST

/* A prefill and a few steps give the same output on every backend. */
START_TEST(same_output)
{
	size_t nout = (size_t)G4.layers * G4.q_heads * G4.head_dim * 3;
	float *ref = calloc(nout, sizeof(float));
	float *got = calloc(nout, sizeof(float));
	struct kvp_kv_synth_opts so;
	struct kvp_kv_synth *sy;
	struct kvp_kv_source src;
	size_t b, per = nout / 3;

	ck_assert(ref && got);
	kvp_kv_synth_opts_default(&so);
	ck_assert_int_eq(kvp_kv_synth_create(&G4, &so, &sy), 0);
	kvp_kv_source_synth(&src, sy);
	for (b = 0; b < NBACKENDS; b++) {
		struct kvp_kvcache_opts o;
		struct kvp_kvcache *c;
		uint32_t id, step;

		opts(&o, backends[b].be);
		ck_assert_int_eq(kvp_kvcache_create(&o, &c), 0);
		ck_assert_int_eq(kvp_kvcache_seq_create(c, &id), 0);
		ck_assert_int_eq(
		    kvp_kvcache_prefill(c, id, 301, &src, NULL, NULL), 0);
		for (step = 0; step < 3; step++)
			ck_assert_int_eq(kvp_kvcache_step(c, &id, 1, &src,
							  got + step * per,
							  NULL),
					 0);
		kvp_kvcache_destroy(c);
		if (!b)
			memcpy(ref, got, nout * sizeof(float));
		else
			ck_assert_msg(!memcmp(ref, got, nout * sizeof(float)),
				      "%s differs from %s", backends[b].name,
				      backends[0].name);
	}
	kvp_kv_synth_destroy(sy);
	free(ref);
	free(got);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kv_backend");
	TCase *tc = kvp_test_tcase(s, "core", 120);
	int err = kvp_test_pager_err();

	if (err)
		return kvp_test_skip("cannot open a pager: %s",
				     kvp_strerror(err));
	tcase_add_loop_test(tc, create_fails_cleanly, 0, NBACKENDS);
	tcase_add_loop_test(tc, name_and_where, 0, NBACKENDS);
	tcase_add_test(tc, same_output);
	return kvp_test_run(s);
}
