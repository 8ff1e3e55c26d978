// frontier_bench: the recall / speed / memory frontier of knnd's recipes
// against FAISS's own FastScan + exact refine and hnswlib, in one run on
// Fashion-MNIST (60,000 train images as the base, the first --nq test
// images as queries, exact ground truth, k 10, 1 thread, 1 query per call).
//
//   build/bench/frontier_bench [--recipes ...] [--nq 2000] [--work DIR]
//
// Recipes (--recipes, comma-separated):
//   knnd-fastscan  knnctl build's default recipe through IndexBuilder
//                  (IVF<~sqrt N>,PQ<M>x4fs) and INDEX.vectors (f32),
//                  searched by IndexSnapshot, nprobe x refine_factor sweep
//   knnd-pq8       the 8-bit recipe (--recipe pq8: IVF<~4 sqrt N>,PQ<M>)
//   faiss-fastscan FAISS's IndexRefineFlat over the same FastScan factory
//                  (index_factory "<factory>,RFlat"), nprobe x k_factor
//   hnsw16, hnsw32 hnswlib, M 16 / 32, efConstruction 200, ef sweep
// Each recipe is built (train + add timed, --build_threads threads),
// written to --work, freed, then loaded from the file and swept; "RSS"
// is the process's resident-set growth from before the load to after the
// sweep (heap and mapped pages touched), "RssAnon" the anonymous part of
// it (what the kernel never reclaims), "bytes" the files. knnd recipes
// are then searched in calls of --batch_rows rows from --batch_threads
// threads at each target's fastest setting (the ceiling that batched gRPC
// requests are compared with). --json writes everything for
// bench/frontier_run.py, which adds knnd over gRPC and the plot.
// q/s are from this thread's CPU time (the median of --reps passes), so
// time spent descheduled on a shared machine counts against nobody; the
// wall-clock rate of the same passes is printed beside it.
#include <malloc.h>
#include <omp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <faiss/IndexIVF.h>
#include <faiss/IndexRefine.h>
#include <faiss/index_factory.h>
#include <faiss/index_io.h>
#include <hnswlib/hnswlib.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench_threads.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_eval.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/index/index_tuning.h"
#include "knnd/monitoring/build_info.h"
#include "knnd/storage/vector_io.h"
#include "knnd/storage/vectors_file.h"

ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Directory of train-images-idx3-ubyte.gz and "
          "t10k-images-idx3-ubyte.gz.");
ABSL_FLAG(std::string, work, "/tmp/knnd_frontier",
          "Directory for the index files (rewritten every run).");
ABSL_FLAG(int, nq, 2000, "Test images used as queries (the first ones).");
ABSL_FLAG(std::string, recipes,
          "knnd-fastscan,faiss-fastscan,knnd-pq8,hnsw16,hnsw32",
          "Recipes to run, comma-separated.");
ABSL_FLAG(std::string, base, "",
          "Base vectors (.npy, .fvecs, IDX...) instead of --data_dir's train "
          "images.");
ABSL_FLAG(std::string, queries, "",
          "Query vectors instead of --data_dir's test images.");
ABSL_FLAG(std::string, knnd_factories, "",
          "More knnd recipes after --recipes: factories separated by ';' "
          "(e.g. 'IVF1024,PQ98x4fs;IVF256,PQ196x4fs'), each built by "
          "IndexBuilder with INDEX.vectors and swept as knnd-fastscan is.");
ABSL_FLAG(std::string, fastscan_factory, "",
          "FastScan factory of knnd-fastscan and faiss-fastscan; default "
          "knnctl build's default recipe for the data.");
ABSL_FLAG(std::string, pq8_factory, "",
          "Factory of knnd-pq8; default knnctl build --recipe pq8's.");
ABSL_FLAG(std::string, nprobes, "4,8,16,32", "nprobe sweep (IVF recipes).");
ABSL_FLAG(std::string, refine_factors, "0,2,4,8,16",
          "refine_factor (knnd) / k_factor (FAISS) sweep; 0: PQ order.");
