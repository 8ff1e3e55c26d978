"""Tokenizers the hybrid benchmark feeds to BM25 (bm25s takes token lists).

  icu         what knnd's analyzer is specified to do (issue 54): NFKC case
              folding, ICU word boundaries, and every run of CJK characters
              (Han, kana, Hangul) as its overlapping unigrams and bigrams;
              python3-icu (Debian), a stand-in until `knnctl analyze` exists
  knnd        `knnctl analyze` itself, one JSON array of tokens per input
              line (read in one process for a whole list of texts)
  whitespace  NFKC case folding, split at white space, punctuation stripped
              from both ends of a token: the tokenizer that finds nothing
              in Chinese (a sentence is one token) and little in Korean
              (particles stay glued to their words)

Every analyzer maps a list of texts to a list of token lists. Repeated
tokens are kept, in the documents (term frequency) and in the queries (a
term twice in a query counts twice, as in bm25s and Lucene).
"""
import json
import re
import subprocess
import unicodedata

CJK_RUN_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
                          r"\uac00-\ud7af\u1100-\u11ff\u3130-\u318f"
                          r"\U00020000-\U0002ffff]")
WORD_STATUS_MIN = 100  # ICU UBRK_WORD_NUMBER; below: spaces, punctuation


def cjk_grams(run):
    """A CJK run's unigrams and bigrams, in text order."""
    out = []
    for i, ch in enumerate(run):
        out.append(ch)
        if i + 1 < len(run):
            out.append(run[i:i + 2])
    return out


class IcuAnalyzer:
    name = "icu"

    def __init__(self):
        import icu
        self._icu = icu
        self._fold = icu.Normalizer2.getNFKCCasefoldInstance()
        self._breaker = icu.BreakIterator.createWordInstance(icu.Locale.getRoot())

    def tokens(self, text):
        icu = self._icu
        folded = icu.UnicodeString(self._fold.normalize(text))
        self._breaker.setText(folded)
        out, run, run_end = [], [], -1
        start = self._breaker.first()
        for end in self._breaker:
            if self._breaker.getRuleStatus() >= WORD_STATUS_MIN:
                word = str(folded[start:end])
                if all(CJK_RUN_CHAR.match(c) for c in word):
                    # ICU splits Chinese into dictionary words; adjacent
                    # CJK words are one run, so bigrams cross them.
                    if start != run_end and run:
                        out.extend(cjk_grams("".join(run)))
                        run = []
                    run.append(word)
                    run_end = end
                else:
                    if run:
                        out.extend(cjk_grams("".join(run)))
                        run = []
                    out.append(word)
            start = end
        if run:
            out.extend(cjk_grams("".join(run)))
        return out

    def __call__(self, texts):
        return [self.tokens(t) for t in texts]


class KnndAnalyzer:
    """`knnctl analyze [--stemmer LANG]`: texts in, one line each (line
    breaks inside a text become spaces), token arrays out."""
    name = "knnd"

    def __init__(self, knnctl, stemmer=None):
        self.cmd = [knnctl, "analyze"] + (["--stemmer", stemmer] if stemmer else [])

    @staticmethod
    def available(knnctl):
        try:
            r = subprocess.run([knnctl, "analyze"], input="a b\n", text=True,
                               capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return False
        if r.returncode != 0:
            return False
        try:
            return isinstance(json.loads(r.stdout.splitlines()[0]), list)
        except (ValueError, IndexError):
            return False

    def __call__(self, texts):
        lines = "".join(re.sub(r"[\r\n\u2028\u2029\x85\x0b\x0c]", " ", t) + "\n"
                        for t in texts)
        r = subprocess.run(self.cmd, input=lines, text=True, capture_output=True,
                           check=True)
        out = [json.loads(l) for l in r.stdout.splitlines()]
        if len(out) != len(texts):
            raise RuntimeError(f"knnctl analyze answered {len(out)} lines "
                               f"for {len(texts)} texts")
        return out


class WhitespaceAnalyzer:
    name = "whitespace"

    def __call__(self, texts):
        out = []
        for t in texts:
            words = unicodedata.normalize("NFKC", t).casefold().split()
            stripped = (w.strip("\"'()[]{}<>.,;:!?«»“”‘’「」『』（），。；：！？、") for w in words)
            out.append([w for w in stripped if w])
        return out
