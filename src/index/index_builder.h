// Building IVF-PQ index files that knnd can serve: choosing defaults from
// the data's shape, training on a sample, adding in batches, and writing the
// file and its metadata sidecar so that a reader never sees half a file;
// and converting a FastScan file written by FAISS into knnd's mappable
// FastScan layout the same way. The FAISS half (factory, training, writing)
// is faiss/faiss_builder.h.
//
// Thread-safety: the free functions are pure. An IndexBuilder is used by one
// thread at a time (FAISS itself may use all cores inside Train and Add).
#ifndef KNND_INDEX_INDEX_BUILDER_H_
#define KNND_INDEX_INDEX_BUILDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "knnd/faiss/faiss_builder.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/index/index_sharding.h"
#include "knnd/v1/index_metadata.pb.h"

namespace knnd {

// nlist about 4 * sqrt(rows), rounded to a power of two, and at most
// rows / 39 (FAISS's minimum of 39 training points per centroid), at least 1.
int64_t DefaultNlist(int64_t rows);

// The largest divisor M of dim with M <= 64 whose sub-vector width dim / M
// is 4, 8, 12 or at least 16: FAISS 1.7.3 computes 8-bit PQ distance tables
// with SIMD kernels for those widths (BLAS from 16) and a slow reference
// loop for every other one. On Fashion-MNIST (784 dims) that is M 49 (16
// wide) instead of 56 (14 wide): 4,260 against 1,900 queries/s at the same
// recall with re-ranking (1 thread, bench/RESULTS.md). 64 bytes per vector
// at most bounds the codes and the precomputed table (nlist * M * 256 * 4).
int DefaultPqM(int dim);

// The default recipe's nlist: sqrt(rows) rounded to the nearer power of
// two, at most rows / 39, at least 1. A 4-bit FastScan list is scanned 32
// codes per SIMD block, so fewer, longer lists than DefaultNlist's cost
// little per probe and the coarse search is cheaper; on Fashion-MNIST
// (60,000 rows) it is 256 lists (bench/RESULTS.md, "Default recipe").
int64_t DefaultFastScanNlist(int64_t rows);

// The default recipe's M (4-bit sub-quantizers, M / 2 bytes per vector):
// dim / w for the first width w of 4, 2, 3 that divides dim and leaves at
// least kMinFastScanM sub-vectors, else dim (1 dim each): sub-vectors at
// most 4 dims wide, and for low dimensions, where 16 centroids per
// sub-vector lose more, at least kMinFastScanM of them (48 bytes per
// vector). 3-dim sub-vectors come last: FAISS has no fast distance-table
// kernel for them (M 128 of 3 dims on the 384-dim set searched at
// 0.38x-0.54x the speed of M 96 of 4 dims). Measured with exact re-ranking
// (bench/RESULTS.md, "Default recipe" and "Sub-quantizers for 128 dims"):
// on Fashion-MNIST (784 dims) M 196 (4 dims) reached recall@10 0.98
// faster than M 98 (8 dims) and far faster than M 49 (16 dims); on its
// 128-dim PCA projection, and on a synthetic 128-dim set, M 128 (1 dim)
// reached 0.98 1.13x-1.20x faster than M 64 (2 dims), and M 32 (4 dims)
// stopped below 0.93; on the 384-dim set M 96 (4 dims) matched M 192
// (2 dims) one query at a time and was 1.10x faster in batches.
// 784 -> 196, 768 -> 192, 384 -> 96, 300 -> 150, 256 -> 128, 192 -> 96,
// and below 192 -> dim (128 -> 128).
inline constexpr int kMaxFastScanWidth = 4;
inline constexpr int kMinFastScanM = 96;
int DefaultFastScanM(int dim);

// Rows to train on: all rows up to max(50 * nlist, 65536). FAISS's k-means
// samples 256 points per centroid at most and the PQ 65536, so more rows
// cost memory and time without improving the quantizers.
int64_t DefaultTrainRows(int64_t rows, int64_t nlist);

// nprobe written into the file as the daemon's default: nlist / 32, at
// least 1. `knnctl eval` measures which nprobe reaches a target recall.
int DefaultNprobe(int64_t nlist);

class IndexBuilder {
 public:
  struct Options {
    int dim = 0;
    // kCosine: vectors are L2-normalised (copies, batch by batch) and the
    // index uses inner product; the sidecar records it.
    Metric metric = Metric::kL2;
    // FAISS factory string; must describe an IVF-PQ index ("IVF1024,PQ32")
    // or an IVF-PQ FastScan index ("IVF256,PQ98x4fs", written in knnd's
    // FastScan layout), optionally behind a pre-transform such as OPQ (what
    // IndexSnapshot can memory-map).
    std::string factory;
    // Seed of FAISS's k-means (coarse quantizer and PQ).
    uint32_t seed = 1234;
  };

  // Builds the empty index. INVALID_ARGUMENT, saying why, for a factory
  // string FAISS cannot parse or whose index knnd cannot memory-map
  // (IVF-Flat/SQ, refinement, non-IVF indexes, ID maps, FastScan with
  // blocks of other than 32 vectors).
  static absl::StatusOr<std::unique_ptr<IndexBuilder>> Create(
      const Options& options);

  ~IndexBuilder();
  IndexBuilder(const IndexBuilder&) = delete;
  IndexBuilder& operator=(const IndexBuilder&) = delete;

