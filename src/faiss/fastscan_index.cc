#include "knnd/faiss/fastscan_index.h"

#include <malloc.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <faiss/IndexIVFPQ.h>
#include <faiss/IndexIVFPQFastScan.h>
#include <faiss/impl/io.h>
#include <faiss/index_io.h>
#include <faiss/invlists/BlockInvertedLists.h>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/fastscan_checks.h"
#include "knnd/faiss/fastscan_format.h"
#include "knnd/faiss/fastscan_writer.h"
#include "knnd/faiss/faiss_types.h"
#include "knnd/faiss/mapped_block_lists.h"

namespace knnd {
namespace {

using faiss_types::CatchFaiss;
using faiss_types::CorruptIndexFile;

// faiss::IOReader over bytes in memory (the mapped blob): FAISS reads the
// index straight from the mapping.
class SpanReader final : public faiss::IOReader {
 public:
  SpanReader(absl::Span<const uint8_t> bytes, std::string name)
      : bytes_(bytes) {
    this->name = std::move(name);
  }
  size_t operator()(void* ptr, size_t size, size_t nitems) override {
    if (size == 0 || nitems == 0) return 0;
    const size_t take = std::min((bytes_.size() - pos_) / size, nitems);
    std::memcpy(ptr, bytes_.data() + pos_, take * size);
    pos_ += take * size;
    return take;
  }
  size_t position() const { return pos_; }

