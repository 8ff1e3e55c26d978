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
//     thread, and cancellation; also a ServerCall (server_call.h), the
//     view of a call that HTTP/JSON calls share.
//   - UnaryMethod<Service, Request, Response>: binds one generated
//     Request<Method> to a handler; each matched call posts the next
//     request on the same queue before its handler runs.
//   - ReadOnMatchMethod<Service, Request, Response>: the same for a unary
//     method whose request message gRPC reads only once the call is
//     matched (a method registered as a stream): at most `reads` messages
//     are read at once, and a call not yet matched holds no more than its
//     HTTP/2 stream window.
//
// Lifetime of a call: it is deleted once gRPC has returned both its finish
// and its done (AsyncNotifyWhenDone) events, so cancellation, deadline and
// a client gone early need no care from the handler beyond calling
// Finish() once.
#ifndef KNND_RPC_ASYNC_CALL_H_
#define KNND_RPC_ASYNC_CALL_H_

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/alarm.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/async_stream.h>
#include <grpcpp/support/async_unary_call.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "knnd/rpc/server_call.h"
#include "knnd/rpc/status_util.h"
#include "knnd/rpc/token_auth.h"

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
  // How many request messages of one ReadOnMatchMethod are read at once on
  // this queue: what the listener's limits let gRPC hold for them
  // (listener.h, RequestReads).
  int request_reads = 1;
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

// Also the protocol-neutral call (server_call.h) that KnnService's
// handlers take, so that they serve HTTP/JSON with the same code.
template <class Request, class Response>
class UnaryCall : public UnaryCallBase, public ServerCall<Request, Response> {
 public:
  const Request& request() const override { return request_; }
  Response* response() override { return &response_; }

  // Sends `status`, and the response when it is OK. Call exactly once,
  // from any thread; the call (and request()/response()) may be gone when
  // it returns.
  virtual void Finish(const grpc::Status& status) = 0;

  // ServerCall, over the call's context.
  Metrics::Protocol protocol() const override {
    return Metrics::Protocol::kGrpc;
  }
  std::string peer() const override { return context_.peer(); }
  absl::Time deadline() const override {
    return absl::FromChrono(context_.deadline());
  }
  bool cancelled() const override { return UnaryCallBase::cancelled(); }
  absl::Status Authorize(const TokenAuthenticator& auth,
                         absl::string_view method) const override {
    return auth.CheckCall(context_, method);
  }
  void AddTrailer(const std::string& key, const std::string& value) override {
    context_.AddTrailingMetadata(key, value);
  }
  void OnCancel(std::function<void()> on_cancel) override {
    UnaryCallBase::OnCancel(std::move(on_cancel));
  }
  void OnDone(std::function<void()> on_done) override {
    UnaryCallBase::OnDone(std::move(on_done));
  }
  void Answer(const absl::Status& status) override {
    Finish(ToGrpcStatus(status));
  }

 protected:
  Request request_;
  Response response_;
};

// A unary call as gRPC serves it: `Writer` (gRPC's responder for the
// method's kind) answers it; its finish and done events come back here.
// The method's Call (below) asks gRPC for the call and takes its request.
template <class Request, class Response, class Writer>
class ServedCall : public UnaryCall<Request, Response> {
 public:
  void Finish(const grpc::Status& status) final {
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

 protected:
  explicit ServedCall(const ServingQueue& queue)
      : queue_(queue),
        writer_(&this->context_),
        finish_tag_(this, &ServedCall::OnFinished),
        done_tag_(this, &ServedCall::OnDoneEvent) {
    this->calls_ = queue_.calls;
    this->calls_->Add();
    PostTag(&done_tag_);
    this->context_.AsyncNotifyWhenDone(&done_tag_);
  }

  // A request gRPC gave back unmatched (the server is shutting down): no
  // other event comes, so the call is deleted here.
  void Discard() {
    CallCount* const calls = this->calls_;
    delete this;
    calls->Remove();
  }

  const ServingQueue queue_;
  Writer writer_;

 private:
  void OnFinished(bool /*ok*/) { this->Unref(); }
  void OnDoneEvent(bool /*ok*/) {
    this->Done();
    this->Unref();
  }

  MemberTag<ServedCall> finish_tag_;
  MemberTag<ServedCall> done_tag_;
};

// Serves one unary method of `Service` (a generated AsyncService) with
// `handler`. gRPC reads a call's request message before it matches the
// call. Handlers run on the queue's thread that matched the call; a
// handler that blocks blocks its queue.
template <class Service, class Request, class Response>
class UnaryMethod {
 public:
  using RequestFn = void (Service::*)(
      grpc::ServerContext*, Request*,
      grpc::ServerAsyncResponseWriter<Response>*, grpc::CompletionQueue*,
      grpc::ServerCompletionQueue*, void*);
  using Handler = std::function<void(UnaryCall<Request, Response>*)>;

  UnaryMethod(Service* service, RequestFn request, Handler handler)
      : service_(service), request_(request), handler_(std::move(handler)) {}

  // Posts `pending` requests of this method on `queue` (each matched call
  // posts its successor, so `pending` stay posted).
  void Listen(const ServingQueue& queue, int pending = 1) {
    for (int i = 0; i < pending; ++i) new Call(this, queue);
  }

