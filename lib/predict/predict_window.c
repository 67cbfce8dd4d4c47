/*
 * predict_window.c - StreamingLLM: the sink tokens' blocks plus the most
 * recent blocks, within the budget.
 */
#include "lib/predict/predict_i.h"

static int window_select(struct kvp_predictor *p, uint32_t seq, uint32_t layer,
			 const struct kvp_block_table *bt, const float *q,
			 uint32_t *lblocks, size_t *n)
{
	uint32_t nb = kvp_block_table_blocks(bt), G = p->g.block_tokens;
	uint32_t budget = kvp_predict_budget_blocks(p);
	uint32_t sink = (p->o.sink_tokens + G - 1) / G, i, k = 0;

	if (nb <= budget) {
		for (i = 0; i < nb; i++)
			lblocks[i] = i;
		*n = nb;
		return 0;
	}
	if (sink >= budget) /* keep the newest block: it is the window */
		sink = budget - 1;
	for (i = 0; i < sink; i++)
		lblocks[k++] = i;
	for (i = nb - (budget - sink); i < nb; i++)
		lblocks[k++] = i;
	*n = k;
	return 0;
}

const struct kvp_predict_ops kvp_predict_window_ops = {
	.name = "window",
	.select = window_select,
};
