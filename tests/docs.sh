#!/usr/bin/env bash
# Checks the user's documentation (README.md and the book in docs/), with python3's standard
# library only and no network:
# - every relative Markdown link points to a file that exists, and a `#anchor` to a heading of
#   that file (GitHub's slug rules);
# - every page in docs/ is linked from docs/README.md, the book's table of contents;
# - README.md has at most 220 lines;
# - the docs, examples/, deploy/, sql/ and bench/*.py mention no issue numbers, commit hashes
#   given as provenance, "development machine" or paths outside the repository (../shared).
# Prints "tests/docs.sh: N pages checked" and exits 0, or prints each problem as FILE:LINE:
# message and exits 1. tests/run.sh runs it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec python3 - "$@" <<'PY'
import re, sys
from pathlib import Path

root = Path(".")
problems = []

def problem(path, line, msg):
    problems.append(f"{path}:{line}: {msg}")

def strip_code(lines):
    """Yields (line number, text) outside fenced code blocks, inline code removed."""
    fence = None
    for n, line in enumerate(lines, 1):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark[0] * 3
            elif mark.startswith(fence):
                fence = None
            continue
        if fence is None:
            yield n, re.sub(r"`+[^`]*`+", "", line)

def slug(text):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # GitHub keeps letters, digits, _, - and spaces
    return text.replace(" ", "-")

anchor_cache = {}
def anchors(path):
    if path not in anchor_cache:
        seen, found = {}, set()
        fence = None
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^\s*(```+|~~~+)", line)
            if m:
                fence = None if fence else m.group(1)[0]
                continue
            if fence:
                continue
            h = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if h:
                s = slug(h.group(1))
                k = seen.get(s, 0)
                seen[s] = k + 1
                found.add(s if k == 0 else f"{s}-{k}")
        anchor_cache[path] = found
    return anchor_cache[path]

pages = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
link_re = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
linked_from_toc = set()
toc = (root / "docs" / "README.md").resolve()

for page in pages:
    lines = page.read_text(encoding="utf-8").splitlines()
    for n, line in strip_code(lines):
        for m in link_re.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page.resolve()
            if not dest.exists():
                problem(page, n, f"link to {target}: {file_part} does not exist")
                continue
            if page.resolve() == toc and dest.suffix == ".md":
                linked_from_toc.add(dest)
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problem(page, n, f"link to {target}: no heading #{anchor} in {file_part or page.name}")

for page in pages[1:]:
    if page.resolve() != toc and page.resolve() not in linked_from_toc:
        problem(page, 1, "page not linked from docs/README.md")

readme_lines = len((root / "README.md").read_text(encoding="utf-8").splitlines())
if readme_lines > 220:
    problem("README.md", readme_lines, f"{readme_lines} lines, at most 220")

history = [
    (re.compile(r"issue [0-9]", re.I), "an issue number"),
    (re.compile(r"\(issue", re.I), "an issue number"),
    (re.compile(r"development machine", re.I), "\"development machine\" (say what the hardware is)"),
    (re.compile(r"\.\./shared"), "a path outside the repository"),
    (re.compile(r"\b(commit|at)\s+(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", re.I),
     "a commit hash as provenance"),
    (re.compile(r"\bcommit\s+[0-9]{7,40}\b", re.I), "a commit hash as provenance"),
]
scanned = list(pages)
for pattern in ("examples/*", "deploy/**/*", "sql/*", "bench/*.py"):
    scanned += sorted(p for p in root.glob(pattern) if p.is_file())
for path in scanned:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        continue
    for n, line in enumerate(text.splitlines(), 1):
        for rx, what in history:
            if rx.search(line):
                problem(path, n, f"{what}: {line.strip()[:100]}")
                break

if problems:
    for p in problems:
        print(p)
    print(f"tests/docs.sh: {len(problems)} problem(s) in the docs", file=sys.stderr)
    sys.exit(1)
print(f"tests/docs.sh: {len(pages)} pages checked")
PY
