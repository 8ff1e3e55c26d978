// knnctl build: vectors in, an IVF-PQ index file and its metadata sidecar
// out, and INDEX.vectors for exact re-ranking unless --keep_vectors=false,
// the input streamed (a training sample, then batches: bounded memory,
// build_memory.h),
// with defaults chosen from the data's shape (index_builder.h): 4-bit
// FastScan (--recipe fastscan) or 8-bit IVF-PQ (--recipe pq8). With --ids
// the index holds row numbers and INDEX.ids (storage/id_table.h)
// translates them to the user's ids; with --payloads INDEX.payloads
// (storage/payload_file.h) holds each row's JSON payload.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/types/optional.h"
#include "build_outputs.h"
#include "command.h"
#include "knnd/base/metric.h"
#include "knnd/base/units.h"
#include "knnd/faiss/vector_math.h"
#include "knnd/index/build_memory.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_sharding.h"
#include "knnd/index/update_drift.h"
#include "knnd/monitoring/build_info.h"
#include "knnd/monitoring/process_stats.h"
#include "knnd/storage/attribute_jsonl.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/payload_file.h"
#include "knnd/storage/vector_io.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/storage/version_manifest.h"
#include "knnd/text/text_index_writer.h"

namespace knnd::knnctl {
namespace {

// Reports progress of a long loop on stderr: a bar redrawn in place with
// rate and ETA when stderr is a terminal, otherwise a plain line about every
// 10% (logs and CI capture stay readable). Not thread-safe: one loop's.
class Progress {
 public:
  Progress(std::string what, int64_t total)
      : what_(std::move(what)),
        total_(total),
        tty_(isatty(STDERR_FILENO) != 0),
        start_(absl::Now()) {}

  void Update(int64_t done) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    const double rate = seconds > 0 ? done / seconds : 0;
    const double eta = rate > 0 ? (total_ - done) / rate : 0;
    const double fraction = total_ > 0 ? static_cast<double>(done) / total_ : 1;
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(fraction * kWidth);
      std::fprintf(stderr,
                   "\r%s [%s%s] %3.0f%% %lld/%lld %.0f rows/s ETA %.0fs ",
                   what_.c_str(), std::string(filled, '#').c_str(),
                   std::string(kWidth - filled, '.').c_str(), 100 * fraction,
                   static_cast<long long>(done), static_cast<long long>(total_),
                   rate, eta);
      if (done >= total_) std::fprintf(stderr, "\n");
    } else if (done >= total_ || fraction >= next_line_) {
      std::fprintf(stderr,
                   "%s %lld/%lld rows (%.0f%%), %.0f rows/s, ETA %.0fs\n",
                   what_.c_str(), static_cast<long long>(done),
                   static_cast<long long>(total_), 100 * fraction, rate, eta);
      next_line_ = fraction + 0.1;
    }
    std::fflush(stderr);
  }

 private:
  const std::string what_;
  const int64_t total_;
  const bool tty_;
  const absl::Time start_;
  double next_line_ = 0.1;
};


// `count` distinct row numbers out of `rows`, seeded, ascending (so the
// reads go front to back): the first `count` positions of a Fisher-Yates
// shuffle of 0..rows-1, with only the positions it touched held.
std::vector<int64_t> SampleRows(int64_t rows, int64_t count, uint32_t seed) {
  absl::flat_hash_map<int64_t, int64_t> moved;
  auto at = [&moved](int64_t position) {
    auto it = moved.find(position);
    return it == moved.end() ? position : it->second;
  };
  std::vector<int64_t> sample(static_cast<size_t>(count));
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < count; ++i) {
    std::uniform_int_distribution<int64_t> pick(i, rows - 1);
    const int64_t j = pick(rng);
    const int64_t value_i = at(i);
    sample[i] = at(j);
    moved[j] = value_i;
    moved.erase(i);  // never read again: later picks are at i + 1 or more
  }
  std::sort(sample.begin(), sample.end());
  return sample;
}