ABSL_FLAG(std::string, efs, "10,16,24,32,48,64,96,128",
          "hnswlib ef sweep (values below k are raised to k).");
ABSL_FLAG(std::string, targets, "0.95,0.98",
          "Recall@10 targets of the matched-recall comparison.");
ABSL_FLAG(int, build_threads, 2, "Threads for training, adding, HNSW.");
ABSL_FLAG(int, reps, 3, "Passes over the queries per setting (median).");
ABSL_FLAG(std::string, batch_rows, "1,256",
          "knnd recipes: rows per call of the multi-threaded in-process "
          "measurements at each target's fastest setting (empty: none); 1 is "
          "what single-query clients of a server compare with, 256 batched "
          "requests.");
ABSL_FLAG(int, batch_threads, 2,
          "Threads of the batched measurement, each with its own calls.");
ABSL_FLAG(std::string, json, "",
          "Also write every row, build summary and batched measurement to "
          "this file as JSON (bench/frontier_run.py reads it).");

namespace {

constexpr int kK = 10;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "frontier_bench: %s\n", message.c_str());
  std::exit(1);
}

template <typename T>
T OrDie(absl::StatusOr<T> value) {
  if (!value.ok()) Die(std::string(value.status().message()));
  return *std::move(value);
}

void OrDie(const absl::Status& status) {
  if (!status.ok()) Die(std::string(status.message()));
}

std::vector<int> IntList(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v;
    if (!absl::SimpleAtoi(part, &v) || v < 0) {
      Die(absl::StrCat("'", part, "' in '", text, "' is not an integer >= 0"));
    }
    out.push_back(v);
  }
  return out;
}

double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// CPU seconds of every thread of this process so far.
double ProcessCpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// Wall and CPU time of a build, from construction to the last add.
struct BuildTimer {
  absl::Time wall = absl::Now();
  double cpu = ProcessCpuSeconds();
  void Stop(double* wall_seconds, double* cpu_seconds) const {
    *wall_seconds = absl::ToDoubleSeconds(absl::Now() - wall);
    *cpu_seconds = ProcessCpuSeconds() - cpu;
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A kB field of /proc/self/status ("VmRSS:", "RssAnon:"), in bytes.
int64_t StatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) {
      return std::atoll(line.c_str() + field.size()) * 1024;
    }
  }
  return -1;
}

// Resident and anonymous (heap, never reclaimed) bytes of this process.
struct Resident {
  int64_t rss = StatusBytes("VmRSS:");
  int64_t anon = StatusBytes("RssAnon:");
};

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

