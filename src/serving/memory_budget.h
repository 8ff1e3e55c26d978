// MemoryBudget: what the memory limit allows the serving process. It
// resolves the limit once (the configured one, else the container's cgroup
// limit), checks that a version about to load fits beside the one serving
// (LoadOptions::check_heap), and after a version is published sets the
// admission gate's byte budget to a share of what is left (unless
// max_inflight_bytes is configured, which wins). The formulas are
// index/memory_model.h's; docs/sizing.md explains them.
//
// Ownership: borrows the gate and the holder, which outlive it.
// Thread-safety: CheckHeap and SetByteBudgetFor may be called from any
// thread (the index manager's); limits() is constant after Create.
#ifndef KNND_SERVING_MEMORY_BUDGET_H_
#define KNND_SERVING_MEMORY_BUDGET_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "knnd/index/memory_model.h"
#include "knnd/serving/admission_gate.h"
#include "knnd/serving/index_holder.h"
#include "knnd/serving/search_limits.h"

namespace knnd {

class MemoryBudget {
 public:
  struct Options {
    // memory_limit_bytes; 0: the cgroup's limit, if any.
    int64_t configured_limit_bytes = 0;
    int64_t headroom_bytes = 128 << 20;
    // max_inflight_bytes as configured, and whether the config set it (then
    // the budget stays fixed at it).
    int64_t max_inflight_bytes = int64_t{1} << 30;
    bool max_inflight_bytes_configured = false;
    int inflight_bytes_limit_percent = 50;
    bool use_precomputed_table = true;  // for the log line only
    // The largest request the limits allow, for the warning when it could
    // never be admitted.
    LimitsConfig limits;
    int64_t max_batch_rows = 128;
    // Where the cgroup is read from (tests point them elsewhere).
    std::string proc_root = "/proc";
    std::string cgroup_root = "/sys/fs/cgroup";
  };

  static std::unique_ptr<MemoryBudget> Create(const Options& options,
                                              AdmissionGate* gate,
                                              const IndexHolder* holder);

  // The limit in force (0: none) and the headroom.
  const MemoryLimits& limits() const { return limits_; }

  // OK when `planned` fits beside the version serving now and the headroom;
  // RESOURCE_EXHAUSTED naming the sizes otherwise (CheckIndexFits).
  absl::Status CheckHeap(const IndexInfo& planned) const;

  // Sets the gate's byte budget for `info`, now serving; logs the budget
  // and warns when the largest allowed request could never be admitted.
  void SetByteBudgetFor(const IndexInfo& info);

 private:
  MemoryBudget(const Options& options, MemoryLimits limits, AdmissionGate* gate,
               const IndexHolder* holder)
      : options_(options), limits_(limits), gate_(gate), holder_(holder) {}

  const Options options_;
  const MemoryLimits limits_;
  AdmissionGate* const gate_;
  const IndexHolder* const holder_;
};

}  // namespace knnd

#endif  // KNND_SERVING_MEMORY_BUDGET_H_