constexpr char kFastScanRecipe[] = "fastscan";
constexpr char kPq8Recipe[] = "pq8";

// --factory, or the recipe's IVF<nlist>,PQ<m>x4fs (fastscan) or
// IVF<nlist>,PQ<m> (pq8) from --nlist/--m and the defaults for `x`'s
// shape; prints which.
absl::StatusOr<std::string> FactoryFor(const BuildOptions& options,
                                       int64_t rows, int dim) {
  if (!options.factory.empty()) {
    std::printf("factory:  %s (from --factory)\n", options.factory.c_str());
    return options.factory;
  }
  const bool fastscan = options.recipe == kFastScanRecipe;
  if (!fastscan && options.recipe != kPq8Recipe) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recipe=", options.recipe, " is not ", kFastScanRecipe, " or ",
        kPq8Recipe));
  }
  const int64_t nlist = options.nlist > 0 ? options.nlist
                        : fastscan        ? DefaultFastScanNlist(rows)
                                          : DefaultNlist(rows);
  const int m = options.m > 0 ? options.m
                : fastscan    ? DefaultFastScanM(dim)
                              : DefaultPqM(dim);
  if (dim % m != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--m=", m, " does not divide dim=", dim));
  }
  std::string factory =
      absl::StrCat("IVF", nlist, ",PQ", m, fastscan ? "x4fs" : "");
  const char* nlist_why = options.nlist > 0 ? "from --nlist"
                          : fastscan        ? "~sqrt(N), <= N/39"
                                            : "~4*sqrt(N), <= N/39";
  const std::string m_why =
      options.m > 0 ? "from --m"
      : fastscan    ? absl::StrCat("sub-vectors <= ", kMaxFastScanWidth,
                                   " dims, M >= ", kMinFastScanM,
                                   " where dim allows")
                    : "largest fast divisor of dim <= 64";
  std::printf(
      "factory:  %s (recipe %s: %s; nlist %s; M %s: %d-dim sub-vectors, "
      "%d bytes per vector)\n",
      factory.c_str(), options.recipe.c_str(),
      fastscan ? "4-bit FastScan PQ" : "8-bit PQ", nlist_why, m_why.c_str(),
      dim / m, fastscan ? (m + 1) / 2 : m);
  return factory;
}

// Trains `b` on `train_rows` rows of `input`: all of them, or a seeded
// sample, read in runs of consecutive rows.
absl::Status Train(IndexBuilder& b, VectorReader& input, int64_t train_rows,
                   uint32_t seed) {
  const int dim = input.dim();
  std::vector<float> sample(static_cast<size_t>(train_rows) * dim);
  if (train_rows == input.rows()) {
    if (absl::Status s = input.Read(0, train_rows, sample.data()); !s.ok()) {
      return s;
    }
    return b.Train(sample.data(), train_rows);
  }
  const std::vector<int64_t> rows = SampleRows(input.rows(), train_rows, seed);
  for (int64_t i = 0; i < train_rows;) {
    int64_t run = 1;
    while (i + run < train_rows && rows[i + run] == rows[i] + run) ++run;
    if (absl::Status s = input.Read(rows[i], run, sample.data() + i * dim);
        !s.ok()) {
      return s;
    }
    i += run;
  }
  return b.Train(sample.data(), train_rows);
}

