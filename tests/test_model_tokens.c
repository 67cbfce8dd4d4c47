/*
 * test_model_tokens.c - stories260K through the pager, token for token.
 *
 * The whole 512-token context of the trained model: prefill 448 tokens,
 * generate 64 greedily.  With the exact predictor the tokens and every
 * logit must be bit-identical to the all-in-RAM run, for both install
 * modes and for pager blocks of 4 KiB, 1 MiB and 2 MiB; under the
 * pager's smallest budget (2 MiB) the 1 and 2 MiB blocks hold 2 resp. 1 of
 * the region's 5 layers, so every step evicts and reloads (checked: every
 * step reads).  (stories260K's whole KV is 640 KiB in fp32: the pager's
 * smallest budget cannot be an eighth of it; large blocks make the
 * resident share small instead.)  window and lowrank, at a quarter of the
 * context: their token agreement with exact, free running and teacher
 * forced (top-1 on exact's own context), and the recall of the true
 * attention mass, printed and held to floors under what was measured
 * (window 15/64 and 0.35, lowrank 20/64 and 0.43).  This model's
 * attention is diffuse (head size 8): the numpy reference puts only about
 * 0.3 of it on the 4 sinks and last 124 tokens, so a quarter of the
 * context loses much of the mass whichever blocks are chosen.
 *
 * Skips (77) when ../shared/models/stories260K.bin (or $KVP_MODEL_FILE) is
 * absent.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/model/model.h"
#include "tests/helpers/helpers.h"

#define PROMPT 448
#define GEN    64
#define VOCAB  512

static const char *model_path(void)
{
	const char *p = getenv("KVP_MODEL_FILE");

	return p && *p ? p : "../shared/models/stories260K.bin";
}

/*
 * The prompt: the model's own text, sampled (temperature 0.8, a fixed
 * seed) from BOS with everything in RAM, so that attention is that of the
 * text it was trained on, not of noise.
 */
static void prompt(uint32_t *t)
{
	struct kvp_model *m;
	char err[256];

	ck_assert_int_eq(kvp_model_load_file(model_path(), &m, err,
					     sizeof(err)),
			 0);
	ck_assert_int_eq(kvp_model_text(m, PROMPT, 0.8f, 42, t), 0);
	kvp_model_close(m);
}

struct run {
	enum kvp_kvcache_backend backend;
	uint64_t install_mode;	  /* pager: KVP_INSTALL_* */
	size_t pager_block;	  /* 0: one KV block, rounded to 4 KiB */
	enum kvp_predictor_kind kind;
	const uint32_t *forced;	  /* feed these instead of the argmax */
	uint32_t tokens[GEN];	  /* out: generated (the argmax of each) */
	float *logits;		  /* out: GEN x VOCAB */
	uint64_t min_step_read;	  /* out: fewest bytes one step read */
	double recall;		  /* out: sparse kinds */
};

static void run(struct run *r)
{
	struct kvp_model *m;
	struct kvp_kv_geometry g;
	struct kvp_kvcache_opts o;
	struct kvp_config cfg;
	struct kvp_kvcache *c;
	struct kvp_model_seq *s;
	uint32_t p[PROMPT], id, i, ns;
	double rel;
	char err[256];

	prompt(p);
	ck_assert_int_eq(kvp_model_load_file(model_path(), &m, err,
					     sizeof(err)),
			 0);
	ck_assert_int_eq(kvp_model_geometry(m, KVP_KV_FP32, 4, &g), 0);
	kvp_kvcache_opts_default(&o, &g);
	o.backend = r->backend;
	o.capacity_tokens = PROMPT + GEN;
	o.pager_block_bytes = r->pager_block;
	o.budget_bytes = 2u << 20;
	kvp_config_defaults(&cfg);
	cfg.install_mode = r->install_mode;
	o.cfg = &cfg;
	kvp_predictor_opts_default(&o.pred, r->kind);
	o.pred.budget_tokens = (PROMPT + GEN) / 4;
	o.pred.rank = 16;
	if (r->kind != KVP_PREDICTOR_EXACT) {
		o.sample_every = 4;
		o.sample_layers = g.layers;
		o.max_samples = 1000;
	}
	ck_assert_int_eq(kvp_kvcache_create(&o, &c), 0);
	ck_assert_int_eq(kvp_kvcache_seq_create(c, &id), 0);
	ck_assert_int_eq(kvp_model_seq_create(m, c, id, 2, &s), 0);
	ck_assert_int_eq(kvp_model_prefill(s, p, PROMPT), 0);
	r->min_step_read = UINT64_MAX;
	for (i = 0; i < GEN; i++) {
		struct kvp_kvcache_step_stats st;
		const float *l = kvp_model_logits(s);

		r->tokens[i] = kvp_model_sample(l, VOCAB, 0, NULL);
		memcpy(r->logits + (size_t)i * VOCAB, l, sizeof(float) * VOCAB);
		if (i + 1 == GEN)
			break; /* its own step's logits are not used */
		ck_assert_int_eq(kvp_model_step(s, r->forced ? r->forced[i]
							     : r->tokens[i],
						&st),
				 0);
		if (st.bytes_read < r->min_step_read)
			r->min_step_read = st.bytes_read;
	}
	r->recall = 0;
	if (r->kind != KVP_PREDICTOR_EXACT)
		ck_assert_int_eq(kvp_kvcache_quality(c, &r->recall, &rel, NULL,
						     &ns),
				 0);
	kvp_model_seq_destroy(s);
	kvp_kvcache_destroy(c);
	kvp_model_close(m);
}

