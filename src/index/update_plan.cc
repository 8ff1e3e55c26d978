#include "knnd/index/update_plan.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "knnd/storage/id_table.h"

namespace knnd {

absl::StatusOr<UpdatePlan> PlanUpdate(absl::Span<const int64_t> base_ids,
                                      absl::Span<const int64_t> input_ids,
                                      absl::Span<const int64_t> deletions,
                                      const std::string& input_name,
                                      const std::string& deletions_name) {
  if (absl::Status s = CheckIdsNonNegative(input_ids, input_name); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckIdsNonNegative(deletions, deletions_name);
      !s.ok()) {
    return s;
  }
  absl::flat_hash_map<int64_t, int64_t> input_row_of;
  input_row_of.reserve(input_ids.size());
  for (size_t i = 0; i < input_ids.size(); ++i) {
    const int64_t id = input_ids[i];
    if (!input_row_of.emplace(id, static_cast<int64_t>(i)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(input_name, ": id ", id, " is given twice (rows ",
                       input_row_of[id], " and ", i, ")"));
    }
  }
  absl::flat_hash_set<int64_t> deleted(deletions.begin(), deletions.end());
  for (int64_t id : deleted) {
    if (input_row_of.contains(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("id ", id, " is both deleted and given a vector in ",
                       input_name, "; give it one or the other"));
    }
  }
  UpdatePlan plan;
  plan.new_row_of_base.assign(base_ids.size(), -1);
  plan.new_row_of_input.assign(input_ids.size(), -1);
  auto append = [&plan](RowSource source, int64_t id) {
    plan.rows.push_back(source);
    plan.ids.push_back(id);
    return static_cast<int64_t>(plan.rows.size() - 1);
  };
  int64_t found_deletions = 0;
  absl::flat_hash_set<int64_t> found;
  for (size_t row = 0; row < base_ids.size(); ++row) {
    const int64_t id = base_ids[row];
    if (deleted.contains(id)) {
      ++found_deletions;
      found.insert(id);
      continue;
    }
    auto upsert = input_row_of.find(id);
    if (upsert != input_row_of.end()) {
      plan.new_row_of_input[upsert->second] =
          append({RowSource::From::kInput, upsert->second}, id);
      ++plan.upserted;
      continue;
    }
    plan.new_row_of_base[row] =
        append({RowSource::From::kBase, static_cast<int64_t>(row)}, id);
    ++plan.kept;
  }
  for (size_t i = 0; i < input_ids.size(); ++i) {
    if (plan.new_row_of_input[i] >= 0) continue;
    plan.new_row_of_input[i] = append(
        {RowSource::From::kInput, static_cast<int64_t>(i)}, input_ids[i]);
    ++plan.added;
  }
  plan.deleted = found_deletions;
  plan.deletions_absent =
      static_cast<int64_t>(deleted.size()) - found_deletions;
  for (int64_t id : deleted) {
    if (!found.contains(id)) plan.absent_deletions.push_back(id);
  }
  std::sort(plan.absent_deletions.begin(), plan.absent_deletions.end());
  plan.row_ids = true;
  for (size_t r = 0; r < plan.ids.size() && plan.row_ids; ++r) {
    plan.row_ids = plan.ids[r] == static_cast<int64_t>(r);
  }
  return plan;
}

std::vector<int64_t> NextIds(absl::Span<const int64_t> base_ids,
                             int64_t count) {
  int64_t next = 0;
  for (int64_t id : base_ids) next = std::max(next, id + 1);
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) ids[i] = next + i;
  return ids;
}

}  // namespace knnd
