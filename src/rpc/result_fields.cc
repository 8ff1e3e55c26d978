#include "knnd/rpc/result_fields.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/base/config.h"

// The bytes fields are little-endian; they are written and read here in
// the host's order.
#ifndef ABSL_IS_LITTLE_ENDIAN
#error "knnd's bytes result fields assume a little-endian host"
#endif

namespace knnd {
namespace {

using knnd::v1::SearchResponse;

template <typename T>
T* ResizeRepeated(google::protobuf::RepeatedField<T>* field, int64_t n,
                  T fill) {
  field->Resize(static_cast<int>(n), fill);
  return field->mutable_data();
}

// `bytes` resized to `n` values of `fill`; returns them.
template <typename T>
T* ResizeBytes(std::string* bytes, int64_t n, T fill) {
  const size_t size = static_cast<size_t>(n) * sizeof(T);
  bytes->resize(size);
  if (reinterpret_cast<uintptr_t>(bytes->data()) % alignof(T) != 0) {
    // Only a small-string buffer inside the string object can be
    // misaligned; growing the capacity moves the values to one from the
    // allocator (operator new), which is aligned for every scalar type.
    bytes->reserve(std::max(size, bytes->capacity() + 1));
  }
  T* values = reinterpret_cast<T*>(bytes->data());
  std::fill_n(values, n, fill);
  return values;
}

template <typename T>
ResultColumn<T> Column(const std::string& bytes,
                       const google::protobuf::RepeatedField<T>& repeated) {
  if (!bytes.empty()) return ResultColumn<T>(bytes.data(), bytes.size());
  return ResultColumn<T>(reinterpret_cast<const char*>(repeated.data()),
                         static_cast<size_t>(repeated.size()) * sizeof(T));
}

}  // namespace

ResultBuffers ResizeResults(int64_t entries, bool candidates, bool as_bytes,
                            float pad, SearchResponse* response) {
  ResultBuffers out;
  if (as_bytes) {
    out.ids = ResizeBytes<int64_t>(response->mutable_ids_i64le(), entries, -1);
    out.distances =
        ResizeBytes(response->mutable_distances_f32le(), entries, pad);
    if (candidates) {
      out.approx_distances = ResizeBytes(
          response->mutable_approx_distances_f32le(), entries, pad);
    }
  } else {
    out.ids = ResizeRepeated<int64_t>(response->mutable_ids(), entries, -1);
    out.distances = ResizeRepeated(response->mutable_distances(), entries, pad);
    if (candidates) {
      out.approx_distances =
          ResizeRepeated(response->mutable_approx_distances(), entries, pad);
    }
  }
  return out;
}

ResultColumns ReadResults(const SearchResponse& response) {
  return ResultColumns{
      Column(response.ids_i64le(), response.ids()),
      Column(response.distances_f32le(), response.distances()),
      Column(response.approx_distances_f32le(), response.approx_distances())};
}

knnd::v1::FusionMethod FusionMethodOf(Fusion fusion) {
  switch (fusion) {
    case Fusion::kRrf:
      return knnd::v1::FUSION_RRF;
    case Fusion::kWeighted:
      return knnd::v1::FUSION_WEIGHTED;
    case Fusion::kNone:
      break;
  }
  return knnd::v1::FUSION_UNSPECIFIED;
}

}  // namespace knnd