int64_t FileBytes(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

double MiB(int64_t bytes) { return bytes / (1024.0 * 1024.0); }

struct Row {
  std::string recipe;
  std::string setting;
  int nprobe = 0;  // IVF recipes: for the same-setting comparison
  int refine = 0;
  double recall = 0;
  double qps = 0;       // from thread CPU time
  double wall_qps = 0;  // from wall time
};

struct RecipeSummary {
  std::string recipe;
  std::string factory;
  double build_seconds = 0;      // wall
  double build_cpu_seconds = 0;  // all threads
  int64_t file_bytes = 0;
  int64_t rss_bytes = 0;   // VmRSS growth: load + sweep
  int64_t anon_bytes = 0;  // RssAnon growth, the part never reclaimed
};

void RecordResident(const Resident& before, RecipeSummary* summary) {
  const Resident after;
  summary->rss_bytes = after.rss - before.rss;
  summary->anon_bytes = after.anon - before.anon;
}

// In-process q/s of `threads` threads each searching `rows` queries per
// call (wall clock: the threads share the machine's cores).
struct Batched {
  std::string recipe;
  int nprobe = 0;
  int refine = 0;
  int rows = 0;
  int threads = 0;
  double recall = 0;
  double qps = 0;
};

struct Data {
  knnd::Matrix base;
  knnd::Matrix queries;
  std::vector<int64_t> truth;  // kK per query
};

// Runs `search(q, ids)` for every query, --reps times, and scores the last
// pass. `search` writes kK ids of query q.
Row Measure(const Data& data,
            const std::function<void(int64_t, int64_t*)>& search) {
  const int64_t nq = data.queries.rows;
  std::vector<int64_t> ids(static_cast<size_t>(nq) * kK, -1);
  std::vector<double> cpu, wall;
  for (int rep = 0; rep < std::max(1, absl::GetFlag(FLAGS_reps)); ++rep) {
    const double cpu0 = ThreadSeconds();
    const absl::Time wall0 = absl::Now();
    for (int64_t q = 0; q < nq; ++q) search(q, ids.data() + q * kK);
    cpu.push_back(ThreadSeconds() - cpu0);
    wall.push_back(absl::ToDoubleSeconds(absl::Now() - wall0));
  }
  Row row;
  row.recall = knnd::RecallAt(ids, kK, data.truth, kK, kK);
  row.qps = nq / Median(cpu);
  row.wall_qps = nq / Median(wall);
  return row;
}

// Names a measured row, prints it and keeps it.
void Record(Row row, const std::string& recipe, std::string setting,
            int nprobe, int refine, std::vector<Row>* rows) {
  row.recipe = recipe;
  row.setting = std::move(setting);
  row.nprobe = nprobe;
  row.refine = refine;
  std::printf("| %s | %s | %.4f | %.0f | %.0f |\n", row.recipe.c_str(),
              row.setting.c_str(), row.recall, row.qps, row.wall_qps);
  std::fflush(stdout);
  rows->push_back(std::move(row));
}

// What knnctl build trains an index of `nlist` lists on: every row of
// the base (returned as is), or DefaultTrainRows of them chosen with a
// fixed seed (written to `sample` and returned).
const knnd::Matrix& TrainingRows(const Data& data, int64_t nlist,
                                 knnd::Matrix* sample) {
  const int64_t rows = knnd::DefaultTrainRows(data.base.rows, nlist);
  if (rows == data.base.rows) return data.base;
  *sample = knnd::SampleRows(data.base, rows, 1);
  return *sample;
}

// Builds `factory` with knnd's IndexBuilder (what knnctl build runs) into
// `path` and its vectors file; records the train + add time in `summary`.
void BuildKnnd(const Data& data, const std::string& factory,
               const std::string& path, RecipeSummary* summary) {
  knnd::IndexBuilder::Options options;
  options.dim = data.base.dim;
  options.factory = factory;
  auto builder = OrDie(knnd::IndexBuilder::Create(options));
  omp_set_num_threads(absl::GetFlag(FLAGS_build_threads));
  const BuildTimer timer;
  knnd::Matrix sample;
  const knnd::Matrix& train = TrainingRows(data, builder->nlist(), &sample);
  OrDie(builder->Train(train.values.data(), train.rows));
  OrDie(builder->Add(data.base.values.data(), data.base.rows, nullptr));
  timer.Stop(&summary->build_seconds, &summary->build_cpu_seconds);
  omp_set_num_threads(1);
  auto writer = OrDie(knnd::VectorsFileWriter::Create(
      knnd::VectorsPath(path), data.base.dim, knnd::VectorsDtype::kFloat32));
  OrDie(writer->Append(data.base.values.data(), data.base.rows));
  OrDie(writer->Finish());
  knnd::v1::IndexMetadata metadata;
  metadata.set_source("frontier_bench");
  OrDie(builder->Write(path, knnd::DefaultNprobe(builder->nlist()), metadata));
}

std::vector<double> Targets() {
  std::vector<double> targets;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_targets), ',', absl::SkipEmpty())) {
    double target;
    if (!absl::SimpleAtod(part, &target)) {
      Die(absl::StrCat("--targets: '", part, "' is not a number"));
    }
    targets.push_back(target);
  }
  return targets;
}

const Row* FastestReaching(const std::vector<Row>& rows,
                           const std::string& recipe, double target);

