// UnaryMethod / UnaryCall / CompletionQueueThreads (rpc/async_call.h) on a
// loopback listener: answers from another thread, errors, cancellation
// reaching the handler, every call deleted, a listener closed with calls
// still posted and one still open, threads that poll their queue before
// sleeping (poll_us), and many calls answered by a thread of their own.
// ReadOnMatchMethod (Search as KnnAsyncService registers it): a unary
// client answered, at most `reads` messages read at once (a call whose
// message has not come holds its read until it comes, the call ends or its
// turn is lent), and a call that closes without a message refused.
#include "knnd/rpc/async_call.h"

#include <atomic>
#include <chrono>
#include <dirent.h>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "knnd/rpc/knn_async_service.h"
#include "knnd/rpc/listener.h"
#include "testing/test_util.h"
#include "knnd/v1/knn_service.grpc.pb.h"

namespace knnd {
namespace {

using knnd::v1::GetIndexInfoRequest;
using knnd::v1::GetIndexInfoResponse;
using Async = knnd::v1::KnnService::AsyncService;
using InfoCall = UnaryCall<GetIndexInfoRequest, GetIndexInfoResponse>;

// GetIndexInfo served by a handler the test sets: it may answer at once,
// or keep the call for the test to finish.
class TestService final : public AsyncService {
 public:
  explicit TestService(std::function<void(InfoCall*)> handler)
      : method_(&service_, &Async::RequestGetIndexInfo, std::move(handler)) {}
  grpc::Service* grpc_service() override { return &service_; }
  void Listen(const ServingQueue& queue) override {
    method_.Listen(queue, 2);
  }

 private:
  Async service_;
  UnaryMethod<Async, GetIndexInfoRequest, GetIndexInfoResponse> method_;
};

struct Served {
  explicit Served(std::function<void(InfoCall*)> handler, int queues = 2,
                  int poll_us = 0, const char* thread_name = "knnd-grpc",
                  std::function<bool()> may_poll = nullptr)
      : service(std::move(handler)) {
    absl::StatusOr<Listener> built = knnd::testing::ServeOnLoopback(
        &service, queues, poll_us, thread_name, std::move(may_poll));
    EXPECT_TRUE(built.ok()) << built.status();
    stub = knnd::v1::KnnService::NewStub(knnd::testing::FreshChannel(
        "127.0.0.1:" + std::to_string(built->port)));
    listener = std::move(*built);
  }

  grpc::Status Call(GetIndexInfoResponse* response,
                    grpc::ClientContext* context = nullptr) {
    grpc::ClientContext own;
    if (context == nullptr) context = &own;
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(20));
    return stub->GetIndexInfo(context, GetIndexInfoRequest(), response);
  }

