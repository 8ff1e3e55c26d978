// The FAISS runtime's knobs and the search's temporaries: OpenBLAS's kernels
// for this CPU, the coarse-search block and FastScan's look-up tables kept
// under glibc's mmap threshold, measured by the page faults of real searches.
#include "knnd/faiss/faiss_runtime.h"

#include <malloc.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <faiss/utils/distances.h>

#include "knnd/faiss/fastscan_writer.h"
#include "knnd/faiss/sgemm.h"
#include "knnd/index/index_snapshot.h"
#include "testing/fastscan_util.h"
#include "testing/glibc_malloc.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::IndexSpec;
using ::knnd::testing::MakeData;
using ::knnd::testing::ReadFaissIndex;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteIndex;

// Minor page faults of the calling thread so far.
int64_t ThreadMinorFaults() {
  struct rusage usage;
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

// A core OpenBLAS does not know is run on the widest kernels the CPU has; a
// known core, a CPU without AVX2 and the user's OPENBLAS_CORETYPE are left
// alone.
TEST(BlasKernels, SwitchesOnlyAFallbackCoreOnACpuThatHasMore) {
  EXPECT_EQ(BlasKernelsToSwitchTo("Prescott", nullptr, "SkylakeX"), "SkylakeX");
  EXPECT_EQ(BlasKernelsToSwitchTo("Prescott", nullptr, "Haswell"), "Haswell");
  EXPECT_EQ(BlasKernelsToSwitchTo("Sandybridge", nullptr, "Haswell"),
            "Haswell");
  EXPECT_EQ(BlasKernelsToSwitchTo("Nehalem", nullptr, "SkylakeX"), "SkylakeX");
  // Recognised cores with AVX2 kernels, in any case.
  EXPECT_EQ(BlasKernelsToSwitchTo("Haswell", nullptr, "SkylakeX"), "");
  EXPECT_EQ(BlasKernelsToSwitchTo("Zen", nullptr, "SkylakeX"), "");
  EXPECT_EQ(BlasKernelsToSwitchTo("SKYLAKEX", nullptr, "SkylakeX"), "");
  EXPECT_EQ(BlasKernelsToSwitchTo("Cooperlake", nullptr, "SkylakeX"), "");
  EXPECT_EQ(BlasKernelsToSwitchTo("SapphireRapids", nullptr, "SkylakeX"), "");
  // The user's choice (or a parent knnd's, inherited) stays.
  EXPECT_EQ(BlasKernelsToSwitchTo("Prescott", "Prescott", "SkylakeX"), "");
  EXPECT_EQ(BlasKernelsToSwitchTo("Prescott", "", "SkylakeX"), "");
  // No AVX2 and FMA here: nothing better to switch to.
  EXPECT_EQ(BlasKernelsToSwitchTo("Prescott", nullptr, ""), "");
}

// What this process ends up with: on a CPU with AVX2 and FMA and without
// OPENBLAS_CORETYPE, kernels that use AVX2 (OpenBLAS's own choice when it
// knew the CPU, the switch otherwise), and the products they compute are
// right.
TEST(BlasKernels, ThisProcessRunsKernelsForThisCpuAndTheyMultiplyRight) {
  const bool user_set = std::getenv("OPENBLAS_CORETYPE") != nullptr;
  const BlasKernels& kernels = UseBlasKernelsForThisCpu();
  EXPECT_EQ(&kernels, &UseBlasKernelsForThisCpu()) << "chosen once";
  EXPECT_EQ(kernels.in_use, BlasKernelsInUse());
  __builtin_cpu_init();
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  std::printf("OpenBLAS chose %s at load; %s in use%s%s\n",
              kernels.chosen_at_load.c_str(), kernels.in_use.c_str(),
              kernels.note.empty() ? "" : ": ", kernels.note.c_str());
  if (kernels.in_use != kernels.chosen_at_load) {
    // Switched: the processes started from here inherit the choice.
    ASSERT_NE(std::getenv("OPENBLAS_CORETYPE"), nullptr);
    EXPECT_EQ(std::string(std::getenv("OPENBLAS_CORETYPE")), kernels.in_use);
    EXPECT_NE(kernels.note.find(kernels.chosen_at_load), std::string::npos);
    EXPECT_NE(kernels.note.find(kernels.in_use), std::string::npos);
  }
  if (avx2 && !user_set) {
    EXPECT_EQ(BlasKernelsToSwitchTo(kernels.in_use, nullptr, "Haswell"), "")
        << kernels.in_use << " has no AVX2 kernels on a CPU with AVX2";
  }
  if (user_set || !avx2) {
    EXPECT_EQ(kernels.in_use, kernels.chosen_at_load);
  }

  // C (m x n, column-major) = A^T B, as the coarse search calls it, against
  // a double-precision product; odd sizes reach the kernels' edge cases.
  const int m = 37, n = 53, k = 29;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(k) * m);
  std::vector<float> b(static_cast<size_t>(k) * n);
  for (float& v : a) v = value(rng);
  for (float& v : b) v = value(rng);
  std::vector<float> c(static_cast<size_t>(m) * n, -7.0f);
  const float one = 1.0f, zero = 0.0f;
  sgemm_("Transpose", "Not transpose", &m, &n, &k, &one, a.data(), &k,
         b.data(), &k, &zero, c.data(), &m);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double want = 0;
      for (int t = 0; t < k; ++t) {
        want += double{a[static_cast<size_t>(i) * k + t]} *
                b[static_cast<size_t>(j) * k + t];
      }
      ASSERT_NEAR(c[static_cast<size_t>(j) * m + i], want, 1e-4)
          << "row " << i << " column " << j << " with " << kernels.in_use;
    }
  }
}

