// knnctl convert: a FastScan index written by FAISS itself
// (faiss.write_index), whose lists FAISS 1.7.3 reads onto the heap, into
// knnd's mappable FastScan layout (docs/fastscan_format.md) with a sidecar.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "command.h"
#include "knnd/base/metric.h"
#include "knnd/index/index_builder.h"
#include "knnd/monitoring/build_info.h"
#include "knnd/storage/index_metadata.h"

namespace knnd::knnctl {
namespace {

struct ConvertOptions {
  std::string input;
  std::string output;
  std::string metric;
};

// A FastScan index written by FAISS itself (faiss.write_index) into knnd's
// mappable FastScan layout, with a sidecar.
int Convert(const ConvertOptions& options) {
  if (options.input.empty() || options.output.empty()) {
    return Fail("convert needs --input FAISS_FILE --output INDEX");
  }
  knnd::v1::IndexMetadata metadata;
  if (!options.metric.empty()) {
    absl::StatusOr<Metric> metric = ParseMetric(options.metric);
    if (!metric.ok()) return Fail(metric.status());
    metadata.set_metric(MetricName(*metric));
    metadata.set_normalized(*metric == Metric::kCosine);
  }
  metadata.set_created(
      absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()));
  metadata.set_built_by(absl::StrCat("knnctl convert: ", BuildInfoLine()));
  const absl::Time start = absl::Now();
  if (absl::Status s =
          ConvertFastScanFile(options.input, options.output, metadata);
      !s.ok()) {
    return Fail(s);
  }
  std::printf("converted %s into %s (knnd FastScan layout, lists mapped) and "
              "its sidecar in %.1f s\n",
              options.input.c_str(), options.output.c_str(),
              absl::ToDoubleSeconds(absl::Now() - start));
  return kExitOk;
}

}  // namespace

std::function<int()> DefineConvert(FlagSet& flags) {
  auto options = std::make_shared<ConvertOptions>();
  flags.Add("input", &options->input, "FAISS_FILE",
            "IVF-PQ FastScan index written by FAISS (faiss.write_index of "
            "an IVF...,PQ...x4fs index). Required.");
  flags.Add("output", &options->output, "INDEX",
            "knnd FastScan file to write (then INDEX.meta.json). Required.");
  flags.Add("metric", &options->metric, "NAME",
            "cosine when the indexed vectors were L2-normalised (the file "
            "says inner product); default the file's metric.");
  return [options] { return Convert(*options); };
}

}  // namespace knnd::knnctl
