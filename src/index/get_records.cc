#include "knnd/index/get_records.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "google/protobuf/io/coded_stream.h"
#include "knnd/storage/json_value.h"

namespace knnd {
namespace {

using google::protobuf::io::CodedOutputStream;

// The bytes a length-delimited field of `size` bytes takes (one-byte tag).
int64_t DelimitedBytes(int64_t size) {
  return 1 + CodedOutputStream::VarintSize64(static_cast<uint64_t>(size)) +
         size;
}

// Per row position (of `rows`), the keywords of `column` it holds,
// ascending.
std::vector<std::vector<int64_t>> RowKeywords(
    const AttributeStore::Column& column, absl::Span<const int64_t> rows) {
  // The rows sorted, with their positions, so that each keyword's
  // postings (ascending rows) can be searched in them or they in it.
  std::vector<std::pair<int64_t, size_t>> sorted;
  sorted.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) sorted.emplace_back(rows[i], i);
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int64_t>> held(rows.size());
  const auto by_row = [](const std::pair<int64_t, size_t>& a, int64_t row) {
    return a.first < row;
  };
  for (int64_t k = 0; k < column.count; ++k) {
    const absl::Span<const int64_t> postings = column.Postings(k);
    if (postings.size() <= sorted.size()) {
      for (int64_t row : postings) {
        auto it = std::lower_bound(sorted.begin(), sorted.end(), row, by_row);
        if (it != sorted.end() && it->first == row)
          held[it->second].push_back(k);
      }
    } else {
      for (const auto& [row, position] : sorted) {
        if (std::binary_search(postings.begin(), postings.end(), row)) {
          held[position].push_back(k);
        }
      }
    }
  }
  return held;
}

void AppendTimestamp(int64_t micros, std::string* out) {
  AppendJsonString(
      absl::FormatTime("%Y-%m-%d%ET%H:%M:%E*SZ", absl::FromUnixMicros(micros),
                       absl::UTCTimeZone()),
      out);
}

}  // namespace

std::vector<std::string> AttributesJson(const AttributeStore& store,
                                        absl::Span<const int64_t> rows) {
  std::vector<std::string> out(rows.size(), "{");
  for (const AttributeStore::Column& column : store.columns()) {
    std::vector<std::vector<int64_t>> keywords;
    if (!IsNumeric(column.type)) keywords = RowKeywords(column, rows);
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t row = rows[i];
      if (!column.Has(row)) continue;
      std::string& json = out[i];
      if (json.size() > 1) json.push_back(',');
      AppendJsonString(column.name, &json);
      json.push_back(':');
      switch (column.type) {
        case AttributeType::kInteger:
          absl::StrAppend(&json, column.ints[row]);
          break;
        case AttributeType::kFloat:
          JsonValue::Double(column.floats[row]).AppendTo(&json);
          break;
        case AttributeType::kTimestamp:
          AppendTimestamp(column.ints[row], &json);
          break;
        case AttributeType::kKeyword:
          AppendJsonString(keywords[i].empty()
                               ? absl::string_view()
                               : column.Keyword(keywords[i].front()),
                           &json);
          break;
        case AttributeType::kKeywordList:
          json.push_back('[');
          for (size_t j = 0; j < keywords[i].size(); ++j) {
            if (j > 0) json.push_back(',');
            AppendJsonString(column.Keyword(keywords[i][j]), &json);
          }
          json.push_back(']');
          break;
      }
    }
  }
  for (std::string& json : out) json.push_back('}');
  return out;
}

absl::Status CheckRecordsAsk(const IndexSnapshot& snapshot,
                             const RecordsAsk& ask) {
  const IndexInfo& index = snapshot.info();
  if (ask.attributes && snapshot.attributes() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "with_attributes: index ", index.path, " (version ", index.version,
        ") has no attributes; build it with knnctl build --attributes FILE"));
  }
  if (ask.vectors && snapshot.vectors() == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("with_vectors: index ", index.path, " (version ",
                     index.version, ") is served without its raw vectors",
                     index.vectors_error.empty()
                         ? ""
                         : absl::StrCat(" (", index.vectors_error, ")"),
                     "; build it with knnctl build --keep_vectors"));
  }
  return absl::OkStatus();
}

absl::Status CheckGetIds(absl::Span<const int64_t> ids, int64_t max_ids) {
  if (ids.empty()) {
    return absl::InvalidArgumentError("ids is empty: name at least one id");
  }
  if (max_ids > 0 && static_cast<int64_t>(ids.size()) > max_ids) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ids holds ", ids.size(), " ids, more than max_get_ids=", max_ids,
        "; split the request"));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ids[", i, "]=", ids[i], " is negative: ids are >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RecordsPlan> PlanRecords(const IndexSnapshot& snapshot,
                                        absl::Span<const int64_t> ids,
                                        const RecordsAsk& ask,
                                        int64_t max_ids) {
  if (absl::Status s = CheckGetIds(ids, max_ids); !s.ok()) return s;
  RecordsPlan plan;
  absl::flat_hash_set<int64_t> seen;
  seen.reserve(ids.size());
  for (int64_t id : ids) {
    if (!seen.insert(id).second) continue;
    const int64_t row = snapshot.RowOfId(id);
    if (row < 0) {
      plan.missing.push_back(id);
      plan.answer_bytes += 1 + CodedOutputStream::VarintSize64(id);
      continue;
    }
    plan.ids.push_back(id);
    plan.rows.push_back(row);
  }
  if (ask.attributes)
    plan.attributes = AttributesJson(*snapshot.attributes(), plan.rows);
  plan.payload_bytes.assign(plan.ids.size(), 0);
  const int64_t vector_bytes =
      ask.vectors ? DelimitedBytes(int64_t{4} * snapshot.vectors()->dim()) : 0;
  for (size_t i = 0; i < plan.ids.size(); ++i) {
    int64_t record =
        1 + CodedOutputStream::VarintSize64(plan.ids[i]) + vector_bytes;
    if (ask.payloads != nullptr) {
      plan.payload_bytes[i] =
          snapshot.PayloadJsonBytes(plan.ids[i], *ask.payloads);
      record += DelimitedBytes(plan.payload_bytes[i]);
    }
    if (ask.attributes) {
      record += DelimitedBytes(static_cast<int64_t>(plan.attributes[i].size()));
    }
    plan.answer_bytes += DelimitedBytes(record);
  }
  return plan;
}

void FillRecords(const IndexSnapshot& snapshot, const RecordsAsk& ask,
                 RecordsPlan& plan, knnd::v1::GetResponse* response) {
  const VectorsFile* vectors = ask.vectors ? snapshot.vectors() : nullptr;
  std::vector<float> scratch(vectors == nullptr ? 0 : vectors->dim());
  response->mutable_records()->Reserve(static_cast<int>(plan.ids.size()));
  for (size_t i = 0; i < plan.ids.size(); ++i) {
    knnd::v1::Record* record = response->add_records();
    record->set_id(plan.ids[i]);
    if (ask.payloads != nullptr) {
      std::string* payload = record->mutable_payload();
      payload->reserve(static_cast<size_t>(plan.payload_bytes[i]));
      snapshot.AppendPayload(plan.ids[i], *ask.payloads, payload);
    }
    if (ask.attributes)
      *record->mutable_attributes() = std::move(plan.attributes[i]);
    if (vectors != nullptr) {
      const float* row = vectors->RowAsFloats(plan.rows[i], scratch.data());
      record->mutable_vector()->Add(row, row + vectors->dim());
    }
  }
  response->mutable_missing()->Add(plan.missing.begin(), plan.missing.end());
}

}  // namespace knnd
