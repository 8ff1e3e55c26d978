// Whether a test's allocations go through glibc's malloc (its mallopt,
// malloc_trim and arenas): not under a sanitizer, whose allocator
// replaces it.
#ifndef KNND_TESTS_GLIBC_MALLOC_H_
#define KNND_TESTS_GLIBC_MALLOC_H_

namespace knnd {
namespace testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kGlibcMalloc = false;
#else
inline constexpr bool kGlibcMalloc = true;
#endif

}  // namespace testing
}  // namespace knnd

#endif  // KNND_TESTS_GLIBC_MALLOC_H_
