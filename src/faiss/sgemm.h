// OpenBLAS's single-precision matrix product, its Fortran interface
// declared as FAISS declares it (FAISS is built with 32-bit BLAS
// integers): for the files of src/faiss/ that call it beside FAISS
// (exact_scan.cc, coarse_l2.cc). Internal to src/faiss/.
#ifndef KNND_FAISS_SGEMM_H_
#define KNND_FAISS_SGEMM_H_

extern "C" int sgemm_(const char* transa, const char* transb, const int* m,
                      const int* n, const int* k, const float* alpha,
                      const float* a, const int* lda, const float* b,
                      const int* ldb, const float* beta, float* c,
                      const int* ldc);

#endif  // KNND_FAISS_SGEMM_H_
