// ServingIndex on knnd FastScan files: told apart by the magic, described by
// the same facts, searched through the same call; FastScan files written by
// FAISS itself are refused with the way out.
#include "knnd/faiss/serving_index.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/faiss/fastscan_index.h"
#include "knnd/faiss/ivfpq_index.h"
#include "testing/fastscan_util.h"

namespace knnd {
namespace {

using ::knnd::testing::HeaderOf;
using ::knnd::testing::IndexSpec;
using ::knnd::testing::MakeData;
using ::knnd::testing::ReadBytes;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFastScanIndex;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

// The FAISS wrapper's arithmetic that the memory model relies on.
TEST(MemoryModel, PrecomputedTableIsNlistTimesMTimesKsubFloats) {
  EXPECT_EQ(PrecomputedTableBytes(4096, 32, 8), int64_t{4096} * 32 * 256 * 4);
  EXPECT_EQ(PrecomputedTableBytes(1024, 16, 4), int64_t{1024} * 16 * 16 * 4);
}

std::unique_ptr<ServingIndex> MustOpen(const std::string& path) {
  auto opened = ServingIndex::Open(path);
  EXPECT_TRUE(opened.ok()) << opened.status();
  return opened.ok() ? std::move(*opened) : nullptr;
}

IndexSpec FastScanSpec(const std::string& factory) {
  IndexSpec spec;
  spec.n = 3000;
  spec.factory = factory;
  spec.nprobe = 3;
  return spec;
}

// `spec` written by FAISS, converted to knnd's FastScan file in `tmp` and
// opened.
std::unique_ptr<ServingIndex> OpenConverted(const TempDir& tmp,
                                            const IndexSpec& spec) {
  WriteFastScanIndex(tmp.path("f.faiss"), tmp.path("f.index"), spec);
  return MustOpen(tmp.path("f.index"));
}

// Each kind of file opens as its own implementation, told by its first
// bytes: knnd's FastScan layout, or a FAISS IVF-PQ file.
TEST(ServingIndex, OpensEachKindAsItsImplementation) {
  TempDir tmp;
  std::unique_ptr<ServingIndex> fastscan =
      OpenConverted(tmp, FastScanSpec("IVF16,PQ8x4fs"));
  ASSERT_NE(fastscan, nullptr);
  EXPECT_NE(dynamic_cast<const FastScanIndex*>(fastscan.get()), nullptr);
  EXPECT_TRUE(fastscan->facts().fastscan);
  IndexSpec spec;
  spec.n = 2000;
  spec.factory = "IVF16,PQ8";
  WriteIndex(tmp.path("ivfpq.index"), spec);
  std::unique_ptr<ServingIndex> ivfpq = MustOpen(tmp.path("ivfpq.index"));
  ASSERT_NE(ivfpq, nullptr);
  EXPECT_NE(dynamic_cast<const IvfPqIndex*>(ivfpq.get()), nullptr);
  EXPECT_FALSE(ivfpq->facts().fastscan);
  EXPECT_EQ(ivfpq->facts().index_type, "IVF16,PQ8");
  EXPECT_THAT(ivfpq->WritePart(tmp.path("part.index"), 0, 10).message(),
              HasSubstr("only FastScan indexes"));
}

TEST(ServingIndexFastScan, ReportsStructureAndMemory) {
  TempDir tmp;
  auto index = OpenConverted(tmp, FastScanSpec("IVF32,PQ16x4fs"));
  ASSERT_NE(index, nullptr);
  const IndexFacts& f = index->facts();
  EXPECT_TRUE(f.fastscan);
  EXPECT_EQ(f.index_type, "IVF32,PQ16x4fs");
  EXPECT_EQ(f.dim, 32);
  EXPECT_EQ(f.ivf_dim, 32);
  EXPECT_EQ(f.metric, Metric::kL2);
  EXPECT_EQ(f.ntotal, 3000);
  EXPECT_EQ(f.nlist, 32);
  EXPECT_EQ(f.pq_m, 16);
  EXPECT_EQ(f.pq_nbits, 4);
  EXPECT_EQ(f.code_size_bytes, 8);
  EXPECT_FALSE(f.by_residual);
  EXPECT_EQ(f.stored_nprobe, 3);
  EXPECT_EQ(f.file_bytes, static_cast<int64_t>(ReadBytes(tmp.path("f.index")).size()));
  // The list region with its padding: at least the codes and ids.
  const std::string bytes = ReadBytes(tmp.path("f.index"));
  EXPECT_EQ(f.mapped_list_bytes,
            static_cast<int64_t>(HeaderOf(bytes).lists_bytes));
  EXPECT_GE(f.mapped_list_bytes, 3000 * (8 + 8));
  // Centroids 32 x 32 floats + codebooks 16 x 16 x 2 floats; FAISS's reader
  // built a 32 x 16 x 16 table, which codes that are not residuals never use.
  EXPECT_EQ(f.heap_bytes, 32 * 32 * 4 + 16 * 16 * 2 * 4);
  EXPECT_EQ(f.precomputed_table_bytes, 0);
  EXPECT_EQ(f.read_peak_extra_bytes, 32 * 16 * 16 * 4);
  EXPECT_EQ(index->PlannedTableBytes(), 0);
}

TEST(ServingIndexFastScan, ResidualCodesBuildTheirTableOnlyWhenAsked) {
  TempDir tmp;
  auto index = OpenConverted(tmp, FastScanSpec("IVF32,PQ16x4fsr"));
  ASSERT_NE(index, nullptr);
  EXPECT_EQ(index->facts().index_type, "IVF32,PQ16x4fsr");
  EXPECT_TRUE(index->facts().by_residual);
  const int64_t table = PrecomputedTableBytes(32, 16, 4);
  EXPECT_EQ(index->PlannedTableBytes(), table);
  EXPECT_EQ(index->facts().precomputed_table_bytes, 0);
  const int64_t heap = index->facts().heap_bytes;
  ASSERT_TRUE(index->BuildPrecomputedTable().ok());
  EXPECT_EQ(index->facts().precomputed_table_bytes, table);
  EXPECT_EQ(index->facts().heap_bytes, heap + table);
}

TEST(ServingIndexFastScan, NamesThePreTransform) {
  TempDir tmp;
  auto index = OpenConverted(tmp, FastScanSpec("PCA30,IVF16,PQ15x4fs"));
  ASSERT_NE(index, nullptr);
  EXPECT_EQ(index->facts().index_type, "PCA30,IVF16,PQ15x4fs");
  EXPECT_TRUE(index->facts().has_pretransform);
  EXPECT_EQ(index->facts().dim, 32);
  EXPECT_EQ(index->facts().ivf_dim, 30);
  EXPECT_EQ(index->facts().code_size_bytes, 8);  // 15 rounded up to 16 / 2
}

TEST(ServingIndexFastScan, FastScanWrittenByFaissIsRefusedWithTheWayOut) {
  TempDir tmp;
  for (const std::string factory : {"IVF32,PQ8x4fs", "PCA16,IVF32,PQ8x4fs"}) {
    WriteIndex(tmp.path("plain.index"), FastScanSpec(factory));
    auto opened = ServingIndex::Open(tmp.path("plain.index"));
    ASSERT_FALSE(opened.ok()) << factory;
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(opened.status().message(), HasSubstr(tmp.path("plain.index")));
    EXPECT_THAT(opened.status().message(), HasSubstr("knnctl convert"));
  }
}

TEST(ServingIndexFastScan, MissingNeighboursAreMinusOneWithTheMetricsPad) {
  TempDir tmp;
  for (bool inner_product : {false, true}) {
    IndexSpec spec = FastScanSpec("IVF32,PQ16x4fs");
    spec.inner_product = inner_product;
    auto index = OpenConverted(tmp, spec);
    ASSERT_NE(index, nullptr);
    const std::vector<float> queries = MakeData(3, 32, 9);
    const std::vector<int64_t> allowed = {5, 6, 7};
    const int k = 10;
    std::vector<float> d(3 * k);
    std::vector<int64_t> ids(3 * k);
    SearchArgs args;
    args.queries = queries.data();
    args.num_queries = 3;
    args.k = k;
    args.nprobe = 32;
    args.allowed_ids = allowed;
    args.distances = d.data();
    args.ids = ids.data();
    ASSERT_TRUE(index->Search(args).ok());
    const float pad = inner_product ? -std::numeric_limits<float>::infinity()
                                    : std::numeric_limits<float>::infinity();
    for (int64_t q = 0; q < 3; ++q) {
      for (int j = 0; j < k; ++j) {
        const int64_t id = ids[q * k + j];
        if (j < 3) {
          EXPECT_THAT(allowed, ::testing::Contains(id));
        } else {
          EXPECT_EQ(id, -1);
          EXPECT_EQ(d[q * k + j], pad);
        }
      }
    }
  }
}

}  // namespace
}  // namespace knnd
