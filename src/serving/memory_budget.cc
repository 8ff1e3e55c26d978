#include "knnd/serving/memory_budget.h"

#include "absl/types/optional.h"
#include "knnd/base/units.h"
#include "knnd/monitoring/cgroup_memory.h"
#include "spdlog/spdlog.h"

namespace knnd {
namespace {

// The configured memory limit, else the cgroup's; 0 when there is none.
MemoryLimits ResolveMemoryLimits(const MemoryBudget::Options& options) {
  MemoryLimits limits;
  limits.headroom_bytes = options.headroom_bytes;
  if (options.configured_limit_bytes > 0) {
    limits.limit_bytes = options.configured_limit_bytes;
    spdlog::info("memory limit {:.1f} MiB (memory_limit_bytes), headroom "
                 "{:.1f} MiB",
                 MiB(limits.limit_bytes), MiB(limits.headroom_bytes));
    return limits;
  }
  absl::optional<CgroupMemory> cg =
      ReadCgroupMemory(options.proc_root, options.cgroup_root);
  if (cg.has_value() && cg->limit_bytes.has_value()) {
    limits.limit_bytes = *cg->limit_bytes;
    spdlog::info("memory limit {:.1f} MiB (cgroup v{} {}), headroom {:.1f} MiB",
                 MiB(limits.limit_bytes), cg->version, cg->dir,
                 MiB(limits.headroom_bytes));
  } else {
    spdlog::info("no memory limit found (no cgroup limit, memory_limit_bytes "
                 "unset): max_inflight_bytes={} applies",
                 options.max_inflight_bytes);
  }
  return limits;
}

}  // namespace

std::unique_ptr<MemoryBudget> MemoryBudget::Create(const Options& options,
                                                   AdmissionGate* gate,
                                                   const IndexHolder* holder) {
  return std::unique_ptr<MemoryBudget>(
      new MemoryBudget(options, ResolveMemoryLimits(options), gate, holder));
}

absl::Status MemoryBudget::CheckHeap(const IndexInfo& planned) const {
  std::shared_ptr<const IndexSnapshot> serving = holder_->Pin();
  const int64_t other = serving == nullptr ? 0 : serving->info().heap_bytes;
  spdlog::info("index {}: heap need {:.1f} MiB (precomputed table {:.1f} MiB"
               "{}, filter cache {:.1f} MiB), mapped lists {:.1f} MiB",
               planned.path, MiB(planned.heap_bytes),
               MiB(planned.precomputed_table_bytes),
               options_.use_precomputed_table ? "" : ", turned off",
               MiB(planned.filter_cache_bytes),
               MiB(planned.mapped_list_bytes));
  return CheckIndexFits(planned, other, limits_);
}

void MemoryBudget::SetByteBudgetFor(const IndexInfo& info) {
  if (limits_.limit_bytes <= 0 || options_.max_inflight_bytes_configured) {
    return;
  }
  const int64_t budget = InflightBytesBudget(
      limits_, info.heap_bytes, options_.inflight_bytes_limit_percent,
      options_.max_inflight_bytes);
  gate_->SetMaxInflightBytes(budget);
  const SearchLimits limits = ResolveLimits(options_.limits, info);
  SearchShape largest{limits.max_queries_per_request, limits.max_k,
                      static_cast<int>(info.nlist), 0,
                      info.has_vectors ? limits.max_refine_factor : 0,
                      options_.max_batch_rows};
  const int64_t largest_bytes = EstimateSearchBytes(info, largest);
  spdlog::info("max_inflight_bytes {:.1f} MiB: {}% of (limit {:.1f} MiB - "
               "index heap {:.1f} MiB - headroom {:.1f} MiB); the largest "
               "request allowed (max_queries_per_request x max_k, nprobe "
               "nlist) is estimated at {:.1f} MiB",
               MiB(budget), options_.inflight_bytes_limit_percent,
               MiB(limits_.limit_bytes), MiB(info.heap_bytes),
               MiB(limits_.headroom_bytes), MiB(largest_bytes));
  if (largest_bytes > budget) {
    spdlog::warn("requests estimated above max_inflight_bytes ({:.1f} MiB) "
                 "are refused with INVALID_ARGUMENT; lower "
                 "max_queries_per_request or max_k, or raise the limit",
                 MiB(budget));
  }
}

}  // namespace knnd
