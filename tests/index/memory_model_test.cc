// The memory model: a request's estimate buffer by buffer, the heap of an
// index, whether an index fits a memory limit, and the byte budget derived
// from the limit.
#include "knnd/index/memory_model.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/base/saturating.h"

namespace knnd {
namespace {

using ::testing::HasSubstr;

IndexInfo Info(int dim, int64_t nlist, int m) {
  IndexInfo info;
  info.path = "x.index";
  info.dim = dim;
  info.nlist = nlist;
  info.pq_m = m;
  info.pq_nbits = 8;
  return info;
}

TEST(MemoryModel, EstimateCountsEachBufferOfTheModel) {
  const IndexInfo info = Info(128, 4096, 32);
  SearchShape one{1, 10, 16, 0, 0, 256};
  // query + 3 x results + coarse ids/distances + norms + 2 PQ tables + 2 d.
  EXPECT_EQ(EstimateSearchBytes(info, one),
            128 * 4 + 3 * 10 * 12 + 16 * 12 + 4096 * 4 +
                (2 * 32 * 256 * 4 + 2 * 128 * 4));
  // 512 rows: two FAISS calls of 256 rows, each with its tables, and the
  // BLAS block of the coarse search (min(nlist, 1024) columns).
  SearchShape big{512, 10, 16, 0, 0, 256};
  EXPECT_EQ(EstimateSearchBytes(info, big),
            512 * 128 * 4 + 3 * 512 * 10 * 12 + 512 * 16 * 12 +
                512 * 1024 * 4 + 4096 * 4 +
                2 * (2 * 32 * 256 * 4 + 2 * 128 * 4));
  SearchShape filtered = one;
  filtered.filter_ids = 1000;
  EXPECT_EQ(EstimateSearchBytes(info, filtered) - EstimateSearchBytes(info, one),
            1000 * 16);
  // Own ids: each call holds the allowed ids' rows too.
  IndexInfo own_ids = info;
  own_ids.has_id_table = true;
  EXPECT_EQ(EstimateSearchBytes(own_ids, filtered) -
                EstimateSearchBytes(own_ids, one),
            1000 * 24);
  // An attribute filter: its bitmap, and per call the larger of the exact
  // plan's rows and the IVF plan's copy of the rows it widens (queries,
  // results and the ids compared, ProbeReference, the closest list's best
  // rows: 256 for one matching row in a million).
  IndexInfo million = info;
  million.ntotal = 1000000;
  SearchShape attributes = one;
  attributes.filtered = true;
  attributes.filter_matched_rows = 3000;
  EXPECT_EQ(EstimateSearchBytes(million, attributes) -
                EstimateSearchBytes(million, one),
            1000000 / 8 + 3000 * 8);
  attributes.filter_matched_rows = 1;
  EXPECT_EQ(EstimateSearchBytes(million, attributes) -
                EstimateSearchBytes(million, one),
            1000000 / 8 + (128 * 4 + 10 * 20 + 16 + 256 * 12));
  // One numeric condition searched through its bounds has no bitmap.
  attributes.filter_bitmap = false;
  EXPECT_EQ(EstimateSearchBytes(million, attributes) -
                EstimateSearchBytes(million, one),
            128 * 4 + 10 * 20 + 16 + 256 * 12);
}

// Payloads: the answer's JSON objects and their serialised copy, at most
// the largest row's per result and never more than the largest answer.
TEST(MemoryModel, PayloadsCountTheirBoundTwice) {
  IndexInfo info = Info(128, 4096, 32);
  EXPECT_EQ(PayloadBytesBound(info, 100, 64 << 20), 0);  // no payloads
  info.max_payload_json_bytes = 1200;
  EXPECT_EQ(PayloadBytesBound(info, 100, 64 << 20), 100 * 1200);
  EXPECT_EQ(PayloadBytesBound(info, 100, 50000), 50000);
  SearchShape plain{10, 10, 16, 0, 0, 256};
  SearchShape with = plain;
  with.payload_bytes = PayloadBytesBound(info, 100, 64 << 20);
  EXPECT_EQ(EstimateSearchBytes(info, with) - EstimateSearchBytes(info, plain),
            2 * 100 * 1200);
}

TEST(MemoryModel, WidenedQueriesCountTheirFloatCopy) {
  // 16-bit vectors (or unaligned float32 ones) are searched from a float32
  // copy of nq * d * 4 bytes that the request holds beside its message.
  const IndexInfo info = Info(128, 4096, 32);
  SearchShape plain{10, 10, 16, 0, 0, 256};
  SearchShape widened = plain;
  widened.query_copy_bytes = 10 * 128 * 4;
  EXPECT_EQ(EstimateSearchBytes(info, widened) - EstimateSearchBytes(info, plain),
            10 * 128 * 4);
}

TEST(MemoryModel, TextsCountEveryRowsScoreAndBothWindows) {
  IndexInfo info = Info(128, 4096, 32);
  info.ntotal = 1000000;
  SearchShape one{1, 10, 16, 0, 0, 256};
  SearchShape hybrid = one;
  hybrid.text_window = 50;
  // 24 bytes a row per call, and (k + text_window) * 56 per query.
  EXPECT_EQ(EstimateSearchBytes(info, hybrid) - EstimateSearchBytes(info, one),
            1000000 * 24 + (10 + 50) * 56);
  SearchShape two_calls = hybrid;
  two_calls.num_queries = 300;
  SearchShape two_calls_plain = two_calls;
  two_calls_plain.text_window = 0;
  EXPECT_EQ(EstimateSearchBytes(info, two_calls) -
                EstimateSearchBytes(info, two_calls_plain),
            2 * 1000000 * 24 + 300 * (10 + 50) * 56);
}

TEST(MemoryModel, IndexFitsOnlyWithTheVersionServingAndTheHeadroom) {
  IndexInfo planned = Info(64, 1024, 16);
  planned.heap_bytes = 300 << 20;
  planned.precomputed_table_bytes = 256 << 20;
  MemoryLimits limits{512 << 20, 128 << 20};
  EXPECT_TRUE(CheckIndexFits(planned, 0, limits).ok());
  absl::Status swap = CheckIndexFits(planned, 100 << 20, limits);
  EXPECT_EQ(swap.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(swap.message()),
              HasSubstr("100.0 MiB of the version still serving"));
  EXPECT_THAT(std::string(swap.message()),
              HasSubstr("more than the memory limit of 512.0 MiB"));
  EXPECT_THAT(std::string(swap.message()),
              HasSubstr("use_precomputed_table: false (saves 256.0 MiB)"));
  EXPECT_TRUE(CheckIndexFits(planned, 100 << 20, MemoryLimits{0, 0}).ok());
}

TEST(MemoryModel, BudgetIsAShareOfWhatTheLimitLeavesElseTheFixedValue) {
  MemoryLimits limits{1000 << 20, 100 << 20};
  EXPECT_EQ(InflightBytesBudget(limits, 300 << 20, 50, 7),
            int64_t{600 << 20} / 100 * 50);
  EXPECT_EQ(InflightBytesBudget(MemoryLimits{0, 100 << 20}, 300 << 20, 50, 7),
            7);
  // Nothing left: a budget of 1 byte refuses requests instead of lifting
  // the bound.
  EXPECT_EQ(InflightBytesBudget(limits, 1000 << 20, 50, 7), 1);
}

TEST(RerankMemory, EstimateCountsTheCandidateBuffers) {
  IndexInfo info = Info(2, 8, 0);
  info.ntotal = 100;
  info.has_vectors = true;
  SearchShape shape{100, 10, 4, 0, 0};
  const int64_t plain = EstimateSearchBytes(info, shape);
  shape.refine_factor = 8;
  // FAISS's 80 + 28 best, then the 80 kept: 12 bytes each per query.
  EXPECT_EQ(EstimateSearchBytes(info, shape) - plain,
            100 * (80 + 28 + 80) * 12);
  // A filtered search keeps and re-ranks all 108, and its IVF plan's
  // widened copies hold 108 results a query (and their ids once more).
  shape.filtered = true;
  shape.filter_bitmap = false;
  shape.filter_matched_rows = 1;
  SearchShape unrefined = shape;
  unrefined.refine_factor = 0;
  EXPECT_EQ(
      EstimateSearchBytes(info, shape) - EstimateSearchBytes(info, unrefined),
      100 * (108 + 108) * 12 + 100 * (108 - 10) * 20);
}

// Shapes an operator's limits allow in combination (max_k 100,000,
// max_refine_factor 1,024, max_queries_per_request unbounded above) and a
// front's shards could ask for: the estimate saturates instead of wrapping
// (before, refine_factor * k wrapped in 32 bits and the products in 64,
// into small or negative estimates the gate took), and a budget built
// from a cgroup "no limit" value stays positive.
TEST(MemoryModel, EstimatesSaturateInsteadOfWrapping) {
  IndexInfo info = Info(128, 4096, 32);
  info.has_vectors = true;
  info.ntotal = 1000000;
  SearchShape huge{int64_t{1} << 32, 100000, 4096, 0, 1024, 128};
  EXPECT_EQ(EstimateSearchBytes(info, huge), kSaturated);
  SearchShape wide{1, 2147483647, 1, 0, 2147483647, 0};
  EXPECT_EQ(EstimateSearchBytes(info, wide), kSaturated);
  wide.payload_bytes = kSaturated;
  wide.refine_factor = 0;
  EXPECT_EQ(EstimateSearchBytes(info, wide), kSaturated);
  info.fastscan = true;
  info.by_residual = true;
  EXPECT_EQ(EstimateSearchBytes(info, huge), kSaturated);
  // Every estimate of a shape with fewer queries is at most this one's.
  SearchShape fewer = huge;
  for (int64_t queries = 1; queries < (int64_t{1} << 32); queries *= 16) {
    fewer.num_queries = queries;
    const int64_t bytes = EstimateSearchBytes(info, fewer);
    EXPECT_GT(bytes, 0) << queries;
  }
  info.max_payload_json_bytes = int64_t{1} << 62;
  EXPECT_EQ(PayloadBytesBound(info, int64_t{1} << 40, 64 << 20), 64 << 20);
  MemoryLimits unlimited{9223372036854771712, 128 << 20};
  EXPECT_GT(InflightBytesBudget(unlimited, 1 << 30, 50, 0), 0);
}

}  // namespace
}  // namespace knnd
