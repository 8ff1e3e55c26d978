#include "knnd/serving/search_request.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "knnd/faiss/vector_math.h"

namespace knnd {
namespace {

// The index of the first of n values that is not finite, or n. Sixteen at
// a time where SSE2 is (an exponent of all ones is inf or NaN): a 256-row
// Fashion-MNIST request's 200,704 values took 66-120 us one at a time on
// the gRPC thread, a fifth of its time per request (bench/RESULTS.md
// "Peers"), 28 us so.
int64_t FirstNonFinite(const float* values, int64_t n) {
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128i exponent = _mm_set1_epi32(0x7f800000);
  for (; i + 16 <= n; i += 16) {
    __m128i any = _mm_setzero_si128();
    for (int j = 0; j < 16; j += 4) {
      const __m128i bits = _mm_and_si128(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(values + i + j)),
          exponent);
      any = _mm_or_si128(any, _mm_cmpeq_epi32(bits, exponent));
    }
    if (_mm_movemask_epi8(any) != 0) break;
  }
#endif
  for (; i < n; ++i) {
    if (!std::isfinite(values[i])) return i;
  }
  return n;
}

// The float16 values of `bytes` (little-endian, a whole number of them)
// into out, exactly. HalvesToFloats reads uint16_t rows; a string's buffer
// is aligned for them unless it is a slice of a larger one, then a copy is.
void WidenHalves(const std::string& bytes, float* out) {
  const size_t n = bytes.size() / sizeof(uint16_t);
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint16_t) == 0) {
    HalvesToFloats(reinterpret_cast<const uint16_t*>(bytes.data()), n, out);
    return;
  }
  std::vector<uint16_t> aligned(n);
  std::memcpy(aligned.data(), bytes.data(), bytes.size());
  HalvesToFloats(aligned.data(), n, out);
}

// The bfloat16 values of `bytes` into out: each is the upper half of its
// float's bits (the compiler vectorises the shift).
void WidenBfloat16(const std::string& bytes, float* out) {
  const size_t n = bytes.size() / sizeof(uint16_t);
  const auto* in = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = (uint32_t{in[2 * i]} | uint32_t{in[2 * i + 1]} << 8)
                          << 16;
    std::memcpy(out + i, &bits, sizeof(bits));
  }
}

// The float32 values of `bytes` into out: vectors_f32le not aligned for
// floats (read in place otherwise).
void CopyFloats(const std::string& bytes, float* out) {
  std::memcpy(out, bytes.data(), bytes.size());
}

// One byte encoding of the query matrix: its field, its bytes per value and
// how its values become the floats searched.
struct Encoding {
  const std::string* bytes;
  const char* name;
  int width;
  void (*widen)(const std::string& bytes, float* out);
};

// The hybrid fields of `request` into parsed.hybrid (its terms are
// ParseTexts()'s): INVALID_ARGUMENT naming a field out of its limit, and
// one set on a request without texts (it would be silently unused).
absl::Status ParseFusion(const knnd::v1::SearchRequest& request, bool vectors,
                         const SearchLimits& limits, ParsedSearch& parsed) {
  if (request.texts_size() == 0) {
    const char* stray = request.fusion() != knnd::v1::FUSION_UNSPECIFIED
                            ? "fusion"
                        : request.has_rrf_k()         ? "rrf_k"
                        : request.has_vector_weight() ? "vector_weight"
                        : request.has_text_weight()   ? "text_weight"
                        : request.has_vector_window() ? "vector_window"
                        : request.has_text_window()   ? "text_window"
                                                      : nullptr;
    if (stray != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(stray,
                       " is set but texts is empty: it applies to hybrid "
                       "requests (texts, with or without vectors)"));
    }
    return absl::OkStatus();
  }
  HybridQuery hybrid;
  switch (request.fusion()) {
    case knnd::v1::FUSION_UNSPECIFIED:
    case knnd::v1::FUSION_RRF:
      hybrid.fusion = Fusion::kRrf;
      break;
    case knnd::v1::FUSION_WEIGHTED:
      hybrid.fusion = Fusion::kWeighted;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "fusion=", static_cast<int>(request.fusion()),
          " is not a known fusion (FUSION_RRF = 1, FUSION_WEIGHTED = 2)"));
  }
  if (!vectors) hybrid.fusion = Fusion::kNone;
  if (request.has_rrf_k()) {
    if (request.rrf_k() < 1 || request.rrf_k() > kMaxRrfK) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rrf_k=", request.rrf_k(), " is outside [1, ", kMaxRrfK, "]"));
    }
    hybrid.rrf_k = static_cast<int>(request.rrf_k());
  }
  if (request.has_vector_weight())
    hybrid.vector_weight = request.vector_weight();
  if (request.has_text_weight()) hybrid.text_weight = request.text_weight();
  for (auto [name, weight] : {std::pair{"vector_weight", hybrid.vector_weight},
                              std::pair{"text_weight", hybrid.text_weight}}) {
    if (!std::isfinite(weight) || weight < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "=", weight, " must be finite and >= 0"));
    }
  }
  if (hybrid.vector_weight == 0 && hybrid.text_weight == 0) {
    return absl::InvalidArgumentError(
        "vector_weight and text_weight are both 0: nothing would rank");
  }
  hybrid.vector_window = parsed.k;
  hybrid.text_window = parsed.k;
  hybrid.windows = request.return_candidates();
  for (auto [name, has, value, window] :
       {std::tuple{"vector_window", request.has_vector_window(),
                   request.vector_window(), &hybrid.vector_window},
        std::tuple{"text_window", request.has_text_window(),
                   request.text_window(), &hybrid.text_window}}) {
    if (!has) continue;
    if (value < static_cast<uint32_t>(parsed.k) ||
        value > static_cast<uint32_t>(limits.max_k)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "=", value, " is outside [k=", parsed.k,
                       ", max_k=", limits.max_k, "]"));
    }
    *window = static_cast<int>(value);
  }
  parsed.hybrid = std::move(hybrid);
  return absl::OkStatus();
}

}  // namespace

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "vectors_f32le is read in place and the 16-bit encodings as "
              "little-endian; a big-endian host would need a byte swap");

