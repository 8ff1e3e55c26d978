#include "knnd/index/index_builder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/serving_index.h"
#include "knnd/faiss/vector_math.h"
#include "knnd/storage/atomic_file.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/payload_file.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/storage/version_manifest.h"
#include "knnd/text/text_index_writer.h"

namespace knnd {
namespace {

int64_t FloorPowerOfTwo(int64_t x) {
  int64_t p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}

// The power of two nearer to `target` (rounded, not always down), at most
// rows / 39 (FAISS's minimum of training points per centroid), at least 1.
int64_t NlistNear(double target, int64_t rows) {
  int64_t nlist = FloorPowerOfTwo(std::max<int64_t>(1, std::llround(target)));
  if (target > 1.5 * static_cast<double>(nlist)) nlist *= 2;
  return std::max<int64_t>(
      1, std::min(nlist, FloorPowerOfTwo(std::max<int64_t>(1, rows / 39))));
}

}  // namespace

int64_t DefaultNlist(int64_t rows) {
  return NlistNear(4.0 * std::sqrt(static_cast<double>(rows)), rows);
}

int DefaultPqM(int dim) {
  for (int m = std::min(64, dim / 4); m > 1; --m) {
    const int width = dim / m;
    const bool fast = width == 4 || width == 8 || width == 12 || width >= 16;
    if (dim % m == 0 && fast) return m;
  }
  return 1;
}

int64_t DefaultFastScanNlist(int64_t rows) {
  return NlistNear(std::sqrt(static_cast<double>(rows)), rows);
}

int DefaultFastScanM(int dim) {
  // 4 and 2 first: sub-vectors of 3 dims have no fast distance tables.
  for (const int width : {kMaxFastScanWidth, 2, 3}) {
    if (dim % width == 0 && dim / width >= kMinFastScanM) return dim / width;
  }
  return std::max(1, dim);
}

int64_t DefaultTrainRows(int64_t rows, int64_t nlist) {
  return std::min(rows, std::max<int64_t>(50 * nlist, 65536));
}

int DefaultNprobe(int64_t nlist) {
  return static_cast<int>(std::max<int64_t>(1, nlist / 32));
}

IndexBuilder::IndexBuilder(const Options& options,
                           std::unique_ptr<FaissBuilder> faiss)
    : options_(options), faiss_(std::move(faiss)) {}

IndexBuilder::~IndexBuilder() = default;

absl::StatusOr<std::unique_ptr<IndexBuilder>> IndexBuilder::Create(
    const Options& options) {
  if (options.dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dim=", options.dim, " must be positive"));
  }
  // Cosine is inner product over the vectors normalised here.
  const Metric faiss_metric =
      options.metric == Metric::kL2 ? Metric::kL2 : Metric::kInnerProduct;
  absl::StatusOr<std::unique_ptr<FaissBuilder>> faiss = FaissBuilder::Create(
      options.dim, options.factory, faiss_metric, options.seed);
  if (!faiss.ok()) return faiss.status();
  return std::unique_ptr<IndexBuilder>(
      new IndexBuilder(options, std::move(*faiss)));
}

int64_t IndexBuilder::nlist() const { return faiss_->nlist(); }

int IndexBuilder::pq_m() const { return faiss_->pq_m(); }

int IndexBuilder::pq_nbits() const { return faiss_->pq_nbits(); }

int64_t IndexBuilder::ntotal() const { return faiss_->ntotal(); }

int64_t IndexBuilder::list_bytes_per_vector() const {
  return faiss_->list_bytes_per_vector();
}

int64_t IndexBuilder::HeldListBytes() const { return faiss_->HeldListBytes(); }

std::vector<float> IndexBuilder::NormalizedCopy(const float* vectors,
                                                int64_t rows) const {
  if (options_.metric != Metric::kCosine) return {};
  std::vector<float> copy(vectors, vectors + rows * options_.dim);
  NormalizeRows(copy.data(), rows, options_.dim);
  return copy;
}

absl::Status IndexBuilder::Train(const float* vectors, int64_t rows) {
  const std::vector<float> normalized = NormalizedCopy(vectors, rows);
  return faiss_->Train(normalized.empty() ? vectors : normalized.data(), rows);
}

absl::Status IndexBuilder::Add(const float* vectors, int64_t rows,
                               const int64_t* ids) {
  const std::vector<float> normalized = NormalizedCopy(vectors, rows);
  return faiss_->Add(normalized.empty() ? vectors : normalized.data(), rows,
                     ids);
}

std::vector<int64_t> IndexBuilder::ListSizes() const {
  return faiss_->ListSizes();
}

absl::StatusOr<QuantizationError> IndexBuilder::MeasureError(
    const float* vectors, int64_t rows) const {
  const std::vector<float> normalized = NormalizedCopy(vectors, rows);
  return faiss_->MeasureError(normalized.empty() ? vectors : normalized.data(),
                              rows);
}

absl::Status IndexBuilder::Write(const std::string& path, int nprobe,
                                 knnd::v1::IndexMetadata metadata) const {
  const std::string tmp = TempPathFor(path);
  if (absl::Status s = faiss_->WriteTo(tmp, nprobe); !s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  metadata.set_metric(MetricName(options_.metric));
  metadata.set_factory(options_.factory);
  return CommitIndexFile(tmp, path, std::move(metadata));
}

absl::Status IndexBuilder::WriteShard(const std::string& path, int nprobe,
                                      const ShardSpec& shard,
                                      const std::string& build_id,
                                      knnd::v1::IndexMetadata metadata) const {
  const std::string tmp = TempPathFor(path);
  if (absl::Status s =
          faiss_->WritePartTo(tmp, nprobe, shard.first_id, shard.end_id);
      !s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  metadata.set_metric(MetricName(options_.metric));
  metadata.set_factory(options_.factory);
  SetShardMetadata(shard, build_id, metadata);
  return CommitIndexFile(tmp, path, std::move(metadata));
}

namespace {

// Writes rows [first, end) of `vectors` to a new vectors file at `path`,
// in batches (bounded memory).
absl::Status WriteVectorRows(const VectorsFile& vectors, int64_t first,
                             int64_t end, const std::string& path) {
  absl::StatusOr<std::unique_ptr<VectorsFileWriter>> writer =
      VectorsFileWriter::Create(path, vectors.dim(), vectors.dtype());
  if (!writer.ok()) return writer.status();
  constexpr int64_t kBatch = 4096;
  const size_t dim = static_cast<size_t>(vectors.dim());
  std::vector<float> batch;
  std::vector<float> scratch(dim);
  for (int64_t begin = first; begin < end; begin += kBatch) {
    const int64_t n = std::min(kBatch, end - begin);
    batch.resize(static_cast<size_t>(n) * dim);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = vectors.RowAsFloats(begin + i, scratch.data());
      std::copy(row, row + dim, batch.data() + i * dim);
    }
    if (absl::Status s = (*writer)->Append(batch.data(), n); !s.ok()) {
      return s;
    }
  }
  return (*writer)->Finish();
}

}  // namespace

absl::Status CommitIndexFile(const std::string& tmp, const std::string& path,
                             knnd::v1::IndexMetadata metadata) {
  auto fail = [&tmp](absl::Status status) {
    std::remove(tmp.c_str());
    return status;
  };
  LoadOptions check;
  check.use_precomputed_table = false;
  check.probe_in_subprocess = false;
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> loaded =
      IndexSnapshot::Load(tmp, check);
  if (!loaded.ok()) {
    return fail(absl::InternalError(absl::StrCat(
        "the written index does not load in knnd, so ", path,
        " was left as it was: ", loaded.status().message())));
  }
  const IndexInfo& info = (*loaded)->info();
  if (metadata.metric().empty()) metadata.set_metric(MetricName(info.metric));
  absl::StatusOr<Metric> metric = ParseMetric(metadata.metric());
  if (!metric.ok()) return fail(metric.status());
  const Metric file_metric =
      *metric == Metric::kCosine ? Metric::kInnerProduct : *metric;
  if (file_metric != info.metric) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "metric ", metadata.metric(), " does not fit index ", path,
        ", whose FAISS metric is ", MetricName(info.metric))));
  }
  if (metadata.factory().empty()) metadata.set_factory(info.index_type);
  absl::StatusOr<std::string> crc = FileCrc32(tmp);
  if (!crc.ok()) return fail(crc.status());
  metadata.set_format_version(kIndexMetadataFormatVersion);
  metadata.set_dim(static_cast<uint32_t>(info.dim));
  metadata.set_normalized(*metric == Metric::kCosine);
  metadata.set_ntotal(info.ntotal);
  metadata.set_file_bytes(info.file_bytes);
  metadata.set_crc32(*crc);
  loaded->reset();
  if (absl::Status s = CommitTempFile(tmp, path); !s.ok()) return s;
  if (absl::Status s = WriteIndexMetadata(MetadataPath(path), metadata);
      !s.ok()) {
    return s;
  }
  // Last: the manifest binds the index, its sidecar and the companions
  // written before it into one version (storage/version_manifest.h).
  return SealVersion(path, metadata.built_by());
}