// --batch_threads threads, each running every query --reps times in calls
// of R rows for each R of --batch_rows, at the fastest setting of `recipe`
// reaching each target: the in-process ceiling that requests through gRPC
// are compared with (every core busy).
void MeasureBatched(const std::string& recipe,
                    const knnd::IndexSnapshot& snapshot, const Data& data,
                    const std::vector<Row>& rows,
                    std::vector<Batched>* batched) {
  const int threads = std::max(1, absl::GetFlag(FLAGS_batch_threads));
  const int64_t nq = data.queries.rows;
  for (const int batch_rows : IntList(absl::GetFlag(FLAGS_batch_rows))) {
    if (batch_rows <= 0) continue;
    for (double target : Targets()) {
      const Row* best = FastestReaching(rows, recipe, target);
      if (best == nullptr) continue;
      bool done = false;
      for (const Batched& b : *batched) {
        done |= b.recipe == recipe && b.nprobe == best->nprobe &&
                b.refine == best->refine && b.rows == batch_rows;
      }
      if (done) continue;
      std::vector<std::vector<int64_t>> ids(threads);
      const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
      const absl::Time start = absl::Now();
      knnd_bench::RunOnThreads(threads, [&](int t) {
        ids[t].assign(static_cast<size_t>(nq) * kK, -1);
        std::vector<float> distances(static_cast<size_t>(batch_rows) * kK);
        for (int rep = 0; rep < reps; ++rep) {
          for (int64_t q = 0; q < nq; q += batch_rows) {
            knnd::SearchArgs args;
            args.queries = data.queries.row(q);
            args.num_queries = std::min<int64_t>(batch_rows, nq - q);
            args.k = kK;
            args.nprobe = best->nprobe;
            args.refine_factor = best->refine;
            args.distances = distances.data();
            args.ids = ids[t].data() + q * kK;
            OrDie(snapshot.Search(args));
          }
        }
      });
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      Batched b{recipe, best->nprobe, best->refine, batch_rows, threads};
      b.recall = knnd::RecallAt(ids[0], kK, data.truth, kK, kK);
      b.qps = static_cast<double>(nq) * reps * threads / seconds;
      std::printf("batched %s nprobe %d refine %d: %d threads x %d rows per "
                  "call: recall %.4f, %.0f q/s (wall)\n",
                  recipe.c_str(), b.nprobe, b.refine, threads, batch_rows,
                  b.recall, b.qps);
      std::fflush(stdout);
      batched->push_back(b);
    }
  }
}

void RunKnnd(const std::string& name, const std::string& factory,
             const Data& data, std::vector<Row>* rows,
             std::vector<RecipeSummary>* summaries,
             std::vector<Batched>* batched) {
  std::string file = name;
  for (char& c : file) {
    if (c == ',' || c == ' ' || c == '/') c = '_';
  }
  const std::string path =
      absl::StrCat(absl::GetFlag(FLAGS_work), "/", file, ".index");
  RecipeSummary summary{name, factory};
  BuildKnnd(data, factory, path, &summary);
  summary.file_bytes = FileBytes(path) + FileBytes(knnd::VectorsPath(path));
  malloc_trim(0);
  const Resident resident0;
  knnd::LoadOptions load;
  load.probe_in_subprocess = false;
  load.verify_checksum = false;
  load.vectors = knnd::VectorsPolicy::kRequired;
  auto snapshot = OrDie(knnd::IndexSnapshot::Load(path, load));
  const int nlist = static_cast<int>(snapshot->info().nlist);
  std::vector<float> distances(kK);
  for (int nprobe : IntList(absl::GetFlag(FLAGS_nprobes))) {
    if (nprobe > nlist) continue;
    for (int refine : IntList(absl::GetFlag(FLAGS_refine_factors))) {
      Row row = Measure(data, [&](int64_t q, int64_t* ids) {
        knnd::SearchArgs args;
        args.queries = data.queries.row(q);
        args.num_queries = 1;
        args.k = kK;
        args.nprobe = nprobe;
        args.refine_factor = refine;
        args.distances = distances.data();
        args.ids = ids;
        OrDie(snapshot->Search(args));
      });
      Record(std::move(row), name,
             absl::StrCat("nprobe ", nprobe, ", refine ", refine), nprobe,
             refine, rows);
    }
  }
  RecordResident(resident0, &summary);
  summaries->push_back(summary);
  MeasureBatched(name, *snapshot, data, *rows, batched);
}

