// knnd's services on gRPC's asynchronous API (completion queues that knnd's
// own threads drain), instead of the callback API. The callback API runs
// its own pool of threads that poll the process's one event set and wake
// for events that are not theirs, and a synchronous service (ThreadManager)
// runs yet another pool; with every service of a listener here, a
// listener's threads are the ones knnd starts, each asleep in Next() until
// an event of its own queue arrives. knnd's search port has one queue and
// a thread per core: the thread that polled a call in finds it in its own
// queue, and a thread busy with a handler (or an inline search) holds up
// no call that another thread could take.
//
// Pieces:
//   - CqTag: what every event's tag points to; Proceed(ok) runs on the
//     thread that drained the event.
//   - AsyncService: a grpc::Service (the generated AsyncService) with the
//     handlers knnd binds to it; Listen(cq) posts its first requests on a
//     queue. BuildListener (listener.h) registers it, adds the queues and
//     starts the threads.
//   - UnaryCall<Request, Response>: one unary call as its handler sees it:
//     the request, the response to fill, the context, Finish() from any
//     thread, and cancellation.
//   - UnaryMethod<Service, Request, Response>: binds one generated
//     Request<Method> to a handler; each matched call posts the next
//     request on the same queue before its handler runs.
//
// Lifetime of a call: it is deleted once gRPC has returned both its finish
// and its done (AsyncNotifyWhenDone) events, so cancellation, deadline and
// a client gone early need no care from the handler beyond calling
// Finish() once.
#ifndef KNND_RPC_ASYNC_CALL_H_
#define KNND_RPC_ASYNC_CALL_H_

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/completion_queue.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/async_unary_call.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#if defined(__SANITIZE_THREAD__)
#define KNND_TSAN_HANDOFF 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KNND_TSAN_HANDOFF 1
#endif
#endif
#ifdef KNND_TSAN_HANDOFF
#include <sanitizer/tsan_interface.h>
#endif

namespace knnd {

// An event's tag. Proceed() runs on a queue's thread; `ok` is gRPC's.
class CqTag {
 public:
  virtual void Proceed(bool ok) = 0;

 protected:
  ~CqTag() = default;
};

// A tag's hand-off between threads, for ThreadSanitizer: the thread that
// gives a tag to gRPC (posting a request, Finish, Write, NotifyWhenDone)
// and the thread that drains its event meet only inside gRPC core, which
// is not instrumented, so TSan would take every write the first made
// before (the call object's construction, its response) for a race with
// the second. PostTag() just before handing `tag` to gRPC and TakeTag()
// on the event make that order visible; both compile to nothing outside
// TSan builds. Writes made inside gRPC's own calls after PostTag() stay
// unseen (tests/sanitizers/tsan.supp names those).
inline void PostTag(CqTag* tag) {
#ifdef KNND_TSAN_HANDOFF
  __tsan_release(tag);
#else
  (void)tag;
#endif
}
inline void TakeTag(void* tag) {
#ifdef KNND_TSAN_HANDOFF
  __tsan_acquire(tag);
#else
  (void)tag;
#endif
}

// A tag that forwards to a member of its owner (one owner has several).
template <class Owner>
class MemberTag final : public CqTag {
 public:
  MemberTag(Owner* owner, void (Owner::*fn)(bool)) : owner_(owner), fn_(fn) {}
  void Proceed(bool ok) override { (owner_->*fn_)(ok); }

 private:
  Owner* const owner_;
  void (Owner::*const fn_)(bool);
};

// The call objects of a listener, posted or running. Its queues are shut
// down only once there are none: gRPC's Server::Shutdown() returns once
// its calls are cancelled, not once their handlers have answered, and an
// answer started on a queue already shut down aborts the process.
class CallCount {
 public:
  void Add() {
    absl::MutexLock lock(&mu_);
    ++count_;
  }
  void Remove() {
    absl::MutexLock lock(&mu_);
    --count_;
  }
  // Waits until none is left (every posted request given back by a
  // server that is shut down, every call answered and its events back).
  void AwaitNone() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* count) { return *count == 0; }, &count_));
  }

 private:
  absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

