#!/usr/bin/env python3
"""Generates a multiple-choice cloze task from plain text, for `sparsim eval --tasks`.

Each item: a context of consecutive non-empty lines of one file, and four choices for the line
that follows it: the true next line and three lines drawn from elsewhere in the text with a
similar length (so the length alone does not give the answer away). The gold position is drawn
at random. Everything is seeded, so the same text and options give the same file.

  scripts/tools/make_cloze_tasks.py CORPUS_DIR_OR_FILE --out tasks.jsonl [--items 200] [--seed 1]

Only lines from the second half of every file are used, so a perplexity run over the start of
the same text does not see the items' contexts first.
"""
import argparse
import json
import os
import random


def read_lines(path):
    files = []
    if os.path.isdir(path):
        for root, _, names in os.walk(path):
            for n in sorted(names):
                files.append(os.path.join(root, n))
        files.sort()
    else:
        files = [path]
    docs = []
    for f in files:
        with open(f, encoding="utf-8", errors="strict") as fh:
            lines = [ln.strip() for ln in fh.read().splitlines()]
        lines = [ln for ln in lines if len(ln) >= 20]
        docs.append(lines[len(lines) // 2:])
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("--out", required=True)
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--context-lines", type=int, default=6)
    ap.add_argument("--choices", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    docs = [d for d in read_lines(a.corpus) if len(d) > a.context_lines + 1]
    if not docs:
        raise SystemExit("make_cloze_tasks: no usable text in " + a.corpus)
    pool = [ln for d in docs for ln in d]
    by_len = sorted(pool, key=len)
    items = []
    seen = set()
    while len(items) < a.items:
        d = rng.choice(docs)
        i = rng.randrange(0, len(d) - a.context_lines - 1)
        if (id(d), i) in seen:
            continue
        seen.add((id(d), i))
        ctx = " ".join(d[i:i + a.context_lines])
        truth = d[i + a.context_lines]
        # distractors of similar length: a window of the length-sorted pool around the truth
        lo = max(0, min(len(by_len) - 200, _index_of_len(by_len, len(truth)) - 100))
        cands = [c for c in by_len[lo:lo + 200] if c != truth]
        distract = rng.sample(cands, a.choices - 1)
        gold = rng.randrange(a.choices)
        choices = distract[:gold] + [truth] + distract[gold:]
        items.append({"context": ctx, "choices": [" " + c for c in choices], "gold": gold})
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    os.replace(tmp, a.out)
    print(f"{len(items)} items -> {a.out}")


def _index_of_len(sorted_lines, n):
    lo, hi = 0, len(sorted_lines)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(sorted_lines[mid]) < n:
            lo = mid + 1
        else:
            hi = mid
    return lo


if __name__ == "__main__":
    main()