faiss::IndexIVF* IvfOf(faiss::Index* index) {
  auto* ivf = dynamic_cast<faiss::IndexIVF*>(index);
  if (ivf == nullptr) Die("the FAISS index is not an IVF index");
  return ivf;
}

void RunFaiss(const std::string& name, const std::string& factory,
              const Data& data, std::vector<Row>* rows,
              std::vector<RecipeSummary>* summaries) {
  const std::string path =
      absl::StrCat(absl::GetFlag(FLAGS_work), "/", name, ".faiss");
  const std::string refined = absl::StrCat(factory, ",RFlat");
  RecipeSummary summary{name, refined};
  {
    std::unique_ptr<faiss::Index> index(faiss::index_factory(
        data.base.dim, refined.c_str(), faiss::METRIC_L2));
    omp_set_num_threads(absl::GetFlag(FLAGS_build_threads));
    const BuildTimer timer;
    auto* refine_index = dynamic_cast<faiss::IndexRefine*>(index.get());
    if (refine_index == nullptr) Die(refined + " is not an IndexRefine");
    knnd::Matrix sample;
    const knnd::Matrix& train =
        TrainingRows(data, IvfOf(refine_index->base_index)->nlist, &sample);
    index->train(train.rows, train.values.data());
    index->add(data.base.rows, data.base.values.data());
    timer.Stop(&summary.build_seconds, &summary.build_cpu_seconds);
    omp_set_num_threads(1);
    faiss::write_index(index.get(), path.c_str());
  }
  summary.file_bytes = FileBytes(path);
  malloc_trim(0);
  const Resident resident0;
  std::unique_ptr<faiss::Index> index(faiss::read_index(path.c_str()));
  auto* refine_index = dynamic_cast<faiss::IndexRefine*>(index.get());
  if (refine_index == nullptr) Die(refined + " is not an IndexRefine");
  faiss::IndexIVF* ivf = IvfOf(refine_index->base_index);
  std::vector<float> distances(kK);
  for (int nprobe : IntList(absl::GetFlag(FLAGS_nprobes))) {
    if (nprobe > static_cast<int>(ivf->nlist)) continue;
    ivf->nprobe = nprobe;
    for (int refine : IntList(absl::GetFlag(FLAGS_refine_factors))) {
      faiss::Index* searched = refine == 0 ? static_cast<faiss::Index*>(ivf)
                                           : refine_index;
      refine_index->k_factor = static_cast<float>(std::max(1, refine));
      Row row = Measure(data, [&](int64_t q, int64_t* ids) {
        searched->search(1, data.queries.row(q), kK, distances.data(), ids);
      });
      Record(std::move(row), name,
             absl::StrCat("nprobe ", nprobe, ", k_factor ", refine), nprobe,
             refine, rows);
    }
  }
  RecordResident(resident0, &summary);
  summaries->push_back(summary);
}