absl::StatusOr<ParsedSearch> ParseSearchRequest(
    const knnd::v1::SearchRequest& request, const IndexInfo& index,
    const SearchLimits& limits) {
  ParsedSearch parsed;
  const int dim = index.dim;
  if (request.dim() != 0 && request.dim() != static_cast<uint32_t>(dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dim=", request.dim(), " does not match the index dimension ", dim));
  }
  // Exactly one of the four encodings of the query matrix.
  const Encoding encodings[] = {
      {&request.vectors_f32le(), "vectors_f32le", 4, CopyFloats},
      {&request.vectors_f16le(), "vectors_f16le", 2, WidenHalves},
      {&request.vectors_bf16le(), "vectors_bf16le", 2, WidenBfloat16}};
  const Encoding* encoding = nullptr;  // null: the repeated float field
  const char* set[4];  // the fields set, no allocation per request
  size_t set_count = 0;
  if (request.vectors_size() > 0) set[set_count++] = "vectors";
  for (const Encoding& e : encodings) {
    if (e.bytes->empty()) continue;
    set[set_count++] = e.name;
    encoding = &e;
  }
  if (set_count == 0 && request.texts_size() == 0) {
    return absl::InvalidArgumentError(
        "no queries: set vectors, vectors_f32le, vectors_f16le or "
        "vectors_bf16le, or texts");
  }
  if (set_count > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "set one of vectors, vectors_f32le, vectors_f16le and "
        "vectors_bf16le, not ",
        absl::StrJoin(absl::MakeConstSpan(set, set_count), " and ")));
  }
  if (request.texts_size() > 0 && index.text_field.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "texts: the index ", index.path,
        " has no text index (build it with knnctl build --text FIELD)"));
  }
  int64_t values = request.vectors_size();
  if (set_count == 0) {
    // Text alone: as many queries as texts, no vectors.
    parsed.num_queries = request.texts_size();
    if (parsed.num_queries > limits.max_queries_per_request) {
      return absl::InvalidArgumentError(
          absl::StrCat("texts holds ", parsed.num_queries,
                       " queries, more than max_queries_per_request=",
                       limits.max_queries_per_request));
    }
    values = 0;
  } else if (encoding != nullptr) {
    const size_t row_bytes = static_cast<size_t>(encoding->width) * dim;
    if (encoding->bytes->size() % row_bytes != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          encoding->name, " has ", encoding->bytes->size(),
          " bytes, not a multiple of ", encoding->width, "*dim=", row_bytes));
    }
    values = static_cast<int64_t>(encoding->bytes->size()) / encoding->width;
  }
  if (values % dim != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vectors has ", values, " values, not a multiple of dim=",
                     dim, " (row-major num_queries x dim)"));
  }
  if (set_count > 0) parsed.num_queries = values / dim;
  if (request.texts_size() > 0 && set_count > 0 &&
      request.texts_size() != parsed.num_queries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "texts holds ", request.texts_size(), " texts but the vectors ",
        parsed.num_queries, " queries: give one text per query vector"));
  }
  // Before any copy: a widened one is only made of an admissible size.
  if (parsed.num_queries > limits.max_queries_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_queries=", parsed.num_queries,
        " exceeds max_queries_per_request=", limits.max_queries_per_request));
  }
  if (set_count == 0) {
    parsed.queries = nullptr;
  } else if (encoding == nullptr) {
    parsed.queries = request.vectors().data();
  } else if (encoding->width == 4 &&
             reinterpret_cast<uintptr_t>(encoding->bytes->data()) %
                     alignof(float) ==
                 0) {
    parsed.queries = reinterpret_cast<const float*>(encoding->bytes->data());
  } else {
    parsed.aligned_copy.resize(static_cast<size_t>(values));
    encoding->widen(*encoding->bytes, parsed.aligned_copy.data());
    parsed.queries = parsed.aligned_copy.data();
  }
  if (const int64_t i = FirstNonFinite(parsed.queries, values); i < values) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query ", i / dim, " has a non-finite value (", parsed.queries[i],
        ") at dimension ", i % dim));
  }
  if (request.k() <= 0 || request.k() > limits.max_k) {
    return absl::InvalidArgumentError(
        absl::StrCat("k=", request.k(),
                     request.k() <= 0 ? " must be positive"
                                      : absl::StrCat(" exceeds max_k=",
                                                     limits.max_k)));
  }
  parsed.k = request.k();
  parsed.nprobe = limits.default_nprobe;
  if (request.has_nprobe()) {
    if (request.nprobe() == 0 ||
        request.nprobe() > static_cast<uint32_t>(limits.max_nprobe)) {
      return absl::InvalidArgumentError(
          absl::StrCat("nprobe=", request.nprobe(), " is outside [1, ",
                       limits.max_nprobe, "] (max_nprobe)"));
    }
    parsed.nprobe = static_cast<int>(request.nprobe());
  }
  parsed.refine_factor = limits.default_refine_factor;
  if (request.has_refine_factor()) {
    if (request.refine_factor() >
        static_cast<uint32_t>(limits.max_refine_factor)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "refine_factor=", request.refine_factor(), " is outside [0, ",
          limits.max_refine_factor, "] (max_refine_factor)"));
    }
    if (request.refine_factor() > 0 && !index.has_vectors) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refine_factor=", request.refine_factor(),
          " needs the index's raw-vectors file (knnctl build --keep_vectors), "
          "which is not loaded",
          index.vectors_error.empty()
              ? absl::StrCat(": ", index.path, ".vectors does not exist")
              : absl::StrCat(": ", index.vectors_error)));
    }
    parsed.refine_factor = static_cast<int>(request.refine_factor());
  }
  if (request.allowed_ids_size() > limits.max_filter_ids) {
    return absl::InvalidArgumentError(
        absl::StrCat("allowed_ids has ", request.allowed_ids_size(),
                     " ids, more than max_filter_ids=", limits.max_filter_ids));
  }
  parsed.allowed_ids.assign(request.allowed_ids().begin(),
                            request.allowed_ids().end());
  std::sort(parsed.allowed_ids.begin(), parsed.allowed_ids.end());
  parsed.allowed_ids.erase(
      std::unique(parsed.allowed_ids.begin(), parsed.allowed_ids.end()),
      parsed.allowed_ids.end());
  if (absl::Status s = ParseFusion(request, set_count > 0, limits, parsed);
      !s.ok()) {
    return s;
  }
  return parsed;
}