  TestService service;
  Listener listener;
  std::unique_ptr<knnd::v1::KnnService::Stub> stub;
};

TEST(AsyncCall, AnswersFromTheHandlerThreadAndFromAnother) {
  std::atomic<int> calls{0};
  std::vector<std::thread> finishers;
  absl::Mutex mu;
  Served served([&](InfoCall* call) {
    const int n = calls.fetch_add(1);
    call->response()->set_dim(static_cast<uint32_t>(100 + n));
    if (n % 2 == 0) {
      call->Finish(grpc::Status::OK);  // on the queue's thread
      return;
    }
    absl::MutexLock lock(&mu);
    finishers.emplace_back([call] { call->Finish(grpc::Status::OK); });
  });
  std::vector<uint32_t> dims;
  for (int i = 0; i < 6; ++i) {
    GetIndexInfoResponse response;
    const grpc::Status status = served.Call(&response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    dims.push_back(response.dim());
  }
  EXPECT_EQ(dims, (std::vector<uint32_t>{100, 101, 102, 103, 104, 105}));
  served.listener.Close(absl::Now() + absl::Seconds(5));
  for (std::thread& t : finishers) t.join();
}

// Calls answered by one finisher thread that hands nothing back to the
// queue threads except through gRPC (the handler publishes each call in a
// slot the finisher only reads), as knnd's workers answer searches: each
// call is deleted by a queue thread after gRPC returns its events, and
// every client gets its answer. Under ThreadSanitizer this checks that
// Finish() holds the call while it reads it: without that reference, about
// one run in three reports the finisher's read of the call's metadata (or
// of its response, as it is serialized) against the queue thread's delete,
// since the order between the two passes through gRPC core only.
TEST(AsyncCall, ManyCallsAnsweredByAnotherThread) {
  constexpr int kClients = 8;
  constexpr int kCallsEach = 300;
  constexpr int kCalls = kClients * kCallsEach;
  std::vector<std::atomic<InfoCall*>> slots(kCalls);
  std::atomic<int> next{0};
  std::thread finisher([&] {
    for (int i = 0; i < kCalls; ++i) {
      InfoCall* call;
      while ((call = slots[i].load(std::memory_order_acquire)) == nullptr) {
        std::this_thread::yield();
      }
      call->Finish(grpc::Status::OK);
    }
  });
  // Queue threads that poll after each event, as knnd's search listener's
  // do: an answer is then often taken without a sleeping thread being woken.
  Served served(
      [&](InfoCall* call) {
        call->response()->set_dim(7);
        slots[next.fetch_add(1)].store(call, std::memory_order_release);
      },
      /*queues=*/1, /*poll_us=*/200);
  std::vector<std::thread> clients;
  std::atomic<int> answered{0};
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      for (int i = 0; i < kCallsEach; ++i) {
        GetIndexInfoResponse response;
        if (served.Call(&response).ok() && response.dim() == 7) ++answered;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(answered.load(), kCalls);
  // Closed while the finisher still runs, as knnd's workers do when its
  // listener closes: the queues are deleted with nothing else ordering the
  // finisher's last Finish() before that.
  served.listener.Close(absl::Now() + absl::Seconds(5));
  finisher.join();
}

TEST(AsyncCall, AnErrorStatusReachesTheClientWithoutTheResponse) {
  Served served([](InfoCall* call) {
    call->response()->set_dim(7);  // not sent with an error
    call->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              "index_version=3 is not loaded"));
  });
  GetIndexInfoResponse response;
  const grpc::Status status = served.Call(&response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), "index_version=3 is not loaded");
  EXPECT_EQ(response.dim(), 0u);
}

