#!/usr/bin/env python3
"""Checks that coffer's documents and comments cite only what exists.

- Every `FORMAT.md §N` cited in Sources/**/*.swift, Tests/**/*.swift, scripts/* and any
  *.md (and every bare `§N` in a *.md, which always means docs/FORMAT.md) is a section
  heading `## N.` of docs/FORMAT.md. Where the citation names a title too
  (`FORMAT.md §12, "Conversion"`, `FORMAT.md, "Key hierarchy"`), the title is the
  section's, or begins one of its headings or bold leads (`**Conversion.**`).
- The format version that `coffer init` makes, as the code has it
  (`VaultConfig.currentFormat` in Sources/CofferVault/VaultConfig.swift), is the one
  README.md and the guides name ("`coffer init` makes format N vaults"; at least one of
  them must say it) and docs/FORMAT.md §3 gives for new vaults. The newest format coffer
  reads and makes on request (the upper end of `VaultConfig.supportedFormats`) is the
  one docs/FORMAT.md's title gives and the newest row of CHANGELOG.md's table of format
  versions, which lists every version from 1 up.
- Every relative file path a document cites — in backticks, in a markdown link, in a
  code block or in prose, under docs/, Sources/, scripts/, Tests/ or systemd/ — exists
  in the repository; a markdown link's `#anchor` names a heading of its target; no
  document cites a path outside the repository (`../…`).
- Every section of another document cited by its title (README "Install",
  docs/CONTROL.md, "Events") is a heading or bold lead of that document.
- docs/ARCHITECTURE.md's count and list of `@unchecked Sendable` types are the ones in
  Sources/.

Python 3 standard library only. Output: one line per problem (`path:line: what`), then
`docs: N checked, M problems`. Exit status 0 when there is no problem, 1 otherwise.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH_ROOTS = ("docs", "Sources", "scripts", "Tests", "systemd")
SKIP_DIRS = {".git", ".build", ".swiftpm"}

checked = 0
problems = []


def check(ok, where, what):
    """Counts one check; records `what` at `where` (path, line) when it fails."""
    global checked
    checked += 1
    if not ok:
        problems.append(f"{where[0]}:{where[1]}: {what}")


def read(relative):
    with open(os.path.join(ROOT, relative), encoding="utf-8", errors="replace") as f:
        return f.read()


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def files(predicate):
    """Repository-relative paths of the files `predicate` accepts, build output left out."""
    out = []
    for directory, subdirs, names in os.walk(ROOT):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIP_DIRS and not d.startswith(".build"))
        for name in sorted(names):
            relative = os.path.relpath(os.path.join(directory, name), ROOT)
            if predicate(relative):
                out.append(relative)
    return out


# --- docs/FORMAT.md's sections --------------------------------------------------------

FORMAT = read("docs/FORMAT.md")
SECTIONS = {}  # number → (title, the names a citation may give: headings and bold leads)
current = None
for line in FORMAT.split("\n"):
    heading = re.match(r"## (\d+)\. (.+)$", line)
    if heading:
        current = int(heading.group(1))
        SECTIONS[current] = (heading.group(2).strip(), [heading.group(2).strip()])
        continue
    if current is None:
        continue
    sub = re.match(r"#{3,6} (.+)$", line)
    if sub:
        SECTIONS[current][1].append(sub.group(1).strip())
    for lead in re.findall(r"\*\*([^*]+)\*\*", line):
        SECTIONS[current][1].append(lead.strip())


def normal(title):
    return re.sub(r"[^a-z0-9 ]", "", title.lower().replace("`", "")).strip()


def title_fits(title, names):
    """A cited title fits a name that it equals or begins (case and punctuation aside)."""
    t = normal(title)
    return bool(t) and any(normal(n) == t or normal(n).startswith(t + " ") for n in names)


# A citation: FORMAT.md, maybe the end of a link or a parenthesis, then §N (§N, §M / and
# §M …), then maybe a quoted title. Comment markers of a wrapped Swift or script line
# (//, ///, #) may stand between the parts.
GAP = r"(?:\s|/{2,3}|#(?!\w))*"
CITATION = re.compile(
    r"FORMAT\.md(?:\]\([^)\n]*\))?\)?(?:'s)?,?" + GAP +
    r"((?:§\s?\d+(?:" + GAP + r"(?:,|/|and|or|&)?" + GAP + r"(?=§))?)+)"
    r"(?:[,:]?" + GAP + r"\(?[\"“]([\w`][^\"”\n]{0,79})[\"”])?")
TITLE_ONLY = re.compile(r"FORMAT\.md(?:\]\([^)\n]*\))?\)?,\s*[\"“]([\w`][^\"”\n]{0,79})[\"”]")
BARE = re.compile(r"(?<!RFC \d{4} )(?<!RFC \d{3} )§\s?(\d+)")


def check_citations(relative, text):
    spans = []
    for m in CITATION.finditer(text):
        where = (relative, line_of(text, m.start()))
        numbers = [int(n) for n in re.findall(r"§\s?(\d+)", m.group(1))]
        for n in numbers:
            check(n in SECTIONS, where, f"cites docs/FORMAT.md §{n}, which has no section '## {n}.'")
        if m.group(2) and numbers and numbers[-1] in SECTIONS:
            title, names = SECTIONS[numbers[-1]]
            check(title_fits(m.group(2), names), where,
                  f"cites docs/FORMAT.md §{numbers[-1]} as \"{m.group(2)}\"; §{numbers[-1]} is \"{title}\" "
                  f"and has no heading or bold lead of that name")
        spans.append((m.start(), m.end()))
    for m in TITLE_ONLY.finditer(text):
        every = [name for _, names in SECTIONS.values() for name in names]
        check(title_fits(m.group(1), every), (relative, line_of(text, m.start())),
              f"cites docs/FORMAT.md \"{m.group(1)}\", which is no section, heading or bold lead of it")
    if relative.endswith(".md"):
        # A bare § in a document is a section of docs/FORMAT.md (RFCs' sections aside).
        for m in BARE.finditer(text):
            if any(a <= m.start() < b for a, b in spans):
                continue
            check(int(m.group(1)) in SECTIONS, (relative, line_of(text, m.start())),
                  f"§{m.group(1)} is no section of docs/FORMAT.md")


# A citation of another document's section: README "The gate", docs/CONTROL.md, "Events",
# [docs/guide/lock.md](…) ("What survives a lock"), (README, Install).
DOC_SECTION = re.compile(
    r"(?<![\w/])((?:docs/(?:guide/)?)?(?:[A-Z]+|[a-z][\w-]*)\.md|README)(?:\]\([^)\n]*\))?\)?(?:'s)?,?" + GAP +
    r"\(?[\"“]([\w`][^\"”\n]{0,79})[\"”]")
UNQUOTED_README = re.compile(r"\(README, ([A-Z][\w ]*)\)")


def resolve_document(name, citing):
    """The repository path a document name stands for, as its citing file would mean it."""
    if name == "README":
        name = "README.md"
    near = os.path.normpath(os.path.join(os.path.dirname(citing), name))
    for candidate in (name, near, os.path.join("docs", name), os.path.join("docs", "guide", name)):
        if os.path.isfile(os.path.join(ROOT, candidate)):
            return candidate
    return None


def section_names(document):
    text = re.sub(r"```.*?```", "", read(document), flags=re.S)
    return re.findall(r"^#{1,6} (.+)$", text, re.M) + re.findall(r"\*\*([^*]+)\*\*", text)


def check_document_sections(relative, text):
    found = [(m.start(), m.group(1), m.group(2)) for m in DOC_SECTION.finditer(text)]
    found += [(m.start(), "README", m.group(1)) for m in UNQUOTED_README.finditer(text)]
    for start, name, title in found:
        if name.endswith("FORMAT.md"):
            continue  # FORMAT.md's are checked with its sections above
        where = (relative, line_of(text, start))
        document = resolve_document(name, relative)
        check(document is not None, where, f"cites {name}, which does not exist")
        if document:
            check(title_fits(title, section_names(document)), where,
                  f"cites {name}, \"{title}\", which is no heading or bold lead of {document}")


sources = files(lambda p: (p.startswith(("Sources" + os.sep, "Tests" + os.sep)) and p.endswith(".swift"))
                or (p.startswith("scripts" + os.sep) and os.path.isfile(os.path.join(ROOT, p))))
documents = files(lambda p: p.endswith(".md"))
for relative in sources + documents:
    text = read(relative)
    check_citations(relative, text)
    check_document_sections(relative, text)

# --- the format version init makes -----------------------------------------------------

config = read("Sources/CofferVault/VaultConfig.swift")
constant = re.search(r"static let currentFormat\s*=\s*(\d+)", config)
check(constant is not None, ("Sources/CofferVault/VaultConfig.swift", 1), "no `static let currentFormat = N` found")
if constant:
    current = int(constant.group(1))
    init = read("Sources/coffer/InitCommand.swift")
    check("VaultConfig.currentFormat" in init or "defaultFormat" in init, ("Sources/coffer/InitCommand.swift", 1),
          "init no longer takes its default format from VaultConfig.currentFormat")
    # "`coffer init` makes format N vaults", "the vault is format N", "new vaults are
    # version N", "format N, the default of `coffer init`", "the on-disk format, version N".
    INIT_MAKES = [
        re.compile(r"(?:\bthe vault is|\bmakes|\bcreates|\bnew vaults are)\s+(?:a\s+|new\s+)?"
                   r"(?:vaults?\s+(?:of\s+)?)?(?:format|version)[\s-]+(\d+)", re.I),
        re.compile(r"(?:format|version)\s+(\d+),?\s+(?:the\s+)?default\s+(?:of|for)\s+`?(?:coffer\s+)?init", re.I),
        re.compile(r"on-disk format,?\s+version\s+(\d+)", re.I),
    ]
    stated = 0
    statements = ["README.md", "SECURITY.md", os.path.join("docs", "ARCHITECTURE.md")] + \
        [d for d in documents if d.startswith(os.path.join("docs", "guide") + os.sep)]
    for relative in statements:
        if not os.path.exists(os.path.join(ROOT, relative)):
            continue
        text = read(relative)
        for pattern in INIT_MAKES:
            for m in pattern.finditer(text):
                stated += relative == "README.md" or relative.startswith(os.path.join("docs", "guide"))
                check(int(m.group(1)) == current, (relative, line_of(text, m.start())),
                      f"says init makes format {m.group(1)}; the code makes format {current} (VaultConfig.currentFormat)")
    check(stated > 0, ("README.md", 1), f"neither README.md nor a guide says which format init makes (format {current})")
    new_vaults = re.search(r"^\| `format` \| integer \| format version: `(\d+)` for new vaults", FORMAT, re.M)
    check(new_vaults is not None and int(new_vaults.group(1)) == current,
          ("docs/FORMAT.md", line_of(FORMAT, new_vaults.start()) if new_vaults else 1),
          f"docs/FORMAT.md §3 gives `{new_vaults.group(1) if new_vaults else '?'}` for new vaults; init makes format {current}")
    supported = re.search(r"static let supportedFormats\s*=\s*\d+\s*\.\.\.\s*(\d+)", config)
    check(supported is not None, ("Sources/CofferVault/VaultConfig.swift", 1), "no `static let supportedFormats = 1...N` found")
    newest = int(supported.group(1)) if supported else current
    title = re.match(r"# coffer on-disk format, version (\d+)", FORMAT)
    check(title is not None and int(title.group(1)) == newest, ("docs/FORMAT.md", 1),
          f"docs/FORMAT.md's title gives version {title.group(1) if title else '?'}; the newest format coffer makes is {newest}")
    changelog = read("CHANGELOG.md")
    rows = sorted({int(n) for n in re.findall(r"^\| (\d+) \| \d{4}-\d\d-\d\d", changelog, re.M)})
    check(rows == list(range(1, newest + 1)), ("CHANGELOG.md", 1),
          f"CHANGELOG.md's table of format versions lists {rows}; expected 1…{newest}")

# --- file paths a document cites -------------------------------------------------------

PATH = r"(?:\./)?(?:" + "|".join(PATH_ROOTS) + r")/[\w.@+-]*(?:/[\w.@+-]+)*/?"
IN_PROSE = re.compile(r"(?<![\w/.~$-])(" + PATH + r")")
OUTSIDE = re.compile(r"(?<![\w/.])(\.\./[\w./@+-]+)")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(relative):
    text = read(relative)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def check_path(token, relative, line):
    token = token.rstrip(".,:;)'\"")
    if token.startswith("./"):
        token = token[2:]
    if not token or re.search(r"[<>*{}$…]|\.\.\.", token):
        return
    check(os.path.exists(os.path.join(ROOT, token)), (relative, line), f"cites {token}, which does not exist")


def blank(text, pattern):
    """`text` with what `pattern` matches blanked out, lines kept (so line numbers hold)."""
    return re.sub(pattern, lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


for relative in documents:
    # FORMAT.md's vectors are values (a symlink target `../target`), not citations.
    text = blank(read(relative), r"<!-- vectors:begin -->.*?<!-- vectors:end -->")
    here = os.path.dirname(relative)
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        where = (relative, line_of(text, m.start()))
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(here, path)) if path else relative
        inside = not resolved.startswith("..") and not os.path.isabs(resolved)
        check(inside, where, f"links {target}, outside the repository")
        if not inside:
            continue
        check(os.path.exists(os.path.join(ROOT, resolved)), where, f"links {target}, which does not exist")
        if anchor and resolved.endswith(".md") and os.path.exists(os.path.join(ROOT, resolved)):
            check(anchor in anchors(resolved), where, f"links {target}: {resolved} has no heading #{anchor}")
    # Paths in backticks, in code blocks and in prose, all alike (links are checked above).
    unlinked = blank(text, r"\]\([^)\s]+\)")
    for m in IN_PROSE.finditer(unlinked):
        check_path(m.group(1), relative, line_of(unlinked, m.start()))
    # A path that leaves the repository, in prose or backticks (a link's target, relative
    # to its document, is checked above; a code block's commands may cd anywhere).
    prose = blank(blank(text, r"```.*?```"), r"\[[^\]\n]*\]\([^)\s]+\)")
    for m in OUTSIDE.finditer(prose):
        check(False, (relative, line_of(prose, m.start())), f"cites {m.group(1)}, outside the repository")

# --- ARCHITECTURE.md's @unchecked Sendable ---------------------------------------------

declared = []
for relative in sources:
    if not relative.endswith(".swift") or not relative.startswith("Sources"):
        continue
    for line in read(relative).split("\n"):
        code = line.split("//")[0]
        m = re.search(r"(?:class|struct|enum|actor)\s+(\w+)(?:<[^>]*>)?\s*:[^{]*@unchecked Sendable", code)
        if m:
            declared.append(m.group(1))
architecture = read("docs/ARCHITECTURE.md")
claim = re.search(r"@unchecked Sendable`[^()]*?there are (\d+) \(([^)]*)\)", architecture, re.S)
where = ("docs/ARCHITECTURE.md", line_of(architecture, claim.start()) if claim else 1)
check(claim is not None, where, "no sentence 'there are N (`A`, `B`…)' about @unchecked Sendable")
if claim:
    named = re.findall(r"`(\w+)`", claim.group(2))
    check(int(claim.group(1)) == len(declared), where,
          f"says there are {claim.group(1)} @unchecked Sendable; Sources/ declares {len(declared)}")
    check(sorted(named) == sorted(declared), where,
          f"names {sorted(named)} as @unchecked Sendable; Sources/ declares {sorted(declared)}")
    for m in re.finditer(r"prints the (\d+) named above", architecture):
        check(int(m.group(1)) == len(declared), ("docs/ARCHITECTURE.md", line_of(architecture, m.start())),
              f"says the grep prints {m.group(1)}; Sources/ declares {len(declared)} @unchecked Sendable")

for problem in problems:
    print(problem)
print(f"docs: {checked} checked, {len(problems)} problems")
sys.exit(1 if problems else 0)
