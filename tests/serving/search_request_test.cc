// ParseSearchRequest and ResolveLimits: every refusal names the input and
// the limit; defaults come from the config or the index.
#include "knnd/serving/search_request.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/vector_math.h"

namespace knnd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

IndexInfo Index(int dim = 4, int64_t nlist = 64, int stored_nprobe = 3) {
  IndexInfo info;
  info.dim = dim;
  info.nlist = nlist;
  info.stored_nprobe = stored_nprobe;
  return info;
}

// max_k 100, 10 queries per request, max_nprobe 32, 5 filter ids.
LimitsConfig Config(int default_nprobe = 0, int max_nprobe = 32) {
  LimitsConfig config;
  config.max_k = 100;
  config.max_queries_per_request = 10;
  config.default_nprobe = default_nprobe;
  config.max_nprobe = max_nprobe;
  config.max_filter_ids = 5;
  return config;
}

SearchLimits Limits() { return ResolveLimits(Config(), Index()); }

knnd::v1::SearchRequest Request(int rows, int dim = 4, int k = 5) {
  knnd::v1::SearchRequest r;
  for (int i = 0; i < rows * dim; ++i) r.add_vectors(static_cast<float>(i));
  r.set_k(k);
  return r;
}

void ExpectInvalid(const knnd::v1::SearchRequest& request,
                   const std::string& message) {
  auto parsed = ParseSearchRequest(request, Index(), Limits());
  ASSERT_FALSE(parsed.ok()) << "accepted: " << request.ShortDebugString();
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr(message));
}

TEST(ResolveLimits, ZeroMeansFromTheIndexAndDefaultsAreClamped) {
  SearchLimits l = ResolveLimits(Config(0, 0), Index(4, 64, 3));
  EXPECT_EQ(l.max_nprobe, 64);
  EXPECT_EQ(l.default_nprobe, 3);
  l = ResolveLimits(Config(100, 500), Index(4, 64, 3));
  EXPECT_EQ(l.max_nprobe, 64);
  EXPECT_EQ(l.default_nprobe, 64);
}

TEST(ParseSearchRequest, AcceptsFloatsAndUsesTheDefaultNprobe) {
  // `queries` points into the request, which must outlive the result.
  const knnd::v1::SearchRequest request = Request(3);
  auto parsed = ParseSearchRequest(request, Index(), Limits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_queries, 3);
  EXPECT_EQ(parsed->k, 5);
  EXPECT_EQ(parsed->nprobe, 3);
  EXPECT_EQ(parsed->queries[5], 5.0f);
}

TEST(ParseSearchRequest, AcceptsRawLittleEndianBytesEvenUnaligned) {
  std::vector<float> values = {1, 2, 3, 4, 5, 6, 7, 8};
  std::string bytes(reinterpret_cast<const char*>(values.data()), 32);
  knnd::v1::SearchRequest r;
  r.set_k(1);
  r.set_dim(4);
  r.set_vectors_f32le(bytes);
  auto parsed = ParseSearchRequest(r, Index(), Limits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_queries, 2);
  EXPECT_EQ(parsed->queries[7], 8.0f);
  // A payload starting at an odd address is copied, not misread.
  std::string padded = "x" + bytes;
  knnd::v1::SearchRequest odd;
  odd.set_k(1);
  odd.mutable_vectors_f32le()->assign(padded.data() + 1, 32);
  parsed = ParseSearchRequest(odd, Index(), Limits());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->queries[6], 7.0f);
}

TEST(ParseSearchRequest, WrongDimension) {
  auto r = Request(1);
  r.set_dim(8);
  ExpectInvalid(r, "dim=8 does not match the index dimension 4");
  ExpectInvalid(Request(1, 3), "vectors has 3 values, not a multiple of dim=4");
}

TEST(ParseSearchRequest, ZeroOrTooManyQueries) {
  ExpectInvalid(Request(0), "no queries");
  ExpectInvalid(Request(11), "num_queries=11 exceeds max_queries_per_request=10");
}

