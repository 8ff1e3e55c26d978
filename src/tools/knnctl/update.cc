// knnctl update: a new index version from the previous one plus a delta
// (additions, upserts, deletions) without training (index/index_update.h),
// with its drift report and whether a full retrain is due
// (docs/updates.md).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "build_outputs.h"
#include "command.h"
#include "knnd/base/units.h"
#include "knnd/index/index_update.h"
#include "knnd/monitoring/build_info.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/payload_file.h"
#include "knnd/storage/vector_io.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/text/text_index.h"
#include "text_input.h"

namespace knnd::knnctl {
namespace {

struct UpdateCommandOptions {
  std::string base;
  std::string output;
  std::string input;
  std::string ids;
  std::string deletions;
  std::string payloads;
  std::string attributes;
  std::string text;
  std::string text_file;
  int recall_queries = 200;
  uint32_t seed = 1;
  int threads = 0;
};

void PrintReport(const UpdateCommandOptions& options,
                 const UpdateReport& report) {
  const UpdatePlan& p = report.plan;
  std::printf(
      "rows:     %lld kept, %lld upserted (replaced in place), "
      "%lld added, %lld deleted\n",
      static_cast<long long>(p.kept), static_cast<long long>(p.upserted),
      static_cast<long long>(p.added), static_cast<long long>(p.deleted));
  // Named, so that a deletion of ids the base never held (a stale list, ids
  // of another index) is seen; bounded, so that a wrong file prints one line.
  if (!p.absent_deletions.empty()) {
    constexpr size_t kNamed = 20;
    const size_t absent = p.absent_deletions.size();
    const size_t named = std::min(kNamed, absent);
    std::string line =
        absl::StrCat(absent, " ids to delete were not in the base: ",
                     absl::StrJoin(p.absent_deletions.begin(),
                                   p.absent_deletions.begin() + named, ", "));
    if (named < absent)
      absl::StrAppend(&line, " and ", absent - named, " more");
    std::printf("absent:   %s\n", line.c_str());
  }
  struct stat st;
  stat(options.output.c_str(), &st);
  std::printf("wrote:    %s (%lld vectors, %.1f MiB) and %s\n",
              options.output.c_str(), static_cast<long long>(report.ntotal),
              MiB(st.st_size), MetadataPath(options.output).c_str());
  if (report.wrote_vectors) {
    std::printf("wrote:    %s\n", VectorsPath(options.output).c_str());
  }
  if (report.wrote_id_table) {
    std::printf("wrote:    %s (row -> id; every kept id as before)\n",
                IdTablePath(options.output).c_str());
  }
  if (report.wrote_payloads) {
    std::printf(
        "wrote:    %s (the base's rows' payloads, and %s for the "
        "input's)\n",
        PayloadPath(options.output).c_str(),
        options.text_file.empty()
            ? "--payloads'"
            : absl::StrCat("--text_file ", options.text_file,
                           "'s lines as field \"", report.text_field, "\"")
                  .c_str());
  }
  if (!report.text_field.empty()) {
    std::printf(
        "wrote:    %s (BM25 postings of payload field \"%s\", %lld terms, "
        "from the new version's payloads)\n",
        TextIndexPath(options.output).c_str(), report.text_field.c_str(),
        static_cast<long long>(report.text_terms));
  }
  if (report.wrote_attributes) {
    std::printf(
        "wrote:    %s (%lld attribute columns: the base's rows' "
        "values, and --attributes' for the input's)\n",
        AttributeStorePath(options.output).c_str(),
        static_cast<long long>(report.attribute_columns));
  }
  for (const std::string& column : report.attribute_columns_added) {
    std::printf(
        "attribute: \"%s\" is new (from --attributes): the base's "
        "rows have no value\n",
        column.c_str());
  }
  std::printf(
      "time:     %.2f s to write (no training), %.2f s to measure "
      "drift\n",
      report.write_seconds, report.drift_seconds);
  for (const std::string& line : DescribeDrift(report.drift)) {
    std::printf("%s\n", line.c_str());
  }
  std::printf(
      "next:     knnctl publish --index %s --dir VERSIONS (knnd "
      "swaps to it; split it with knnctl shard first when serving "
      "shards)\n",
      options.output.c_str());
}

// --text_file: the delta's texts joined to its --payloads as the field of
// the base's text index (its sidecar's text_field), which --text, when
// given, must name: an update does not change what the index searches.
absl::StatusOr<std::unique_ptr<TextPayloads>> JoinTexts(
    const UpdateCommandOptions& options, int64_t rows) {
  if (options.text_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--text ", options.text,
        " names the field of --text_file's lines: give --text_file too (an "
        "update indexes the base's text field)"));
  }
  if (options.input.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--text_file ", options.text_file,
                     " holds the texts of --input's rows; give --input too"));
  }
  absl::StatusOr<knnd::v1::IndexMetadata> meta =
      ReadIndexMetadata(MetadataPath(options.base));
  if (!meta.ok()) return meta.status();
  const std::string& field = meta->text_field();
  if (field.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--text_file ", options.text_file, ": the base ", options.base,
        " has no text index (build it with --text FIELD)"));
  }
  if (!options.text.empty() && options.text != field) {
    return absl::InvalidArgumentError(
        absl::StrCat("--text ", options.text, ": the text index of the base ",
                     options.base, " is of payload field \"", field,
                     "\", which --text_file's lines become: give --text ",
                     field, " or leave --text out"));
  }
  return TextPayloads::Write(options.payloads, options.text_file, field, rows,
                             options.output);
}