  int64_t nlist() const;
  int pq_m() const;
  int pq_nbits() const;
  int64_t ntotal() const;
  // Bytes per vector in the inverted lists (code and id), and the heap
  // bytes they hold now (FaissBuilder's).
  int64_t list_bytes_per_vector() const;
  int64_t HeldListBytes() const;

  // Trains the coarse quantizer, any pre-transform and the product quantizer
  // on `rows` vectors (row-major, dim floats each). Call once, before Add.
  absl::Status Train(const float* vectors, int64_t rows);

  // Adds one batch; `ids` (rows entries) or null for sequential ids that
  // continue from ntotal(). The caller bounds memory by the batch size.
  absl::Status Add(const float* vectors, int64_t rows, const int64_t* ids);

  // The vectors in each list (after Add).
  std::vector<int64_t> ListSizes() const;
  // The quantization error of `rows` vectors (normalised here for cosine)
  // under the trained quantizers: knnctl build's trained reference
  // (update_drift.h).
  absl::StatusOr<QuantizationError> MeasureError(const float* vectors,
                                                 int64_t rows) const;

  // Writes the index to `path` with `nprobe` as its stored default: first to
  // a temporary file in the same directory, which must load in
  // IndexSnapshot (the daemon's own checks), then renamed over `path`, so a
  // failed or killed build never replaces a good file and a mapped file is
  // never rewritten in place. Then writes the sidecar, completed with the
  // file's dim, metric, ntotal, size and CRC-32, likewise. Between the two
  // renames a loader sees a checksum mismatch and refuses the file; it
  // never serves a file with another file's metadata.
  absl::Status Write(const std::string& path, int nprobe,
                     knnd::v1::IndexMetadata metadata) const;

  // Writes one shard of the index as Write() does (docs/sharding.md): the
  // vectors whose ids lie in [shard.first_id, shard.end_id), sharing this
  // index's quantizers, with the shard's fields and `build_id` in its
  // sidecar. INVALID_ARGUMENT for an 8-bit IVF-PQ index: only FastScan
  // indexes split.
  absl::Status WriteShard(const std::string& path, int nprobe,
                          const ShardSpec& shard, const std::string& build_id,
                          knnd::v1::IndexMetadata metadata) const;

 private:
  IndexBuilder(const Options& options, std::unique_ptr<FaissBuilder> faiss);

  // A copy of `vectors` L2-normalised for metric cosine; empty otherwise.
  std::vector<float> NormalizedCopy(const float* vectors, int64_t rows) const;

  Options options_;
  std::unique_ptr<FaissBuilder> faiss_;
};

// Checks that the index file `tmp` loads in IndexSnapshot (the daemon's
// own checks), completes `metadata` from it (dim, ntotal, size, CRC-32; the
// metric and factory when the caller left them empty), renames `tmp` over
// `path`, writes the sidecar beside it and then seals the version
// (storage/version_manifest.h: the manifest binds the index, the sidecar
// and the companions already beside `path`): how every writer here
// (build, shard, convert, update) commits an index file. `tmp` is removed
// on failure, so a failed write never replaces a good file.
absl::Status CommitIndexFile(const std::string& tmp, const std::string& path,
                             knnd::v1::IndexMetadata metadata);

// Converts `faiss_path`, an IVF-PQ FastScan index written by FAISS
// (faiss.write_index, e.g. from Python), into knnd's mappable FastScan
// layout at `out_path` (the work behind `knnctl convert`), as
// IndexBuilder::Write writes: to a temporary file that must load in
// IndexSnapshot, then renamed over `out_path`, then the sidecar.
// `metadata` holds what the FAISS file cannot say: metric "cosine" when its
// vectors were L2-normalised (the file says inner product), source (default
// `faiss_path`), created, built_by; dim, ntotal, size, CRC-32 and, when
// empty, the metric and factory (the index type) are filled in.
// INVALID_ARGUMENT naming `faiss_path` when it is not a FastScan index knnd
// serves, or when the metric given does not fit the file's.
// Splits the knnd FastScan index file `index_path` (the work behind
// `knnctl shard`) into `shards` shards by id ranges (PlanShards), written
// to ShardPath(out_path, s, shards) as IndexBuilder::WriteShard writes,
// each with the source's sidecar fields (its tuning included: the shards
// of a set probe the same lists, so their merged answer is the source's)
// plus the shard's, a new build id and `built_by`, and, when the source
// has a raw-vectors file, a vectors file of the shard's rows
// (first_id .. end_id - 1), written before its index; likewise the slice
// of its id table when it has one (own ids: the ranges are of rows) and of
// its attribute store. INVALID_ARGUMENT for
// an 8-bit IVF-PQ file, a file that is already a shard, or a split the ids
// do not allow; the source's own errors (missing, corrupt, checksum) as
// IndexSnapshot::Load reports them.
absl::StatusOr<std::vector<ShardSpec>> ShardIndexFile(
    const std::string& index_path, int shards, const std::string& out_path,
    const std::string& built_by);

absl::Status ConvertFastScanFile(const std::string& faiss_path,
                                 const std::string& out_path,
                                 knnd::v1::IndexMetadata metadata = {});

}  // namespace knnd

#endif  // KNND_INDEX_INDEX_BUILDER_H_
