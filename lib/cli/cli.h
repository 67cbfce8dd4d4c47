/*
 * cli.h - the tools' option tables: one table per command line, from
 * which come the --help text, getopt_long's tables, the man pages'
 * OPTIONS sections and the bash completion, so that none can drift from
 * the others.
 *
 * A table is an array of struct kvp_cli_opt ended by an entry whose
 * name and short_name are both empty ({ 0 }).  The man pages and the
 * completion are made at build time from `TOOL --cli-table` (see
 * kvp_cli_table_asked), which prints every table of the tool in a
 * line format:
 *
 *   opt <TAB> SCOPE <TAB> -s <TAB> --long <TAB> ARG <TAB> COMPLETE <TAB> HELP
 *   cmd <TAB> SCOPE <TAB> NAME <TAB> HELP
 *
 * SCOPE is "-" for the tool's own options, else the subcommand whose
 * options follow; an absent field is "-"; HELP's line breaks become
 * "\n" (backslash n).  COMPLETE says what the argument completes to:
 * "file", "dir", "-" (nothing), or "words:a,b,c".
 */
#ifndef KVP_CLI_H
#define KVP_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* One option. */
struct kvp_cli_opt {
	const char *name; /* long name without the dashes, or NULL */
	int key;	  /* what getopt_long returns for it (the short
			     option's character when it has one) */
	char short_name;  /* -X, or 0: none */
	const char *arg;  /* the argument's name in the help; NULL: a flag */
	const char *help; /* one line or more ("\n" breaks); NULL: hidden */
};

/* A subcommand, for the help, the man page and the completion. */
struct kvp_cli_cmd {
	const char *name; /* NULL ends a list */
	const char *help; /* one line */
};

/* The entries of table @t before its end. */
size_t kvp_cli_count(const struct kvp_cli_opt *t);

/*
 * kvp_cli_usage - the options of @t as --help lists them: one entry a
 * line, "  -s, --long ARG   help", the help column aligned, a help's
 * further lines indented to it.  Hidden entries are left out.
 */
void kvp_cli_usage(FILE *f, const struct kvp_cli_opt *t);

/*
 * kvp_cli_getopt - getopt_long's tables for @t: @lo gets one struct
 * option per long name and the zero entry (room: kvp_cli_count(t) + 1),
 * @shorts the short options' string, led by @lead ("+" stops at the
 * first operand, or "") (room: 3 per entry + strlen(lead) + 1).
 */
void kvp_cli_getopt(const struct kvp_cli_opt *t, const char *lead,
		    struct option *lo, char *shorts);

/*
 * kvp_cli_table_asked - true when the tool was run as `TOOL --cli-table`,
 * the build's question (see the top of this file).  The tool then prints
 * its tables with kvp_cli_table_print and kvp_cli_cmds_print and exits 0.
 */
bool kvp_cli_table_asked(int argc, char **argv);

/* The lines of table @t for @scope (NULL: the tool's own options). */
void kvp_cli_table_print(FILE *f, const char *scope,
			 const struct kvp_cli_opt *t);

/* The lines of the subcommands @c (ended by a NULL name) of @scope. */
void kvp_cli_cmds_print(FILE *f, const char *scope,
			const struct kvp_cli_cmd *c);

/* @b bytes for a message: "%.2f KiB" (MiB, GiB, TiB), or "%.0f B" under
 * 1 KiB, in @buf (@len bytes), which is returned. */
const char *kvp_cli_human(double b, char *buf, size_t len);

#endif /* KVP_CLI_H */
