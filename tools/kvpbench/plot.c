/*
 * plot.c - `--plot FILE` of stream, random and install: the GB/s chart,
 * drawn by the tools' gnuplot driver (lib/cli/plot.h).
 */
#include "tools/kvpbench/kvpbench.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* ---- the GB/s chart of stream, random and install ---------------------- */

/* A mode drawn as a line across its cluster rather than a bar. */
static bool is_line(const struct kvpb_result *r)
{
	return r->reference || !strcmp(r->mode, "raw") ||
	       !strcmp(r->mode, "mmap");
}

static void cluster_label(const struct kvpb_result *r, char *buf, size_t len)
{
	uint64_t b = r->block_bytes;

	snprintf(buf, len, "%s %llu%s, %u thr", r->scenario,
		 (unsigned long long)(b >= (1u << 20) ? b >> 20 : b >> 10),
		 b >= (1u << 20) ? "M" : "K", r->threads);
}

int kvpb_plot_results(const struct kvpb_ctx *c, const char *file)
{
	/* the line modes: style and legend */
	static const struct {
		const char *mode;
		bool reference;
		const char *style, *title;
	} lines[] = {
		{ "raw", false, "lw 3 lc rgb 'black'", "raw (io_uring O_DIRECT)" },
		{ "mmap", false, "lw 3 dt 2 lc rgb '#d62728'", "mmap (cold)" },
		{ "raw", true, "lw 2 dt 3 lc rgb '#555555'", "raw, depth 32" },
	};
	static const char *const colors[] = { "#1f77b4", "#2ca02c", "#ff7f0e",
					      "#9467bd" };
	const char *bars[4];
	unsigned groups[KVPB_MAX_RESULTS], ngroups = 0, nbars = 0, i, k, g;
	unsigned rows[3] = { 0 }; /* of each line mode's datablock */
	unsigned drawn = 0;	  /* line modes in the plot command */
	char title[256], label[64];
	struct kvp_plot p;
	double w;
	FILE *f;
	int err;

	/* clusters: the groups in the order they ran, but the depth-32
	 * line, which is drawn over the clusters of its block size */
	for (i = 0; i < c->nresults; i++) {
		const struct kvpb_result *r = &c->results[i];

		if (!r->reference) {
			for (g = 0; g < ngroups && groups[g] != r->group; g++)
				;
			if (g == ngroups)
				groups[ngroups++] = r->group;
		}
		if (is_line(r))
			continue;
		for (k = 0; k < nbars && strcmp(bars[k], r->mode); k++)
			;
		if (k == nbars && nbars < 4)
			bars[nbars++] = r->mode;
	}
	if (!ngroups) {
		fprintf(stderr, "kvpbench: --plot %s: no figures to draw\n",
			file);
		return -ENODATA;
	}
	snprintf(title, sizeof(title),
		 "kvpbench: GB/s per mode (bars), raw and mmap as lines; "
		 "budget %llu MiB, file %llu MiB%s",
		 (unsigned long long)(c->opts.budget >> 20),
		 (unsigned long long)(c->file.size >> 20),
		 c->opts.repeat > 1 ? ", medians" : "");
	err = kvp_plot_begin(&p, file, title);
	if (err)
		return err;
	f = p.f;
	w = 0.8 / (nbars ? nbars : 1);
	fprintf(f, "set ylabel 'GB/s'\nset xrange [-0.6:%u.6]\nset xtics (",
		ngroups - 1);
	for (g = 0; g < ngroups; g++) {
		for (i = 0; c->results[i].group != groups[g]; i++)
			;
		cluster_label(&c->results[i], label, sizeof(label));
		fprintf(f, "%s", g ? ", " : "");
		kvp_plot_str(f, label);
		fprintf(f, " %u", g);
	}
	fputs(")\n", f);
	/* $bK: x y width of bar mode K; $lK: x y dx dy of line mode K */
	for (k = 0; k < nbars; k++) {
		fprintf(f, "$b%u << EOD\n", k);
		for (i = 0; i < c->nresults; i++) {
			const struct kvpb_result *r = &c->results[i];

			if (strcmp(r->mode, bars[k]) || is_line(r))
				continue;
			for (g = 0; groups[g] != r->group; g++)
				;
			fprintf(f, "%.4f %.4f %.4f\n", g - 0.4 + w * (k + 0.5),
				r->gb_per_s, w);
		}
		fputs("EOD\n", f);
	}
	for (k = 0; k < sizeof(lines) / sizeof(lines[0]); k++) {
		fprintf(f, "$l%u << EOD\n", k);
		for (i = 0; i < c->nresults; i++) {
			const struct kvpb_result *r = &c->results[i];

			if (strcmp(r->mode, lines[k].mode) ||
			    r->reference != lines[k].reference)
				continue;
			for (g = 0; g < ngroups; g++) {
				unsigned q;

				/* its own cluster; the depth-32 line: each
				 * of its scenario and block size */
				for (q = 0; c->results[q].group != groups[g];
				     q++)
					;
				if (r->reference
					? strcmp(c->results[q].scenario,
						 r->scenario) ||
					      c->results[q].block_bytes !=
						  r->block_bytes
					: groups[g] != r->group)
					continue;
				fprintf(f, "%.2f %.4f 0.9 0\n", g - 0.45,
					r->gb_per_s);
				rows[k]++;
			}
		}
		fputs("EOD\n", f);
	}
	for (k = 0; k < nbars; k++) {
		fprintf(f,
			"%s$b%u using 1:2:3 with boxes lc rgb '%s' title ",
			k ? ", " : "plot ", k, colors[k]);
		kvp_plot_str(f, bars[k]);
		fprintf(f,
			", $b%u using 1:2:(sprintf('%%.2f', $2)) with labels "
			"offset 0,0.6 notitle",
			k);
	}
	for (k = 0; k < sizeof(lines) / sizeof(lines[0]); k++) {
		/* an empty datablock is an error to gnuplot */
		if (!rows[k])
			continue;
		fprintf(f, "%s$l%u using 1:2:3:4 with vectors nohead %s title ",
			nbars || drawn ? ", " : "plot ", k, lines[k].style);
		kvp_plot_str(f, lines[k].title);
		drawn++;
	}
	fputc('\n', f);
	return kvp_plot_end(&p, "kvpbench");
}