void RunHnsw(const std::string& name, int m, const Data& data,
             std::vector<Row>* rows, std::vector<RecipeSummary>* summaries) {
  constexpr int kEfConstruction = 200;
  const std::string path =
      absl::StrCat(absl::GetFlag(FLAGS_work), "/", name, ".hnsw");
  RecipeSummary summary{name, absl::StrCat("hnswlib M ", m,
                                           ", efConstruction ",
                                           kEfConstruction)};
  hnswlib::L2Space space(data.base.dim);
  {
    hnswlib::HierarchicalNSW<float> index(&space, data.base.rows, m,
                                          kEfConstruction);
    const BuildTimer timer;
    std::atomic<int64_t> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < std::max(1, absl::GetFlag(FLAGS_build_threads));
         ++t) {
      threads.emplace_back([&] {
        for (int64_t i = next++; i < data.base.rows; i = next++) {
          index.addPoint(data.base.row(i), static_cast<size_t>(i));
        }
      });
    }
    for (std::thread& t : threads) t.join();
    timer.Stop(&summary.build_seconds, &summary.build_cpu_seconds);
    index.saveIndex(path);
  }
  summary.file_bytes = FileBytes(path);
  malloc_trim(0);
  const Resident resident0;
  hnswlib::HierarchicalNSW<float> index(&space, path);
  for (int ef : IntList(absl::GetFlag(FLAGS_efs))) {
    ef = std::max(ef, kK);
    index.setEf(ef);
    Row row = Measure(data, [&](int64_t q, int64_t* ids) {
      auto found = index.searchKnn(data.queries.row(q), kK);
      for (int j = kK - 1; j >= 0; --j) {
        if (found.empty()) {
          ids[j] = -1;
          continue;
        }
        ids[j] = static_cast<int64_t>(found.top().second);
        found.pop();
      }
    });
    Record(std::move(row), name, absl::StrCat("ef ", ef), 0, 0, rows);
  }
  RecordResident(resident0, &summary);
  summaries->push_back(summary);
}

// The fastest row of `recipe` with recall >= target; null if none.
const Row* FastestReaching(const std::vector<Row>& rows,
                           const std::string& recipe, double target) {
  const Row* best = nullptr;
  for (const Row& row : rows) {
    if (row.recipe == recipe && row.recall >= target &&
        (best == nullptr || row.qps > best->qps)) {
      best = &row;
    }
  }
  return best;
}

void PrintMatched(const std::vector<Row>& rows,
                  const std::vector<RecipeSummary>& summaries) {
  std::printf("\nmatched recall: the fastest setting of each recipe "
              "reaching the target\n\n");
  std::printf("| target | recipe | setting | recall@10 | q/s | knnd-fastscan "
              "/ this |\n|---|---|---|---|---|---|\n");
  for (double target : Targets()) {
    const Row* ours = FastestReaching(rows, "knnd-fastscan", target);
    for (const RecipeSummary& s : summaries) {
      const Row* best = FastestReaching(rows, s.recipe, target);
      if (best == nullptr) {
        std::printf("| %.2f | %s | not reached | | | |\n", target,
                    s.recipe.c_str());
        continue;
      }
      const std::string ratio =
          ours == nullptr ? "-" : absl::StrFormat("%.2f", ours->qps / best->qps);
      std::printf("| %.2f | %s | %s | %.4f | %.0f | %s |\n", target,
                  s.recipe.c_str(), best->setting.c_str(), best->recall,
                  best->qps, ratio.c_str());
    }
  }
}

void PrintSameSetting(const std::vector<Row>& rows) {
  std::printf("\nsame setting, same factory: knnd-fastscan vs "
              "faiss-fastscan (IndexRefineFlat)\n\n");
  std::printf("| nprobe | refine / k_factor | knnd recall | FAISS recall | "
              "knnd q/s | FAISS q/s | knnd / FAISS |\n"
              "|---|---|---|---|---|---|---|\n");
  std::vector<double> ratios;
  for (const Row& ours : rows) {
    if (ours.recipe != "knnd-fastscan") continue;
    for (const Row& theirs : rows) {
      if (theirs.recipe == "faiss-fastscan" && theirs.nprobe == ours.nprobe &&
          theirs.refine == ours.refine) {
        std::printf("| %d | %d | %.4f | %.4f | %.0f | %.0f | %.2f |\n",
                    ours.nprobe, ours.refine, ours.recall, theirs.recall,
                    ours.qps, theirs.qps, ours.qps / theirs.qps);
        ratios.push_back(ours.qps / theirs.qps);
      }
    }
  }
  if (!ratios.empty()) {
    std::printf("\nknnd / FAISS, median over the %zu settings: %.2f\n",
                ratios.size(), Median(ratios));
  }
}

