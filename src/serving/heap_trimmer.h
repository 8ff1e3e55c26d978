// HeapTrimmer: gives freed heap memory back to the kernel after a burst.
//
// glibc returns free memory to the kernel only from the top of an arena
// (M_TRIM_THRESHOLD); what gRPC's receive buffers, parsed requests and
// responses free in the middle of the heap stays resident as anonymous
// memory until malloc_trim(0) releases its pages. A burst of large requests
// left ~250 MiB of freed [heap] resident that way (issue 18's flood). The
// trimmer checks how much free memory the arenas hold every `interval` and
// calls malloc_trim(0) when it is at least `min_free_bytes`, so anonymous
// memory comes back within about one interval of the last request.
//
// Thread-safety: Start/Stop from one thread (the server's); TrimNow and the
// counters from any thread.
#ifndef KNND_SERVING_HEAP_TRIMMER_H_
#define KNND_SERVING_HEAP_TRIMMER_H_

#include <cstdint>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace knnd {

// What malloc's arenas hold free (mallinfo2's fordblks, glibc >= 2.33): the
// bytes a trim could give back, at most.
int64_t HeapFreeBytes();

class HeapTrimmer {
 public:
  struct Options {
    // How often the arenas' free memory is checked; zero turns the
    // trimmer off (Start does nothing).
    absl::Duration interval = absl::Seconds(1);
    // Trim only when at least this much is free (a trim walks and locks
    // every arena: not worth it for a few pages).
    int64_t min_free_bytes = 2 << 20;
  };

  // The range of each option, naming its config field and the limit.
  static absl::Status ValidateOptions(const Options& options);

  explicit HeapTrimmer(const Options& options) : options_(options) {}
  ~HeapTrimmer() { Stop(); }
  HeapTrimmer(const HeapTrimmer&) = delete;
  HeapTrimmer& operator=(const HeapTrimmer&) = delete;

  // Starts the checking thread (unless the interval is zero).
  void Start();
  // Stops and joins it; idempotent.
  void Stop();

  // Trims now if at least min_free_bytes are free: returns the bytes that
  // were free before the trim, or 0 when it did not trim.
  int64_t TrimIfWorthIt();

  int64_t trims() const;
  // The free bytes seen before each trim, summed: an upper bound of what
  // the trims gave back.
  int64_t trimmed_free_bytes() const;

 private:
  void Run();

  const Options options_;
  std::thread thread_;
  absl::Notification stop_;
  mutable absl::Mutex mu_;
  int64_t trims_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t trimmed_free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace knnd

#endif  // KNND_SERVING_HEAP_TRIMMER_H_
