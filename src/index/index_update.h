// A new index version made from the previous one plus a delta, without
// training (`knnctl update`, docs/updates.md): deletions, upserts and
// additions planned by UpdatePlan (update_plan.h), the kept vectors' codes
// moved and the new ones encoded with the base's coarse quantizer and PQ
// (faiss/fastscan_update.h), INDEX.vectors, INDEX.ids, INDEX.payloads and
// INDEX.attrs (attribute_update.h) rewritten row by row, the file
// committed as every builder commits one (CommitIndexFile: it must load
// in knnd, then the sidecar with its checksum). Then drift:
// how far the new vectors' quantization error and the list sizes have
// moved from the base's and from the build's trained reference, recall@10
// on a sample of the delta, and whether a full retrain is due
// (update_drift.h).
//
// Thread-safety: pure function (FAISS may use all cores inside it).
#ifndef KNND_INDEX_INDEX_UPDATE_H_
#define KNND_INDEX_INDEX_UPDATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "knnd/index/update_drift.h"
#include "knnd/index/update_plan.h"
#include "knnd/storage/vector_io.h"

namespace knnd {

struct UpdateOptions {
  std::string base_path;    // the previous version (a whole FastScan index)
  std::string output_path;  // the new version; may not be base_path
  // The delta: vectors (raw; normalised here when the base is cosine),
  // their ids (empty: for a row-id base, the ids after its largest; an
  // own-ids base needs them), the ids to delete. `input_name` names them.
  const Matrix* input = nullptr;  // null: deletions only
  std::vector<int64_t> input_ids;
  std::vector<int64_t> deletions;
  std::string input_name;
  std::string deletions_name;  // names the deletions' file in errors
  // JSON Lines, line i the payload of input row i (as knnctl build
  // --payloads reads it): required when the base has payloads and the
  // delta has rows, refused when the base has none. The base's rows keep
  // theirs; an upsert takes its new line.
  std::string input_payloads;
  // JSON Lines, line i the attributes of input row i (as knnctl build
  // --attributes reads them): required when the base has attributes and
  // the delta has rows, refused when the base has none. Carried as
  // attribute_update.h says.
  std::string input_attributes;
  // Queries for the recall estimate (drawn from the delta's rows, or the
  // new version's when the delta has none); 0: not measured.
  int recall_queries = 200;
  // Rows whose quantization error is measured, from each side.
  int64_t error_sample_rows = kDriftSampleRows;
  uint32_t seed = kDriftSeed;
  std::string built_by;  // the sidecar's built_by
};

struct UpdateReport {
  bool wrote_payloads = false;
  // The new version's text index's payload field and distinct terms (built
  // from the new payloads with the base's options); "" and 0 without one.
  std::string text_field;
  int64_t text_terms = 0;
  bool wrote_attributes = false;
  int64_t attribute_columns = 0;  // of the new version's INDEX.attrs
  // The delta's attribute columns the base did not have, added without a
  // value on the base's rows.
  std::vector<std::string> attribute_columns_added;
  UpdatePlan plan;
  UpdateDrift drift;
  int64_t ntotal = 0;
  bool wrote_vectors = false;
  bool wrote_id_table = false;
  double write_seconds = 0;  // plan, encode, files, commit
  double drift_seconds = 0;
};

// Writes the new version at options.output_path (its INDEX.vectors when the
// base has one, INDEX.ids unless the rows are the ids, INDEX.payloads and
// INDEX.attrs when the base has them, the index, then its
// sidecar: from the base's, with ntotal, checksum, created, built_by and
// id_table new and the tuning kept). INVALID_ARGUMENT for a shard (update
// the whole index and split it again), an 8-bit IVF-PQ base, an own-ids
// base without input ids, vectors of another dim, or PlanUpdate's
// refusals; the base's load errors as IndexSnapshot::Load reports them.
absl::StatusOr<UpdateReport> UpdateIndexFile(const UpdateOptions& options);

}  // namespace knnd

#endif  // KNND_INDEX_INDEX_UPDATE_H_