// A client that cancels: the handler's OnCancel runs, cancelled() turns
// true, and once the handler finishes the call is deleted (OnDone).
TEST(AsyncCall, CancellationReachesTheHandlerAndTheCallIsDeleted) {
  absl::Notification received, cancel_seen, deleted;
  std::atomic<InfoCall*> held{nullptr};
  Served served([&](InfoCall* call) {
    call->OnDone([&] { deleted.Notify(); });
    call->OnCancel([&] { cancel_seen.Notify(); });
    held = call;
    received.Notify();
  });
  grpc::ClientContext context;
  std::thread client([&] {
    GetIndexInfoResponse response;
    EXPECT_EQ(served.Call(&response, &context).error_code(),
              grpc::StatusCode::CANCELLED);
  });
  ASSERT_TRUE(received.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_FALSE(held.load()->cancelled());
  EXPECT_FALSE(deleted.HasBeenNotified());
  context.TryCancel();
  ASSERT_TRUE(cancel_seen.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_TRUE(held.load()->cancelled());
  EXPECT_FALSE(deleted.HasBeenNotified());  // not before its Finish
  held.load()->Finish(grpc::Status::OK);
  EXPECT_TRUE(deleted.WaitForNotificationWithTimeout(absl::Seconds(20)));
  client.join();
}

// A handler that sets OnCancel after the cancellation arrived has it run
// at once.
TEST(AsyncCall, OnCancelSetLateRunsAtOnce) {
  absl::Notification received, deleted;
  std::atomic<InfoCall*> held{nullptr};
  Served served([&](InfoCall* call) {
    call->OnDone([&] { deleted.Notify(); });
    held = call;
    received.Notify();
  });
  grpc::ClientContext context;
  std::thread client([&] {
    GetIndexInfoResponse response;
    served.Call(&response, &context);
  });
  ASSERT_TRUE(received.WaitForNotificationWithTimeout(absl::Seconds(20)));
  context.TryCancel();
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (!held.load()->cancelled() && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(held.load()->cancelled());
  bool ran = false;
  held.load()->OnCancel([&] { ran = true; });
  EXPECT_TRUE(ran);
  held.load()->Finish(grpc::Status::OK);
  EXPECT_TRUE(deleted.WaitForNotificationWithTimeout(absl::Seconds(20)));
  client.join();
}

// Closing with a call still open: gRPC cancels it at the deadline, the
// handler's Finish (after that) still ends it, and Close returns with
// every posted request given back.
TEST(AsyncCall, CloseCancelsAnOpenCallAndReturnsOnceItIsFinished) {
  absl::Notification received, deleted;
  std::atomic<InfoCall*> held{nullptr};
  auto served = std::make_unique<Served>([&](InfoCall* call) {
    call->OnDone([&] { deleted.Notify(); });
    call->OnCancel([call] { call->Finish(grpc::Status::CANCELLED); });
    held = call;
    received.Notify();
  });
  std::thread client([&] {
    GetIndexInfoResponse response;
    EXPECT_FALSE(served->Call(&response).ok());
  });
  ASSERT_TRUE(received.WaitForNotificationWithTimeout(absl::Seconds(20)));
  served->listener.Close(absl::Now() + absl::Milliseconds(100));
  EXPECT_TRUE(deleted.HasBeenNotified());
  EXPECT_FALSE(served->listener.open());
  client.join();
}

// Voluntary context switches (the thread blocked) of this process's
// threads named `name`, summed.
int64_t VoluntarySwitches(const std::string& name) {
  int64_t total = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + entry->d_name;
    std::string comm;
    std::getline(std::ifstream(task + "/comm"), comm);
    if (comm != name) continue;
    std::ifstream status(task + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) {
        total += std::stoll(line.substr(line.find(':') + 1));
      }
    }
  }
  closedir(dir);
  return total;
}

// Sequential calls, each sent once the previous one is answered: a queue
// thread that sleeps as soon as its events are handled goes to gRPC's
// blocking Next() for every event and blocks about once per call or more
// (voluntary context switches, measured: 1.0-2.5; fewer on a busy machine,
// where the next call can arrive before the thread sleeps); one that polls
// for 50 ms after each event takes the next call while still polling and
// (almost) never goes to Next() (the count CompletionQueueThreads keeps;
// its context switches are not the measure, since gRPC's own locks can
// block a polling thread: under AddressSanitizer beside other test
// processes, runs of 100 calls blocked 20 times while polling (CI)). The
// polling thread is still given three runs, its fewest waits counting, in
// case a call's turn outlasts a poll. A thread whose may_poll says no
// (knnd's while a worker is busy) sleeps at once, as one that does not
// poll, and is asked after every event. All answer every call and shut
// down.
TEST(AsyncCall, APollingThreadTakesTheNextCallWithoutSleeping) {
  constexpr int kCalls = 100;
  constexpr int kPollingRuns = 3;
  struct Case {
    const char* name;
    int poll_us;
    bool may_poll;
    int runs;
    int64_t blocked = -1;  // voluntary context switches, of the run kept
    int64_t waits = -1;    // blocking waits: the fewest over the runs
  };
  Case cases[] = {{"test-sleeping", 0, true, 1},
                  {"test-polling", 50000, true, kPollingRuns},
                  {"test-held", 50000, false, 1}};
  std::atomic<int> asked{0};
  // The voluntary context switches of one run of kCalls calls, in
  // *blocked, and its threads' blocking waits, in *waits.
  auto run = [&asked](const Case& c, int64_t* blocked, int64_t* waits) {
    std::function<bool()> may_poll;
    if (!c.may_poll) {
      may_poll = [&asked] {
        asked.fetch_add(1);
        return false;
      };
    }
    Served served(
        [](InfoCall* call) {
          call->response()->set_dim(3);
          call->Finish(grpc::Status::OK);
        },
        /*queues=*/1, c.poll_us, c.name, std::move(may_poll));
    GetIndexInfoResponse response;
    ASSERT_TRUE(served.Call(&response).ok());  // the connection is up
    const int64_t before = VoluntarySwitches(c.name);
    ASSERT_GE(before, 0);
    const int64_t waits_before = served.listener.queues->blocking_waits();
    for (int i = 0; i < kCalls; ++i) {
      response.Clear();
      const grpc::Status status = served.Call(&response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      ASSERT_EQ(response.dim(), 3u);
    }
    *blocked = VoluntarySwitches(c.name) - before;
    *waits = served.listener.queues->blocking_waits() - waits_before;
    served.listener.Close(absl::Now() + absl::Seconds(5));
    EXPECT_FALSE(served.listener.open());
  };
  for (Case& c : cases) {
    for (int r = 0; r < c.runs; ++r) {
      int64_t blocked = -1;
      int64_t waits = -1;
      run(c, &blocked, &waits);
      ASSERT_FALSE(::testing::Test::HasFatalFailure()) << c.name;
      if (c.waits < 0 || waits < c.waits) {
        c.waits = waits;
        c.blocked = blocked;
      }
      if (c.waits < kCalls / 5) break;  // a quiet run: no need for more
    }
  }
  // Every call's events went to Next() without polling, and the threads
  // slept there.
  EXPECT_GE(cases[0].waits, kCalls) << "threads that do not poll";
  EXPECT_GE(cases[0].blocked, kCalls / 3) << "threads that do not poll";
  EXPECT_LT(cases[1].waits, kCalls / 5)
      << "threads polling for 50 ms (context switches: " << cases[1].blocked
      << ")";
  EXPECT_GE(cases[2].waits, kCalls) << "threads whose may_poll says no";
  EXPECT_GE(cases[2].blocked, kCalls / 3) << "threads whose may_poll says no";
  EXPECT_GE(asked.load(), kCalls) << "may_poll asked after each event";
}

using knnd::v1::SearchRequest;
using knnd::v1::SearchResponse;
using SearchCall = UnaryCall<SearchRequest, SearchResponse>;

// Search served by ReadOnMatchMethod with `reads` reads at once, each
// lent after `lend_after`; the handler answers with the request's k and
// records the order of the ks.
class ReadOnMatchService final : public AsyncService {
 public:
  ReadOnMatchService(int reads, absl::Duration lend_after)
      : reads_(reads),
        lend_after_(lend_after),
        method_(&service_, &KnnAsyncService::RequestSearch,
                [this](SearchCall* call) {
                  {
                    absl::MutexLock lock(&mu_);
                    handled_.push_back(call->request().k());
                  }
                  call->response()->set_k(call->request().k());
                  call->Finish(grpc::Status::OK);
                }) {}
  grpc::Service* grpc_service() override { return &service_; }
  void Listen(const ServingQueue& queue) override {
    method_.Listen(queue, reads_, lend_after_);
  }
  // The ks of the requests handled, in order.
  std::vector<int> handled() {
    absl::MutexLock lock(&mu_);
    return handled_;
  }
  // Waits until `n` requests have been handled; false after `timeout`.
  bool AwaitHandled(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return handled_.size() >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

 private:
  const int reads_;
  const absl::Duration lend_after_;
  KnnAsyncService service_;
  ReadOnMatchMethod<KnnAsyncService, SearchRequest, SearchResponse> method_;
  absl::Mutex mu_;
  std::vector<int> handled_ ABSL_GUARDED_BY(mu_);
};

// A Search opened as a raw stream, as a unary client's call looks on the
// wire, whose message the test sends when it wants (or never).
class OpenSearch {
 public:
  explicit OpenSearch(grpc::GenericStub* stub) {
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(20));
    call_ = stub->PrepareCall(&context_, "/knnd.v1.KnnService/Search", &cq_);
    call_->StartCall(Tag(1));
    Await(1);  // its headers are on the wire
  }
  ~OpenSearch() {
    cq_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  // Sends the message with `k` and half-closes; the answer's status, and
  // its k in *k.
  grpc::Status Send(int k, int* answered_k) {
    SearchRequest request;
    request.set_k(k);
    return SendBytes(request.SerializeAsString(), answered_k);
  }
  // Sends `bytes` as the message and half-closes; as Send.
  grpc::Status SendBytes(const std::string& bytes, int* answered_k = nullptr) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    call_->Write(buffer, Tag(2));
    Await(2);
    return Close(answered_k);
  }
  // Half-closes without a message; the answer's status.
  grpc::Status Close(int* answered_k = nullptr) {
    call_->WritesDone(Tag(3));
    Await(3);
    grpc::ByteBuffer answer;
    call_->Read(&answer, Tag(4));
    const bool got = Await(4);
    grpc::Status status;
    call_->Finish(&status, Tag(5));
    Await(5);
    SearchResponse response;
    if (got && answered_k != nullptr &&
        grpc::SerializationTraits<SearchResponse>::Deserialize(&answer,
                                                               &response)
            .ok()) {
      *answered_k = static_cast<int>(response.k());
    }
    return status;
  }
  void Cancel() { context_.TryCancel(); }

 private:
  static void* Tag(intptr_t n) { return reinterpret_cast<void*>(n); }
  // Waits for the event `tag`; its ok.
  bool Await(intptr_t tag) {
    void* got = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq_.Next(&got, &ok));
    EXPECT_EQ(got, Tag(tag));
    return ok;
  }

  grpc::ClientContext context_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
};

struct ReadOnMatchServed {
  // By default a read is never lent within a test.
  explicit ReadOnMatchServed(int reads,
                             absl::Duration lend_after = absl::Hours(1))
      : service(reads, lend_after) {
    absl::StatusOr<Listener> built =
        knnd::testing::ServeOnLoopback(&service, /*queues=*/1);
    EXPECT_TRUE(built.ok()) << built.status();
    channel =
        knnd::testing::FreshChannel("127.0.0.1:" + std::to_string(built->port));
    stub = knnd::v1::KnnService::NewStub(channel);
    generic = std::make_unique<grpc::GenericStub>(channel);
    listener = std::move(*built);
  }
  // A unary Search with `k`, from a thread of its own; its status goes to
  // *status and its answered k to *answered_k.
  std::thread UnarySearch(int k, grpc::Status* status, int* answered_k) {
    return std::thread([this, k, status, answered_k] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(20));
      SearchRequest request;
      request.set_k(k);
      SearchResponse response;
      *status = stub->Search(&context, request, &response);
      *answered_k = static_cast<int>(response.k());
    });
  }

  ReadOnMatchService service;
  Listener listener;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<knnd::v1::KnnService::Stub> stub;
  std::unique_ptr<grpc::GenericStub> generic;
};

