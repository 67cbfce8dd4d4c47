#!/usr/bin/python3
"""gen.py - the man pages' generated parts and the bash completion, from
the tools' own tables, so that neither can drift from --help.

  gen.py man TEMPLATE TABLE >PAGE
      TEMPLATE with @OPTIONS@ (the tool's own options), @OPTIONS:SCOPE@
      (a subcommand's) and @COMMANDS@ replaced; TABLE is the
      output of `TOOL --cli-table` (lib/cli/cli.h).
  gen.py tunables TEMPLATE LIST >PAGE
      TEMPLATE with @TUNABLES@ replaced by every tunable of LIST, the
      output of `kvpctl list` with no pager running (the registry).
  gen.py completion TOOL TABLE >FILE
      a bash completion script for TOOL.
"""
import re
import sys


def roff(text):
    """Text as roff: backslashes and dashes escaped, no line opening
    with a control character."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + ln if ln[:1] in (".", "'") else ln
                     for ln in text.split("\n"))


def read_table(path):
    opts, cmds = [], []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if p[0] == "opt" and len(p) == 7:
                opts.append({"scope": p[1], "short": p[2], "long": p[3],
                             "arg": p[4], "complete": p[5],
                             "help": p[6].replace("\\n", "\n")})
            elif p[0] == "cmd" and len(p) == 4:
                cmds.append({"scope": p[1], "name": p[2],
                             "help": p[3].replace("\\n", "\n")})
            else:
                sys.exit(f"gen.py: {path}: not a --cli-table line: {line!r}")
    return opts, cmds


def man_options(opts, scope):
    out = []
    for o in opts:
        if o["scope"] != scope:
            continue
        names = [n for n in (o["short"], o["long"]) if n != "-"]
        head = ", ".join("\\fB" + roff(n) + "\\fR" for n in names)
        if o["arg"] != "-":
            head += " \\fI" + roff(o["arg"]) + "\\fR"
        out.append(".TP\n" + head + "\n" +
                   roff(o["help"]).replace("\n", "\n.br\n"))
    return "\n".join(out)


def man_commands(cmds):
    return "\n".join(".TP\n\\fB" + roff(c["name"]) + "\\fR\n" +
                     roff(c["help"]) for c in cmds if c["scope"] == "-")


def cmd_man(template, table):
    opts, cmds = read_table(table)
    text = open(template).read()
    text = re.sub(r"@OPTIONS:([a-z]+)@",
                  lambda m: man_options(opts, m.group(1)), text)
    text = text.replace("@OPTIONS@", man_options(opts, "-"))
    text = text.replace("@COMMANDS@", man_commands(cmds))
    leftover = re.findall(r"@[A-Z]+(?::[a-z]+)?@", text)
    if leftover:
        sys.exit(f"gen.py: {template}: unknown {leftover}")
    sys.stdout.write(text)


def cmd_tunables(template, listing):
    """`kvpctl list`: NAME = VALUE, then the doc, then
    'TYPE RANGE, default D, runtime|at start only' (indented)."""
    lines = open(listing).read().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\w+) = (.*)$", lines[i])
        if not m or i + 2 >= len(lines):
            sys.exit(f"gen.py: {listing}:{i + 1}: not a tunable: "
                     f"{lines[i]!r}")
        name, value = m.groups()
        doc, facts = lines[i + 1].strip(), lines[i + 2].strip()
        choices = ""
        if "[" in value:
            choices = " | ".join(value.replace("[", "").replace("]", "")
                                 .split())
        out.append(".TP\n\\fB" + roff(name) + "\\fR (\\fBKVP_" +
                   roff(name.upper()) + "\\fR)\n" + roff(doc) +
                   "\n.br\n" + roff(facts) +
                   ("\n.br\n" + "one of: " + roff(choices)
                    if choices else ""))
        i += 3
    text = open(template).read().replace("@TUNABLES@", "\n".join(out))
    sys.stdout.write(text)


def cmd_completion(tool, table):
    opts, cmds = read_table(table)
    fn = "_" + re.sub(r"[^a-z0-9]", "_", tool)
    scopes = sorted({o["scope"] for o in opts} | {"-"})
    subs = [c["name"] for c in cmds if c["name"] in scopes]
    words = {s: " ".join(n for o in opts if o["scope"] == s
                         for n in (o["short"], o["long"]) if n != "-")
             for s in scopes}
    cases = []
    for o in opts:
        if o["arg"] == "-":
            continue
        for n in (o["short"], o["long"]):
            if n == "-":
                continue
            c = o["complete"]
            if c == "file":
                act = 'COMPREPLY=($(compgen -f -- "$cur"))'
            elif c == "dir":
                act = 'COMPREPLY=($(compgen -d -- "$cur"))'
            elif c.startswith("words:"):
                act = ('COMPREPLY=($(compgen -W "' +
                       c[6:].replace(",", " ") + '" -- "$cur"))')
            else:
                act = "COMPREPLY=()"
            cases.append(f'\t"{o["scope"]} {n}") {act}; return ;;')
    print(f"# bash completion for {tool}, made by man/gen.py from "
          f"`{tool} --cli-table`")
    print(f"{fn}()\n{{")
    print('\tlocal cur=${COMP_WORDS[COMP_CWORD]} '
          'prev=${COMP_WORDS[COMP_CWORD-1]} scope=- w')
    if subs:
        print('\tfor w in "${COMP_WORDS[@]:1:COMP_CWORD-1}"; do')
        print(f'\t\tcase $w in {"|".join(subs)}) scope=$w; break ;; esac')
        print("\tdone")
    print('\tcase "$scope $prev" in')
    print("\n".join(cases))
    print("\tesac")
    print('\tcase $scope in')
    for s in scopes:
        print(f'\t{s}) w="{words[s]}" ;;')
    print("\tesac")
    top = " ".join(c["name"] for c in cmds if c["scope"] == "-")
    print('\tif [[ $cur == -* || $scope != - ]]; then')
    print('\t\tCOMPREPLY=($(compgen -W "$w" -- "$cur"))')
    print("\telse")
    print(f'\t\tCOMPREPLY=($(compgen -W "{top} $w" -- "$cur"))')
    print("\tfi")
    print("}")
    print(f"complete -F {fn} {tool}")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "man":
        cmd_man(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "tunables":
        cmd_tunables(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "completion":
        cmd_completion(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