absl::Status ParseTexts(const knnd::v1::SearchRequest& request,
                        const IndexSnapshot& snapshot,
                        const SearchLimits& limits, ParsedSearch& parsed) {
  if (!parsed.hybrid.has_value()) return absl::OkStatus();
  const TextIndex* text = snapshot.text();
  if (text == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "texts: the index ", snapshot.info().path,
        " has no text index (build it with knnctl build --text FIELD)"));
  }
  parsed.hybrid->terms.reserve(static_cast<size_t>(request.texts_size()));
  for (int i = 0; i < request.texts_size(); ++i) {
    const std::string& t = request.texts(i);
    if (static_cast<int64_t>(t.size()) > limits.max_text_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "texts[", i, "] has ", t.size(),
          " bytes, more than max_text_bytes=", limits.max_text_bytes));
    }
    parsed.hybrid->terms.push_back(text->QueryTerms(t));
  }
  return absl::OkStatus();
}

absl::Status ParseFilter(const knnd::v1::SearchRequest& request,
                         const IndexSnapshot& snapshot,
                         const SearchLimits& limits, ParsedSearch& parsed) {
  if (!request.has_filter()) return absl::OkStatus();
  // A hybrid request's vector search runs for its window.
  const int k =
      parsed.hybrid.has_value() ? parsed.hybrid->vector_window : parsed.k;
  absl::StatusOr<PreparedFilter> filter = PrepareFilter(
      request.filter(), parsed.allowed_ids,
      {parsed.num_queries, k, parsed.nprobe, parsed.refine_factor}, snapshot,
      limits.filter);
  if (!filter.ok()) return filter.status();
  parsed.filter = std::move(*filter);
  return absl::OkStatus();
}

bool AnswersWithCandidates(const knnd::v1::SearchRequest& request,
                           const ParsedSearch& parsed) {
  return request.return_candidates() && parsed.refine_factor > 0 &&
         !parsed.filter.has_value() && !parsed.hybrid.has_value();
}

int64_t AnswerWidth(const knnd::v1::SearchRequest& request,
                    const ParsedSearch& parsed) {
  if (parsed.hybrid.has_value() && parsed.hybrid->windows) {
    return (parsed.hybrid->fusion != Fusion::kNone
                ? int64_t{parsed.hybrid->vector_window}
                : 0) +
           parsed.hybrid->text_window;
  }
  return AnswersWithCandidates(request, parsed)
             ? int64_t{parsed.k} * parsed.refine_factor
             : parsed.k;
}

}  // namespace knnd