static struct run ref;

static void ref_once(void)
{
	if (ref.logits)
		return;
	ref.backend = KVP_KVCACHE_RAM;
	ref.kind = KVP_PREDICTOR_EXACT;
	ref.logits = malloc(sizeof(float) * GEN * VOCAB);
	run(&ref);
}

static const struct {
	uint64_t install;
	size_t pager_block;
	bool reloads; /* the budget holds under the region: every step reads */
} exact_cases[] = {
	{ KVP_INSTALL_MOVE, 1u << 20, true },
	{ KVP_INSTALL_COPY, 1u << 20, true },
	{ KVP_INSTALL_MOVE, 2u << 20, true },
	{ KVP_INSTALL_COPY, 2u << 20, true },
	{ KVP_INSTALL_MOVE, 0, false },
	{ KVP_INSTALL_COPY, 0, false },
};

START_TEST(exact_bit_identical)
{
	struct run r = { 0 };
	uint32_t i;

	ref_once();
	r.backend = KVP_KVCACHE_PAGER;
	r.install_mode = exact_cases[_i].install;
	r.pager_block = exact_cases[_i].pager_block;
	r.kind = KVP_PREDICTOR_EXACT;
	r.logits = malloc(sizeof(float) * GEN * VOCAB);
	run(&r);
	printf("exact, install %s, pager block %zu KiB: fewest bytes read "
	       "in a step %llu\n",
	       r.install_mode == KVP_INSTALL_MOVE ? "move" : "copy",
	       r.pager_block >> 10, (unsigned long long)r.min_step_read);
	fflush(stdout);
	for (i = 0; i < GEN; i++)
		ck_assert_msg(r.tokens[i] == ref.tokens[i],
			      "token %u: %u, all in RAM %u", i, r.tokens[i],
			      ref.tokens[i]);
	ck_assert_msg(memcmp(r.logits, ref.logits,
			     sizeof(float) * GEN * VOCAB) == 0,
		      "logits differ from the all-in-RAM run");
	if (exact_cases[_i].reloads)
		ck_assert_uint_gt(r.min_step_read, 0);
	free(r.logits);
}
END_TEST

/* Sparse predictors: agreement with exact (printed), loose floors. */
static void sparse(enum kvp_predictor_kind kind, double min_top1,
		   double min_recall)
{
	struct run fr = { 0 }, tf = { 0 };
	uint32_t i, same = 0, top1 = 0, first = GEN;

	ref_once();
	fr.backend = tf.backend = KVP_KVCACHE_PAGER;
	fr.kind = tf.kind = kind;
	fr.logits = malloc(sizeof(float) * GEN * VOCAB);
	tf.logits = malloc(sizeof(float) * GEN * VOCAB);
	tf.forced = ref.tokens;
	run(&fr);
	run(&tf);
	for (i = 0; i < GEN; i++) {
		same += fr.tokens[i] == ref.tokens[i];
		if (fr.tokens[i] != ref.tokens[i] && first == GEN)
			first = i;
		top1 += tf.tokens[i] == ref.tokens[i];
	}
	printf("%s (a quarter of the context): generated tokens equal to "
	       "exact's %u/%u (first difference at %u); top-1 on exact's "
	       "context %u/%u; recall of attention mass %.3f\n",
	       kvp_predictor_kind_name(kind), same, GEN, first, top1, GEN,
	       tf.recall);
	fflush(stdout);
	ck_assert_msg(top1 >= min_top1 * GEN, "top-1 agreement %u/%u", top1,
		      GEN);
	ck_assert_msg(tf.recall >= min_recall, "recall %.3f", tf.recall);
	free(fr.logits);
	free(tf.logits);
}

START_TEST(window_agreement)
{
	sparse(KVP_PREDICTOR_WINDOW, 0.15, 0.25);
}
END_TEST

START_TEST(lowrank_agreement)
{
	sparse(KVP_PREDICTOR_LOWRANK, 0.15, 0.3);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("model_tokens");
	TCase *tc;

	if (access(model_path(), R_OK))
		return kvp_test_skip("no model file %s (set KVP_MODEL_FILE)",
				     model_path());
	tc = kvp_test_tcase(s, "stories260K", 300);
	tcase_add_loop_test(tc, exact_bit_identical, 0,
			    sizeof(exact_cases) / sizeof(exact_cases[0]));
	tcase_add_test(tc, window_agreement);
	tcase_add_test(tc, lowrank_agreement);
	return kvp_test_run(s);
}
