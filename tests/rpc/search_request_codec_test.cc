// search_request_codec.h: how knnd reads a SearchRequest off the wire.
// Filters nested up to kMaxFilterDepthLimit are read whole; deeper ones
// (as deep as a 4 MiB message allows) are read without the filter and
// marked for refusal; the parse's stack stays bounded all the while.
// (Through a real server: shard_front_test.cc's DeepFilters test.)
#include "knnd/rpc/search_request_codec.h"

#include <pthread.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "testing/deep_filter.h"

namespace knnd {
namespace {

using knnd::testing::DeepestWithin;
using knnd::testing::DeepFilterBytes;
using knnd::testing::Nesting;
using knnd::testing::WithFilterBytes;
using knnd::v1::SearchRequest;
using ::testing::HasSubstr;

SearchRequest Plain() {
  SearchRequest request;
  request.set_k(5);
  request.set_vectors_f32le(std::string(8 * 4, '\0'));
  return request;
}

// The depth of a filter read whole, walking it as a message.
int Depth(const knnd::v1::Filter& filter) {
  switch (filter.expression_case()) {
    case knnd::v1::Filter::kNegate:
      return 1 + Depth(filter.negate());
    case knnd::v1::Filter::kAllOf:
      return 1 + Depth(filter.all_of().filters(0));
    default:
      return 1;
  }
}

// Before: protobuf's default limit of 100 nested messages failed these in
// gRPC (INTERNAL "Unable to parse request"), before knnd's own check.
TEST(SearchRequestCodec, FiltersUpToTheLimitAreReadWhole) {
  for (Nesting nesting : {Nesting::kNegate, Nesting::kAllOf}) {
    for (int depth : {1, 16, 100, 200, kMaxFilterDepthLimit}) {
      const std::string what = absl::StrCat(
          nesting == Nesting::kNegate ? "negate " : "all_of ", depth);
      SearchRequest request;
      ASSERT_TRUE(ReadSearchRequest(
          WithFilterBytes(Plain(), DeepFilterBytes(depth, nesting)), &request))
          << what;
      EXPECT_EQ(request.k(), 5) << what;
      ASSERT_TRUE(request.has_filter()) << what;
      EXPECT_EQ(Depth(request.filter()), depth) << what;
      // Read whole: attribute_filter.h's own check names max_filter_depth.
      EXPECT_TRUE(CheckFilterParsed(request, 16).ok()) << what;
    }
  }
}

TEST(SearchRequestCodec, DeeperFiltersAreReadWithoutThemAndRefusedByName) {
  const int64_t deepest = DeepestWithin(Plain(), 4 << 20);
  EXPECT_GT(deepest, 800000);
  for (int64_t depth : {int64_t{600}, int64_t{100000}, deepest}) {
    const std::string bytes =
        WithFilterBytes(Plain(), DeepFilterBytes(depth, Nesting::kNegate));
    ASSERT_LE(bytes.size(), size_t{4} << 20);
    SearchRequest request;
    ASSERT_TRUE(ReadSearchRequest(bytes, &request)) << depth;
    EXPECT_EQ(request.k(), 5) << depth;
    EXPECT_FALSE(request.has_filter()) << depth;
    const absl::Status status = CheckFilterParsed(request, 16);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << depth;
    EXPECT_THAT(status.message(),
                HasSubstr("filter is nested more than 256 deep, more than "
                          "max_filter_depth=16"));
  }
  // The same through gRPC's byte buffer, in several slices.
  const std::string bytes =
      WithFilterBytes(Plain(), DeepFilterBytes(deepest, Nesting::kAllOf));
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += 1000) {
    slices.emplace_back(bytes.substr(at, 1000));
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  SearchRequest request;
  ASSERT_TRUE(DeserializeSearchRequest(&buffer, &request).ok());
  EXPECT_FALSE(CheckFilterParsed(request, 16).ok());
}

// Bytes that are no SearchRequest stay refused (gRPC then answers
// INTERNAL, as for any unparsable message), deep filter or not.
TEST(SearchRequestCodec, MalformedBytesAreStillRefused) {
  const std::string good =
      WithFilterBytes(Plain(), DeepFilterBytes(600, Nesting::kNegate));
  SearchRequest request;
  EXPECT_FALSE(ReadSearchRequest(good.substr(0, good.size() - 1), &request));
  // The outermost negate's tag made a group's (wire type 3).
  const std::string filter = DeepFilterBytes(600, Nesting::kNegate);
  std::string garbage = good;
  garbage[Plain().ByteSizeLong() + 1 +
          knnd::testing::VarintSize(filter.size())] = '\x23';
  EXPECT_FALSE(ReadSearchRequest(garbage, &request));
  EXPECT_FALSE(
      ReadSearchRequest(std::string("\x0a\xff\xff\xff\xff\x0f", 6), &request));
  // A request without a deep filter that fails for another reason.
  std::string bad = Plain().SerializeAsString();
  bad += std::string("\x62\x03\x0a\x05\x01", 5);  // a filter longer than itself
  EXPECT_FALSE(ReadSearchRequest(bad, &request));
}

// Runs `fn` on a thread whose `size`-byte stack is painted first; returns
// how many bytes of it were written (the stack's high-water mark). A stack
// overflow hits the guard page below it.
int64_t StackUsed(size_t size, const std::function<void()>& fn) {
  const size_t page = 4096;
  void* map = mmap(nullptr, size + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(map, MAP_FAILED);
  mprotect(map, page, PROT_NONE);  // the guard
  uint8_t* stack = static_cast<uint8_t*>(map) + page;
  std::memset(stack, 0xa5, size);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstack(&attr, stack, size);
  pthread_t thread;
  auto* call = new std::function<void()>(fn);
  EXPECT_EQ(pthread_create(
                &thread, &attr,
                [](void* arg) -> void* {
                  auto* f = static_cast<std::function<void()>*>(arg);
                  (*f)();
                  delete f;
                  return nullptr;
                },
                call),
            0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  size_t untouched = 0;
  while (untouched < size && stack[untouched] == 0xa5) ++untouched;
  munmap(map, size + page);
  return static_cast<int64_t>(size - untouched);
}

// The parse's stack, measured: the deepest filter read whole, and the
// deepest a 4 MiB message holds, on a 1 MiB stack (an unbounded parse of
// the latter needs hundreds of MiB and would hit the guard page).
TEST(SearchRequestCodec, ParsingStaysBoundedInStack) {
  const int64_t deepest = DeepestWithin(Plain(), 4 << 20);
  const std::string limit_bytes = WithFilterBytes(
      Plain(), DeepFilterBytes(kMaxFilterDepthLimit, Nesting::kAllOf));
  const std::string deep_bytes =
      WithFilterBytes(Plain(), DeepFilterBytes(deepest, Nesting::kNegate));
  const std::string plain_bytes = Plain().SerializeAsString();
  auto parse = [](const std::string* bytes, bool* filter) {
    return [bytes, filter] {
      SearchRequest request;
      ASSERT_TRUE(ReadSearchRequest(*bytes, &request));
      *filter = request.has_filter();
    };
  };
  bool filter = false;
  const int64_t plain = StackUsed(1 << 20, parse(&plain_bytes, &filter));
  const int64_t at_limit = StackUsed(1 << 20, parse(&limit_bytes, &filter));
  EXPECT_TRUE(filter);
  const int64_t deep = StackUsed(1 << 20, parse(&deep_bytes, &filter));
  EXPECT_FALSE(filter);
  std::printf(
      "stack used: plain request %lld bytes, filter %d deep (all_of) "
      "%lld bytes, filter %lld deep (negate, %zu-byte message) %lld "
      "bytes\n",
      static_cast<long long>(plain), kMaxFilterDepthLimit,
      static_cast<long long>(at_limit), static_cast<long long>(deepest),
      deep_bytes.size(), static_cast<long long>(deep));
  // The deep one's parse stops at the recursion limit, as the one at the
  // limit does: no more stack than it.
  EXPECT_LE(deep, at_limit + 16384);
}

}  // namespace
}  // namespace knnd
