#include "knnd/faiss/faiss_builder.h"

#include <algorithm>

#include <faiss/IndexIVFPQ.h>
#include <faiss/IndexIVFPQFastScan.h>
#include <faiss/IndexPreTransform.h>
#include <faiss/index_factory.h>
#include <faiss/index_io.h>
#include <faiss/invlists/BlockInvertedLists.h>
#include <faiss/invlists/InvertedLists.h>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/faiss_types.h"
#include "knnd/faiss/fastscan_checks.h"
#include "knnd/faiss/fastscan_writer.h"
#include "knnd/faiss/quantization_error.h"

namespace knnd {

using faiss_types::CatchFaiss;

struct FaissBuilder::Objects {
  std::unique_ptr<faiss::Index> root;
  faiss::IndexIVF* ivf = nullptr;           // owned by root
  faiss::ProductQuantizer* pq = nullptr;    // owned by ivf
  bool fastscan = false;  // an IndexIVFPQFastScan, written in knnd's layout
};

FaissBuilder::FaissBuilder(std::unique_ptr<Objects> objects)
    : objects_(std::move(objects)) {}

FaissBuilder::~FaissBuilder() = default;

absl::StatusOr<std::unique_ptr<FaissBuilder>> FaissBuilder::Create(
    int dim, const std::string& factory, Metric metric, uint32_t seed) {
  auto objects = std::make_unique<Objects>();
  const faiss::MetricType faiss_metric =
      metric == Metric::kL2 ? faiss::METRIC_L2 : faiss::METRIC_INNER_PRODUCT;
  if (absl::Status s = CatchFaiss(
          absl::StatusCode::kInvalidArgument,
          absl::StrCat("factory '", factory, "' for dim=", dim,
                       " is not valid"),
          [&] {
            objects->root.reset(
                faiss::index_factory(dim, factory.c_str(), faiss_metric));
          });
      !s.ok()) {
    return s;
  }
  faiss::Index* inner = objects->root.get();
  if (auto* pre = dynamic_cast<faiss::IndexPreTransform*>(inner)) {
    inner = pre->index;
  }
  if (std::string why = faiss_types::WhyNotServable(*inner); !why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "factory '", factory, "' makes a ", faiss_types::TypeOf(inner),
        ", which knnd cannot serve: ", why));
  }
  if (auto* fastscan = dynamic_cast<faiss::IndexIVFPQFastScan*>(inner)) {
    objects->ivf = fastscan;
    objects->pq = &fastscan->pq;
    objects->fastscan = true;
  } else {
    auto* ivfpq = static_cast<faiss::IndexIVFPQ*>(inner);
    objects->ivf = ivfpq;
    objects->pq = &ivfpq->pq;
    // index_factory turns on polysemous training (a PQ centroid reordering
    // for Hamming-distance filtering, which knnd never uses); with M=56 on
    // Fashion-MNIST it took over 10 minutes of a 20-second build.
    ivfpq->do_polysemous_training = false;
  }
  objects->ivf->cp.seed = static_cast<int>(seed);
  objects->pq->cp.seed = static_cast<int>(seed);
  return std::unique_ptr<FaissBuilder>(new FaissBuilder(std::move(objects)));
}

int64_t FaissBuilder::nlist() const {
  return static_cast<int64_t>(objects_->ivf->nlist);
}

int FaissBuilder::pq_m() const { return static_cast<int>(objects_->pq->M); }

int FaissBuilder::pq_nbits() const {
  return static_cast<int>(objects_->pq->nbits);
}

int64_t FaissBuilder::ntotal() const { return objects_->root->ntotal; }

int64_t FaissBuilder::list_bytes_per_vector() const {
  return static_cast<int64_t>(objects_->ivf->code_size + sizeof(int64_t));
}