int Update(const UpdateCommandOptions& options) {
  UseThreads(options.threads);
  if (options.base.empty() || options.output.empty()) {
    return Fail("update needs --base INDEX and --output INDEX");
  }
  if (options.input.empty() && options.deletions.empty()) {
    return Fail(
        "update needs --input FILE (additions and upserts), "
        "--delete FILE, or both");
  }
  const size_t slash = options.output.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : options.output.substr(0, slash + 1);
  if (access(dir.c_str(), W_OK) != 0) {
    return Fail(absl::StrCat("cannot write into the directory of ",
                             options.output, ": ", std::strerror(errno)));
  }
  if (options.output == options.base) {
    return Fail(absl::StrCat("the new version cannot overwrite its base ",
                             options.base,
                             ": write it beside it (knnctl publish numbers "
                             "versions)"));
  }
  // Written under a staging name and committed as --output once whole
  // (storage/version_manifest.h): a killed or failed update leaves
  // --output's version as it was.
  // Beside the base too: the build or update that wrote it may have left
  // a killed run's files there, often in another directory than --output.
  RemoveKilledRunsFiles(options.base);
  const std::unique_ptr<StagingGuard> staging = BeginStaging(options.output);
  UpdateOptions update;
  update.base_path = options.base;
  update.output_path = staging->path();
  update.input_name = options.input.empty() ? options.deletions : options.input;
  update.input_payloads = options.payloads;
  update.input_attributes = options.attributes;
  update.recall_queries = options.recall_queries;
  update.seed = options.seed;
  update.built_by = absl::StrCat("knnctl update: ", BuildInfoLine());
  Matrix input;
  if (!options.input.empty()) {
    absl::StatusOr<Matrix> read = ReadVectors(options.input);
    if (!read.ok()) return Fail(read.status());
    input = std::move(*read);
    update.input = &input;
    if (!options.ids.empty()) {
      absl::StatusOr<std::vector<int64_t>> ids =
          ReadRowIds(options.ids, input.rows);
      if (!ids.ok()) return Fail(ids.status());
      update.input_ids = std::move(*ids);
    }
  } else if (!options.ids.empty()) {
    return Fail("--ids names the ids of --input's rows; give --input too");
  } else if (!options.attributes.empty()) {
    return Fail(
        "--attributes holds the attributes of --input's rows; give --input "
        "too (a deletion carries the kept rows' attributes by itself)");
  }
  // Removed (by its destructor) once the update has read it.
  std::unique_ptr<TextPayloads> text_payloads;
  if (!options.text.empty() || !options.text_file.empty()) {
    absl::StatusOr<std::unique_ptr<TextPayloads>> joined =
        JoinTexts(options, input.rows);
    if (!joined.ok()) return Fail(joined.status());
    text_payloads = std::move(*joined);
    update.input_payloads = text_payloads->path();
  }
  if (!options.deletions.empty()) {
    absl::StatusOr<IdMatrix> deletions = ReadIds(options.deletions);
    if (!deletions.ok()) return Fail(deletions.status());
    if (deletions->cols != 1) {
      return Fail(absl::StrCat("--delete ", options.deletions, ": holds ",
                               deletions->rows, " x ", deletions->cols,
                               " ids; expected one column"));
    }
    update.deletions = std::move(deletions->values);
    update.deletions_name = absl::StrCat("--delete ", options.deletions);
  }
  absl::StatusOr<UpdateReport> report = UpdateIndexFile(update);
  if (!report.ok()) return Fail(report.status());
  if (absl::Status s = CommitStaged(staging->path(), options.output); !s.ok()) {
    return Fail(s);
  }
  PrintReport(options, *report);
  return kExitOk;
}

}  // namespace

