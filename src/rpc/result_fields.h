// The result columns of a SearchResponse (ids, distances, approx_distances)
// in either of their wire forms: the repeated fields, or the little-endian
// bytes fields (ids_i64le, distances_f32le, approx_distances_f32le) that a
// request asks for with results_as_bytes (proto/knnd/v1/knn_service.proto).
// Writers size a response once and fill plain arrays (the search job of
// knn_service.cc, the merge of shard_merge.cc); readers see one answer's
// columns whatever form each came in (shard_merge.cc).
//
// Thread-safety: functions over one message, owned by the caller.
#ifndef KNND_RPC_RESULT_FIELDS_H_
#define KNND_RPC_RESULT_FIELDS_H_

#include <cstdint>
#include <cstring>

#include "knnd/index/hybrid_fusion.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

// Where the results of one response are written, `entries` values each.
struct ResultBuffers {
  int64_t* ids = nullptr;
  float* distances = nullptr;
  float* approx_distances = nullptr;  // only when sized with candidates
};

// Sizes `response`'s result columns for `entries` values (ids -1,
// distances `pad`), with the approx_distances column too when `candidates`
// (also `pad`), as bytes fields when `as_bytes` and as repeated fields
// otherwise; the other form is left empty. The buffers are aligned for
// their type and stay valid until those fields of `response` change.
ResultBuffers ResizeResults(int64_t entries, bool candidates, bool as_bytes,
                            float pad, knnd::v1::SearchResponse* response);

// SearchResponse.fusion of a hybrid answer fused by `fusion`
// (FUSION_UNSPECIFIED for texts alone).
knnd::v1::FusionMethod FusionMethodOf(Fusion fusion);

// A read-only column of values, from a repeated field or from a bytes
// field (little-endian, any alignment: read with memcpy).
template <typename T>
class ResultColumn {
 public:
  ResultColumn(const char* data, size_t bytes)
      : data_(data),
        size_(bytes % sizeof(T) == 0 ? static_cast<int64_t>(bytes / sizeof(T))
                                     : -1) {}

  // Values in the column; -1 when a bytes field does not hold a whole
  // number of them (a count no answer is expected to have).
  int64_t size() const { return size_; }

  T operator[](int64_t i) const {
    T value;
    std::memcpy(&value, data_ + i * static_cast<int64_t>(sizeof(T)),
                sizeof(T));
    return value;
  }

 private:
  const char* data_;
  int64_t size_;
};

// The columns of one answer. Each is its bytes field when that is not
// empty, else its repeated field, so that an answer from a knnd that knows
// no bytes fields reads as one that sent them.
struct ResultColumns {
  ResultColumn<int64_t> ids;
  ResultColumn<float> distances;
  ResultColumn<float> approx_distances;
};
ResultColumns ReadResults(const knnd::v1::SearchResponse& response);

}  // namespace knnd

#endif  // KNND_RPC_RESULT_FIELDS_H_
