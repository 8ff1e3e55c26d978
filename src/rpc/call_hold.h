// CallHold: the last moments of a shutdown, when grpc::Server::Shutdown()
// is about to send GOAWAY. gRPC's core cancels (CANCELLED, not retryable)
// every call that reaches it once Shutdown() has begun, until the client
// has read the GOAWAY; a client answered UNAVAILABLE just before it sends
// its retry straight into that window. Holding the answers to the calls
// refused in those moments until the GOAWAY is out keeps a client that waits
// for its answer (a blocking stub, or a retry loop) from sending anything
// meanwhile: its retry then goes to a new connection (another replica, or a
// refused connect, UNAVAILABLE).
//
// A held call is answered on Release(), or shortly before its deadline if
// that comes first (a hold never turns into DEADLINE_EXCEEDED).
//
// Thread-safety: every method is safe to call concurrently. Answers run on
// the thread of Release() or on the hold's timer thread, never while a lock
// is held.
#ifndef KNND_RPC_CALL_HOLD_H_
#define KNND_RPC_CALL_HOLD_H_

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace knnd {

class CallHold {
 public:
  // A held call is answered `deadline_margin` before its deadline.
  explicit CallHold(absl::Duration deadline_margin = absl::Milliseconds(50))
      : margin_(deadline_margin) {}
  // Answers every call still held.
  ~CallHold();
  CallHold(const CallHold&) = delete;
  CallHold& operator=(const CallHold&) = delete;

  // From now on Hold() keeps calls until Release().
  void Start();
  // Answers every held call now; later Hold() calls return false.
  void Release();

  // Keeps `answer` to run on Release() or `margin` before `deadline`, and
  // returns true; false (the caller answers at once) when the hold is not
  // on, or the deadline is too near to wait.
  bool Hold(absl::Time deadline, std::function<void()> answer);

  bool holding() const;
  int held() const;

 private:
  struct Held {
    absl::Time answer_by;
    std::function<void()> answer;
  };
  enum class State { kOff, kHolding, kReleased };

  // The timer thread: answers each call whose answer_by has come.
  void AnswerDueCalls();
  void Join();

  const absl::Duration margin_;
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kOff;
  std::vector<Held> held_ ABSL_GUARDED_BY(mu_);
  std::thread timer_;
};

}  // namespace knnd

#endif  // KNND_RPC_CALL_HOLD_H_