TEST(ParseSearchRequest, KOutOfRange) {
  ExpectInvalid(Request(1, 4, 0), "k=0 must be positive");
  ExpectInvalid(Request(1, 4, -3), "k=-3 must be positive");
  ExpectInvalid(Request(1, 4, 101), "k=101 exceeds max_k=100");
}

TEST(ParseSearchRequest, NprobeOutOfRange) {
  auto r = Request(1);
  r.set_nprobe(0);
  ExpectInvalid(r, "nprobe=0 is outside [1, 32]");
  r.set_nprobe(33);
  ExpectInvalid(r, "nprobe=33 is outside [1, 32]");
  r.set_nprobe(32);
  EXPECT_TRUE(ParseSearchRequest(r, Index(), Limits()).ok());
}

TEST(ParseSearchRequest, NonFiniteValues) {
  auto r = Request(2);
  r.set_vectors(6, std::numeric_limits<float>::quiet_NaN());
  ExpectInvalid(r, "query 1 has a non-finite value (nan) at dimension 2");
  r.set_vectors(6, std::numeric_limits<float>::infinity());
  ExpectInvalid(r, "query 1 has a non-finite value (inf)");
}

TEST(ParseSearchRequest, FirstNonFiniteValueOfManyIsNamed) {
  // 4 rows of 41: 164 values, checked sixteen at a time, then a tail of 4.
  const IndexInfo index = Index(41);
  const SearchLimits limits = ResolveLimits(Config(), index);
  auto r = Request(4, 41);
  // The largest finite float and a subnormal are values like any other.
  r.set_vectors(0, std::numeric_limits<float>::max());
  r.set_vectors(1, std::numeric_limits<float>::denorm_min());
  r.set_vectors(2, -std::numeric_limits<float>::max());
  const auto parsed = ParseSearchRequest(r, index, limits);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  for (int at : {0, 15, 16, 37, 159, 160, 163}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      auto bad_request = r;
      bad_request.set_vectors(at, bad);
      // A later one too: the first is named.
      if (at + 5 < bad_request.vectors_size()) {
        bad_request.set_vectors(at + 5,
                                std::numeric_limits<float>::quiet_NaN());
      }
      const auto refused = ParseSearchRequest(bad_request, index, limits);
      ASSERT_FALSE(refused.ok()) << "value " << at << " = " << bad;
      EXPECT_THAT(refused.status().message(),
                  HasSubstr(absl::StrCat("query ", at / 41,
                                         " has a non-finite value (", bad,
                                         ") at dimension ", at % 41)));
    }
  }
}

TEST(ParseSearchRequest, ByteLengthNotAMultipleOfRowSize) {
  knnd::v1::SearchRequest r;
  r.set_k(1);
  r.set_vectors_f32le(std::string(20, '\0'));
  ExpectInvalid(r, "vectors_f32le has 20 bytes, not a multiple of 4*dim=16");
}

TEST(ParseSearchRequest, BothEncodingsAtOnce) {
  auto r = Request(1);
  r.set_vectors_f32le(std::string(16, '\0'));
  ExpectInvalid(r, "set one of vectors, vectors_f32le, vectors_f16le and "
                   "vectors_bf16le, not vectors and vectors_f32le");
  knnd::v1::SearchRequest halves;
  halves.set_k(1);
  halves.set_vectors_f16le(std::string(8, '\0'));
  halves.set_vectors_bf16le(std::string(8, '\0'));
  ExpectInvalid(halves, "not vectors_f16le and vectors_bf16le");
}

// `values` as little-endian 16-bit words.
std::string Words(const std::vector<uint16_t>& values) {
  std::string bytes;
  for (uint16_t v : values) {
    bytes.push_back(static_cast<char>(v & 0xff));
    bytes.push_back(static_cast<char>(v >> 8));
  }
  return bytes;
}