std::function<int()> DefineUpdate(FlagSet& flags) {
  auto options = std::make_shared<UpdateCommandOptions>();
  flags.Add("base", &options->base, "INDEX",
            "The previous version: a whole knnd FastScan index (with its "
            "sidecar, and INDEX.vectors and INDEX.ids when it has them). "
            "Required.");
  flags.Add("output", &options->output, "INDEX",
            "The new version to write, beside the base (not over it), with "
            "its sidecar, INDEX.vectors and INDEX.ids (and INDEX.payloads "
            "and INDEX.attrs when the base has them). Required.");
  flags.Add("input", &options->input, "FILE",
            "Vectors to add or replace, in any format build reads; an id "
            "the base holds is replaced in place (upsert), a new one "
            "appended.");
  flags.Add("ids", &options->ids, "FILE",
            "int64/int32 .npy or .ivecs, one id per --input row (required "
            "for a base with its own ids). Default for a row-id base: the "
            "ids after its largest.");
  flags.Add("delete", &options->deletions, "FILE",
            "int64/int32 .npy or .ivecs of ids (>= 0) to delete; those the "
            "base does not hold are named (absent:). In a row-id index the "
            "rows after a deleted one renumber, so the new version gets "
            "INDEX.ids keeping every id as it was.");
  flags.Add("payloads", &options->payloads, "FILE.jsonl",
            "JSON Lines, line i the payload of --input's row i, as build "
            "--payloads reads it: required when the base has payloads and "
            "--input is given (with --text_file, their payloads may be the "
            "texts alone). The base's other rows keep theirs.");
  flags.Add("attributes", &options->attributes, "FILE.jsonl",
            "JSON Lines, line i the attributes of --input's row i, as build "
            "--attributes reads them: required when the base has attributes "
            "and --input is given. The base's other rows keep theirs; a "
            "column keeps its type, one the base lacks is added (no value "
            "on the base's rows).");
  flags.Add("text_file", &options->text_file, "FILE",
            "The texts of --input's rows for a base with a text index: line "
            "i is row i's text, joined to its payload (beside --payloads' "
            "fields when given) as the field the base's text index was "
            "built on, so that the new version's text index holds it (an "
            "upsert's old text goes).");
  flags.Add("text", &options->text, "FIELD",
            "With --text_file: the base's text field (its sidecar's "
            "text_field); any other is refused. Default: that field.");
  flags.Add("recall_queries", &options->recall_queries, "N",
            "Rows of the delta (or of the new version, without --input) "
            "searched to estimate recall@10 against exact search over "
            "INDEX.vectors; 0: not measured.");
  flags.Add("seed", &options->seed, "N", "Seed of the drift samples.");
  AddThreadsFlag(flags, &options->threads);
  return [options] { return Update(*options); };
}

}  // namespace knnd::knnctl
