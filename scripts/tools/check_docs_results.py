#!/usr/bin/env python3
"""Check that the committed results under docs/results/ and the pages that cite them agree.

    python3 scripts/tools/check_docs_results.py REPO_ROOT

Problems, each named on its own line, with a non-zero exit if there is any:
  - a file under docs/results/ (recursively) that no page references: a page is docs/*.md or
    README.md, and it references a file by the file's name or, for a file in a subfolder of
    docs/results/, by that subfolder's name;
  - a name under docs/results/ ending in _<7 hex digits> before its extension (a commit hash:
    an older run belongs in the history, cited as `git show <commit>:docs/results/<name>`);
  - a page's relative link, or backquoted path, to results/... that names no file.
Standard library only.
"""
import os
import re
import sys

HASHED = re.compile(r"_[0-9a-f]{7}$")
# a Markdown link target: ](results/x.json) or ](docs/results/x.json), optionally with #anchor
LINK = re.compile(r"\]\(((?:\./)?(?:docs/)?results/[^)\s#]+)(?:#[^)]*)?\)")
CODE = re.compile(r"`([^`\n]+)`")
# a results path inside a backquoted span: the path itself, not one inside `git show c:path`
PATH = re.compile(r"(?<![\w:./-])((?:docs/)?results/[^\s`'\"()]+)")
PATTERN_CHARS = set("<>*{}[]?|$")


def stem(name):
    base = name
    while True:
        root, ext = os.path.splitext(base)
        if not ext or root == "":
            return base
        base = root


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: check_docs_results.py REPO_ROOT")
    root = argv[1]
    results = os.path.join(root, "docs", "results")
    pages = [os.path.join(root, "README.md")] if os.path.isfile(os.path.join(root, "README.md")) else []
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        pages += sorted(os.path.join(docs, n) for n in os.listdir(docs)
                        if n.endswith(".md") and os.path.isfile(os.path.join(docs, n)))
    texts = {p: open(p, encoding="utf-8", errors="replace").read() for p in pages}
    everything = "\n".join(texts.values())
    problems = []

    if os.path.isdir(results):
        for dirpath, dirnames, filenames in os.walk(results):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, results)
            for d in dirnames:
                if HASHED.search(d):
                    problems.append(f"docs/results/{os.path.join(rel_dir, d) if rel_dir != '.' else d}: "
                                    "name ends in a commit hash (keep older runs in the history)")
            for f in sorted(filenames):
                rel = f if rel_dir == "." else os.path.join(rel_dir, f)
                if HASHED.search(stem(f)):
                    problems.append(f"docs/results/{rel}: name ends in a commit hash "
                                    "(keep older runs in the history)")
                # referenced by its own name, or by the name of its top folder under docs/results/
                names = [f] if rel_dir == "." else [f, rel_dir.split(os.sep)[0]]
                if not any(re.search(r"(?<![\w.-])" + re.escape(n) + r"(?![\w-])", everything)
                           for n in names):
                    problems.append(f"docs/results/{rel}: referenced by no page (docs/*.md, README.md)")

    for page, text in texts.items():
        base = os.path.dirname(page)
        cited = [m.group(1) for m in LINK.finditer(text)]
        for span in CODE.finditer(text):
            if span.group(1).lstrip().startswith("git show"):
                continue
            cited += [m.group(1) for m in PATH.finditer(span.group(1))]
        for target in cited:
            target = target.rstrip(".,;:")
            if any(c in PATTERN_CHARS for c in target) or target.endswith("/"):
                continue
            # relative to the page, or to the repository root for docs/results/... paths
            candidates = [os.path.join(base, target), os.path.join(root, target),
                          os.path.join(docs, target)]
            if not any(os.path.exists(c) for c in candidates):
                problems.append(f"{os.path.relpath(page, root)}: cites {target}, which does not exist")

    for p in problems:
        print(p)
    if problems:
        print(f"check_docs_results: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"check_docs_results: {len(pages)} pages, docs/results consistent")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
