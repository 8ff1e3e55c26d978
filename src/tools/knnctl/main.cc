// knnctl: the command-line companion of knnd. main() picks the command from
// the table below, parses that command's own flags and runs it; every
// usage text is generated from the table and the commands' FlagSets.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "command.h"
#include "flag_set.h"
#include "knnd/faiss/faiss_runtime.h"
#include "knnd/index/index_probe.h"
#include "knnd/monitoring/build_info.h"

namespace knnd::knnctl {
namespace {

constexpr Command kCommands[] = {
    {"build", "vectors in, IVF-PQ index file and metadata sidecar out",
     "--input FILE --output INDEX [flags]", DefineBuild},
    {"convert", "a FastScan index written by FAISS into knnd's mappable layout",
     "--input FAISS_FILE --output INDEX [--metric cosine]", DefineConvert},
    {"shard",
     "splits an index into shards sharing its quantizers (docs/sharding.md)",
     "--index INDEX --shards N [--output PATH]", DefineShard},
    {"update",
     "a new version from the previous one and a delta, without training "
     "(docs/updates.md)",
     "--base INDEX --output INDEX [--input FILE [--ids FILE]] "
     "[--delete FILE]",
     DefineUpdate},
    {"analyze",
     "prints the terms knnd's text analyzer makes of each line, as JSON "
     "arrays",
     "[--input FILE] [--index INDEX | --stemmer LANG]", DefineAnalyze},
    {"eval",
     "recall and queries/s over a sweep of nprobe and refine_factor, or "
     "nDCG/Recall/MRR of BM25, dense and hybrid against relevance labels",
     "--index INDEX (--queries FILE (--ground_truth FILE | --base FILE) | "
     "--labels FILE [--texts FILE] [--queries FILE]) [flags]",
     DefineEval},
    {"tune",
     "stores in the sidecar the fastest nprobe and refine_factor reaching a "
     "target recall",
     "--index INDEX [--shards N] [--queries FILE] [--target_recall R] "
     "[flags]",
     DefineTune},
    {"search", "sends queries to knnd, prints neighbours and latency",
     "(--queries FILE | --random N) [flags]", DefineSearch},
    {"info", "describes the served index (--addr) or an index file (--index)",
     "[--index FILE | --addr HOST:PORT] [flags]", DefineInfo},
    {"health", "exit 0 when knnd reports SERVING, 1 otherwise", "[flags]",
     DefineHealth},
    {"get",
     "prints the stored records (payload, attributes, vector) of ids, one "
     "JSON line each",
     "--ids ID,ID,... [--fields F,F,...|*] [--attributes] [--vectors] "
     "[flags]",
     DefineGet},
    {"publish",
     "copies a version (the files its manifest binds) into a versions "
     "directory, or uploads it to a bucket, as its next version",
     "--index FILE (--dir DIR | --remote REMOTE:bucket/prefix)", DefinePublish},
    {"seal",
     "binds an index and the files beside it into one version (its "
     "manifest), for files written before manifests",
     "--index FILE", DefineSeal},
    {"reload", "admin API: load the latest version now, or pin one (rollback)",
     "[--pin N] [flags]", DefineReload},
    {"versions", "admin API: versions known, which serves, why one was refused",
     "[flags]", DefineVersions},
};

const Command* FindCommand(const std::string& name) {
  for (const Command& command : kCommands) {
    if (name == command.name) return &command;
  }
  return nullptr;
}

bool IsHelp(const std::string& arg) {
  return arg == "--help" || arg == "-help" || arg == "-h";
}

// `knnctl --help`: the command list.
std::string Usage() {
  std::string out =
      "knnctl: the command-line companion of knnd.\n\n"
      "usage: knnctl COMMAND [flags]\n\ncommands:\n";
  for (const Command& command : kCommands) {
    absl::StrAppendFormat(&out, "  %-9s %s\n", command.name, command.summary);
  }
  absl::StrAppend(
      &out,
      "\n`knnctl COMMAND --help` lists a command's flags; `knnctl "
      "--version`\nnames the build. Exit codes: 0 done, 1 health: not "
      "serving, 2 any error\n(the message on stderr).\n");
  return out;
}

// `knnctl COMMAND --help`: what it does, its usage line and flags.
std::string CommandUsage(const Command& command, const FlagSet& flags) {
  return absl::StrCat("knnctl ", command.name, ": ", command.summary,
                      ".\n\nusage: knnctl ", command.name, " ",
                      command.synopsis, "\n\n", flags.Help());
}

int Run(const Command& command, const std::vector<std::string>& args) {
  FlagSet flags;
  const std::function<int()> run = command.define(flags);
  for (const std::string& arg : args) {
    if (IsHelp(arg)) {
      std::printf("%s", CommandUsage(command, flags).c_str());
      return kExitOk;
    }
  }
  if (absl::Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "knnctl %s: %s (`knnctl %s --help` lists its flags)\n",
                 command.name, std::string(s.message()).c_str(), command.name);
    return kExitError;
  }
  return run();
}

int Main(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fprintf(stderr, "%s", Usage().c_str());
    return kExitError;
  }
  const std::string& first = args.front();
  if (IsHelp(first) || first == "help") {
    if (args.size() > 1 && first == "help") {
      const Command* command = FindCommand(args[1]);
      if (command == nullptr) {
        return Fail(absl::StrCat("help: unknown command '", args[1], "'"));
      }
      return Run(*command, {"--help"});
    }
    std::printf("%s", Usage().c_str());
    return kExitOk;
  }
  if (first == "--version" || first == "-version") {
    std::printf("%s\n", BuildInfoLine().c_str());
    return kExitOk;
  }
  const Command* command = FindCommand(first);
  if (command == nullptr) {
    std::fprintf(stderr, "knnctl: unknown command '%s'\n\n%s", first.c_str(),
                 Usage().c_str());
    return kExitError;
  }
  // OpenBLAS threads spinning next to FAISS's OpenMP threads oversubscribe
  // the cores; FAISS parallelises over rows itself.
  UseSingleThreadedBlas();
  return Run(*command, std::vector<std::string>(args.begin() + 1, args.end()));
}

}  // namespace
}  // namespace knnd::knnctl

int main(int argc, char** argv) {
  // Before any other thread or BLAS call: k-means and the coarse search run
  // on OpenBLAS's sgemm.
  knnd::UseBlasKernelsForThisCpu();
  knnd::RunIndexProbeIfAsked(argc, argv);
  return knnd::knnctl::Main(std::vector<std::string>(argv + 1, argv + argc));
}