// One completion queue of a listener and its listener's call count: every
// call object posted on the queue is counted from its creation to its
// deletion.
struct ServingQueue {
  grpc::ServerCompletionQueue* cq = nullptr;
  CallCount* calls = nullptr;
};

// A service served from completion queues.
class AsyncService {
 public:
  virtual ~AsyncService() = default;
  // The generated grpc::Service to register with the server.
  virtual grpc::Service* grpc_service() = 0;
  // Posts the first request of every method on `queue`; called once per
  // queue of the server the service is registered with, after it started.
  virtual void Listen(const ServingQueue& queue) = 0;
};

// Drains completion queues with threads of its own. Shutdown(): after the
// server's Shutdown() has returned (it needs the queues drained until
// then).
class CompletionQueueThreads {
 public:
  CompletionQueueThreads() = default;
  ~CompletionQueueThreads() { Shutdown(); }
  CompletionQueueThreads(const CompletionQueueThreads&) = delete;
  CompletionQueueThreads& operator=(const CompletionQueueThreads&) = delete;

  // Takes the queues (from ServerBuilder::AddCompletionQueue) before Start.
  void Add(std::unique_ptr<grpc::ServerCompletionQueue> cq);
  size_t size() const { return queues_.size(); }
  ServingQueue queue(size_t i) {
    return ServingQueue{queues_[i].get(), &calls_};
  }
  // `threads_per_queue` threads per queue, named `name` (15 characters at
  // most are shown). After each event a thread polls its queue for
  // `poll_us` microseconds (0: none) before it blocks: an event arriving
  // meanwhile is taken without a sleeping thread being woken for it.
  // With `may_poll`, a thread polls only when it returns true (asked after
  // each event; it must be cheap and thread-safe).
  void Start(const char* name, int threads_per_queue = 1, int poll_us = 0,
             std::function<bool()> may_poll = nullptr);
  // Waits for every call object to be gone (the server must be shut
  // down), shuts the queues down and joins their threads once every event
  // is drained. Idempotent.
  void Shutdown();

  // How many times a thread has gone to gRPC's blocking Next() (where it
  // sleeps unless an event is waiting): once per event without polling, and
  // only when a poll ran out (or may_poll said no) with it.
  int64_t blocking_waits() const {
    return blocking_waits_.load(std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> blocking_waits_{0};
  CallCount calls_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::vector<std::thread> threads_;
};

// One unary call, as its handler sees it.
class UnaryCallBase {
 public:
  grpc::ServerContext* context() { return &context_; }
  const grpc::ServerContext& context() const { return context_; }

  // Whether gRPC has cancelled the call (client gone, deadline passed,
  // server shut down). Safe on any thread, at any time before Finish.
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // `on_cancel` runs once if the call is cancelled: on a queue's thread
  // when gRPC says so, or at once here if it already has. Set it at most
  // once, before Finish().
  void OnCancel(std::function<void()> on_cancel);

  // `on_done` runs when the call is deleted (every event back), on the
  // thread that drained the last event, or on the one that called Finish()
  // when both events were back before it returned; the owner of state kept
  // beside the call frees it there. Set it at most once, before Finish().
  void OnDone(std::function<void()> on_done);

 protected:
  UnaryCallBase() = default;
  virtual ~UnaryCallBase();

  // The done event: records cancellation and runs the cancel callback.
  void Done();
  // A reference besides the two events' (the finishing thread's).
  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  // Drops one; the last deletes the call.
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      CallCount* const calls = calls_;
      delete this;
      calls->Remove();
    }
  }

  grpc::ServerContext context_;
  CallCount* calls_ = nullptr;  // the listener's count (set by the call)

