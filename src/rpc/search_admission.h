// SearchAdmission: the way into a Search, the same for both front doors
// (KnnServiceImpl over a local index, ShardFront over shards) and both
// protocols (a ServerCall of gRPC or HTTP/JSON): the caller's
// token, then the door's own readiness and parsing, then the deadline on
// arrival and the AdmissionGate. Every refusal is counted by reason,
// answered through the door's `Answer` (which records the RPC and finishes
// the call), and a gate full says when to retry (grpc-retry-pushback-ms);
// a gate draining while `hold` holds keeps the answer until GOAWAY is out
// (call_hold.h).
//
// Ownership: borrows the gate, metrics, authenticator and hold (optional),
// which must outlive it.
// Thread-safety: const methods, safe from any number of threads.
#ifndef KNND_RPC_SEARCH_ADMISSION_H_
#define KNND_RPC_SEARCH_ADMISSION_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "knnd/monitoring/metrics.h"
#include "knnd/rpc/call_hold.h"
#include "knnd/rpc/server_call.h"
#include "knnd/rpc/token_auth.h"
#include "knnd/serving/admission_gate.h"

namespace knnd {

// The trailing metadata with which a refusal for a full gate says how long
// to wait before retrying, in milliseconds (gRPC's retry policy reads it).
inline constexpr char kPushbackMetadata[] = "grpc-retry-pushback-ms";

inline constexpr char kSearchMethod[] = "/knnd.v1.KnnService/Search";
inline constexpr char kGetMethod[] = "/knnd.v1.KnnService/Get";

class SearchAdmission {
 public:
  struct Options {
    // The pushback a refusal for a full gate asks for, in milliseconds.
    int retry_pushback_ms = 50;
  };

  // Finishes the call with `status`; called at most once per call, maybe
  // later and on another thread (a held refusal), so it must own what it
  // needs.
  using Answer = std::function<void(const absl::Status&)>;

  // What a call asks of the gate.
  struct Demand {
    int64_t queries = 0;
    int64_t bytes = 0;
    int64_t work_units = 0;  // rows x nprobe; 0: not counted
  };

  // What a refusal for a saturated estimate names: the request's shape as
  // the door read it (for a front, as it will ask the shards).
  struct Shape {
    int64_t queries = 0;
    int64_t k = 0;
    int64_t refine_factor = 0;
    int64_t nprobe = 0;  // 0: the shards' default
    bool payloads = false;
  };

  SearchAdmission(const Options& options, AdmissionGate* gate,
                  Metrics* metrics, const TokenAuthenticator* auth,
                  CallHold* hold);

  // The caller's bearer token for `method` (Search, or Get, which the same
  // gate admits); on refusal answers it and returns false (not a
  // rejection: as for every other RPC).
  bool Authorize(const ServerCallBase& call, const Answer& answer,
                 absl::string_view method = kSearchMethod) const;

  // A refusal of the door's own (not ready, an invalid request): counted
  // under `reason`, then answered.
  void Refuse(RejectReason reason, const absl::Status& status,
              const Answer& answer) const;

  // A request whose memory estimate saturated (base/saturating.h): no
  // budget can hold it. Counted as too large and answered INVALID_ARGUMENT
  // naming its shape and the gate's max_inflight_bytes.
  void RefuseSaturated(const Shape& shape, const Answer& answer) const;

  // The deadline on arrival, then the gate: the call's ticket, or, refused
  // (deadline passed, gate full or draining), the call is answered (at
  // once, or when the hold lets go of it) and the status returned; a full
  // gate adds the pushback to `call`'s trailers.
  absl::StatusOr<AdmissionGate::Ticket> Admit(ServerCallBase& call,
                                              absl::Time arrival,
                                              absl::Time deadline,
                                              const Demand& demand,
                                              const Answer& answer) const;

 private:
  const Options options_;
  AdmissionGate* const gate_;
  Metrics* const metrics_;
  const TokenAuthenticator* const auth_;
  CallHold* const hold_;
};

}  // namespace knnd

#endif  // KNND_RPC_SEARCH_ADMISSION_H_
