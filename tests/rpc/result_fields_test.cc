#include "knnd/rpc/result_fields.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnd {
namespace {

using ::testing::ElementsAre;
using knnd::v1::SearchResponse;

template <typename T>
bool Aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % alignof(T) == 0;
}

TEST(ResizeResults, RepeatedFormFillsTheRepeatedFieldsOnly) {
  SearchResponse r;
  ResultBuffers out = ResizeResults(3, /*candidates=*/true, /*as_bytes=*/false,
                                    2.5f, &r);
  out.ids[1] = 7;
  out.distances[2] = 1.0f;
  out.approx_distances[0] = 0.5f;
  EXPECT_THAT(r.ids(), ElementsAre(-1, 7, -1));
  EXPECT_THAT(r.distances(), ElementsAre(2.5f, 2.5f, 1.0f));
  EXPECT_THAT(r.approx_distances(), ElementsAre(0.5f, 2.5f, 2.5f));
  EXPECT_TRUE(r.ids_i64le().empty());
  EXPECT_TRUE(r.distances_f32le().empty());
  EXPECT_TRUE(r.approx_distances_f32le().empty());
}

TEST(ResizeResults, BytesFormIsLittleEndianAndAlignedAtEverySize) {
  // 1 and 2 entries fit a small-string buffer; 100 does not.
  for (int64_t n : {1, 2, 3, 100}) {
    SearchResponse r;
    ResultBuffers out =
        ResizeResults(n, /*candidates=*/true, /*as_bytes=*/true, 0.0f, &r);
    EXPECT_TRUE(Aligned(out.ids) && Aligned(out.distances) &&
                Aligned(out.approx_distances))
        << n;
    out.ids[n - 1] = 0x0102030405060708;
    out.distances[0] = 3.0f;
    out.approx_distances[n - 1] = 4.0f;
    ASSERT_EQ(r.ids_i64le().size(), static_cast<size_t>(n) * 8);
    ASSERT_EQ(r.distances_f32le().size(), static_cast<size_t>(n) * 4);
    ASSERT_EQ(r.approx_distances_f32le().size(), static_cast<size_t>(n) * 4);
    EXPECT_EQ(r.ids_i64le()[(n - 1) * 8], '\x08') << "little-endian";
    const ResultColumns read = ReadResults(r);
    EXPECT_EQ(read.ids[0], n == 1 ? 0x0102030405060708 : -1);
    EXPECT_EQ(read.ids[n - 1], 0x0102030405060708);
    EXPECT_EQ(read.distances[0], 3.0f);
    EXPECT_EQ(read.approx_distances[n - 1], 4.0f);
    EXPECT_EQ(r.ids_size() + r.distances_size() + r.approx_distances_size(), 0);
  }
}

TEST(ResizeResults, WithoutCandidatesLeavesTheEstimatesEmpty) {
  for (bool as_bytes : {false, true}) {
    SearchResponse r;
    ResultBuffers out =
        ResizeResults(4, /*candidates=*/false, as_bytes, 0.0f, &r);
    EXPECT_EQ(out.approx_distances, nullptr);
    EXPECT_EQ(r.approx_distances_size(), 0);
    EXPECT_TRUE(r.approx_distances_f32le().empty());
  }
}

TEST(ReadResults, ReadsEitherFormColumnByColumn) {
  SearchResponse repeated;
  repeated.add_ids(4);
  repeated.add_ids(-1);
  repeated.add_distances(0.25f);
  repeated.add_distances(9.0f);
  ResultColumns a = ReadResults(repeated);
  EXPECT_EQ(a.ids.size(), 2);
  EXPECT_EQ(a.ids[0], 4);
  EXPECT_EQ(a.distances[1], 9.0f);
  EXPECT_EQ(a.approx_distances.size(), 0);

  // Bytes for the ids, repeated for the distances; the bytes start at an
  // odd address (a parser may hand out any alignment).
  SearchResponse mixed;
  const int64_t ids[2] = {11, 12};
  std::string odd(1 + sizeof(ids), '\0');
  std::memcpy(&odd[1], ids, sizeof(ids));
  mixed.set_ids_i64le(odd.substr(1));
  mixed.add_distances(1.5f);
  mixed.add_distances(2.5f);
  ResultColumns b = ReadResults(mixed);
  EXPECT_EQ(b.ids.size(), 2);
  EXPECT_EQ(b.ids[1], 12);
  EXPECT_EQ(b.distances[0], 1.5f);
  const ResultColumn<int64_t> unaligned(odd.data() + 1, sizeof(ids));
  EXPECT_EQ(unaligned[0], 11);
  EXPECT_EQ(unaligned[1], 12);
}

TEST(ReadResults, ABytesFieldOfPartialValuesHasNoSize) {
  SearchResponse r;
  r.set_ids_i64le(std::string(12, '\0'));
  r.set_distances_f32le(std::string(6, '\0'));
  EXPECT_EQ(ReadResults(r).ids.size(), -1);
  EXPECT_EQ(ReadResults(r).distances.size(), -1);
}

}  // namespace
}  // namespace knnd
