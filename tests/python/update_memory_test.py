#!/usr/bin/python3
"""knnctl update's peak resident memory grows with the change, not with the
base: the base's INDEX.vectors is read through a bounded buffer
(storage/vectors_file_reader.h), not through its mapping, whose every page
read stays in the process's RSS. Through the mapping, the update of a
base twice as large peaked higher by the whole difference of their vectors
files. Labelled plain: ASan's shadow memory and quarantine change RSS.

  update_memory_test.py --knnd BUILD/knnd --knnctl BUILD/knnctl \\
      --source-dir . [unittest args]
"""
import os
import sys
import tempfile
import unittest

from knnd_harness import unittest_main

ARGS = None
ROWS = 60000
DIM = 512  # 2 KiB of vectors a row against ~0.2 KiB of the rest
BUILD_FLAGS = ("--nlist", "64")


class UpdateMemoryTest(unittest.TestCase):
    def peak_of_update(self, rows):
        """The default update's peak RSS (bytes) on a base of `rows` rows,
        and the size of that base's INDEX.vectors."""
        import update_memory
        with tempfile.TemporaryDirectory() as directory:
            update_memory.make_inputs(directory, rows, DIM, 0.01)
            index = update_memory.build_base(ARGS.knnctl, directory,
                                             BUILD_FLAGS)
            vectors = os.path.getsize(index + ".vectors")
            peak, _, output = update_memory.run_update(ARGS.knnctl,
                                                       directory)
            self.assertIn("recall@10", output)
            return peak, vectors

    def test_peak_grows_with_the_change_not_the_base_vectors(self):
        small_peak, small_vectors = self.peak_of_update(ROWS // 2)
        peak, vectors = self.peak_of_update(ROWS)
        grown = peak - small_peak
        print("peak RSS %.1f MiB (base of %d rows, %.1f MiB of vectors), "
              "%.1f MiB (%d rows, %.1f MiB): %.1f MiB more for %.1f MiB more "
              "vectors" % (small_peak / 2**20, ROWS // 2,
                           small_vectors / 2**20, peak / 2**20, ROWS,
                           vectors / 2**20, grown / 2**20,
                           (vectors - small_vectors) / 2**20))
        # Measured: 4.2 MiB more for 58.6 MiB more vectors; 62.7 MiB more
        # with knnctl at 77e3826, which read the base through its mapping.
        self.assertLess(grown, 0.4 * (vectors - small_vectors))


def add_bench_to_path(args):
    sys.path.insert(0, os.path.join(args.source_dir, "bench"))


if __name__ == "__main__":
    unittest_main(__doc__, knnctl=True, setup=add_bench_to_path)
