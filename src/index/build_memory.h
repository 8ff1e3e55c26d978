// The memory model of `knnctl build` (docs/knnctl.md, "Memory of a
// build"): what a streamed build holds on the heap at its peak, from the
// input's shape and the recipe, so that an operator can size the machine
// or pod that builds, and so that the build can print the model beside the
// peak it measured. The input itself is never held: an .npy is mapped and
// each range read is dropped from the resident set, other formats are read
// a batch at a time.
//
// Thread-safety: pure functions.
#ifndef KNND_INDEX_BUILD_MEMORY_H_
#define KNND_INDEX_BUILD_MEMORY_H_

#include <cstdint>
#include <string>

namespace knnd {

struct BuildShape {
  int64_t rows = 0;
  int dim = 0;
  int64_t train_rows = 0;
  int64_t add_batch_rows = 0;
  // Bytes per vector in the inverted lists: the code (FastScan: M / 2
  // rounded up; 8-bit PQ: M) plus its 8-byte id.
  int64_t list_bytes_per_vector = 0;
  // Centroids per PQ sub-quantizer (16 for 4-bit FastScan, 256 for 8-bit):
  // FAISS trains the PQ on at most 256 residuals per centroid.
  int pq_centroids = 16;
  bool cosine = false;   // normalised copies of the sample and batches
  bool own_ids = false;  // --ids: the ids are held, then sorted
  // --attributes: the columns read and the largest store image written
  // from them, before training (then freed); measured by the build.
  int64_t attribute_bytes = 0;
};

// The phases' heap bytes above the process's own (its code, libraries and
// their first allocations, measured before the input is opened).
struct BuildMemoryModel {
  // The training sample, a normalised copy for cosine, and FAISS's
  // residuals of the rows the product quantizer trains on (at most 256 per
  // centroid: 4,096 rows for FastScan, 65,536 for 8-bit PQ).
  int64_t train_bytes = 0;
  // The inverted lists being filled (the codes the build must hold), the
  // batch read and the trained reference's sample rows, and normalised
  // copies of them for cosine.
  int64_t add_bytes = 0;
  // The lists, plus the id table's sort (16 bytes per row) with --ids.
  int64_t write_bytes = 0;
  // The attribute columns and their store's image (--attributes), written
  // and freed before training.
  int64_t attribute_bytes = 0;
  // The ids read with --ids (8 bytes per row), held through every phase.
  int64_t ids_bytes = 0;
  // Working buffers of every phase: OpenBLAS's GEMM buffer (32 MiB per
  // thread it runs; knnd runs it on one) and FAISS's coarse-assignment
  // blocks (4096 rows x 1024 centroids of floats, 16 MiB, within it).
  int64_t working_bytes = 0;
  // The largest phase (the working buffers counted with FAISS's phases:
  // train, add, write) plus the ids.
  int64_t PeakBytes() const;
};

// FAISS grows an inverted list to the next power of two of its bytes (and
// its ids as std::vector does), so the lists hold between 1 and 2 times
// their content: `list_growth` is that factor. The model before a build
// takes kExpectedListGrowth (lists of sizes spread evenly over the
// powers-of-two intervals, 1 / ln 2); after adding, the build knows the
// lists' real bytes and passes their ratio to the content.
inline constexpr double kExpectedListGrowth = 1.4427;
inline constexpr int64_t kBuildWorkingBytes = int64_t{32} << 20;
BuildMemoryModel ModelBuildMemory(const BuildShape& shape,
                                  double list_growth = kExpectedListGrowth);

// "train 150.0 MiB, add 420.3 MiB, write 380.1 MiB (+ ids 38.1 MiB)
// + working 32.0 MiB".
std::string DescribeBuildMemory(const BuildMemoryModel& model);

}  // namespace knnd

#endif  // KNND_INDEX_BUILD_MEMORY_H_