// --shards: the built index written as the shards of `plan`, sharing its
// quantizers (docs/sharding.md), each with its slice of the id table with
// --ids (their vectors files were written while adding). The index holds
// row numbers, so the shards hold ranges of rows. Prints what it wrote;
// false (after printing why) on failure.
bool WriteShards(const BuildOptions& options, const std::string& staged,
                 const IndexBuilder& b, const std::vector<ShardSpec>& plan,
                 const std::vector<int64_t>& ids, int nprobe,
                 const knnd::v1::IndexMetadata& metadata) {
  const std::string build_id = NewBuildId();
  for (const ShardSpec& shard : plan) {
    const std::string path =
        ShardPath(staged, shard.shard_id, shard.shard_count);
    if (absl::Status s = WriteIdTableSlice(path, ids, shard.first_id,
                                           shard.end_id, options.ids);
        !s.ok()) {
      Fail(s);
      return false;
    }
    if (absl::Status s = b.WriteShard(path, nprobe, shard, build_id, metadata);
        !s.ok()) {
      Fail(s);
      return false;
    }
  }
  // Every shard is written and sealed before the first is committed.
  for (const ShardSpec& shard : plan) {
    const std::string path =
        ShardPath(options.output, shard.shard_id, shard.shard_count);
    if (absl::Status s = CommitStaged(
            ShardPath(staged, shard.shard_id, shard.shard_count), path);
        !s.ok()) {
      Fail(s);
      return false;
    }
    PrintShardWritten(path, shard);
  }
  std::printf("build id: %s (in every shard's sidecar)\n", build_id.c_str());
  std::printf("next:     knnctl tune --index %s --shards %zu (tunes the set "
              "as one), then serve each shard with its own knnd and merge "
              "with knnd --shard_targets (docs/sharding.md)\n",
              options.output.c_str(), plan.size());
  return true;
}

// The resident set now and at its highest (VmRSS, VmHWM), 0 when /proc
// does not say.
int64_t ResidentBytes() {
  return ReadProcessStats("/proc").resident_bytes.value_or(0);
}
int64_t PeakResidentBytes() {
  return ReadProcessStats("/proc").peak_resident_bytes.value_or(0);
}

// Prints the memory model with the lists' real bytes beside the peak
// measured, and the peak as it stood after training and after adding
// (docs/knnctl.md, "Memory of a build").
void PrintMemory(const BuildShape& shape, const IndexBuilder& b,
                 int64_t baseline, int64_t peak_trained, int64_t peak_added) {
  const double content = static_cast<double>(shape.rows) *
                         static_cast<double>(shape.list_bytes_per_vector);
  const double growth =
      content > 0 ? static_cast<double>(b.HeldListBytes()) / content : 1;
  const BuildMemoryModel model = ModelBuildMemory(shape, growth);
  const int64_t predicted = baseline + model.PeakBytes();
  const int64_t peak = PeakResidentBytes();
  std::printf("memory:   peak RSS %.1f MiB (VmHWM; %.1f after training, "
              "%.1f after adding); model %.1f MiB = process %.1f + max(%s), "
              "lists grown %.2fx their content\n",
              MiB(peak), MiB(peak_trained), MiB(peak_added), MiB(predicted),
              MiB(baseline), DescribeBuildMemory(model).c_str(), growth);
}