// float32's bits' upper half: exact for the values below, which have no
// bits in the lower one.
uint16_t Bfloat16(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  EXPECT_EQ(bits & 0xffff, 0u) << value << " is not a bfloat16";
  return static_cast<uint16_t>(bits >> 16);
}

TEST(ParseSearchRequest, HalfPrecisionBytesAreWidenedExactly) {
  // 2 rows of 9 (F16C converts 8 at a time, then a tail), including the
  // largest half, the smallest subnormal, a negative zero and fractions.
  const IndexInfo index = Index(9);
  const SearchLimits limits = ResolveLimits(Config(), index);
  const std::vector<float> values = {
      0.0f,  -0.0f, 1.0f,   -2.5f,   0.333251953125f, 65504.0f,
      -65504.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -14),
      1e-3f, 7.0f,  -100.5f, 0.75f,  3.140625f, 42.0f, -1.0f, 8.0f, 1e4f};
  std::vector<uint16_t> halves;
  for (float v : values) halves.push_back(FloatToHalf(v));
  // An odd start: a slice of a larger buffer is copied, not misread.
  for (int offset : {0, 1}) {
    const std::string bytes = std::string(offset, 'x') + Words(halves);
    knnd::v1::SearchRequest r;
    r.set_k(1);
    r.mutable_vectors_f16le()->assign(bytes.data() + offset,
                                      bytes.size() - offset);
    const auto parsed = ParseSearchRequest(r, index, limits);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->num_queries, 2);
    ASSERT_EQ(parsed->aligned_copy.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(parsed->queries[i], HalfToFloat(halves[i])) << i;
      if (i < 9) {
        EXPECT_EQ(parsed->queries[i], values[i]) << i;  // exact halves
      }
    }
    EXPECT_TRUE(std::signbit(parsed->queries[1]));
    EXPECT_NEAR(parsed->queries[9], 1e-3f, 1e-6f);  // rounded to a half
  }
}

TEST(ParseSearchRequest, Bfloat16BytesAreWidenedExactly) {
  const IndexInfo index = Index(9);
  const SearchLimits limits = ResolveLimits(Config(), index);
  const std::vector<float> values = {
      0.0f, -0.0f, 1.0f, -2.5f, 0.75f, std::ldexp(1.0f, 100),
      -std::ldexp(1.0f, -126), std::ldexp(1.0f, -133), 3.140625f};
  std::vector<uint16_t> words;
  for (float v : values) words.push_back(Bfloat16(v));
  knnd::v1::SearchRequest r;
  r.set_k(1);
  r.set_vectors_bf16le(Words(words));
  const auto parsed = ParseSearchRequest(r, index, limits);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_queries, 1);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(parsed->queries[i], values[i]) << i;
  }
  EXPECT_TRUE(std::signbit(parsed->queries[1]));
}

TEST(ParseSearchRequest, HalfPrecisionLengthAndValuesAreChecked) {
  knnd::v1::SearchRequest r;
  r.set_k(1);
  r.set_vectors_f16le(std::string(10, '\0'));
  ExpectInvalid(r, "vectors_f16le has 10 bytes, not a multiple of 2*dim=8");
  r.clear_vectors_f16le();
  r.set_vectors_bf16le(std::string(6, '\0'));
  ExpectInvalid(r, "vectors_bf16le has 6 bytes, not a multiple of 2*dim=8");
  // 11 rows against max_queries_per_request=10, refused before widening.
  r.set_vectors_bf16le(std::string(88, '\0'));
  ExpectInvalid(r, "num_queries=11 exceeds max_queries_per_request=10");

  // Inf and NaN in either encoding name their query and dimension.
  struct Case {
    bool bf16;
    int at;
    uint16_t word;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {false, 6, 0x7c00, "query 1 has a non-finite value (inf) at dimension 2"},
           {false, 6, 0xfe00, "query 1 has a non-finite value ("},  // a NaN
           {true, 3, 0xff80, "query 0 has a non-finite value (-inf) at dimension 3"},
           {true, 3, 0x7fc1, "query 0 has a non-finite value (nan) at dimension 3"}}) {
    std::vector<uint16_t> words(8, c.bf16 ? Bfloat16(1.0f) : FloatToHalf(1.0f));
    words[c.at] = c.word;
    knnd::v1::SearchRequest bad;
    bad.set_k(1);
    if (c.bf16) {
      bad.set_vectors_bf16le(Words(words));
    } else {
      bad.set_vectors_f16le(Words(words));
    }
    ExpectInvalid(bad, c.message);
  }
}

