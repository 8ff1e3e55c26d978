#include "knnd/index/index_update.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <functional>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "knnd/faiss/fastscan_update.h"
#include "knnd/faiss/vector_math.h"
#include "knnd/index/attribute_update.h"
#include "knnd/index/index_builder.h"
#include "knnd/index/index_eval.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/storage/atomic_file.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/storage/id_table.h"
#include "knnd/storage/index_metadata.h"
#include "knnd/storage/payload_file.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/storage/vectors_file_reader.h"
#include "knnd/text/text_index_writer.h"

namespace knnd {
namespace {

constexpr int64_t kRowBatch = 4096;

// Writes the new version's vectors file: row r from the base's file or the
// (normalised) input, as plan.rows says, in batches. The base's rows come
// through a VectorsFileReader, in ascending order as the plan keeps them,
// never through its mapping: the update's peak RSS is its buffers and the
// delta's, not the base's whole file.
absl::Status WriteUpdatedVectors(const UpdatePlan& plan,
                                 const VectorsFile& base, const Matrix* input,
                                 const std::string& path) {
  absl::StatusOr<std::unique_ptr<VectorsFileReader>> reader =
      VectorsFileReader::Open(base);
  if (!reader.ok()) return reader.status();
  absl::StatusOr<std::unique_ptr<VectorsFileWriter>> writer =
      VectorsFileWriter::Create(path, base.dim(), base.dtype());
  if (!writer.ok()) return writer.status();
  const int dim = base.dim();
  std::vector<float> batch;
  const int64_t rows = static_cast<int64_t>(plan.rows.size());
  for (int64_t begin = 0; begin < rows; begin += kRowBatch) {
    const int64_t n = std::min(kRowBatch, rows - begin);
    batch.resize(static_cast<size_t>(n) * dim);
    for (int64_t i = 0; i < n; ++i) {
      const RowSource& source = plan.rows[begin + i];
      const float* row = nullptr;
      if (source.from == RowSource::From::kBase) {
        absl::StatusOr<const float*> read = (*reader)->Row(source.row);
        if (!read.ok()) return read.status();
        row = *read;
      } else {
        row = input->row(source.row);
      }
      std::copy(row, row + dim, batch.data() + i * dim);
    }
    if (absl::Status s = (*writer)->Append(batch.data(), n); !s.ok()) return s;
  }
  return (*writer)->Finish();
}

// The base's id of every row: its id table's, or the rows themselves.
absl::StatusOr<std::vector<int64_t>> BaseIds(const IndexInfo& info) {
  std::vector<int64_t> ids(static_cast<size_t>(info.ntotal));
  if (!info.has_id_table) {
    for (int64_t row = 0; row < info.ntotal; ++row) ids[row] = row;
    return ids;
  }
  absl::StatusOr<std::unique_ptr<IdTable>> table =
      IdTable::Open(info.id_table_path, info.ntotal, /*verify_checksum=*/false);
  if (!table.ok()) return table.status();
  for (int64_t row = 0; row < info.ntotal; ++row) {
    ids[row] = (*table)->IdOf(row);
  }
  return ids;
}

// The lines of `path`, which must hold exactly `rows` of them (the
// payloads of the delta's rows: it is in memory too).
absl::StatusOr<std::vector<std::string>> ReadPayloadLines(
    const std::string& path, int64_t rows) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read --payloads ", path));
  }
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (static_cast<int64_t>(lines.size()) == rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("--payloads ", path, " holds more than the ", rows,
                       " lines of the input's rows"));
    }
    lines.push_back(std::move(line));
  }
  if (static_cast<int64_t>(lines.size()) != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("--payloads ", path, " holds ", lines.size(),
                     " lines for the input's ", rows, " rows"));
  }
  return lines;
}

