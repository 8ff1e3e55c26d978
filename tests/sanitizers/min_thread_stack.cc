// Linked into every binary of a sanitizer build (KNND_SANITIZE), never into
// a normal one. Debian's civetweb, which serves prometheus-cpp's /metrics,
// starts its threads with 100 KiB stacks (USE_STACK_SIZE=102400), and glibc
// carves the static TLS out of them: OpenBLAS's alone is 60 KiB. The 40 KiB
// left suffice for the uninstrumented scrape path but not for its
// ASan/TSan-instrumented frames, which overflow the stack in the first
// scrape. This interposer raises any requested thread stack to 1 MiB.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr,
                                         size_t stacksize) {
  using SetStackSize = int (*)(pthread_attr_t*, size_t);
  static const SetStackSize next = reinterpret_cast<SetStackSize>(
      dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return next(attr, std::max<size_t>(stacksize, size_t{1} << 20));
}