TEST(ParseSearchRequest, AllowListIsBoundedSortedAndDeduplicated) {
  auto r = Request(1);
  for (int64_t id : {9, 2, 9, 5}) r.add_allowed_ids(id);
  auto parsed = ParseSearchRequest(r, Index(), Limits());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->allowed_ids, (std::vector<int64_t>{2, 5, 9}));
  for (int64_t id : {1, 3}) r.add_allowed_ids(id);
  ExpectInvalid(r, "allowed_ids has 6 ids, more than max_filter_ids=5");
}

// Index() with or without the raw vectors of re-ranking.
IndexInfo InfoWithVectors(bool has_vectors) {
  IndexInfo info = Index();
  info.has_vectors = has_vectors;
  return info;
}

// Parses Request(1) with refine_factor set, under max_refine_factor 16.
absl::StatusOr<ParsedSearch> ParseWithRefine(const IndexInfo& info,
                                             int refine_factor) {
  LimitsConfig config;
  config.max_refine_factor = 16;
  const SearchLimits limits = ResolveLimits(config, info);
  knnd::v1::SearchRequest r = Request(1);
  r.set_refine_factor(refine_factor);
  return ParseSearchRequest(r, info, limits);
}

TEST(RerankRequest, RefineFactorOutOfRangeNamesTheLimit) {
  const IndexInfo info = InfoWithVectors(true);
  auto parsed = ParseWithRefine(info, 17);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(),
              AllOf(HasSubstr("refine_factor=17"), HasSubstr("[0, 16]"),
                    HasSubstr("max_refine_factor")));
  parsed = ParseWithRefine(info, 16);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->refine_factor, 16);
}

TEST(RerankRequest, DefaultAppliesOnlyWithVectors) {
  LimitsConfig config;
  config.default_refine_factor = 4;
  config.max_refine_factor = 16;
  const SearchLimits limits = ResolveLimits(config, InfoWithVectors(true));
  auto with = ParseSearchRequest(Request(1), InfoWithVectors(true), limits);
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(with->refine_factor, 4);
  auto without = ParseSearchRequest(
      Request(1), InfoWithVectors(false),
      ResolveLimits(config, InfoWithVectors(false)));
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(without->refine_factor, 0);
  knnd::v1::SearchRequest r = Request(1);
  r.set_refine_factor(0);  // explicitly off
  with = ParseSearchRequest(r, InfoWithVectors(true), limits);
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(with->refine_factor, 0);
}

TEST(RerankRequest, RefineWithoutVectorsIsFailedPrecondition) {
  IndexInfo info = InfoWithVectors(false);
  info.vectors_error = "vectors file /data/x.index.vectors has dim=3";
  auto parsed = ParseWithRefine(info, 2);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(parsed.status().message()),
              AllOf(HasSubstr("refine_factor=2"), HasSubstr("--keep_vectors"),
                    HasSubstr("has dim=3")));
}

IndexInfo IndexWithText() {
  IndexInfo info = Index();
  info.text_field = "text";
  return info;
}

TEST(HybridRequest, TextsAloneAreQueriesWithoutVectors) {
  knnd::v1::SearchRequest r;
  r.add_texts("printer settings");
  r.add_texts("服务器");
  r.set_k(5);
  auto parsed = ParseSearchRequest(r, IndexWithText(), Limits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_queries, 2);
  EXPECT_EQ(parsed->queries, nullptr);
  ASSERT_TRUE(parsed->hybrid.has_value());
  EXPECT_EQ(parsed->hybrid->fusion, Fusion::kNone);
  EXPECT_EQ(parsed->hybrid->text_window, 5);
}