int Build(BuildOptions options) {
  UseThreads(options.threads);
  if (!options.attribute_fields_list.empty()) {
    options.attribute_fields = absl::StrSplit(options.attribute_fields_list,
                                              ',', absl::SkipWhitespace());
  }
  const int64_t baseline = ResidentBytes();
  const std::string& input = options.input;
  const std::string& output = options.output;
  if (input.empty() || output.empty()) {
    return Fail("build needs --input FILE and --output INDEX");
  }
  absl::StatusOr<Metric> metric = ParseMetric(options.metric);
  if (!metric.ok()) return Fail(metric.status());
  if (!options.factory.empty() &&
      (options.nlist > 0 || options.m > 0 ||
       options.recipe != kFastScanRecipe)) {
    return Fail("give either --factory or --recipe/--nlist/--m, not both");
  }
  absl::StatusOr<VectorsDtype> vectors_dtype =
      ParseVectorsDtype(options.vectors_dtype);
  if (!vectors_dtype.ok()) {
    return Fail(
        absl::StrCat("--vectors_dtype: ", vectors_dtype.status().message()));
  }
  const bool keep_vectors = options.keep_vectors.value_or(true);
  if (options.shards > 0 && options.factory.empty() &&
      options.recipe != kFastScanRecipe) {
    return Fail(absl::StrCat("--shards needs the ", kFastScanRecipe,
                             " recipe: only FastScan indexes are split"));
  }
  // Fail before reading and training, not after.
  if (absl::Status s = CheckCompanionOptions(options); !s.ok()) return Fail(s);
  if (access(DirectoryOf(output).c_str(), W_OK) != 0) {
    return Fail(absl::StrCat("cannot write into the directory of ", output,
                             ": ", std::strerror(errno)));
  }
  // Every file is written under a staging name and the version committed
  // as `output` only once whole (storage/version_manifest.h): a build that
  // fails or is killed leaves `output`'s version as it was.
  const std::unique_ptr<StagingGuard> staging = BeginStaging(output);
  const std::string& staged = staging->path();
  BuildOptions staged_options = options;
  staged_options.output = staged;

  absl::StatusOr<std::unique_ptr<VectorReader>> reader =
      VectorReader::Open(input);
  if (!reader.ok()) return Fail(reader.status());
  VectorReader& x = **reader;
  const int64_t rows = x.rows();
  const int dim = x.dim();
  std::printf("input:    %s: %lld x %d (%.1f MiB as float32), streamed\n",
              input.c_str(), static_cast<long long>(rows), dim,
              MiB(rows * dim * static_cast<int64_t>(sizeof(float))));
  std::vector<int64_t> ids;
  if (!options.ids.empty()) {
    absl::StatusOr<std::vector<int64_t>> read_ids =
        ReadRowIds(options.ids, rows);
    if (!read_ids.ok()) return Fail(read_ids.status());
    ids = std::move(*read_ids);
  }
  absl::StatusOr<std::vector<ShardSpec>> plan =
      PlanRowShards(rows, options.shards);
  if (!plan.ok()) return Fail(plan.status());
  int attribute_columns = 0;
  absl::StatusOr<int64_t> attribute_bytes =
      WriteCompanionStores(staged_options, *plan, rows, &attribute_columns);
  if (!attribute_bytes.ok()) return Fail(attribute_bytes.status());

  absl::StatusOr<std::string> factory = FactoryFor(options, rows, dim);
  if (!factory.ok()) return Fail(factory.status());
  IndexBuilder::Options builder_options;
  builder_options.dim = dim;
  builder_options.metric = *metric;
  builder_options.factory = *factory;
  builder_options.seed = options.seed;
  absl::StatusOr<std::unique_ptr<IndexBuilder>> builder =
      IndexBuilder::Create(builder_options);
  if (!builder.ok()) return Fail(builder.status());
  IndexBuilder& b = **builder;

  int64_t train_rows = options.train_size > 0
                           ? options.train_size
                           : DefaultTrainRows(rows, b.nlist());
  if (train_rows > rows) {
    std::printf(
        "note:     --train_size=%lld exceeds the %lld input rows; "
        "training on all of them\n",
        static_cast<long long>(train_rows), static_cast<long long>(rows));
    train_rows = rows;
  }
  const int64_t batch = std::max<int64_t>(1, options.add_batch);
  BuildShape shape;
  shape.rows = rows;
  shape.dim = dim;
  shape.train_rows = train_rows;
  shape.add_batch_rows = batch;
  shape.list_bytes_per_vector = b.list_bytes_per_vector();
  shape.pq_centroids = 1 << b.pq_nbits();
  shape.cosine = *metric == Metric::kCosine;
  shape.own_ids = !ids.empty();
  shape.attribute_bytes = *attribute_bytes;
  std::printf("metric:   %s%s\n", MetricName(*metric),
              *metric == Metric::kCosine
                  ? " (vectors L2-normalised; knnd normalises queries)"
                  : "");
  std::printf("training: %lld rows (%s, seed %u), %.1f MiB\n",
              static_cast<long long>(train_rows),
              train_rows == rows ? "all rows" : "seeded random sample",
              options.seed,
              MiB(train_rows * dim * static_cast<int64_t>(sizeof(float))));
  std::printf("memory:   model %.1f MiB above the process's %.1f MiB (%s)\n",
              MiB(ModelBuildMemory(shape).PeakBytes()), MiB(baseline),
              DescribeBuildMemory(ModelBuildMemory(shape)).c_str());
  if (train_rows < 39 * b.nlist()) {
    std::printf(
        "warning:  %lld training rows are fewer than 39 * nlist = "
        "%lld, the minimum FAISS's k-means wants; centroids will be "
        "poor. Lower --nlist or raise --train_size.\n",
        static_cast<long long>(train_rows),
        static_cast<long long>(39 * b.nlist()));
  }
  std::fflush(stdout);

  const absl::Time train_start = absl::Now();
  if (absl::Status s = Train(b, x, train_rows, options.seed); !s.ok()) {
    return Fail(s);
  }
  const int64_t peak_trained = PeakResidentBytes();
  std::printf("trained in %.1f s\n",
              absl::ToDoubleSeconds(absl::Now() - train_start));
  std::fflush(stdout);

  // The lists hold row numbers; with --ids the id table maps them. The
  // vectors files are written as the rows pass.
  VectorsSink vectors(VectorsParts(staged_options, *plan, rows, keep_vectors),
                      dim, *metric, *vectors_dtype);
  std::vector<float> values(static_cast<size_t>(std::min(batch, rows)) * dim);
  // The trained reference knnctl update compares its deltas with
  // (index/update_drift.h): its sample rows copied as the batches pass.
  TrainedReferenceSample reference(rows, dim);
  Progress progress("adding", rows);
  for (int64_t begin = 0; begin < rows; begin += batch) {
    const int64_t n = std::min(batch, rows - begin);
    if (absl::Status s = x.Read(begin, n, values.data()); !s.ok()) {
      return Fail(s);
    }
    if (absl::Status s = b.Add(values.data(), n, nullptr); !s.ok()) {
      return Fail(s);
    }
    reference.Collect(begin, n, values.data());
    if (keep_vectors) {
      if (absl::Status s = vectors.Append(values.data(), n); !s.ok()) {
        return Fail(s);
      }
    }
    progress.Update(begin + n);
  }
  values = std::vector<float>();
  const int64_t peak_added = PeakResidentBytes();

  const int nprobe = options.stored_nprobe > 0 ? options.stored_nprobe
                                               : DefaultNprobe(b.nlist());
  knnd::v1::IndexMetadata metadata;
  metadata.set_source(input);
  metadata.set_created(
      absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()));
  metadata.set_train_rows(train_rows);
  metadata.set_built_by(absl::StrCat("knnctl build: ", BuildInfoLine()));
  metadata.set_id_table(!ids.empty());
  metadata.set_payloads(!options.payloads.empty() ||
                        !options.text_file.empty());
  metadata.set_attributes(!options.attributes.empty() ||
                          !options.attribute_fields.empty());
  for (const std::string& field : options.attribute_fields) {
    metadata.add_attribute_fields(field);
  }
  metadata.set_text_field(options.text);
  absl::StatusOr<knnd::v1::IndexMetadata::TrainedReference> trained =
      reference.Measure(b);
  if (!trained.ok()) return Fail(trained.status());
  *metadata.mutable_trained() = std::move(*trained);
  if (options.shards > 0) {
    const bool ok =
        WriteShards(options, staged, b, *plan, ids, nprobe, metadata);
    if (ok) PrintMemory(shape, b, baseline, peak_trained, peak_added);
    return ok ? kExitOk : kExitError;
  }
  // The id table joins the staged companions; the index, its sidecar and
  // the manifest follow, and the whole version is then committed.
  if (absl::Status s = WriteIdTableSlice(staged, ids, 0, rows, options.ids);
      !s.ok()) {
    return Fail(s);
  }
  if (absl::Status s = b.Write(staged, nprobe, metadata); !s.ok()) {
    return Fail(s);
  }
  if (absl::Status s = CommitStaged(staged, output); !s.ok()) return Fail(s);
  struct stat st;
  stat(output.c_str(), &st);
  std::printf(
      "wrote:    %s (%lld vectors, %.1f MiB, stored nprobe %d) and "
      "%s\n",
      output.c_str(), static_cast<long long>(b.ntotal()), MiB(st.st_size),
      nprobe, MetadataPath(output).c_str());
  std::printf("sealed:   %s (binds the version's files)\n",
              ManifestPath(output).c_str());
  PrintCompanionsWritten(options, keep_vectors, *vectors_dtype,
                         attribute_columns);
  PrintMemory(shape, b, baseline, peak_trained, peak_added);
  std::printf("next:     knnctl tune --index %s%s%s (records the fastest "
              "setting reaching a recall target)\n",
              output.c_str(), keep_vectors ? "" : " --base ",
              keep_vectors ? "" : input.c_str());
  return kExitOk;
}

}  // namespace

