// What knnctl build writes beside the index as the rows pass (the vectors
// files), before training (payloads, attribute stores) and with the index
// (the id table), for the whole index or each shard of --shards; and the
// line build and shard print per shard. Shared by build.cc and shard.cc.
//
// Thread-safety: knnctl's commands run on one thread.
#ifndef KNND_TOOLS_KNNCTL_BUILD_OUTPUTS_H_
#define KNND_TOOLS_KNNCTL_BUILD_OUTPUTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/optional.h"
#include "knnd/base/metric.h"
#include "knnd/index/index_sharding.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/text/text_index_writer.h"

namespace knnd::knnctl {

// knnctl build's flags.
struct BuildOptions {
  std::string input;
  std::string output;
  std::string metric = "l2";
  std::string factory;
  std::string recipe = "fastscan";
  int64_t nlist = 0;
  int m = 0;
  int64_t train_size = 0;
  std::string ids;
  std::string payloads;
  std::string attributes;
  // --attribute_fields F1,F2 (as given, and split): the attributes are
  // these fields of --payloads.
  std::string attribute_fields_list;
  std::vector<std::string> attribute_fields;
  int64_t add_batch = 65536;
  uint32_t seed = 1234;
  int stored_nprobe = 0;
  // Unset: kept.
  absl::optional<bool> keep_vectors;
  std::string vectors_dtype = "f32";
  int threads = 0;
  int shards = 0;
  // --text FIELD: a BM25 text index of this payload field, from
  // --payloads or (--text_file) a text file's lines.
  std::string text;
  std::string text_file;
  std::string text_stemmer;
  double bm25_k1 = 1.2;
  double bm25_b = 0.75;
};

// The directory of `path`, with its trailing slash ("." for a bare name).
std::string DirectoryOf(const std::string& path);

// Removes the temporary and staging files of `index_path` that runs
// killed before they finished left beside it (RemoveStaleTemporaries:
// only names INDEX[.suffix].tmp.PID[...] whose process is gone), printing
// each path: a build killed by SIGKILL leaves up to its input's size.
void RemoveKilledRunsFiles(const std::string& index_path);

// The staging name a run writes its version under
// (storage/version_manifest.h) before it commits it as its output. Made
// by BeginStaging(), which first removes what killed runs left for the
// output (RemoveKilledRunsFiles); the destructor removes the staging files
// of a run that returned without committing, so a failed build or update
// leaves the output as it was.
class StagingGuard {
 public:
  explicit StagingGuard(std::string staged) : staged_(std::move(staged)) {}
  ~StagingGuard();
  StagingGuard(const StagingGuard&) = delete;
  StagingGuard& operator=(const StagingGuard&) = delete;
  const std::string& path() const { return staged_; }

 private:
  const std::string staged_;
};
std::unique_ptr<StagingGuard> BeginStaging(const std::string& output);

// Commits the sealed version at `staged` as `output`
// (CommitStagedVersion), printing the files of the previous version it
// removed because the new one has none of their kind.
absl::Status CommitStaged(const std::string& staged, const std::string& output);

// Writes the rows streamed through it (L2-normalised for cosine, as the
// index holds them) to the vectors files of consecutive row ranges: one
// for the whole index, or one per shard. Each file is opened when its
// first row arrives and finished (renamed into place) after its last.
class VectorsSink {
 public:
  struct Part {
    std::string path;
    int64_t end_row = 0;  // the part holds rows up to here
  };
  VectorsSink(std::vector<Part> parts, int dim, Metric metric,
              VectorsDtype dtype)
      : parts_(std::move(parts)), dim_(dim), metric_(metric), dtype_(dtype) {}

  absl::Status Append(const float* rows, int64_t n) {
    if (metric_ == Metric::kCosine) {
      normalized_.assign(rows, rows + n * dim_);
      NormalizeRows(normalized_.data(), n, dim_);
      rows = normalized_.data();
    }
    while (n > 0) {
      if (writer_ == nullptr) {
        absl::StatusOr<std::unique_ptr<VectorsFileWriter>> writer =
            VectorsFileWriter::Create(parts_[part_].path, dim_, dtype_);
        if (!writer.ok()) return writer.status();
        writer_ = std::move(*writer);
      }
      const int64_t take = std::min(n, parts_[part_].end_row - next_row_);
      if (absl::Status s = writer_->Append(rows, take); !s.ok()) return s;
      rows += take * dim_;
      n -= take;
      next_row_ += take;
      if (next_row_ == parts_[part_].end_row) {
        if (absl::Status s = writer_->Finish(); !s.ok()) return s;
        writer_.reset();
        ++part_;
      }
    }
    return absl::OkStatus();
  }