TEST(HybridRequest, DefaultsAreRrf60AndWindowsOfK) {
  knnd::v1::SearchRequest r = Request(2);
  r.add_texts("a");
  r.add_texts("b");
  auto parsed = ParseSearchRequest(r, IndexWithText(), Limits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(parsed->hybrid.has_value());
  EXPECT_EQ(parsed->hybrid->fusion, Fusion::kRrf);
  EXPECT_EQ(parsed->hybrid->rrf_k, 60);
  EXPECT_EQ(parsed->hybrid->vector_window, 5);
  EXPECT_EQ(parsed->hybrid->text_window, 5);
  r.set_fusion(knnd::v1::FUSION_WEIGHTED);
  r.set_vector_weight(0.2f);
  r.set_vector_window(40);
  parsed = ParseSearchRequest(r, IndexWithText(), Limits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->hybrid->fusion, Fusion::kWeighted);
  EXPECT_EQ(parsed->hybrid->vector_weight, 0.2f);
  EXPECT_EQ(parsed->hybrid->text_weight, 0.5f);
  EXPECT_EQ(parsed->hybrid->vector_window, 40);
  EXPECT_FALSE(parsed->hybrid->terms.size());  // ParseTexts' part
}

void ExpectHybridInvalid(const knnd::v1::SearchRequest& request,
                         const std::string& message,
                         const IndexInfo& index = IndexWithText()) {
  auto parsed = ParseSearchRequest(request, index, Limits());
  ASSERT_FALSE(parsed.ok()) << "accepted: " << request.ShortDebugString();
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr(message));
}

TEST(HybridRequest, BadInputIsNamed) {
  knnd::v1::SearchRequest none;
  none.set_k(5);
  ExpectHybridInvalid(none, "no queries");
  knnd::v1::SearchRequest r = Request(2);
  r.add_texts("only one");
  ExpectHybridInvalid(r, "texts holds 1 texts but the vectors 2 queries");
  ExpectHybridInvalid(r, "has no text index", Index());
  r = Request(1);
  r.add_texts("x");
  r.set_fusion(static_cast<knnd::v1::FusionMethod>(9));
  ExpectHybridInvalid(r, "fusion=9 is not a known fusion");
  r.clear_fusion();
  r.set_rrf_k(0);
  ExpectHybridInvalid(r, "rrf_k=0 is outside [1, 100000]");
  r.clear_rrf_k();
  r.set_text_weight(-1);
  ExpectHybridInvalid(r, "text_weight=-1 must be finite and >= 0");
  r.set_text_weight(0);
  r.set_vector_weight(0);
  ExpectHybridInvalid(r, "both 0");
  r.clear_text_weight();
  r.clear_vector_weight();
  r.set_text_window(4);
  ExpectHybridInvalid(r, "text_window=4 is outside [k=5, max_k=100]");
  r.set_text_window(101);
  ExpectHybridInvalid(r, "text_window=101");
  knnd::v1::SearchRequest stray = Request(1);
  stray.set_vector_window(10);
  ExpectHybridInvalid(stray, "vector_window is set but texts is empty");
  knnd::v1::SearchRequest many;
  many.set_k(5);
  for (int i = 0; i < 11; ++i) many.add_texts("t");
  ExpectHybridInvalid(many, "more than max_queries_per_request=10");
}

TEST(HybridRequest, CandidatesForAMergerAreNeverHybrid) {
  knnd::v1::SearchRequest r = Request(1);
  r.add_texts("x");
  r.set_return_candidates(true);
  auto parsed = ParseSearchRequest(r, IndexWithText(), Limits());
  ASSERT_TRUE(parsed.ok());
  parsed->refine_factor = 2;
  EXPECT_FALSE(AnswersWithCandidates(r, *parsed));
}

}  // namespace
}  // namespace knnd