// Names and settings are the bench's own (no quotes or backslashes).
// "truth" holds the exact k nearest ids of every query, row after row.
void WriteJson(const std::string& path, const Data& data,
               const std::string& base_path, const std::vector<Row>& rows,
               const std::vector<RecipeSummary>& summaries,
               const std::vector<Batched>& batched) {
  std::string out = absl::StrFormat(
      "{\"version\": \"%s\", \"base\": \"%s\", \"n\": %d, \"d\": %d, "
      "\"nq\": %d, \"k\": %d,\n \"rows\": [",
      knnd::BuildInfoLine(), base_path, data.base.rows, data.base.dim,
      data.queries.rows, kK);
  const char* sep = "";
  for (const Row& r : rows) {
    absl::StrAppendFormat(
        &out,
        "%s\n  {\"recipe\": \"%s\", \"setting\": \"%s\", \"nprobe\": %d, "
        "\"refine\": %d, \"recall\": %.5f, \"qps\": %.1f, "
        "\"wall_qps\": %.1f}",
        sep, r.recipe, r.setting, r.nprobe, r.refine, r.recall, r.qps,
        r.wall_qps);
    sep = ",";
  }
  out += "],\n \"summaries\": [";
  sep = "";
  for (const RecipeSummary& s : summaries) {
    absl::StrAppendFormat(
        &out,
        "%s\n  {\"recipe\": \"%s\", \"factory\": \"%s\", "
        "\"build_s\": %.2f, \"build_cpu_s\": %.2f, \"file_bytes\": %d, "
        "\"rss_bytes\": %d, \"anon_bytes\": %d}",
        sep, s.recipe, s.factory, s.build_seconds, s.build_cpu_seconds,
        s.file_bytes, s.rss_bytes, s.anon_bytes);
    sep = ",";
  }
  out += "],\n \"batched\": [";
  sep = "";
  for (const Batched& b : batched) {
    absl::StrAppendFormat(
        &out,
        "%s\n  {\"recipe\": \"%s\", \"nprobe\": %d, \"refine\": %d, "
        "\"rows\": %d, \"threads\": %d, \"recall\": %.5f, \"qps\": %.1f}",
        sep, b.recipe, b.nprobe, b.refine, b.rows, b.threads, b.recall, b.qps);
    sep = ",";
  }
  out += "],\n \"truth\": [";
  for (size_t i = 0; i < data.truth.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ",", i % kK == 0 ? "\n  " : "",
                    data.truth[i]);
  }
  out += "]}\n";
  std::ofstream file(path);
  file << out;
  if (!file.good()) Die(absl::StrCat("cannot write --json ", path));
}

}  // namespace

