#include "build_outputs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "command.h"
#include "knnd/base/units.h"
#include "knnd/storage/attribute_jsonl.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/payload_file.h"
#include "knnd/storage/version_manifest.h"
#include "knnd/text/text_index_writer.h"
#include "text_input.h"

namespace knnd::knnctl {
namespace {

// The payload files of the index the build writes (`plan` empty), or of
// the shards of `plan`, each with the end of its rows.
std::vector<PayloadPart> PayloadParts(const BuildOptions& options,
                                      const std::vector<ShardSpec>& plan,
                                      int64_t rows) {
  std::vector<PayloadPart> parts;
  for (const ShardSpec& shard : plan) {
    parts.push_back({PayloadPath(ShardPath(options.output, shard.shard_id,
                                           shard.shard_count)),
                     shard.end_id});
  }
  if (plan.empty()) parts.push_back({PayloadPath(options.output), rows});
  return parts;
}

}  // namespace

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash + 1);
}

StagingGuard::~StagingGuard() { RemoveStagedVersion(staged_); }

void RemoveKilledRunsFiles(const std::string& index_path) {
  for (const std::string& stale : RemoveStaleTemporaries(index_path)) {
    std::printf("removed:  %s (left by a run that was killed)\n",
                stale.c_str());
  }
}

std::unique_ptr<StagingGuard> BeginStaging(const std::string& output) {
  RemoveKilledRunsFiles(output);
  return std::make_unique<StagingGuard>(StagingPathFor(output));
}

absl::Status CommitStaged(const std::string& staged,
                          const std::string& output) {
  std::vector<std::string> removed;
  if (absl::Status s = CommitStagedVersion(staged, output, &removed); !s.ok()) {
    return s;
  }
  for (const std::string& path : removed) {
    std::printf("removed:  %s (of the previous version)\n", path.c_str());
  }
  return absl::OkStatus();
}

// The line build --shards and shard print for each shard written: its
// file, part and size, and whether its vectors file and id table are
// beside it (with an id table the part is a range of rows).
void PrintShardWritten(const std::string& path, const ShardSpec& shard) {
  struct stat st;
  stat(path.c_str(), &st);
  const bool vectors = access(VectorsPath(path).c_str(), R_OK) == 0;
  const bool id_table = access(IdTablePath(path).c_str(), R_OK) == 0;
  const bool payloads = access(PayloadPath(path).c_str(), R_OK) == 0;
  std::printf(
      "wrote:    %s (shard %d of %d: %s [%lld, %lld), %.1f MiB%s%s%s)\n",
      path.c_str(), shard.shard_id, shard.shard_count,
      id_table ? "rows" : "ids", static_cast<long long>(shard.first_id),
      static_cast<long long>(shard.end_id), MiB(st.st_size),
      vectors ? ", with its .vectors" : "", id_table ? ", with its .ids" : "",
      payloads ? ", with its .payloads" : "");
}

// Writes the id table of rows [first, end) of `ids` beside `index_path`
// (own ids); nothing with row ids.
absl::Status WriteIdTableSlice(const std::string& index_path,
                               const std::vector<int64_t>& ids, int64_t first,
                               int64_t end, const std::string& source) {
  if (ids.empty()) return absl::OkStatus();
  return WriteIdTable(IdTablePath(index_path),
                      absl::MakeConstSpan(ids.data() + first, end - first),
                      source);
}

// Reads --attributes (JSON Lines, line i for row i) and writes its store
// beside the index or each shard (its rows' slice). Runs before training, like
// the payloads, so that a bad line fails the build at once and the columns are
// freed before the lists grow: returns the heap bytes the step holds at its
// peak (the "attributes" phase of the memory model), 0 without --attributes.
absl::StatusOr<int64_t> WriteAttributeStores(const BuildOptions& options,
                                             const std::vector<ShardSpec>& plan,
                                             int64_t rows,
                                             int* columns_written) {
  std::vector<std::pair<std::string, ShardSpec>> parts;
  for (const ShardSpec& shard : plan) {
    parts.emplace_back(
        ShardPath(options.output, shard.shard_id, shard.shard_count), shard);
  }
  if (plan.empty()) {
    ShardSpec whole;
    whole.first_id = 0;
    whole.end_id = rows;
    parts.emplace_back(options.output, whole);
  }
  *columns_written = 0;
  const bool from_payloads = !options.attribute_fields.empty();
  if (options.attributes.empty() && !from_payloads) return 0;
  const absl::Time start = absl::Now();
  absl::StatusOr<AttributeColumns> columns =
      from_payloads ? ReadAttributesJsonl(options.payloads, rows, {},
                                          &options.attribute_fields)
                    : ReadAttributesJsonl(options.attributes, rows);
  if (!columns.ok()) return columns.status();
  for (const AttributeColumn& column : columns->columns) {
    std::printf("attribute: %s (%s)\n", column.name.c_str(),
                AttributeTypeName(column.type));
  }
  int64_t largest_store = 0;
  int64_t total = 0;
  for (const auto& [index_path, shard] : parts) {
    const std::string path = AttributeStorePath(index_path);
    if (absl::Status s = WriteAttributeStore(
            path, plan.empty()
                      ? *columns
                      : SliceColumns(*columns, shard.first_id, shard.end_id));
        !s.ok()) {
      return s;
    }
    struct stat st;
    if (stat(path.c_str(), &st) == 0) {
      largest_store = std::max<int64_t>(largest_store, st.st_size);
      total += st.st_size;
    }
  }
  *columns_written = static_cast<int>(columns->columns.size());
  std::printf(
      "attributes: %s: %zu columns to %zu store%s (%.1f MiB) in "
      "%.1f s\n",
      options.attributes.c_str(), columns->columns.size(), parts.size(),
      parts.size() > 1 ? "s" : "", MiB(total),
      absl::ToDoubleSeconds(absl::Now() - start));
  // The store is assembled in memory (WriteAttributeStore): a string
  // that grows by doubling, up to twice the image while it reallocates,
  // beside one numeric column's sort buffers (rows, sorted and held
  // values: 24 bytes a row).
  return AttributeColumnsHeldBytes(*columns) + 2 * largest_store + 24 * rows;
}

