#!/usr/bin/python3
"""The hybrid benchmark's labelled corpus, made from Debian's LibreOffice
help (libreoffice-help-en-us, -zh-cn, -ko): the same ~2,560 pages under the
same relative paths in every language, each page carrying its authors'
index entries as <meta itemprop="keywords" content="...">.

  /usr/bin/python3 bench/hybrid/corpus.py --out DIR [--help-root
      /usr/share/libreoffice/help] [--langs en-US,zh-CN,ko]

Writes, per language, DIR/<lang>/chunks.jsonl ({"text", "page", "title",
"lang"} a line), DIR/<lang>/queries.jsonl ({"query", "pages"} a line) and
DIR/<lang>/stats.json; DIR/stats.json holds all of them. Standard library
only.

Queries and labels. A query is an index entry; its labels are every page
that carries it. The entries are made parallel across the languages so that
the per-language figures compare like with like: a page is kept only when
every language has it with the same number of entries (translated entries
stand at the same positions), an English entry (case-folded) groups the
(page, position) pairs that carry it, and that group is one query in every
language with the same page labels; its Chinese or Korean text is the entry
at those positions (the most frequent one where translators wrote two
forms; stats count such groups).

Indexed text. The keywords live only in the <meta> elements, which are
never indexed text here (that is what "strip" means: no extractor may fold
them in); the indexed text is the page title and the body of the display
area (headings, paragraphs, lists, tables, code), without the navigation,
scripts and the debug footer. stats report the share of entries that
occur verbatim (NFKC, case-folded) in their page's indexed text, and the
share whose every part does ("functions, mathematical": entry and
sub-entry, split at commas and semicolons): how much of the task plain
substring matching already solves.
"""
import argparse
import collections
import html.parser
import json
import os
import re
import sys
import unicodedata

LANGS = ("en-US", "zh-CN", "ko")

# Chunk budget. The pages are translations of one another, so a budget
# that covers the same content in every language keeps the languages
# comparable (about as many chunks per page, as much text behind each BM25
# length norm and each vector). Sizes are counted in English-word
# equivalents: a non-CJK word counts 1 and a CJK character 1/r, where r is
# the CJK characters per English word measured on the fully translated
# pages of these packages (pages with > 200 CJK characters and < 15% of
# the English word count left in Latin script): 1.74 Han characters (zh-CN)
# and 2.21 Hangul syllables (ko) per English word. A fixed character count
# would not do: a quarter of the Chinese pages and more of the Korean are
# still partly English, and code, function names and menu paths stay Latin
# in every translation. 150 English words (about 950 characters, about 200
# XLM-R tokens) is a common RAG chunk; its equivalents are about 260 Han
# characters and 330 Hangul syllables, all well under multilingual-e5's 512
# tokens, so no chunk is truncated or windowed by the model. Chunks end at
# paragraph boundaries; a paragraph over the budget is cut at sentence ends,
# then between words (between characters inside a CJK run).
BUDGET_WORDS = 150
CJK_CHARS_PER_WORD = {"zh-CN": 1.74, "ko": 2.21}

BLOCK_TAGS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "td", "th",
              "tr", "pre", "div", "table", "ul", "ol", "dt", "dd", "br",
              "section", "blockquote"}
SKIP_TAGS = {"script", "style", "header", "footer", "aside", "noscript",
             "nav", "button", "input", "label"}
VOID_TAGS = {"meta", "link", "br", "img", "input", "hr", "base", "wbr",
             "col", "area", "source", "embed", "param", "track"}


