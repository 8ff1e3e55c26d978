// The serving layer's live load as monitoring reads it at scrape time.
#ifndef KNND_SERVING_SERVING_LOAD_H_
#define KNND_SERVING_SERVING_LOAD_H_

#include "knnd/monitoring/metrics.h"
#include "knnd/serving/admission_gate.h"
#include "knnd/serving/worker_pool.h"

namespace knnd {

// Readings of `gate` and `pool`, which must outlive the Metrics given them.
inline Metrics::LoadReadings ServingLoad(const AdmissionGate* gate,
                                         const WorkerPool* pool) {
  Metrics::LoadReadings load;
  load.queries_in_flight = [gate] { return gate->queries_in_flight(); };
  load.bytes_in_flight = [gate] { return gate->bytes_in_flight(); };
  load.max_inflight_bytes = [gate] { return gate->max_inflight_bytes(); };
  load.work_units_queued = [pool] {
    return static_cast<int64_t>(pool->queued());
  };
  return load;
}

}  // namespace knnd

#endif  // KNND_SERVING_SERVING_LOAD_H_
