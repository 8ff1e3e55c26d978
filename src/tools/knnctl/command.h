// The commands of knnctl and what they share. main.cc holds the table of
// commands; each command group has its own file (build.cc, eval.cc,
// query.cc, versions.cc) defining its flags and what it runs.
//
// Exit codes of every command: 0 done, 1 health: not serving, 2 any error
// (the message on stderr).
//
// Thread-safety: commands run on main()'s thread, one per process.
#ifndef KNND_TOOLS_KNNCTL_COMMAND_H_
#define KNND_TOOLS_KNNCTL_COMMAND_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "flag_set.h"

namespace knnd::knnctl {

constexpr int kExitOk = 0;
constexpr int kExitNotServing = 1;
constexpr int kExitError = 2;

// Adds a command's flags to `flags`, bound to options it owns, and returns
// what runs the command once they are parsed.
using DefineCommand = std::function<int()> (*)(FlagSet& flags);

// One row of the command table.
struct Command {
  const char* name;
  const char* summary;   // one line, for `knnctl --help`
  const char* synopsis;  // what follows the name on its usage line
  DefineCommand define;
};

// build.cc: making index files.
std::function<int()> DefineBuild(FlagSet& flags);
std::function<int()> DefineConvert(FlagSet& flags);
std::function<int()> DefineShard(FlagSet& flags);
// update.cc
std::function<int()> DefineUpdate(FlagSet& flags);
// analyze.cc
std::function<int()> DefineAnalyze(FlagSet& flags);
// eval.cc
std::function<int()> DefineEval(FlagSet& flags);
// tune.cc
std::function<int()> DefineTune(FlagSet& flags);
// query.cc: the search API's gRPC client commands.
std::function<int()> DefineSearch(FlagSet& flags);
std::function<int()> DefineInfo(FlagSet& flags);
std::function<int()> DefineHealth(FlagSet& flags);
// get.cc: records by id.
std::function<int()> DefineGet(FlagSet& flags);
// versions.cc: index versions on disk and knnd's admin API.
std::function<int()> DefinePublish(FlagSet& flags);
std::function<int()> DefineSeal(FlagSet& flags);
std::function<int()> DefineReload(FlagSet& flags);
std::function<int()> DefineVersions(FlagSet& flags);

// Prints "knnctl: <message>" on stderr and returns kExitError.
int Fail(absl::string_view message);
int Fail(const absl::Status& status);

// The query vectors of the commands that search (eval, search): --queries
// FILE, at most --limit rows of it, --k neighbours each.
struct QueryOptions {
  std::string queries;
  int64_t limit = 0;  // 0: all rows
  int k = 10;
};
void AddQueryFlags(FlagSet& flags, QueryOptions& options);

// --threads of the commands that run FAISS (build, eval), bound to
// `threads`; UseThreads() applies it to the calling thread.
void AddThreadsFlag(FlagSet& flags, int* threads);
void UseThreads(int threads);

// Ids for the `rows` rows of a vectors file (--ids of build and eval): one
// column, one per row, unique and >= 0 (-1 marks a missing neighbour in
// results); an error names the file, the row and the id otherwise.
absl::StatusOr<std::vector<int64_t>> ReadRowIds(const std::string& path,
                                                int64_t rows);

// --nprobes of eval and tune: a comma-separated list, or (empty) the
// powers of two below nlist and nlist itself.
absl::StatusOr<std::vector<int>> NprobeList(const std::string& list,
                                            int64_t nlist);
// --refine_factors of eval and tune: a comma-separated list, or (empty)
// 0,1,2,4,8,16 with the re-ranking vectors and 0 without.
absl::StatusOr<std::vector<int>> RefineFactorList(const std::string& list,
                                                  bool has_vectors);

}  // namespace knnd::knnctl

#endif  // KNND_TOOLS_KNNCTL_COMMAND_H_