 private:
  absl::Span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

absl::Status Mismatch(const std::string& path, absl::string_view field,
                      uint64_t header, uint64_t blob) {
  return CorruptIndexFile(path, absl::StrCat("its header says ", field, " ",
                                             header, " but its FAISS blob ",
                                             blob));
}

// The header's description of the index against the FAISS blob's.
absl::Status CheckHeaderAgainstBlob(const std::string& path,
                                    const FastScanHeader& h,
                                    const faiss::Index& root,
                                    const FastScanParts& parts) {
  const faiss::IndexIVFPQFastScan& ivf = *parts.ivf;
  if (h.nlist != ivf.nlist) return Mismatch(path, "nlist", h.nlist, ivf.nlist);
  if (h.code_size != ivf.code_size) {
    return Mismatch(path, "code_size", h.code_size, ivf.code_size);
  }
  if (h.ntotal != static_cast<uint64_t>(ivf.ntotal) ||
      root.ntotal != ivf.ntotal) {
    return Mismatch(path, "ntotal", h.ntotal, root.ntotal);
  }
  if (h.metric != static_cast<uint32_t>(ivf.metric_type)) {
    return Mismatch(path, "metric", h.metric, ivf.metric_type);
  }
  if (h.dim != static_cast<uint64_t>(root.d)) {
    return Mismatch(path, "dim", h.dim, root.d);
  }
  // The blob's own lists: empty placeholders (fastscan_format.h).
  const auto* empty =
      dynamic_cast<const faiss::BlockInvertedLists*>(ivf.invlists);
  bool all_empty = empty != nullptr && empty->nlist == ivf.nlist;
  for (size_t l = 0; all_empty && l < empty->nlist; ++l) {
    all_empty = empty->ids[l].empty() && empty->codes[l].size() == 0;
  }
  if (!all_empty) {
    return CorruptIndexFile(
        path, absl::StrCat("its FAISS blob holds inverted lists of type ",
                           faiss_types::TypeOf(ivf.invlists),
                           ", expected nlist empty BlockInvertedLists"));
  }
  return absl::OkStatus();
}

}  // namespace

FastScanIndex::~FastScanIndex() {
  searcher_.reset();
  index_.reset();  // deletes the MappedBlockLists before the mapping goes
  file_.reset();
}

absl::StatusOr<std::unique_ptr<FastScanIndex>> FastScanIndex::Open(
    const std::string& path) {
  absl::StatusOr<std::unique_ptr<MappedFile>> mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  std::shared_ptr<const MappedFile> file(std::move(*mapped));
  absl::StatusOr<FastScanLayout> layout =
      ParseFastScanLayout(file->bytes(), path);
  if (!layout.ok()) return layout.status();
  const FastScanHeader& h = layout->header;

  std::unique_ptr<FastScanIndex> out(new FastScanIndex());
  out->file_ = file;
  absl::Status s = CatchFaiss(
      absl::StatusCode::kDataLoss,
      absl::StrCat("index file ", path, " is corrupt: its FAISS blob"), [&] {
        SpanReader reader(layout->blob, path);
        out->index_.reset(faiss::read_index(&reader, 0));
        if (reader.position() != layout->blob.size()) {
          return CorruptIndexFile(
              path, absl::StrCat("its FAISS blob has ",
                                 layout->blob.size() - reader.position(),
                                 " bytes after the index"));
        }
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  FastScanParts parts;
  if (std::string why = CheckFastScanIndex(*out->index_, parts);
      !why.empty()) {
    return CorruptIndexFile(path, absl::StrCat("its FAISS blob: ", why));
  }
  if (s = CheckHeaderAgainstBlob(path, h, *out->index_, parts); !s.ok()) {
    return s;
  }
  // The index was just read and is not shared yet: the only place it is
  // modified, besides BuildPrecomputedTable().
  out->ivf_ = const_cast<faiss::IndexIVFPQFastScan*>(parts.ivf);
  faiss::IndexIVFPQFastScan& ivf = *out->ivf_;

  std::vector<MappedBlockLists::List> lists(h.nlist);
  for (size_t l = 0; l < h.nlist; ++l) {
    const FastScanListEntry& e = layout->lists[l];
    lists[l].n = e.n;
    if (e.n == 0) continue;
    lists[l].codes = file->data() + e.codes_offset;
    lists[l].ids =
        reinterpret_cast<const faiss::Index::idx_t*>(file->data() + e.ids_offset);
  }
  IndexFacts& facts = out->facts_;
  s = CatchFaiss(absl::StatusCode::kInternal,
                 absl::StrCat("installing the lists of index file ", path),
                 [&] {
                   ivf.replace_invlists(
                       new MappedBlockLists(ivf.code_size, std::move(lists),
                                            file),
                       /*own=*/true);
                   // FAISS 1.7.3's reader built the precomputed table for
                   // any L2 quantizer; it waits for BuildPrecomputedTable()
                   // (-1: none, residual tables per query meanwhile).
                   facts.read_peak_extra_bytes = static_cast<int64_t>(
                       ivf.precomputed_table.size() * sizeof(float));
                   ivf.precomputed_table.resize(0);
                   ivf.use_precomputed_table = -1;
                 });
  if (!s.ok()) return s;
  if (facts.read_peak_extra_bytes > 0) malloc_trim(0);

  absl::StatusOr<std::unique_ptr<FastScanSearcher>> searcher =
      FastScanSearcher::Create(out->index_.get(), path);
  if (!searcher.ok()) return searcher.status();
  out->searcher_ = std::move(*searcher);

  const faiss::ProductQuantizer& pq = ivf.pq;
  facts.path = path;
  facts.file_bytes = static_cast<int64_t>(h.file_bytes);
  facts.fastscan = true;
  facts.has_pretransform = parts.layers.pre != nullptr;
  facts.dim = out->index_->d;
  facts.ivf_dim = ivf.d;
  facts.metric = ivf.metric_type == faiss::METRIC_L2 ? Metric::kL2
                                                     : Metric::kInnerProduct;
  facts.ntotal = ivf.ntotal;
  facts.nlist = static_cast<int64_t>(ivf.nlist);
  facts.pq_m = static_cast<int>(pq.M);
  facts.pq_nbits = static_cast<int>(pq.nbits);
  facts.code_size_bytes = static_cast<int64_t>(ivf.code_size);
  facts.by_residual = ivf.by_residual;
  facts.stored_nprobe = static_cast<int>(std::max<size_t>(1, ivf.nprobe));
  facts.heap_bytes =
      parts.layers.transform_heap_bytes + faiss_types::IvfHeapBytes(ivf) +
      static_cast<int64_t>(pq.centroids.size() * sizeof(float));
  facts.mapped_list_bytes = static_cast<int64_t>(h.lists_bytes);
  facts.index_type =
      absl::StrCat(parts.layers.prefix, faiss_types::DescribeIvf(ivf), ",PQ",
                   pq.M, "x4fs", ivf.by_residual ? "r" : "");
  return out;
}

int64_t FastScanIndex::PlannedTableBytes() const {
  if (!ivf_->by_residual || ivf_->quantizer->metric_type != faiss::METRIC_L2) {
    return 0;
  }
  const int64_t bytes = PrecomputedTableBytes(
      facts_.nlist, facts_.pq_m, facts_.pq_nbits);
  if (bytes > static_cast<int64_t>(faiss::precomputed_table_max_bytes)) {
    return 0;
  }
  return bytes;
}

absl::Status FastScanIndex::BuildPrecomputedTable() {
  if (PlannedTableBytes() == 0) return absl::OkStatus();
  absl::Status s = CatchFaiss(
      absl::StatusCode::kResourceExhausted,
      absl::StrCat("cannot build the precomputed table of index file ",
                   facts_.path),
      [&] {
        ivf_->use_precomputed_table = 0;  // FAISS chooses the table type
        ivf_->precompute_table();
      });
  if (!s.ok()) return s;
  facts_.precomputed_table_bytes =
      static_cast<int64_t>(ivf_->precomputed_table.size() * sizeof(float));
  facts_.heap_bytes += facts_.precomputed_table_bytes;
  return absl::OkStatus();
}

absl::Status FastScanIndex::SearchUnpadded(const SearchArgs& args) const {
  return searcher_->Search(args);
}

absl::Status FastScanIndex::WritePart(const std::string& path,
                                      int64_t first_id, int64_t end_id) const {
  return WriteFastScanFilePart(*index_, path, IdRange{first_id, end_id});
}

std::unique_ptr<const FilteredLists> FastScanIndex::FilterLists(
    const RowBitmap& rows, int64_t first) const {
  return FilteredLists::Build(*ivf_->invlists, ivf_->M2, rows, first);
}

}  // namespace knnd
