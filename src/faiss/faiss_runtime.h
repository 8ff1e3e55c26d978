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
// rows itself. Call before the first search or build.
void UseSingleThreadedBlas();

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
