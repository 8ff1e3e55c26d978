// Percentiles of latency samples, one definition for knnctl and the
// benchmarks: the nearest-rank value (the smallest sample with at least p of
// the samples at or below it), so p 0.5 of {1, 2, 3, 4} is 2 and p 0.99 of
// 100 samples is the 99th smallest.
#ifndef KNND_BASE_PERCENTILE_H_
#define KNND_BASE_PERCENTILE_H_

#include <vector>

namespace knnd {

// p in [0, 1]; 0 for no samples. Reorders `samples` (nth_element).
double Percentile(std::vector<double>& samples, double p);

}  // namespace knnd

#endif  // KNND_BASE_PERCENTILE_H_