class HelpPage(html.parser.HTMLParser):
    """One help page: its title, its index entries (in document order) and
    its body as a list of paragraphs (block elements' text)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.title = ""
        self.keywords = []
        self.paragraphs = []
        self._in_title = False
        self._skip_depth = 0
        self._display_depth = 0  # > 0 inside <div id="DisplayArea">
        self._div_depth = 0
        self._current = []

    def _flush(self):
        text = re.sub(r"\s+", " ", "".join(self._current)).strip()
        if text:
            self.paragraphs.append(text)
        self._current = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "meta" and attrs.get("itemprop") == "keywords":
            self.keywords.append(attrs.get("content", "").strip())
            return
        if tag == "title":
            self._in_title = True
            return
        if tag == "div":
            self._div_depth += 1
            if attrs.get("id") == "DisplayArea":
                self._display_depth = self._div_depth
        if tag in SKIP_TAGS and tag not in VOID_TAGS:
            self._skip_depth += 1
        if tag in BLOCK_TAGS:
            self._flush()

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
            return
        if tag in SKIP_TAGS and tag not in VOID_TAGS:
            self._skip_depth = max(0, self._skip_depth - 1)
        if tag in BLOCK_TAGS:
            self._flush()
        if tag == "div":
            if self._div_depth == self._display_depth:
                self._display_depth = 0
            self._div_depth -= 1

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        elif self._display_depth and not self._skip_depth:
            self._current.append(data)

    def close(self):
        super().close()
        self._flush()
        self.title = re.sub(r"\s+", " ", self.title).strip()


def parse_page(path):
    page = HelpPage()
    with open(path, encoding="utf-8") as f:
        page.feed(f.read())
    page.close()
    return page


def is_cjk(lang):
    return lang in CJK_CHARS_PER_WORD


SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s*")
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
                 r"\u1100-\u11ff\u3130-\u318f\uf900-\ufaff]")
# A CJK character, or a run of other non-space characters, with the spaces
# after it: what a hard cut may fall between.
ATOM = re.compile(CJK.pattern + r"\s*|(?:(?!" + CJK.pattern + r")\S)+\s*|\s+")


def text_size(text, lang):
    """English-word equivalents (see BUDGET_WORDS)."""
    if not is_cjk(lang):
        return len(text.split())
    cjk = len(CJK.findall(text))
    return len(CJK.sub(" ", text).split()) + cjk / CJK_CHARS_PER_WORD[lang]


def split_long(paragraph, lang):
    """A paragraph longer than the budget, cut at sentence ends where it
    can, then between words (between characters inside a CJK run)."""
    pieces, current = [], ""
    for sentence in [s for s in SENTENCE_END.split(paragraph) if s]:
        sep = "" if not current or CJK.match(sentence[:1]) else " "
        joined = current + sep + sentence
        if current and text_size(joined, lang) > BUDGET_WORDS:
            pieces.append(current)
            current = sentence
        else:
            current = joined
    if current:
        pieces.append(current)
    out = []
    for piece in pieces:
        if text_size(piece, lang) <= BUDGET_WORDS:
            out.append(piece)
            continue
        current = ""
        for atom in ATOM.findall(piece):
            if current and text_size(current + atom, lang) > BUDGET_WORDS:
                out.append(current.strip())
                current = ""
            current += atom
        if current.strip():
            out.append(current.strip())
    return out


def chunk_page(title, paragraphs, lang):
    """Paragraphs packed into chunks of at most the budget. Every chunk
    starts with the page title (a chunk cut from the middle of a page says
    what it is about, for BM25 and the embedding alike) unless its first
    paragraph already is the title."""
    units = []
    for p in paragraphs:
        units.extend(split_long(p, lang) if text_size(p, lang) > BUDGET_WORDS
                     else [p])
    chunks, current = [], []
    for unit in units:
        if current and text_size("\n".join(current + [unit]), lang) > BUDGET_WORDS:
            chunks.append(current)
            current = []
        current.append(unit)
    if current:
        chunks.append(current)
    texts = []
    for c in chunks:
        if title and c[0] != title:
            c = [title] + c
        texts.append("\n".join(c))
    return texts


def fold(text):
    return unicodedata.normalize("NFKC", text).casefold()


def find_pages(root, lang):
    base = os.path.join(root, lang)
    pages = []
    for dirpath, _, files in os.walk(os.path.join(base, "text")):
        for name in files:
            if name.endswith(".html"):
                pages.append(os.path.relpath(os.path.join(dirpath, name), base))
    return sorted(pages)


def build(root, langs, out):
    parsed = {}
    for lang in langs:
        parsed[lang] = {rel: parse_page(os.path.join(root, lang, rel))
                        for rel in find_pages(root, lang)}
    common = sorted(set.intersection(*(set(p) for p in parsed.values())))
    aligned = [rel for rel in common
               if len({len(parsed[lang][rel].keywords) for lang in langs}) == 1]
    # English entries (case-folded) group the (page, position) pairs.
    pivot = langs[0]
    groups = collections.OrderedDict()
    for rel in aligned:
        for pos, entry in enumerate(parsed[pivot][rel].keywords):
            if entry:
                groups.setdefault(fold(entry), []).append((rel, pos))
    # Each group's text in every language (the most frequent form where
    # translators wrote two); a group is kept when every CJK language has a
    # translated (CJK) form: about a third of the Korean entries and a
    # quarter of the Chinese are still English in Debian's 7.4 packages,
    # and an English query in the Chinese run would measure English.
    queries = {lang: [] for lang in langs}
    mixed = collections.Counter()
    untranslated = 0
    for key, places in groups.items():
        texts = {}
        for lang in langs:
            forms = collections.Counter(
                parsed[lang][rel].keywords[pos].strip() for rel, pos in places)
            forms.pop("", None)
            mixed[lang] += len(forms) > 1
            texts[lang] = forms.most_common(1)[0][0] if forms else ""
        if not all(texts[l] and (not is_cjk(l) or CJK.search(texts[l]))
                   for l in langs):
            untranslated += 1
            continue
        pages = sorted({rel for rel, _ in places})
        for lang in langs:
            queries[lang].append(({"query": texts[lang], "pages": pages}, places))
    all_stats = {"pages_installed": {l: len(parsed[l]) for l in langs},
                 "pages_common": len(common), "pages_aligned": len(aligned),
                 "entry_groups": len(groups),
                 "groups_dropped_untranslated": untranslated,
                 "langs": {}}
    for lang in langs:
        os.makedirs(os.path.join(out, lang), exist_ok=True)
        chunks, chars, cjk_chars, indexed = [], 0, 0, {}
        for rel in aligned:
            page = parsed[lang][rel]
            body = "\n".join(page.paragraphs)
            chars += len(body)
            cjk_chars += len(CJK.findall(body))
            indexed[rel] = fold(page.title + "\n" + body)
            for text in chunk_page(page.title, page.paragraphs, lang):
                chunks.append({"text": text, "page": rel, "title": page.title,
                               "lang": lang})
        verbatim_pairs = parts_pairs = pairs = 0
        for _, places in queries[lang]:
            for rel, pos in places:
                pairs += 1
                entry = fold(parsed[lang][rel].keywords[pos])
                verbatim_pairs += bool(entry) and entry in indexed[rel]
                # "functions, mathematical": an entry and its sub-entry.
                parts = [t.strip() for t in re.split(r"[,;]", entry) if t.strip()]
                parts_pairs += bool(parts) and all(t in indexed[rel] for t in parts)
        queries[lang] = [q for q, _ in queries[lang]]
        with open(os.path.join(out, lang, "chunks.jsonl"), "w", encoding="utf-8") as f:
            for c in chunks:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        with open(os.path.join(out, lang, "queries.jsonl"), "w", encoding="utf-8") as f:
            for q in queries[lang]:
                f.write(json.dumps(q, ensure_ascii=False) + "\n")
        stats = {
            "pages": len(aligned), "chunks": len(chunks),
            "queries": len(queries[lang]),
            "entries": pairs,
            "queries_with_several_pages": sum(len(q["pages"]) > 1
                                              for q in queries[lang]),
            "queries_with_two_forms": mixed[lang],
            "cjk_share_of_chars": round(cjk_chars / max(chars, 1), 3),
            "verbatim_share": round(verbatim_pairs / max(pairs, 1), 4),
            "verbatim_parts_share": round(parts_pairs / max(pairs, 1), 4),
            "chars_per_page": round(chars / max(len(aligned), 1), 1),
            "chunk_budget_words": BUDGET_WORDS,
        }
        all_stats["langs"][lang] = stats
        with open(os.path.join(out, lang, "stats.json"), "w") as f:
            json.dump(stats, f, indent=1)
    with open(os.path.join(out, "stats.json"), "w") as f:
        json.dump(all_stats, f, indent=1)
    return all_stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--help-root", default="/usr/share/libreoffice/help")
    ap.add_argument("--langs", default=",".join(LANGS))
    args = ap.parse_args()
    langs = args.langs.split(",")
    missing = [l for l in langs if not os.path.isdir(os.path.join(args.help_root, l))]
    if missing:
        sys.exit(f"no LibreOffice help under {args.help_root} for {missing}: "
                 "apt-get install libreoffice-help-en-us libreoffice-help-zh-cn "
                 "libreoffice-help-ko")
    json.dump(build(args.help_root, langs, args.out), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