int main(int argc, char** argv) {
  knnd::UseBlasKernelsForThisCpu();  // as knnd and knnctl do, first thing
  knnd::UseSingleThreadedBlas();  // as knnd's workers: one thread a call
  absl::ParseCommandLine(argc, argv);
  omp_set_num_threads(1);
  const std::string work = absl::GetFlag(FLAGS_work);
  if (mkdir(work.c_str(), 0755) != 0 && errno != EEXIST) {
    Die(absl::StrCat("cannot create --work ", work));
  }
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  Data data;
  const std::string base_path = absl::GetFlag(FLAGS_base).empty()
                                    ? dir + "/train-images-idx3-ubyte.gz"
                                    : absl::GetFlag(FLAGS_base);
  const std::string query_path = absl::GetFlag(FLAGS_queries).empty()
                                     ? dir + "/t10k-images-idx3-ubyte.gz"
                                     : absl::GetFlag(FLAGS_queries);
  data.base = OrDie(knnd::ReadVectors(base_path));
  data.queries =
      OrDie(knnd::ReadVectors(query_path, absl::GetFlag(FLAGS_nq)));
  if (data.queries.dim != data.base.dim) {
    Die(absl::StrCat(query_path, " has dim ", data.queries.dim, ", ",
                     base_path, " ", data.base.dim));
  }
  omp_set_num_threads(absl::GetFlag(FLAGS_build_threads));
  data.truth = OrDie(
      knnd::ExactNeighbors(data.base, data.queries, kK, knnd::Metric::kL2));
  omp_set_num_threads(1);

  const int64_t n = data.base.rows;
  const int d = data.base.dim;
  std::string fastscan = absl::GetFlag(FLAGS_fastscan_factory);
  if (fastscan.empty()) {
    fastscan = absl::StrCat("IVF", knnd::DefaultFastScanNlist(n), ",PQ",
                            knnd::DefaultFastScanM(d), "x4fs");
  }
  std::string pq8 = absl::GetFlag(FLAGS_pq8_factory);
  if (pq8.empty()) {
    pq8 = absl::StrCat("IVF", knnd::DefaultNlist(n), ",PQ",
                       knnd::DefaultPqM(d));
  }
  std::printf("frontier_bench: %s, OpenBLAS kernels %s\nbase %s: %lld x %d, "
              "%lld queries from %s, "
              "k %d, exact ground truth; search: 1 thread, 1 query per call; "
              "build: %d threads; load average at start %s\n\n",
              knnd::BuildInfoLine().c_str(),
              knnd::UseBlasKernelsForThisCpu().in_use.c_str(), base_path.c_str(),
              static_cast<long long>(n), d,
              static_cast<long long>(data.queries.rows), query_path.c_str(),
              kK,
              absl::GetFlag(FLAGS_build_threads), LoadAverage().c_str());
  std::printf("| recipe | setting | recall@10 | q/s (CPU) | q/s (wall) |\n"
              "|---|---|---|---|---|\n");
  std::vector<Row> rows;
  std::vector<RecipeSummary> summaries;
  std::vector<Batched> batched;
  for (absl::string_view recipe :
       absl::StrSplit(absl::GetFlag(FLAGS_recipes), ',', absl::SkipEmpty())) {
    if (recipe == "knnd-fastscan") {
      RunKnnd("knnd-fastscan", fastscan, data, &rows, &summaries, &batched);
    } else if (recipe == "knnd-pq8") {
      RunKnnd("knnd-pq8", pq8, data, &rows, &summaries, &batched);
    } else if (recipe == "faiss-fastscan") {
      RunFaiss("faiss-fastscan", fastscan, data, &rows, &summaries);
    } else if (recipe == "hnsw16") {
      RunHnsw("hnsw16", 16, data, &rows, &summaries);
    } else if (recipe == "hnsw32") {
      RunHnsw("hnsw32", 32, data, &rows, &summaries);
    } else {
      Die(absl::StrCat("unknown recipe '", recipe,
                       "' (knnd-fastscan, knnd-pq8, faiss-fastscan, hnsw16, "
                       "hnsw32)"));
    }
  }
  for (absl::string_view factory : absl::StrSplit(
           absl::GetFlag(FLAGS_knnd_factories), ';', absl::SkipEmpty())) {
    RunKnnd(absl::StrCat("knnd ", factory), std::string(factory), data, &rows,
            &summaries, &batched);
  }
  std::printf("\n| recipe | index | build s (train + add, wall) | build "
              "CPU s (all threads) | files MiB | RSS growth MiB (load + "
              "sweep) | RssAnon growth MiB |\n|---|---|---|---|---|---|---|\n");
  for (const RecipeSummary& s : summaries) {
    std::printf("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                s.recipe.c_str(), s.factory.c_str(), s.build_seconds,
                s.build_cpu_seconds, MiB(s.file_bytes), MiB(s.rss_bytes),
                MiB(s.anon_bytes));
  }
  PrintMatched(rows, summaries);
  PrintSameSetting(rows);
  std::printf("\nload average at end %s\n", LoadAverage().c_str());
  if (!absl::GetFlag(FLAGS_json).empty()) {
    WriteJson(absl::GetFlag(FLAGS_json), data, base_path, rows, summaries,
              batched);
  }
  return 0;
}
