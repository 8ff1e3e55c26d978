// The process-wide and per-thread knobs of the FAISS runtime (OpenBLAS,
// OpenMP, FAISS's global block sizes) and what the linked FAISS build says
// of itself. knnd sets them deliberately: OpenBLAS threads spinning beside
// FAISS's OpenMP threads and the worker threads oversubscribe small
// machines badly.
#ifndef KNND_FAISS_FAISS_RUNTIME_H_
#define KNND_FAISS_FAISS_RUNTIME_H_

#include <cstdint>
#include <string>

namespace knnd {

// OpenBLAS runs single-threaded (process-wide): FAISS parallelises over
// rows itself. Call before the first search or build. Without it Debian's
// OpenBLAS (its pthreads build) starts as many threads as OMP_NUM_THREADS
// says, else one per core.
void UseSingleThreadedBlas();

// The threads OpenBLAS runs a call on now (openblas_get_num_threads).
int BlasThreads();

// OpenBLAS's kernels for this CPU. Debian 12's OpenBLAS (0.3.21, built
// with the kernels of every x86-64 core it knew: DYNAMIC_ARCH) picks them by
// CPU model as it loads, and takes a model it does not know for Prescott,
// whose SSE3 kernels run sgemm (FAISS's coarse search from 20 query rows up,
// its k-means, exact scans) at a fraction of an AVX-512 CPU's speed: Intel
// family 6 model 207 (5th generation Xeon) is such a model, 36 against 159
// GFlop/s for a 256 x 256 x 784 product on one core (bench/RESULTS.md
// "OpenBLAS kernels").
//
// When OPENBLAS_CORETYPE is unset and OpenBLAS chose a core without AVX2
// on a CPU with AVX2 and FMA, this switches it to the kernels of the widest
// vectors the CPU has: SkylakeX's (AVX-512 F, BW, DQ and VL) or Haswell's,
// and sets OPENBLAS_CORETYPE to them for the processes started from this
// one. A core OpenBLAS recognised, or one the user named, stays. Call at
// the start of main(), before other threads start and before any BLAS call;
// later calls return the first one's answer and change nothing.
struct BlasKernels {
  std::string chosen_at_load;  // OpenBLAS's own choice, e.g. "Prescott"
  std::string in_use;          // e.g. "SkylakeX"
  // Why in_use differs from chosen_at_load, or why a core without AVX2 was
  // kept on a CPU with it; empty otherwise.
  std::string note;
};
const BlasKernels& UseBlasKernelsForThisCpu();

// The kernels OpenBLAS runs now (openblas_get_corename), changing nothing.
std::string BlasKernelsInUse();

// UseBlasKernelsForThisCpu's decision: the kernels to switch to, or "" to
// keep `chosen_at_load`. `coretype_env` is OPENBLAS_CORETYPE (null when
// unset); `widest` is this CPU's "SkylakeX", "Haswell" or "" (no AVX2 and
// FMA).
std::string BlasKernelsToSwitchTo(const std::string& chosen_at_load,
                                  const char* coretype_env,
                                  const std::string& widest);

// OpenMP threads for parallel regions that FAISS starts from the calling
// thread (a per-thread setting); n >= 1.
void SetOpenMpThreadsOfThisThread(int n);

// FAISS's coarse search (IndexFlat, >= 20 query rows) allocates a block of
// distance_compute_blas_query_bs x distance_compute_blas_database_bs floats
// per call, 4096 x 1024 (16 MiB) by default, and fills rows x min(nlist,
// 1024) of it. When glibc maps blocks that large afresh (a fixed
// M_MMAP_THRESHOLD below 16 MiB, as knnd sets), every call page-faults on
// each 4 KiB it fills (~300 faults per 256-row call). This sets the query
// rows per block so that the block stays under `mmap_threshold_bytes` (at
// least 20 rows, at most FAISS's 4096) and is reused from the heap; 0 leaves
// FAISS's default. Process-wide; returns the rows set.
int SetCoarseBlockRowsUnder(int64_t mmap_threshold_bytes);

// "1.7.3"
std::string FaissVersion();
// faiss::get_compile_options() trimmed, e.g. "OPTIMIZE AVX2".
std::string FaissCompileOptions();

}  // namespace knnd

#endif  // KNND_FAISS_FAISS_RUNTIME_H_