// Writes the payloads of --payloads (JSON Lines, line i for row i) beside
// the index or each shard (its rows' lines), read one line at a time. Runs
// before training, so that a bad line fails the build at once.
absl::Status WritePayloadStores(const BuildOptions& options,
                                const std::vector<ShardSpec>& plan,
                                int64_t rows) {
  const std::vector<PayloadPart> parts = PayloadParts(options, plan, rows);
  if (options.payloads.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  if (absl::Status s = WritePayloadsFromJsonLines(options.payloads, parts);
      !s.ok()) {
    return s;
  }
  const int64_t count = static_cast<int64_t>(parts.size());
  int64_t bytes = 0;
  for (const PayloadPart& part : parts) {
    struct stat st;
    if (stat(part.path.c_str(), &st) == 0) bytes += st.st_size;
  }
  std::printf("payloads: %s: %lld rows to %lld file%s (%.1f MiB) in %.1f s\n",
              options.text_file.empty()
                  ? options.payloads.c_str()
                  : absl::StrCat("--text_file ", options.text_file,
                                 " as field ", options.text)
                        .c_str(),
              static_cast<long long>(rows), static_cast<long long>(count),
              count > 1 ? "s" : "", MiB(bytes),
              absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

TextIndexOptions TextOptionsOf(const BuildOptions& options) {
  TextIndexOptions text;
  text.field = options.text;
  text.analyzer.stemmer = options.text_stemmer;
  text.k1 = options.bm25_k1;
  text.b = options.bm25_b;
  return text;
}

absl::Status CheckTextOptions(const BuildOptions& options) {
  if (options.text.empty()) return absl::OkStatus();
  const TextIndexOptions text = TextOptionsOf(options);
  if (absl::Status s = ValidateTextIndexOptions(text); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Analyzer>> analyzer =
      Analyzer::Create(text.analyzer);
  if (!analyzer.ok()) {
    return absl::Status(
        analyzer.status().code(),
        absl::StrCat("--text_stemmer: ", analyzer.status().message()));
  }
  return absl::OkStatus();
}

absl::Status WriteTextStores(const BuildOptions& options,
                             const std::vector<ShardSpec>& plan, int64_t rows) {
  if (options.text.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  const std::vector<PayloadPart> payload_parts =
      PayloadParts(options, plan, rows);
  std::vector<std::unique_ptr<PayloadFile>> files;
  std::vector<const PayloadFile*> views;
  std::vector<TextIndexPart> parts;
  int64_t first = 0;
  for (const PayloadPart& part : payload_parts) {
    absl::StatusOr<std::unique_ptr<PayloadFile>> file = PayloadFile::Open(
        part.path, part.end_row - first, /*verify_checksum=*/false);
    if (!file.ok()) return file.status();
    views.push_back(file->get());
    files.push_back(std::move(*file));
    // Beside the part's payloads: INDEX.payloads -> INDEX.text.
    const std::string index_path =
        part.path.substr(0, part.path.size() - PayloadPath("").size());
    parts.push_back({TextIndexPath(index_path), part.end_row});
    first = part.end_row;
  }
  absl::StatusOr<TextCorpusSummary> written =
      WriteTextIndexes(views, TextOptionsOf(options), parts);
  if (!written.ok()) {
    return absl::Status(written.status().code(),
                        absl::StrCat("--text ", options.text, ": ",
                                     written.status().message()));
  }
  int64_t bytes = 0;
  for (const TextIndexPart& part : parts) {
    struct stat st;
    if (stat(part.path.c_str(), &st) == 0) bytes += st.st_size;
  }
  std::printf(
      "text:     payload field \"%s\"%s of %lld rows: %lld terms, %.1f terms "
      "a row, BM25 k1 %g b %g%s%s, %.1f MiB in %.1f s\n",
      options.text.c_str(),
      options.text_file.empty()
          ? ""
          : absl::StrCat(" (--text_file ", options.text_file, ")").c_str(),
      static_cast<long long>(written->rows),
      static_cast<long long>(written->terms), written->average_length,
      options.bm25_k1, options.bm25_b,
      options.text_stemmer.empty() ? "" : ", stemmer ",
      options.text_stemmer.c_str(), MiB(bytes),
      absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status CheckCompanionOptions(const BuildOptions& options) {
  if (!options.attribute_fields.empty() &&
      (options.payloads.empty() || !options.attributes.empty())) {
    return absl::InvalidArgumentError(
        "--attribute_fields names fields of --payloads: give --payloads, and "
        "not --attributes");
  }
  if (!options.text_file.empty() && options.text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--text_file ", options.text_file,
        " needs --text FIELD: the payload field its lines become"));
  }
  if (!options.text.empty() && options.payloads.empty() &&
      options.text_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--text ", options.text,
                     " names a payload field: give --payloads or --text_file"));
  }
  return CheckTextOptions(options);
}

absl::StatusOr<int64_t> WriteCompanionStores(const BuildOptions& options,
                                             const std::vector<ShardSpec>& plan,
                                             int64_t rows,
                                             int* attribute_columns) {
  BuildOptions joined = options;
  std::unique_ptr<TextPayloads> text_payloads;
  if (!options.text_file.empty()) {
    absl::StatusOr<std::unique_ptr<TextPayloads>> written =
        TextPayloads::Write(options.payloads, options.text_file, options.text,
                            rows, options.output);
    if (!written.ok()) return written.status();
    text_payloads = std::move(*written);
    joined.payloads = text_payloads->path();
  }
  if (absl::Status s = WritePayloadStores(joined, plan, rows); !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteTextStores(joined, plan, rows); !s.ok()) return s;
  return WriteAttributeStores(joined, plan, rows, attribute_columns);
}

void PrintCompanionsWritten(const BuildOptions& options, bool keep_vectors,
                            VectorsDtype dtype, int attribute_columns) {
  struct stat st;
  const std::string vectors_path = VectorsPath(options.output);
  if (keep_vectors) {
    stat(vectors_path.c_str(), &st);
    std::printf("wrote:    %s (%s, %.1f MiB, for refine_factor > 0)\n",
                vectors_path.c_str(), VectorsDtypeName(dtype), MiB(st.st_size));
  }
  if (!options.ids.empty()) {
    stat(IdTablePath(options.output).c_str(), &st);
    std::printf(
        "wrote:    %s (%.1f MiB: row -> id and id -> row for the "
        "ids of %s)\n",
        IdTablePath(options.output).c_str(), MiB(st.st_size),
        options.ids.c_str());
  }
  if (!options.payloads.empty() || !options.text_file.empty()) {
    stat(PayloadPath(options.output).c_str(), &st);
    std::printf("wrote:    %s (%.1f MiB: each row's payload)\n",
                PayloadPath(options.output).c_str(), MiB(st.st_size));
  }
  if (!options.text.empty()) {
    stat(TextIndexPath(options.output).c_str(), &st);
    std::printf(
        "wrote:    %s (%.1f MiB: BM25 postings of payload field "
        "\"%s\", for texts)\n",
        TextIndexPath(options.output).c_str(), MiB(st.st_size),
        options.text.c_str());
  }
  if (attribute_columns > 0) {
    stat(AttributeStorePath(options.output).c_str(), &st);
    std::printf(
        "wrote:    %s (%d attribute columns, %.1f MiB, for "
        "filters)\n",
        AttributeStorePath(options.output).c_str(), attribute_columns,
        MiB(st.st_size));
  }
}

// The shards' row ranges with --shards (equal counts), else none.
absl::StatusOr<std::vector<ShardSpec>> PlanRowShards(int64_t rows, int shards) {
  if (shards <= 0) return std::vector<ShardSpec>();
  std::vector<int64_t> all(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) all[i] = i;
  return PlanShards(all, shards);
}

// The vectors files the add loop writes: one per shard of `plan`, or one
// for the whole index; none without --keep_vectors.
std::vector<VectorsSink::Part> VectorsParts(const BuildOptions& options,
                                            const std::vector<ShardSpec>& plan,
                                            int64_t rows, bool keep_vectors) {
  std::vector<VectorsSink::Part> parts;
  for (const ShardSpec& shard : plan) {
    parts.push_back({VectorsPath(ShardPath(options.output, shard.shard_id,
                                           shard.shard_count)),
                     shard.end_id});
  }
  if (plan.empty()) parts.push_back({VectorsPath(options.output), rows});
  if (keep_vectors) return parts;
  std::printf(
      "note:     no raw-vectors file (--keep_vectors=false): knnd cannot "
      "re-rank exactly (refine_factor)\n");
  return {};
}

}  // namespace knnd::knnctl
