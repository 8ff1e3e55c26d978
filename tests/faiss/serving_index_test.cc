// ServingIndex on knnd FastScan files: told apart by the magic, described by
// the same facts, searched through the same call; FastScan files written by
// FAISS itself are refused with the way out.
#include "knnd/faiss/serving_index.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
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

// The IVF plan's widening (index/filter_planner.h) asks a pass for the
// lists past the previous pass's only (SearchArgs::skip_probes) and for
// where the scan stands (SearchArgs::probe_reference). For both kinds of
// file and metric: the best of lists [3, 12) merged with the best of
// [0, 3) are the best of [0, 12); the reference's frontier (the 12th
// list) lies no closer than its anchor (the 4th), the closest list's 30th
// row no closer than its 10th; skipping every list probed is refused.
TEST(ServingIndex, SkipsTheListsAPreviousPassScannedAndReportsWhereItStands) {
  TempDir tmp;
  for (const bool inner_product : {false, true}) {
    for (const std::string factory : {"IVF32,PQ16x4fs", "IVF32,PQ8"}) {
      SCOPED_TRACE(factory + (inner_product ? " ip" : " l2"));
      IndexSpec spec = FastScanSpec(factory);
      spec.inner_product = inner_product;
      std::unique_ptr<ServingIndex> index;
      if (factory == "IVF32,PQ8") {
        WriteIndex(tmp.path("p.index"), spec);
        index = MustOpen(tmp.path("p.index"));
      } else {
        index = OpenConverted(tmp, spec);
      }
      ASSERT_NE(index, nullptr);
      const std::vector<float> queries = MakeData(8, spec.d, 77);
      RowBitmap rows(spec.n);
      for (int64_t r = 0; r < spec.n; r += 3) rows.Set(r);
      constexpr int kK = 10;
      const auto search = [&](int nprobe, int skip,
                              std::vector<ProbeReference>* reference) {
        std::pair<std::vector<float>, std::vector<int64_t>> out;
        out.first.resize(8 * kK);
        out.second.resize(8 * kK);
        SearchArgs args;
        args.queries = queries.data();
        args.num_queries = 8;
        args.k = kK;
        args.nprobe = nprobe;
        args.skip_probes = skip;
        args.allowed_rows = &rows;
        args.distances = out.first.data();
        args.ids = out.second.data();
        if (reference != nullptr) {
          reference->resize(8);
          args.probe_reference = reference->data();
          args.reference_nprobe = 4;
          args.reference_k = kK;
          args.reference_rank = 3 * kK;
        }
        EXPECT_TRUE(index->Search(args).ok());
        return out;
      };
      std::vector<ProbeReference> reference;
      const auto whole = search(12, 0, &reference);
      const auto head = search(3, 0, nullptr);
      const auto tail = search(12, 3, nullptr);
      for (int q = 0; q < 8; ++q) {
        std::vector<std::pair<float, int64_t>> merged;
        for (const auto* part : {&head, &tail}) {
          for (int j = 0; j < kK; ++j) {
            merged.emplace_back(part->first[q * kK + j],
                                part->second[q * kK + j]);
          }
        }
        std::stable_sort(
            merged.begin(), merged.end(), [&](const auto& a, const auto& b) {
              return inner_product ? a.first > b.first : a.first < b.first;
            });
        for (int j = 0; j < kK; ++j) {
          EXPECT_EQ(merged[j].first, whole.first[q * kK + j]) << q << " " << j;
        }
        const ProbeReference& r = reference[q];
        if (inner_product) {
          EXPECT_LE(r.frontier, r.anchor);
          EXPECT_LE(r.nearest_rank, r.nearest_kth);
        } else {
          EXPECT_GE(r.frontier, r.anchor);
          EXPECT_GE(r.nearest_rank, r.nearest_kth);
        }
        EXPECT_TRUE(std::isfinite(r.nearest_kth));
      }
      SearchArgs bad;
      bad.queries = queries.data();
      bad.num_queries = 8;
      bad.k = kK;
      bad.nprobe = 4;
      bad.skip_probes = 4;
      std::vector<float> d(8 * kK);
      std::vector<int64_t> ids(8 * kK);
      bad.distances = d.data();
      bad.ids = ids.data();
      EXPECT_THAT(index->Search(bad).message(),
                  HasSubstr("skip_probes=4 is outside [0, 4)"));
    }
  }
}

}  // namespace
}  // namespace knnd