constexpr int kRows = 256;  // a 256-row request searched in one call

// Minor page faults per search on this thread of kRows seeded queries (k 10,
// nprobe 4) by `index`, over `calls` searches after a first one (the heap
// grows once).
double FaultsPerCall(const IndexSnapshot& index, int dim, uint32_t seed,
                     int calls) {
  const std::vector<float> q = MakeData(kRows, dim, seed);
  std::vector<float> d(kRows * 10);
  std::vector<int64_t> ids(kRows * 10);
  const SearchArgs args{q.data(), kRows, 10, 4, {}, d.data(), ids.data()};
  EXPECT_TRUE(index.Search(args).ok());
  const int64_t before = ThreadMinorFaults();
  for (int i = 0; i < calls; ++i) EXPECT_TRUE(index.Search(args).ok());
  return static_cast<double>(ThreadMinorFaults() - before) / calls;
}

// glibc's thresholds as knnd fixes them (1 MiB, malloc_mmap_threshold_bytes)
// for the scope's life; glibc's defaults and FAISS's coarse block rows are
// restored after, whatever the test asserted.
class KnndMallocThresholds {
 public:
  KnndMallocThresholds() {
    EXPECT_EQ(mallopt(M_MMAP_THRESHOLD, 1 << 20), 1);
    EXPECT_EQ(mallopt(M_TRIM_THRESHOLD, 1 << 20), 1);
  }
  ~KnndMallocThresholds() {
    faiss::distance_compute_blas_query_bs = faiss_default_;
    mallopt(M_MMAP_THRESHOLD, 128 << 10);
    mallopt(M_TRIM_THRESHOLD, 128 << 10);
  }

 private:
  const int faiss_default_ = faiss::distance_compute_blas_query_bs;
};

// Under knnd's fixed 1 MiB mmap threshold, FAISS's default 16 MiB coarse
// distance block is mapped afresh by every call of >= 20 rows and faulted in
// page by page; sized under the threshold it is reused from the heap.
TEST(IndexSnapshot, CoarseSearchBlockUnderTheMmapThresholdStopsPageFaults) {
  if (!::knnd::testing::kGlibcMalloc) {
    GTEST_SKIP() << "a sanitizer's allocator ignores mallopt and keeps freed "
                    "memory in quarantine";
  }
  TempDir tmp;
  IndexSpec spec;
  spec.factory = "IVF128,PQ8";  // 256 rows x 128 centroids: 32 pages a call
  WriteIndex(tmp.path("c.index"), spec);
  auto s = IndexSnapshot::Load(tmp.path("c.index"), {});
  ASSERT_TRUE(s.ok()) << s.status();
  constexpr int kCalls = 20;
  double mapped, reused;
  {
    const KnndMallocThresholds thresholds;
    mapped = FaultsPerCall(**s, spec.d, 5, kCalls);
    EXPECT_EQ(SetCoarseBlockRowsUnder(1 << 20), 128);
    reused = FaultsPerCall(**s, spec.d, 5, kCalls);
    EXPECT_EQ(SetCoarseBlockRowsUnder(0), 128);  // 0 leaves it
    EXPECT_EQ(SetCoarseBlockRowsUnder(1 << 10), 20);
    EXPECT_EQ(SetCoarseBlockRowsUnder(int64_t{1} << 40), 4096);
  }
  std::printf("page faults per %d-row call: %.1f with FAISS's block, %.1f "
              "with one under the threshold\n", kRows, mapped, reused);
  EXPECT_GE(mapped, 30) << "FAISS's default block";
  EXPECT_LT(reused, 2) << "the block under the threshold";
}

// A FastScan search's look-up tables: a 256-row call over 196 sub-vectors
// of 4 dims (knnctl build's Fashion-MNIST recipe) quantizes 784 KiB of
// tables from 3 MiB of float ones. Under knnd's 1 MiB threshold both now
// come from the heap (the quantized tables allocated to size in slices
// under the threshold, the float ones a query at a time); before, FAISS's
// power-of-two tables of 1 and 4 MiB were mapped and faulted in on every
// call (102 faults a call here before, 0 after).
TEST(IndexSnapshot, FastScanTablesStayUnderTheMmapThreshold) {
  if (!::knnd::testing::kGlibcMalloc) {
    GTEST_SKIP() << "a sanitizer's allocator ignores mallopt and keeps freed "
                    "memory in quarantine";
  }
  TempDir tmp;
  IndexSpec spec;
  spec.n = 3000;
  spec.d = 784;
  spec.factory = "IVF16,PQ196x4fs";
  WriteIndex(tmp.path("faiss.index"), spec);
  ASSERT_TRUE(WriteFastScanFile(*ReadFaissIndex(tmp.path("faiss.index")),
                                tmp.path("f.index"))
                  .ok());
  auto s = IndexSnapshot::Load(tmp.path("f.index"), {});
  ASSERT_TRUE(s.ok()) << s.status();
  double per_call;
  {
    const KnndMallocThresholds thresholds;
    SetCoarseBlockRowsUnder(1 << 20);
    per_call = FaultsPerCall(**s, spec.d, 6, /*calls=*/10);
  }
  std::printf("page faults per %d-row FastScan call: %.1f\n", kRows,
              per_call);
  // The bound sits between the mapped tables (102) and what the heap's
  // own trimming costs: at the 1 MiB trim threshold, freed tables that
  // end at the top of the heap are given back and faulted in again, by
  // how the heap happens to be laid out. The same binary measured 0.0,
  // 19.7 and 39.3 faults a call, run from different working directories.
  EXPECT_LT(per_call, 64) << "the tables are mapped per call again";
}

}  // namespace
}  // namespace knnd