// The new version's payloads, row by row in the plan's order: a base row
// keeps its fields, an input row takes its line of --payloads.
absl::Status WriteUpdatedPayloads(const UpdatePlan& plan,
                                  const PayloadFile& base,
                                  const std::vector<std::string>& lines,
                                  const std::string& payloads_name,
                                  const std::string& path) {
  absl::StatusOr<std::unique_ptr<PayloadFileWriter>> writer =
      PayloadFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  for (const RowSource& source : plan.rows) {
    if (source.from == RowSource::From::kBase) {
      const std::vector<PayloadField> fields = base.Fields(source.row);
      if (absl::Status s = (*writer)->AppendFields(fields); !s.ok()) {
        return s;
      }
    } else if (absl::Status s = (*writer)->AppendJsonLine(lines[source.row]);
               !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--payloads ", payloads_name, " line ",
                       source.row + 1, ": ", s.message()));
    }
  }
  return (*writer)->Finish();
}

}  // namespace

absl::StatusOr<UpdateReport> UpdateIndexFile(const UpdateOptions& options) {
  const absl::Time start = absl::Now();
  if (options.output_path == options.base_path) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the new version cannot overwrite its base ", options.base_path,
        ": write it beside it (knnctl publish numbers versions)"));
  }
  // The base's structure is checked (layout, sizes, counts, the sidecar
  // against the file); its payload checksums are not read again: it is a
  // published version, verified when it was published and served, and
  // reading its INDEX.vectors once more would cost as much as the update.
  LoadOptions load;
  load.use_precomputed_table = false;
  load.probe_in_subprocess = false;
  load.verify_checksum = false;
  absl::StatusOr<std::unique_ptr<IndexSnapshot>> base =
      IndexSnapshot::Load(options.base_path, load);
  if (!base.ok()) return base.status();
  const IndexInfo& info = (*base)->info();
  if (info.shard_count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.base_path, " is shard ", info.shard_id, " of ",
                     info.shard_count,
                     "; update the whole index, then split it again "
                     "with knnctl shard"));
  }
  if (!info.vectors_error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the raw-vectors file of ", options.base_path,
                     " does not load: ", info.vectors_error));
  }
  const Matrix* input = options.input;
  if (input != nullptr && input->rows > 0 && input->dim != info.dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.input_name, " has dim=", input->dim,
                     ", the index ", options.base_path, " dim=", info.dim));
  }
  const int64_t input_rows = input != nullptr ? input->rows : 0;
  absl::StatusOr<std::vector<int64_t>> base_ids = BaseIds(info);
  if (!base_ids.ok()) return base_ids.status();
  std::vector<int64_t> input_ids = options.input_ids;
  if (input_ids.empty() && input_rows > 0) {
    if (info.has_id_table) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.base_path,
                       " holds its own ids (INDEX.ids): give the ids "
                       "of ",
                       options.input_name, " (--ids)"));
    }
    input_ids = NextIds(*base_ids, input_rows);
  }
  if (static_cast<int64_t>(input_ids.size()) != input_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("ids for ", options.input_name, ": ", input_ids.size(),
                     " ids for ", input_rows, " rows"));
  }
  if (!info.has_payloads && !options.input_payloads.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--payloads ", options.input_payloads, ": the base ",
                     options.base_path,
                     " has no payloads (build it with --payloads)"));
  }
  if (info.has_payloads && input_rows > 0 && options.input_payloads.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the base ", options.base_path, " has payloads (", info.payloads_path,
        "): give the payloads of ", options.input_name,
        "'s rows with --payloads"));
  }
  std::vector<std::string> payload_lines;
  if (!options.input_payloads.empty()) {
    absl::StatusOr<std::vector<std::string>> lines =
        ReadPayloadLines(options.input_payloads, input_rows);
    if (!lines.ok()) return lines.status();
    payload_lines = std::move(*lines);
  }
  // Without the delta's attributes a new row would match no filter but a
  // negated one: required, as payloads are.
  const AttributeStore* base_attributes = (*base)->attributes();
  // A base whose attributes are payload fields takes the delta's from its
  // payloads.
  std::vector<std::string> attribute_fields;
  if (absl::StatusOr<knnd::v1::IndexMetadata> meta =
          ReadIndexMetadata(MetadataPath(options.base_path));
      meta.ok()) {
    attribute_fields.assign(meta->attribute_fields().begin(),
                            meta->attribute_fields().end());
  }
  const bool attributes_from_payloads =
      !attribute_fields.empty() && options.input_attributes.empty();
  if (base_attributes == nullptr && !options.input_attributes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--attributes ", options.input_attributes, ": the base ",
        options.base_path, " has no attributes (build it with --attributes)"));
  }
  if (base_attributes != nullptr && input_rows > 0 &&
      options.input_attributes.empty() && !attributes_from_payloads) {
    return absl::InvalidArgumentError(
        absl::StrCat("the base ", options.base_path, " has attributes (",
                     info.attributes_path, "): give the attributes of ",
                     options.input_name, "'s rows with --attributes"));
  }
  AttributeDelta attribute_delta;
  if (!options.input_attributes.empty()) {
    absl::StatusOr<AttributeDelta> read = ReadAttributeDelta(
        options.input_attributes, input_rows, *base_attributes);
    if (!read.ok()) return read.status();
    attribute_delta = std::move(*read);
  } else if (attributes_from_payloads && base_attributes != nullptr &&
             input_rows > 0) {
    absl::StatusOr<AttributeDelta> read =
        ReadAttributeDelta(options.input_payloads, input_rows, *base_attributes,
                           &attribute_fields);
    if (!read.ok()) return read.status();
    attribute_delta = std::move(*read);
  }
  UpdateReport report;
  report.attribute_columns_added = attribute_delta.added_columns;
  absl::StatusOr<UpdatePlan> plan =
      PlanUpdate(*base_ids, input_ids, options.deletions, options.input_name,
                 options.deletions_name);
  if (!plan.ok()) return plan.status();
  report.plan = std::move(*plan);
  base_ids->clear();
  base_ids->shrink_to_fit();
  const UpdatePlan& p = report.plan;

  // The delta as the index holds it: normalised for cosine.
  Matrix normalized;
  if (input != nullptr && info.metric == Metric::kCosine) {
    normalized = *input;
    NormalizeRows(normalized.values.data(), normalized.rows, normalized.dim);
    input = &normalized;
  }
  absl::StatusOr<std::unique_ptr<FastScanUpdate>> update =
      FastScanUpdate::Open(options.base_path);
  if (!update.ok()) return update.status();
  if (input_rows > 0) {
    if (absl::Status s = (*update)->Add(input->values.data(), input_rows,
                                        p.new_row_of_input.data());
        !s.ok()) {
      return s;
    }
  }
  // The per-row files first, then the index, its sidecar and the manifest
  // (CommitIndexFile), as knnctl build orders them; the caller writes to a
  // staging name and commits the version (storage/version_manifest.h).
  const std::string vectors_path = VectorsPath(options.output_path);
  if (info.has_vectors) {
    absl::StatusOr<std::unique_ptr<VectorsFile>> vectors = VectorsFile::Open(
        info.vectors_path, info.dim, info.ntotal, /*verify_checksum=*/false);
    if (!vectors.ok()) return vectors.status();
    if (absl::Status s = WriteUpdatedVectors(p, **vectors, input, vectors_path);
        !s.ok()) {
      return s;
    }
    report.wrote_vectors = true;
  }
  const std::string ids_path = IdTablePath(options.output_path);
  if (!p.row_ids) {
    if (absl::Status s = WriteIdTable(ids_path, p.ids, options.input_name);
        !s.ok()) {
      return s;
    }
    report.wrote_id_table = true;
  }
  const std::string payloads_path = PayloadPath(options.output_path);
  if (info.has_payloads) {
    absl::StatusOr<std::unique_ptr<PayloadFile>> payloads = PayloadFile::Open(
        info.payloads_path, info.ntotal, /*verify_checksum=*/false);
    if (!payloads.ok()) return payloads.status();
    if (absl::Status s =
            WriteUpdatedPayloads(p, **payloads, payload_lines,
                                 options.input_payloads, payloads_path);
        !s.ok()) {
      return s;
    }
    report.wrote_payloads = true;
  }
  // The text index is the new payloads' field analyzed again, with the
  // base's options: the corpus statistics are the new version's.
  if (const TextIndex* text = (*base)->text(); text != nullptr) {
    absl::StatusOr<std::unique_ptr<PayloadFile>> payloads =
        PayloadFile::Open(payloads_path, static_cast<int64_t>(p.rows.size()),
                          /*verify_checksum=*/false);
    if (!payloads.ok()) return payloads.status();
    const PayloadFile* files[] = {payloads->get()};
    const TextIndexPart part{TextIndexPath(options.output_path),
                             static_cast<int64_t>(p.rows.size())};
    absl::StatusOr<TextCorpusSummary> written =
        WriteTextIndexes(files, OptionsOf(text->stats()), {&part, 1});
    if (!written.ok()) return written.status();
    report.text_field = info.text_field;
    report.text_terms = written->terms;
  }
  const std::string attributes_path = AttributeStorePath(options.output_path);
  if (base_attributes != nullptr) {
    absl::StatusOr<AttributeColumns> columns =
        UpdatedAttributes(p, *base_attributes, attribute_delta);
    if (!columns.ok()) return columns.status();
    attribute_delta = AttributeDelta();
    if (absl::Status s = WriteAttributeStore(attributes_path, *columns);
        !s.ok()) {
      return s;
    }
    report.wrote_attributes = true;
    report.attribute_columns = static_cast<int64_t>(columns->columns.size());
  }
  const std::string tmp = TempPathFor(options.output_path);
  if (absl::Status s = (*update)->Write(p.new_row_of_base, tmp); !s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  knnd::v1::IndexMetadata metadata;
  if (absl::StatusOr<knnd::v1::IndexMetadata> read =
          ReadIndexMetadata(MetadataPath(options.base_path));
      read.ok()) {
    metadata = *read;
  }
  CarryTrainedReference(p, metadata, report.drift);
  metadata.clear_file_bytes();
  metadata.clear_crc32();
  metadata.clear_build_id();
  metadata.set_metric(MetricName(info.metric));
  metadata.set_created(
      absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()));
  metadata.set_built_by(options.built_by);
  metadata.set_id_table(!p.row_ids);
  metadata.set_payloads(info.has_payloads);
  metadata.set_attributes(base_attributes != nullptr);
  metadata.set_text_field(info.text_field);
  if (!options.input_attributes.empty()) metadata.clear_attribute_fields();
  if (absl::Status s =
          CommitIndexFile(tmp, options.output_path, std::move(metadata));
      !s.ok()) {
    return s;
  }
  report.ntotal = static_cast<int64_t>(p.rows.size());
  report.write_seconds = absl::ToDoubleSeconds(absl::Now() - start);

  // Drift.
  const absl::Time drift_start = absl::Now();
  UpdateDrift& drift = report.drift;
  if (absl::Status s = MeasureQuantizationDrift(
          **update, info, input_rows > 0 ? input : nullptr, p.new_row_of_base,
          options.error_sample_rows, options.seed, drift);
      !s.ok()) {
    return s;
  }
  update->reset();
  base->reset();
  if (options.recall_queries > 0) {
    if (absl::Status s =
            MeasureUpdateRecall(options.output_path, input,
                                options.recall_queries, options.seed, drift);
        !s.ok()) {
      return s;
    }
  }
  JudgeRetrain(drift);
  report.drift_seconds = absl::ToDoubleSeconds(absl::Now() - drift_start);
  return report;
}

}  // namespace knnd