absl::StatusOr<std::vector<ShardSpec>> ShardIndexFile(
    const std::string& index_path, int shards, const std::string& out_path,
    const std::string& built_by) {
  knnd::v1::IndexMetadata metadata;
  absl::StatusOr<knnd::v1::IndexMetadata> read =
      ReadIndexMetadata(MetadataPath(index_path));
  if (read.ok()) {
    metadata = *read;
    if (metadata.shard_count() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_path, " is already shard ", metadata.shard_id(), " of ",
          metadata.shard_count(), "; split the whole index instead"));
    }
  } else if (!absl::IsNotFound(read.status())) {
    return read.status();
  }
  // The daemon's own load: checksum, dim, count and metric against the
  // sidecar, and the raw-vectors file when there is one.
  LoadOptions load;
  load.use_precomputed_table = false;
  load.probe_in_subprocess = false;
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> source =
      IndexSnapshot::Load(index_path, load);
  if (!source.ok()) return source.status();
  const IndexInfo& info = (*source)->info();
  if (!info.vectors_error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the raw-vectors file of ", index_path,
                     " does not load: ", info.vectors_error));
  }
  absl::StatusOr<std::unique_ptr<ServingIndex>> faiss =
      ServingIndex::Open(index_path);
  if (!faiss.ok()) return faiss.status();
  const std::vector<int64_t> ids = (*faiss)->SortedIds();
  absl::StatusOr<std::vector<ShardSpec>> plan = PlanShards(ids, shards);
  if (!plan.ok()) return plan.status();
  // With own ids the lists hold rows, so the plan splits rows, and each
  // shard gets the ids of its rows.
  std::unique_ptr<IdTable> id_table;
  if (info.has_id_table) {
    absl::StatusOr<std::unique_ptr<IdTable>> opened = IdTable::Open(
        info.id_table_path, info.ntotal, /*verify_checksum=*/false);
    if (!opened.ok()) return opened.status();
    id_table = std::move(*opened);
  }
  std::unique_ptr<PayloadFile> payloads;
  if (info.has_payloads) {
    absl::StatusOr<std::unique_ptr<PayloadFile>> opened = PayloadFile::Open(
        info.payloads_path, info.ntotal, /*verify_checksum=*/false);
    if (!opened.ok()) return opened.status();
    payloads = std::move(*opened);
  }
  std::unique_ptr<VectorsFile> vectors;
  if (info.has_vectors) {
    absl::StatusOr<std::unique_ptr<VectorsFile>> opened = VectorsFile::Open(
        info.vectors_path, info.dim, info.ntotal, /*verify_checksum=*/false);
    if (!opened.ok()) return opened.status();
    vectors = std::move(*opened);
  }
  // A text index is cut from the whole corpus's, each shard's scored with
  // the whole corpus's statistics.
  if (const TextIndex* text = (*source)->text(); text != nullptr) {
    std::vector<TextIndexPart> parts;
    for (const ShardSpec& shard : *plan) {
      parts.push_back(
          {TextIndexPath(ShardPath(out_path, shard.shard_id, shards)),
           shard.end_id});
    }
    if (!parts.empty()) parts.back().end_row = info.ntotal;
    const PayloadFile* files[] = {payloads.get()};
    absl::StatusOr<TextCorpusSummary> written =
        WriteTextIndexes(files, OptionsOf(text->stats()), parts);
    if (!written.ok()) return written.status();
  } else {
    for (const ShardSpec& shard : *plan) {
      // Of an earlier split.
      std::remove(
          TextIndexPath(ShardPath(out_path, shard.shard_id, shards)).c_str());
    }
  }
  const std::string build_id = NewBuildId();
  metadata.clear_file_bytes();
  metadata.clear_crc32();
  metadata.set_built_by(built_by);
  for (const ShardSpec& shard : *plan) {
    const std::string path = ShardPath(out_path, shard.shard_id, shards);
    // Row i of the source's vectors holds list id i (knnctl build writes
    // them for lists of row numbers), so the shard's rows are its list ids.
    if (id_table != nullptr) {
      std::vector<int64_t> slice;
      for (int64_t row = shard.first_id; row < shard.end_id; ++row) {
        slice.push_back(id_table->IdOf(row));
      }
      if (absl::Status s =
              WriteIdTable(IdTablePath(path), slice, info.id_table_path);
          !s.ok()) {
        return s;
      }
    } else {
      std::remove(IdTablePath(path).c_str());  // of an earlier split
    }
    // Likewise the payloads: row i's is line i of the build's input.
    if (payloads != nullptr) {
      if (absl::Status s = WritePayloadRows(*payloads, shard.first_id,
                                            shard.end_id, PayloadPath(path));
          !s.ok()) {
        return s;
      }
    } else {
      std::remove(PayloadPath(path).c_str());  // of an earlier split
    }
    if (const AttributeStore* attributes = (*source)->attributes();
        attributes != nullptr) {
      if (absl::Status s = WriteAttributeStore(
              AttributeStorePath(path),
              attributes->Slice(shard.first_id, shard.end_id));
          !s.ok()) {
        return s;
      }
    } else {
      std::remove(AttributeStorePath(path).c_str());  // of an earlier split
    }
    if (vectors != nullptr) {
      if (absl::Status s = WriteVectorRows(*vectors, shard.first_id,
                                           shard.end_id, VectorsPath(path));
          !s.ok()) {
        return s;
      }
    } else {
      std::remove(VectorsPath(path).c_str());  // of an earlier split
    }
    const std::string tmp = TempPathFor(path);
    if (absl::Status s = (*faiss)->WritePart(tmp, shard.first_id, shard.end_id);
        !s.ok()) {
      std::remove(tmp.c_str());
      return s;
    }
    knnd::v1::IndexMetadata shard_metadata = metadata;
    if (shard_metadata.metric().empty()) {
      shard_metadata.set_metric(MetricName(info.metric));
    }
    SetShardMetadata(shard, build_id, shard_metadata);
    if (absl::Status s = CommitIndexFile(tmp, path, std::move(shard_metadata));
        !s.ok()) {
      return s;
    }
  }
  return plan;
}

absl::Status ConvertFastScanFile(const std::string& faiss_path,
                                 const std::string& out_path,
                                 knnd::v1::IndexMetadata metadata) {
  const std::string tmp = TempPathFor(out_path);
  if (absl::Status s = ConvertFaissFileToFastScan(faiss_path, tmp); !s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  if (metadata.source().empty()) metadata.set_source(faiss_path);
  return CommitIndexFile(tmp, out_path, std::move(metadata));
}

}  // namespace knnd