 private:
  const std::vector<Part> parts_;
  const int dim_;
  const Metric metric_;
  const VectorsDtype dtype_;
  size_t part_ = 0;
  int64_t next_row_ = 0;
  std::unique_ptr<VectorsFileWriter> writer_;
  std::vector<float> normalized_;
};

// The line build --shards and shard print for each shard written: its
// file, part and size, and whether its vectors file and id table are
// beside it (with an id table the part is a range of rows).
void PrintShardWritten(const std::string& path, const ShardSpec& shard);

// Writes the id table of rows [first, end) of `ids` beside `index_path`
// (own ids); nothing with row ids.
absl::Status WriteIdTableSlice(const std::string& index_path,
                               const std::vector<int64_t>& ids, int64_t first,
                               int64_t end, const std::string& source);

// Reads --attributes (JSON Lines, line i for row i) and writes its store
// beside the index or each shard (its rows' slice). Runs before training, like
// the payloads, so that a bad line fails the build at once and the columns are
// freed before the lists grow: returns the heap bytes the step holds at its
// peak (the "attributes" phase of the memory model), 0 without --attributes.
absl::StatusOr<int64_t> WriteAttributeStores(const BuildOptions& options,
                                             const std::vector<ShardSpec>& plan,
                                             int64_t rows,
                                             int* columns_written);

// Writes the payloads of --payloads (JSON Lines, line i for row i) beside
// the index or each shard (its rows' lines), read one line at a time. Runs
// before training, so that a bad line fails the build at once.
absl::Status WritePayloadStores(const BuildOptions& options,
                                const std::vector<ShardSpec>& plan,
                                int64_t rows);

// --text's field, --text_stemmer and --bm25_* as the text index takes them.
TextIndexOptions TextOptionsOf(const BuildOptions& options);
// With --text: INVALID_ARGUMENT naming a bad --bm25_k1/--bm25_b or an
// unknown --text_stemmer, checked before anything is read or trained.
absl::Status CheckTextOptions(const BuildOptions& options);

// With --text, the text index of the payload field beside the index or
// each shard (text/text_index_writer.h), read from the payloads
// WritePayloadStores() wrote, with the whole corpus's statistics.
absl::Status WriteTextStores(const BuildOptions& options,
                             const std::vector<ShardSpec>& plan, int64_t rows);

// The checks of the companions' flags (--payloads, --attributes,
// --attribute_fields, --text, --text_file, --text_stemmer, --bm25_*) that
// need no file read, made before anything is read or trained.
absl::Status CheckCompanionOptions(const BuildOptions& options);

// Writes the companions built before training beside the index or each
// shard of `plan`: the payloads (with --text_file, its lines joined to
// them as the field --text), the text index and the attribute store; sets
// `attribute_columns` and returns the attribute step's peak heap bytes
// (WriteAttributeStores()).
absl::StatusOr<int64_t> WriteCompanionStores(const BuildOptions& options,
                                             const std::vector<ShardSpec>& plan,
                                             int64_t rows,
                                             int* attribute_columns);

// The lines knnctl build prints for the companions it wrote beside a
// whole index: the vectors file, id table, payloads, text index and
// attribute store, each with its size.
void PrintCompanionsWritten(const BuildOptions& options, bool keep_vectors,
                            VectorsDtype dtype, int attribute_columns);

// The shards' row ranges with --shards (equal counts), else none.
absl::StatusOr<std::vector<ShardSpec>> PlanRowShards(int64_t rows, int shards);

// The vectors files the add loop writes: one per shard of `plan`, or one
// for the whole index; none without --keep_vectors.
std::vector<VectorsSink::Part> VectorsParts(const BuildOptions& options,
                                            const std::vector<ShardSpec>& plan,
                                            int64_t rows, bool keep_vectors);

}  // namespace knnd::knnctl

#endif  // KNND_TOOLS_KNNCTL_BUILD_OUTPUTS_H_