TEST(ReadOnMatchMethod, AnswersAUnaryClient) {
  ReadOnMatchServed served(/*reads=*/2);
  for (int k : {7, 8, 9}) {
    grpc::Status status;
    int answered = 0;
    served.UnarySearch(k, &status, &answered).join();
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(answered, k);
  }
  EXPECT_EQ(served.service.handled(), (std::vector<int>{7, 8, 9}));
}

// With one read, a call whose message has not come holds it: a unary
// call sent after it (on the same connection, so matched after it) is
// read and handled only once the first call's message has come. A method
// that read every call at once (as gRPC does for a unary method) would
// have handled the second call first.
TEST(ReadOnMatchMethod, ReadsAtMostItsReadsAtOnce) {
  ReadOnMatchServed served(/*reads=*/1);
  OpenSearch first(served.generic.get());
  grpc::Status second_status;
  int second_k = 0;
  std::thread second = served.UnarySearch(2, &second_status, &second_k);
  EXPECT_FALSE(served.service.AwaitHandled(1, absl::Milliseconds(300)))
      << "the second call was read while the first held the only read";
  int first_k = 0;
  const grpc::Status first_status = first.Send(1, &first_k);
  second.join();
  ASSERT_TRUE(first_status.ok()) << first_status.error_message();
  ASSERT_TRUE(second_status.ok()) << second_status.error_message();
  EXPECT_EQ(first_k, 1);
  EXPECT_EQ(second_k, 2);
  EXPECT_EQ(served.service.handled(), (std::vector<int>{1, 2}));
}