 private:
  std::atomic<bool> cancelled_{false};
  // A matched call's two events still to come: its finish and its done
  // (which gRPC may deliver on another thread before the request's own
  // event has been handled), and one more while Finish() runs. An
  // unmatched one is deleted without them.
  std::atomic<int> refs_{2};
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_done_;
};

template <class Request, class Response>
class UnaryCall : public UnaryCallBase {
 public:
  const Request& request() const { return request_; }
  Response* response() { return &response_; }

  // Sends `status`, and the response when it is OK. Call exactly once,
  // from any thread; the call (and request()/response()) may be gone when
  // it returns.
  virtual void Finish(const grpc::Status& status) = 0;

 protected:
  Request request_;
  Response response_;
};

// Serves one unary method of `Service` (a generated AsyncService) with
// `handler`. Handlers run on the queue's thread that matched the call; a
// handler that blocks blocks its queue.
template <class Service, class Request, class Response>
class UnaryMethod {
 public:
  using RequestFn = void (Service::*)(
      grpc::ServerContext*, Request*, grpc::ServerAsyncResponseWriter<Response>*,
      grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*);
  using Handler = std::function<void(UnaryCall<Request, Response>*)>;

  UnaryMethod(Service* service, RequestFn request, Handler handler)
      : service_(service), request_(request), handler_(std::move(handler)) {}

  // Posts `pending` requests of this method on `queue` (each matched call
  // posts its successor, so `pending` stay posted).
  void Listen(const ServingQueue& queue, int pending = 1) {
    for (int i = 0; i < pending; ++i) new Call(this, queue);
  }

 private:
  class Call final : public UnaryCall<Request, Response> {
   public:
    Call(UnaryMethod* method, const ServingQueue& queue)
        : method_(method),
          queue_(queue),
          writer_(&this->context_),
          request_tag_(this, &Call::OnRequest),
          finish_tag_(this, &Call::OnFinished),
          done_tag_(this, &Call::OnDoneEvent) {
      this->calls_ = queue_.calls;
      this->calls_->Add();
      PostTag(&done_tag_);
      PostTag(&request_tag_);
      this->context_.AsyncNotifyWhenDone(&done_tag_);
      (method_->service_->*method_->request_)(&this->context_, &this->request_,
                                              &writer_, queue_.cq, queue_.cq,
                                              &request_tag_);
    }

    void Finish(const grpc::Status& status) override {
      // The finishing thread holds the call until Finish() returns: Finish
      // reads the call (the response as it is serialized, the context's
      // metadata) after PostTag() and before gRPC starts the batch, and the
      // events that may delete it on a queue's thread meanwhile come back
      // through gRPC core, which TSan does not see. The reference count's
      // order is one it sees; outside TSan it costs two atomic operations.
      this->Ref();
      PostTag(&finish_tag_);
      if (status.ok()) {
        writer_.Finish(this->response_, status, &finish_tag_);
      } else {
        writer_.FinishWithError(status, &finish_tag_);
      }
      this->Unref();
    }

   private:
    void OnRequest(bool ok) {
      if (!ok) {  // the server is shutting down; no other event comes
        CallCount* const calls = this->calls_;
        delete this;
        calls->Remove();
        return;
      }
      new Call(method_, queue_);  // the next call of this method here
      method_->handler_(this);
    }
    void OnFinished(bool /*ok*/) { this->Unref(); }
    void OnDoneEvent(bool /*ok*/) {
      this->Done();
      this->Unref();
    }

    UnaryMethod* const method_;
    const ServingQueue queue_;
    grpc::ServerAsyncResponseWriter<Response> writer_;
    MemberTag<Call> request_tag_;
    MemberTag<Call> finish_tag_;
    MemberTag<Call> done_tag_;
  };

  Service* const service_;
  const RequestFn request_;
  const Handler handler_;
};

}  // namespace knnd

#endif  // KNND_RPC_ASYNC_CALL_H_