std::vector<int64_t> FaissBuilder::ListSizes() const {
  const faiss::InvertedLists* lists = objects_->ivf->invlists;
  std::vector<int64_t> sizes(lists->nlist);
  for (size_t l = 0; l < lists->nlist; ++l) {
    sizes[l] = static_cast<int64_t>(lists->list_size(l));
  }
  return sizes;
}

absl::StatusOr<QuantizationError> FaissBuilder::MeasureError(
    const float* vectors, int64_t rows) const {
  return MeasureQuantizationError(*objects_->root, vectors, rows);
}

int64_t FaissBuilder::HeldListBytes() const {
  const faiss::InvertedLists* lists = objects_->ivf->invlists;
  size_t bytes = 0;
  if (const auto* block =
          dynamic_cast<const faiss::BlockInvertedLists*>(lists)) {
    for (size_t l = 0; l < block->nlist; ++l) {
      bytes += block->codes[l].tab.numel +
               block->ids[l].capacity() * sizeof(faiss::Index::idx_t);
    }
  } else if (const auto* array =
                 dynamic_cast<const faiss::ArrayInvertedLists*>(lists)) {
    for (size_t l = 0; l < array->nlist; ++l) {
      bytes += array->codes[l].capacity() +
               array->ids[l].capacity() * sizeof(faiss::Index::idx_t);
    }
  }
  return static_cast<int64_t>(bytes);
}

absl::Status FaissBuilder::Train(const float* vectors, int64_t rows) {
  return CatchFaiss(absl::StatusCode::kInvalidArgument,
                    absl::StrCat("training on ", rows, " rows failed"),
                    [&] { objects_->root->train(rows, vectors); });
}

absl::Status FaissBuilder::Add(const float* vectors, int64_t rows,
                               const int64_t* ids) {
  return CatchFaiss(absl::StatusCode::kInternal,
                    absl::StrCat("adding ", rows, " rows failed"), [&] {
                      if (ids != nullptr) {
                        objects_->root->add_with_ids(rows, vectors, ids);
                      } else {
                        objects_->root->add(rows, vectors);
                      }
                    });
}

absl::Status FaissBuilder::WriteTo(const std::string& path, int nprobe) const {
  // The builder owns this index alone; no search shares its nprobe.
  objects_->ivf->nprobe = static_cast<size_t>(std::max(1, nprobe));
  if (objects_->fastscan) return WriteFastScanFile(*objects_->root, path);
  return CatchFaiss(absl::StatusCode::kPermissionDenied,
                    absl::StrCat("cannot write ", path), [&] {
                      faiss::write_index(objects_->root.get(), path.c_str());
                    });
}

absl::Status FaissBuilder::WritePartTo(const std::string& path, int nprobe,
                                       int64_t first_id,
                                       int64_t end_id) const {
  if (!objects_->fastscan) {
    return absl::InvalidArgumentError(
        "only FastScan indexes (--recipe fastscan, the default) are split "
        "into shards; this one is 8-bit IVF-PQ");
  }
  objects_->ivf->nprobe = static_cast<size_t>(std::max(1, nprobe));
  return WriteFastScanFilePart(*objects_->root, path,
                               IdRange{first_id, end_id});
}

absl::Status ConvertFaissFileToFastScan(const std::string& faiss_path,
                                        const std::string& out_path) {
  int64_t file_bytes = 0;
  if (absl::Status s = faiss_types::StatIndexFile(faiss_path, file_bytes);
      !s.ok()) {
    return s;
  }
  std::unique_ptr<faiss::Index> index;
  absl::Status read = CatchFaiss(
      absl::StatusCode::kInvalidArgument,
      absl::StrCat("cannot read FAISS index file ", faiss_path), [&] {
        index.reset(faiss::read_index(faiss_path.c_str()));
      });
  if (!read.ok()) return read;
  FastScanParts parts;
  if (std::string why = CheckFastScanIndex(*index, parts); !why.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FAISS index file ", faiss_path,
                     " is not an IVF-PQ FastScan index knnd serves: ", why));
  }
  return WriteFastScanFile(*index, out_path);
}

}  // namespace knnd