 private:
  class Call final
      : public ServedCall<Request, Response,
                          grpc::ServerAsyncResponseWriter<Response>> {
   public:
    Call(UnaryMethod* method, const ServingQueue& queue)
        : ServedCall<Request, Response,
                     grpc::ServerAsyncResponseWriter<Response>>(queue),
          method_(method),
          request_tag_(this, &Call::OnRequest) {
      PostTag(&request_tag_);
      (method_->service_->*method_->request_)(&this->context_, &this->request_,
                                              &this->writer_, this->queue_.cq,
                                              this->queue_.cq, &request_tag_);
    }

   private:
    void OnRequest(bool ok) {
      if (!ok) return this->Discard();
      new Call(method_, this->queue_);  // the next call of this method here
      method_->handler_(this);
    }

    UnaryMethod* const method_;
    MemberTag<Call> request_tag_;
  };

  Service* const service_;
  const RequestFn request_;
  const Handler handler_;
};

// Serves one unary method of `Service` that is registered as a stream
// (WithStreamedUnaryMethod_<M>, then marked asynchronous: see
// knn_async_service.h), so that gRPC matches a call without reading its
// request message; a matched call reads it, then posts its successor and
// runs `handler`, as UnaryMethod does. Why: gRPC reads a unary call's
// message as soon as its headers arrive, every call at once, so a flood of
// large requests made gRPC hold all of them before knnd could refuse any,
// and its memory quota then cut random calls (admitted ones among them) to
// free memory. Here at most `reads` calls of the method are matched and
// reading at once per queue; the others wait in gRPC's queue of calls
// (first come, first served) with no more than their HTTP/2 stream window
// received. A read still going after `lend_after` (a client that sends its
// message slowly, or not at all) lets the next call read beside it, so
// that a stalled client holds up no other: it adds memory only as fast as
// it sends. A client sees an ordinary unary method.
template <class Service, class Request, class Response>
class ReadOnMatchMethod {
 public:
  using Reader = grpc::ServerAsyncReader<Response, Request>;
  using RequestFn = void (Service::*)(grpc::ServerContext*, Reader*,
                                      grpc::CompletionQueue*,
                                      grpc::ServerCompletionQueue*, void*);
  using Handler = std::function<void(UnaryCall<Request, Response>*)>;

  // How long a read holds its turn by default: a message of the largest
  // size (32 MiB by default) arrives within it from a client sending 300
  // Mbit/s or more, so a flood of large messages from such clients is read
  // within the bound.
  static constexpr absl::Duration kLendAfter = absl::Seconds(1);

  ReadOnMatchMethod(Service* service, RequestFn request, Handler handler)
      : service_(service), request_(request), handler_(std::move(handler)) {}

  // Posts `reads` requests of this method on `queue`: at most that many of
  // its calls read their message at once there, besides those reading for
  // longer than `lend_after`.
  void Listen(const ServingQueue& queue, int reads,
              absl::Duration lend_after = kLendAfter) {
    lend_after_ = lend_after;
    for (int i = 0; i < std::max(1, reads); ++i) new Call(this, queue);
  }

 private:
  class Call final : public ServedCall<Request, Response, Reader> {
   public:
    Call(ReadOnMatchMethod* method, const ServingQueue& queue)
        : ServedCall<Request, Response, Reader>(queue),
          method_(method),
          request_tag_(this, &Call::OnMatched),
          read_tag_(this, &Call::OnRead),
          lend_tag_(this, &Call::OnLendTime) {
      PostTag(&request_tag_);
      (method_->service_->*method_->request_)(&this->context_, &this->writer_,
                                              this->queue_.cq, this->queue_.cq,
                                              &request_tag_);
    }

   private:
    void OnMatched(bool ok) {
      if (!ok) return this->Discard();
      // The alarm's event comes back (fired or cancelled) before the call
      // may be deleted.
      this->Ref();
      PostTag(&lend_tag_);
      lend_alarm_.Set(this->queue_.cq,
                      absl::ToChronoTime(absl::Now() + method_->lend_after_),
                      &lend_tag_);
      PostTag(&read_tag_);
      this->writer_.Read(&this->request_, &read_tag_);
    }
    // Once per call, from the read's end or the alarm, whichever is first.
    void PassTurn() {
      if (!turn_passed_.exchange(true, std::memory_order_acq_rel)) {
        new Call(method_, this->queue_);
      }
    }
    void OnLendTime(bool fired) {
      if (fired) PassTurn();
      this->Unref();
    }
    void OnRead(bool ok) {
      PassTurn();  // the next call may read now
      lend_alarm_.Cancel();
      if (ok) return method_->handler_(this);
      // No message: the client went away, gRPC refused the message (larger
      // than max_receive_message_bytes: the client already has gRPC's
      // status), or the stream closed without one or with one that does
      // not parse. The status reaches only the last kind of client.
      this->Finish(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "the call carried no request message that parses as a " +
                           Request::descriptor()->full_name()));
    }

    ReadOnMatchMethod* const method_;
    MemberTag<Call> request_tag_;
    MemberTag<Call> read_tag_;
    MemberTag<Call> lend_tag_;
    grpc::Alarm lend_alarm_;
    std::atomic<bool> turn_passed_{false};
  };

  Service* const service_;
  const RequestFn request_;
  const Handler handler_;
  absl::Duration lend_after_ = kLendAfter;  // set by Listen, before any call
};

}  // namespace knnd

#endif  // KNND_RPC_ASYNC_CALL_H_