// A read that outlasts `lend_after` lets the next call read beside it: a
// client that does not send its message holds up no other.
TEST(ReadOnMatchMethod, ASlowReadLendsItsTurn) {
  ReadOnMatchServed served(/*reads=*/1, absl::Milliseconds(50));
  OpenSearch slow(served.generic.get());
  grpc::Status second_status;
  int second_k = 0;
  served.UnarySearch(2, &second_status, &second_k).join();
  ASSERT_TRUE(second_status.ok()) << second_status.error_message();
  EXPECT_EQ(second_k, 2);
  int slow_k = 0;
  const grpc::Status slow_status = slow.Send(1, &slow_k);
  ASSERT_TRUE(slow_status.ok()) << slow_status.error_message();
  EXPECT_EQ(slow_k, 1);
  EXPECT_EQ(served.service.handled(), (std::vector<int>{2, 1}));
  // Each call passed its turn on once: the next call still reads.
  grpc::Status third;
  int k = 0;
  served.UnarySearch(3, &third, &k).join();
  EXPECT_TRUE(third.ok()) << third.error_message();
}

// A call that ends while it holds the read (its client cancels) gives the
// read to the next call.
TEST(ReadOnMatchMethod, ACancelledReadGoesToTheNextCall) {
  ReadOnMatchServed served(/*reads=*/1);
  auto first = std::make_unique<OpenSearch>(served.generic.get());
  grpc::Status second_status;
  int second_k = 0;
  std::thread second = served.UnarySearch(2, &second_status, &second_k);
  first->Cancel();
  second.join();
  ASSERT_TRUE(second_status.ok()) << second_status.error_message();
  EXPECT_EQ(second_k, 2);
  EXPECT_EQ(served.service.handled(), (std::vector<int>{2}));
  first.reset();
}

// A call that closes without a message, or with one that does not parse,
// is refused INVALID_ARGUMENT (gRPC's own answer for a unary method that
// does not parse is INTERNAL "Unable to parse request").
TEST(ReadOnMatchMethod, ACallWithoutAMessageThatParsesIsRefused) {
  ReadOnMatchServed served(/*reads=*/1);
  for (const char* bytes : {"", "\xff\xff\xff"}) {
    OpenSearch call(served.generic.get());
    const grpc::Status status =
        *bytes == '\0' ? call.Close() : call.SendBytes(bytes);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(status.error_message(),
              "the call carried no request message that parses as a "
              "knnd.v1.SearchRequest");
  }
  EXPECT_TRUE(served.service.handled().empty());
  // And the read is free again.
  grpc::Status next;
  int k = 0;
  served.UnarySearch(5, &next, &k).join();
  EXPECT_TRUE(next.ok()) << next.error_message();
}

}  // namespace
}  // namespace knnd
