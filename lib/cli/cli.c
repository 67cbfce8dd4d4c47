/*
 * cli.c - the tools' option tables (cli.h).
 */
#include "lib/cli/cli.h"

#include <string.h>

/* Where the help column starts, unless an entry's left part is longer. */
#define HELP_COL 22

size_t kvp_cli_count(const struct kvp_cli_opt *t)
{
	size_t n = 0;

	while (t[n].name || t[n].short_name)
		n++;
	return n;
}

/* "-s, --long ARG" into @buf. */
static void left_part(const struct kvp_cli_opt *o, char *buf, size_t len)
{
	int n = 0;

	buf[0] = 0;
	if (o->short_name)
		n = snprintf(buf, len, "-%c%s", o->short_name,
			     o->name ? ", " : "");
	if (o->name)
		n += snprintf(buf + n, len - n, "--%s", o->name);
	if (o->arg)
		snprintf(buf + n, len - n, " %s", o->arg);
}

void kvp_cli_usage(FILE *f, const struct kvp_cli_opt *t)
{
	char left[80];
	const char *h, *nl;
	size_t i, n = kvp_cli_count(t);
	int col;

	for (i = 0; i < n; i++) {
		if (!t[i].help)
			continue;
		left_part(&t[i], left, sizeof(left));
		col = fprintf(f, "  %s", left);
		h = t[i].help;
		/* a long left part: the help starts on the next line */
		if (col >= HELP_COL && *h) {
			fputc('\n', f);
			col = 0;
		}
		do {
			nl = strchr(h, '\n');
			fprintf(f, "%*s%.*s\n", col < HELP_COL ? HELP_COL - col : 1,
				"", nl ? (int)(nl - h) : (int)strlen(h), h);
			col = 0;
			h = nl ? nl + 1 : NULL;
		} while (h);
	}
}

void kvp_cli_getopt(const struct kvp_cli_opt *t, const char *lead,
		    struct option *lo, char *shorts)
{
	size_t i, nl = 0, n = kvp_cli_count(t);
	char *s = shorts + strlen(strcpy(shorts, lead));

	for (i = 0; i < n; i++) {
		int has = t[i].arg ? required_argument : no_argument;

		if (t[i].name)
			lo[nl++] = (struct option){ t[i].name, has, NULL,
						    t[i].key };
		if (t[i].short_name) {
			*s++ = t[i].short_name;
			if (has)
				*s++ = ':';
		}
	}
	*s = 0;
	memset(&lo[nl], 0, sizeof(lo[nl]));
}

bool kvp_cli_table_asked(int argc, char **argv)
{
	return argc == 2 && !strcmp(argv[1], "--cli-table");
}

/*
 * What an argument completes to, from the conventions of the tables:
 * FILE a file; DIR, PATH and MOUNT a directory; a help that opens with
 * "a | b | c" those words.
 */
static void put_complete(FILE *f, const struct kvp_cli_opt *o)
{
	const char *h = o->help ? o->help : "", *p;
	size_t wl;

	if (!o->arg) {
		fputc('-', f);
		return;
	}
	if (!strcmp(o->arg, "FILE")) {
		fputs("file", f);
		return;
	}
	if (!strcmp(o->arg, "DIR") || !strcmp(o->arg, "PATH") ||
	    !strcmp(o->arg, "MOUNT")) {
		fputs("dir", f);
		return;
	}
	p = strstr(h, " | ");
	if (!p || memchr(h, ' ', (size_t)(p - h))) {
		fputc('-', f);
		return;
	}
	fputs("words:", f);
	for (p = h;;) {
		wl = strcspn(p, " ,\n(");
		fprintf(f, "%.*s", (int)wl, p);
		p += wl;
		if (strncmp(p, " | ", 3))
			break;
		p += 3;
		fputc(',', f);
	}
}

/* A help text on one line: line breaks as \n, tabs as spaces. */
static void put_help(FILE *f, const char *h)
{
	if (!h || !*h) {
		fputc('-', f);
		return;
	}
	for (; *h; h++) {
		if (*h == '\n')
			fputs("\\n", f);
		else
			fputc(*h == '\t' ? ' ' : *h, f);
	}
}

void kvp_cli_table_print(FILE *f, const char *scope,
			 const struct kvp_cli_opt *t)
{
	size_t i, n = kvp_cli_count(t);

	for (i = 0; i < n; i++) {
		if (!t[i].help)
			continue;
		fprintf(f, "opt\t%s\t", scope ? scope : "-");
		if (t[i].short_name)
			fprintf(f, "-%c\t", t[i].short_name);
		else
			fputs("-\t", f);
		fprintf(f, "%s%s\t%s\t", t[i].name ? "--" : "-",
			t[i].name ? t[i].name : "", t[i].arg ? t[i].arg : "-");
		put_complete(f, &t[i]);
		fputc('\t', f);
		put_help(f, t[i].help);
		fputc('\n', f);
	}
}

void kvp_cli_cmds_print(FILE *f, const char *scope,
			const struct kvp_cli_cmd *c)
{
	for (; c->name; c++) {
		fprintf(f, "cmd\t%s\t%s\t", scope ? scope : "-", c->name);
		put_help(f, c->help);
		fputc('\n', f);
	}
}

const char *kvp_cli_human(double b, char *buf, size_t len)
{
	const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	int i = 0;

	while (b >= 1024 && i < 4) {
		b /= 1024;
		i++;
	}
	snprintf(buf, len, i ? "%.2f %s" : "%.0f %s", b, u[i]);
	return buf;
}
