#!/usr/bin/python3
"""bench/hybrid's own logic on small made-up inputs, without its packages,
corpus or models (make bench-hybrid runs the real thing): a help page's
index entries kept out of its indexed text, chunk budgets counted in
English-word equivalents, chunk hits mapped to pages and scored, the two
fusions knnd must reproduce, the top-10 comparison's tie rule, and (where
python3-icu is installed) the analyzer's CJK unigrams and bigrams.

  hybrid_bench_test.py --source-dir . [unittest args]
"""
import argparse
import os
import sys
import unittest

import numpy as np

PAGE = """<html><head><title>Mathematical Functions</title></head><body>
<header><p>LibreOffice Help</p></header>
<div id="DisplayArea">
<meta itemprop="keywords" content="trigonometric functions">
<h1>Mathematical Functions</h1>
<p>This category contains the <span>Mathematical</span> functions.</p>
<script>var x = 1;</script>
<div class="embedded"><p>ABS returns the absolute value.</p></div>
</div>
<footer><p>debug</p></footer>
</body></html>"""


class CorpusTest(unittest.TestCase):
    def test_page_keywords_are_kept_out_of_the_text(self):
        import corpus
        page = corpus.HelpPage()
        page.feed(PAGE)
        page.close()
        self.assertEqual(page.title, "Mathematical Functions")
        self.assertEqual(page.keywords, ["trigonometric functions"])
        self.assertEqual(page.paragraphs, [
            "Mathematical Functions",
            "This category contains the Mathematical functions.",
            "ABS returns the absolute value."])

    def test_chunks_stay_within_the_budget_in_every_script(self):
        import corpus
        english = [" ".join(["word"] * 100)] * 3
        chinese = ["数学函数计算" * 100]
        for lang, paragraphs in (("en-US", english), ("zh-CN", chinese)):
            chunks = corpus.chunk_page("T", paragraphs, lang)
            self.assertGreater(len(chunks), 1)
            for c in chunks:
                body = c.split("\n", 1)[1]
                self.assertLessEqual(corpus.text_size(body, lang), corpus.BUDGET_WORDS)
                self.assertTrue(c.startswith("T\n"))
        # 600 Han characters are 600 / 1.74 word equivalents: 3 chunks.
        self.assertEqual(len(corpus.chunk_page("T", chinese, "zh-CN")), 3)


class MetricsTest(unittest.TestCase):
    def test_chunk_hits_map_to_pages_in_rank_order(self):
        import hybrid_bench as hb
        chunk_page = ["a", "a", "b", "c"]
        self.assertEqual(hb.pages_of([1, 0, 3, -1, 2], chunk_page), ["a", "c", "b"])
        m = hb.page_metrics([[3, 0, 2]], [{"pages": ["a", "b"]}], chunk_page)
        ideal = 1 + 1 / np.log2(3)
        self.assertAlmostEqual(m["ndcg@10"], (1 / np.log2(3) + 1 / np.log2(4)) / ideal)
        self.assertAlmostEqual(m["recall@10"], 1.0)
        self.assertAlmostEqual(m["mrr@10"], 0.5)

    def test_rrf_sums_reciprocal_ranks(self):
        import hybrid_bench as hb
        # 3: 1/63 + 1/61; 1: 1/61; 2: 1/62; 4: 1/62 (tie: lower row first).
        self.assertEqual(hb.rrf([[1, 2, 3], [3, 4]]), [3, 1, 2, 4])

    def test_weighted_normalizes_each_window(self):
        import hybrid_bench as hb
        got = hb.weighted([([1, 2, 3], [0.9, 0.8, 0.1]), ([3, 4], [5.0, 1.0])])
        self.assertEqual(got, [1, 3, 2, 4])  # 1 and 3 tie at 0.5

    def test_top_sets_tied_at_the_kth_score_count_as_equal(self):
        import hybrid_bench as hb
        a = [np.array([1, 2, 3])], [np.array([3.0, 2.0, 1.0])]
        tied = [np.array([1, 2, 4])], [np.array([3.0, 2.0, 1.0])]
        other = [np.array([1, 2, 4])], [np.array([3.0, 2.0, 1.5])]
        self.assertEqual(hb.top_sets_equal(*a, *tied, k=3), (1.0, 0.0))
        self.assertEqual(hb.top_sets_equal(*a, *other, k=3)[0], 0.0)


class AnalyzerTest(unittest.TestCase):
    def test_cjk_runs_become_unigrams_and_bigrams(self):
        try:
            import icu  # noqa: F401
        except ImportError:
            self.skipTest("python3-icu not installed")
        import analyzers
        a = analyzers.IcuAnalyzer()
        self.assertEqual(a.tokens("ＡＢＳ 函数向导"),
                         ["abs", "函", "函数", "数", "数向", "向", "向导", "导"])
        self.assertEqual(a.tokens("수학 함수"), ["수", "수학", "학", "함", "함수", "수"])
        self.assertEqual(analyzers.WhitespaceAnalyzer()(["函数向导, 数学"]),
                         [["函数向导", "数学"]])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source-dir", required=True)
    args, rest = parser.parse_known_args()
    sys.path.insert(0, os.path.join(args.source_dir, "bench", "hybrid"))
    sys.path.insert(0, os.path.join(args.source_dir, "tests", "python"))
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
