/*
 * predict_exact.c - every block: full attention.  The schedule is known
 * ahead for any layer, which is what layer-ahead prefetch needs.
 */
#include "lib/predict/predict_i.h"

static int exact_select(struct kvp_predictor *p, uint32_t seq, uint32_t layer,
			const struct kvp_block_table *bt, const float *q,
			uint32_t *lblocks, size_t *n)
{
	uint32_t nb = kvp_block_table_blocks(bt), i;

	for (i = 0; i < nb; i++)
		lblocks[i] = i;
	*n = nb;
	return 0;
}

const struct kvp_predict_ops kvp_predict_exact_ops = {
	.name = "exact",
	.select = exact_select,
};