std::function<int()> DefineBuild(FlagSet& flags) {
  auto options = std::make_shared<BuildOptions>();
  flags.Add("input", &options->input, "FILE",
            "Vectors to index: .npy (float32, 2-D, C order), .fvecs, .bvecs "
            "or IDX (.gz allowed). Required.");
  flags.Add("output", &options->output, "INDEX",
            "Index file to write, with INDEX.meta.json beside it. Required.");
  flags.Add("metric", &options->metric, "l2|ip|cosine",
            "Distance: l2, ip (inner product) or cosine (vectors and, in "
            "knnd, queries are L2-normalised).");
  flags.Add("recipe", &options->recipe, "fastscan|pq8",
            "Index recipe: fastscan = IVF<nlist>,PQ<M>x4fs, 4-bit FastScan "
            "PQ (fast scans, re-ranked exactly with INDEX.vectors); pq8 = "
            "IVF<nlist>,PQ<M>, 8-bit PQ (better recall without re-ranking, "
            "slower to build and search).");
  flags.Add("factory", &options->factory, "STR",
            "FAISS factory string of an IVF-PQ index instead of a recipe, "
            "e.g. 'IVF1024,PQ32', 'OPQ32,IVF1024,PQ32' or 'IVF256,PQ98x4fs'.");
  flags.Add("nlist", &options->nlist, "N",
            "Inverted lists; 0 = a power of two near sqrt(rows) (fastscan) "
            "or 4*sqrt(rows) (pq8), at most rows/39.");
  flags.Add("m", &options->m, "M",
            "PQ sub-quantizers, must divide dim (fastscan: M/2 bytes per "
            "vector, pq8: M); 0 = fastscan: dim/w for the first of w = 4, 2, "
            "3 dividing dim with dim/w >= 96, else dim (784 -> 196, 384 -> "
            "96, 128 -> 128); pq8: the largest divisor <= 64 leaving "
            "sub-vectors 4, 8, 12 or >= 16 dims wide.");
  flags.Add("train_size", &options->train_size, "N",
            "Rows sampled (seeded) for training; 0 = min(rows, "
            "max(50*nlist, 65536)).");
  flags.Add("ids", &options->ids, "FILE",
            "int64/int32 .npy or .ivecs of one id per input row: distinct, "
            ">= 0, in any order, sparse (e.g. 63-bit hashes); answers carry "
            "them. Written to INDEX.ids (row -> id and id -> row), the index "
            "holding row numbers, so re-ranking works as with row ids. "
            "Default: row numbers.");
  flags.Add("payloads", &options->payloads, "FILE",
            "JSON Lines of one payload per input row (line i: row i, in the "
            "order of --input and --ids): a JSON object of fields, e.g. "
            "{\"text\": \"...\", \"source\": \"a.pdf\", \"page\": 3}, or "
            "a JSON string, stored as {\"text\": \"...\"}. Written to "
            "INDEX.payloads (mapped by knnd, file-backed), which knnd "
            "returns with the ids of a Search asking for them.");
  flags.Add("attributes", &options->attributes, "FILE",
            "JSON Lines of the rows' attributes for filters: line i is a "
            "JSON object holding row i's (e.g. {\"genre\": \"news\", "
            "\"year\": 2021, \"tags\": [\"a\"]}; {} for none). Column "
            "types are inferred: integer, float, timestamp (RFC 3339 "
            "strings), keyword (other strings), keyword_list (arrays of "
            "strings). Written to INDEX.attrs (docs/knnctl.md).");
  flags.Add("text", &options->text, "FIELD",
            "Also write INDEX.text, a BM25 text index of this payload field "
            "(a string, or an array of strings) of every row, for hybrid "
            "search (SearchRequest.texts; docs/hybrid.md). Needs --payloads "
            "or --text_file. "
            "Terms: ICU word boundaries, NFKC case folding, CJK as "
            "unigrams and bigrams.");
  flags.Add("text_file", &options->text_file, "FILE",
            "With --text FIELD: the rows' texts from this UTF-8 file, line i "
            "row i's text (a text with newlines goes in --payloads as a JSON "
            "string), stored as payload field FIELD (beside --payloads' "
            "fields when given) and indexed.");
  flags.Add("text_stemmer", &options->text_stemmer, "LANG",
            "With --text: stem words with libstemmer's Snowball stemmer of "
            "LANG (english, german, french ...; knnctl analyze "
            "--list_stemmers lists them). Default: none.");
  flags.Add("bm25_k1", &options->bm25_k1, "X",
            "With --text: BM25's term-frequency saturation k1 (>= 0).");
  flags.Add("bm25_b", &options->bm25_b, "X",
            "With --text: BM25's length normalisation b, in [0, 1].");
  flags.Add("attribute_fields", &options->attribute_fields_list, "F1,F2",
            "Instead of --attributes: these fields of --payloads are the "
            "rows' attributes (types inferred as for --attributes), and "
            "knnctl update reads a delta's from its payloads too.");
  flags.Add("stored_nprobe", &options->stored_nprobe, "N",
            "nprobe stored in the index file: what knnd searches with when "
            "its config's default_nprobe is 0; 0 = nlist/32.");
  flags.AddSwitch("keep_vectors", &options->keep_vectors,
                  "Write the raw vectors to INDEX.vectors (one per row) so "
                  "knnd can re-rank IVF-PQ candidates exactly "
                  "(refine_factor). Default: on; --keep_vectors=false turns "
                  "it off.");
  flags.Add("vectors_dtype", &options->vectors_dtype, "f32|f16",
            "Element type of INDEX.vectors: f32, or f16 (half the bytes, "
            "distances rounded to ~3 decimal digits).");
  flags.Add("add_batch", &options->add_batch, "N",
            "Rows added per batch (bounds the temporary memory of add).");
  flags.Add("seed", &options->seed, "N",
            "Seed of the training sample and of k-means.");
  flags.Add("shards", &options->shards, "N",
            "Write N shards instead of one index: one coarse quantizer and "
            "PQ trained on all rows, then OUTPUT.shard-S-of-N holding the "
            "rows of range S (equal counts), each with its sidecar, vectors, "
            "with --ids its slice of the id table and with --payloads its "
            "rows' payloads; a merger of all N answers as the whole index "
            "(docs/sharding.md). 0: one index. FastScan recipe only.");
  AddThreadsFlag(flags, &options->threads);
  return [options] { return Build(*options); };
}

}  // namespace knnd::knnctl
