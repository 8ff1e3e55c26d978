#include "knnd/index/build_memory.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "knnd/base/units.h"
#include "knnd/index/update_drift.h"

namespace knnd {

int64_t BuildMemoryModel::PeakBytes() const {
  // The attributes are written before FAISS or OpenBLAS allocate anything.
  return std::max(attribute_bytes,
                  std::max({train_bytes, add_bytes, write_bytes}) +
                      working_bytes) +
         ids_bytes;
}

BuildMemoryModel ModelBuildMemory(const BuildShape& shape, double list_growth) {
  const int64_t row_bytes = int64_t{shape.dim} * int64_t{sizeof(float)};
  const int64_t copies = shape.cosine ? 2 : 1;
  const int64_t batch_rows = std::min(shape.add_batch_rows, shape.rows);
  const int64_t lists =
      static_cast<int64_t>(list_growth * static_cast<double>(shape.rows) *
                           static_cast<double>(shape.list_bytes_per_vector));
  BuildMemoryModel model;
  const int64_t pq_rows =
      std::min<int64_t>(shape.train_rows, int64_t{256} * shape.pq_centroids);
  model.train_bytes = (shape.cosine ? 2 : 1) * shape.train_rows * row_bytes +
                      pq_rows * row_bytes;
  // The trained reference's sample rows (update_drift.h) are held from
  // the first batch on, and copied once more to normalise them for cosine.
  const int64_t reference_rows = std::min(kDriftSampleRows, shape.rows);
  model.add_bytes = lists + copies * (batch_rows + reference_rows) * row_bytes;
  model.write_bytes = lists + (shape.own_ids ? 16 * shape.rows : 0);
  model.attribute_bytes = shape.attribute_bytes;
  model.ids_bytes = shape.own_ids ? 8 * shape.rows : 0;
  model.working_bytes = kBuildWorkingBytes;
  return model;
}

std::string DescribeBuildMemory(const BuildMemoryModel& model) {
  std::string out;
  if (model.attribute_bytes > 0) {
    out = absl::StrFormat("attributes %.1f MiB, ",
                          MiB(model.attribute_bytes));
  }
  absl::StrAppendFormat(&out, "train %.1f MiB, add %.1f MiB, write %.1f MiB",
                        MiB(model.train_bytes), MiB(model.add_bytes),
                        MiB(model.write_bytes));
  if (model.ids_bytes > 0) {
    absl::StrAppendFormat(&out, " (+ ids %.1f MiB)", MiB(model.ids_bytes));
  }
  absl::StrAppendFormat(&out, " + working %.1f MiB", MiB(model.working_bytes));
  return out;
}

}  // namespace knnd
