// Wire bytes of SearchRequests with deeply nested filters, built without
// ever holding the nested Filter as a message: protobuf's own serialising
// (and destroying) of a message nested 900,000 deep would recurse as deep.
#ifndef KNND_TESTS_TESTING_DEEP_FILTER_H_
#define KNND_TESTS_TESTING_DEEP_FILTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "knnd/v1/knn_service.pb.h"

namespace knnd::testing {

// How each level nests the next: negate (one message a level) or all_of
// (a FilterList and a Filter a level).
enum class Nesting { kNegate, kAllOf };

inline void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

inline size_t VarintSize(uint64_t value) {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

// A Filter nested `depth` deep (as attribute_filter.h counts: a lone
// condition is 1) around {field: "genre", eq: {keyword: "news"}}.
inline std::string DeepFilterBytes(int64_t depth, Nesting nesting) {
  knnd::v1::Filter leaf;
  leaf.mutable_condition()->set_field("genre");
  leaf.mutable_condition()->mutable_eq()->set_keyword("news");
  const std::string inner = leaf.SerializeAsString();
  // Each level from the inside out: the tags before it, its length.
  std::vector<std::string> heads;
  heads.reserve(static_cast<size_t>(depth));
  uint64_t size = inner.size();
  for (int64_t level = 1; level < depth; ++level) {
    std::string head;
    if (nesting == Nesting::kNegate) {
      head.push_back(static_cast<char>((4 << 3) | 2));  // Filter.negate
      AppendVarint(size, &head);
    } else {
      std::string list_head;  // FilterList.filters
      list_head.push_back(static_cast<char>((1 << 3) | 2));
      AppendVarint(size, &list_head);
      const uint64_t list_size = list_head.size() + size;
      head.push_back(static_cast<char>((2 << 3) | 2));  // Filter.all_of
      AppendVarint(list_size, &head);
      head += list_head;
    }
    size += head.size();
    heads.push_back(std::move(head));
  }
  std::string out;
  out.reserve(size);
  for (auto it = heads.rbegin(); it != heads.rend(); ++it) out += *it;
  out += inner;
  return out;
}

// `request` (without a filter) serialised, with `filter` (Filter wire
// bytes) as its field 12.
inline std::string WithFilterBytes(const knnd::v1::SearchRequest& request,
                                   const std::string& filter) {
  std::string out = request.SerializeAsString();
  out.push_back(static_cast<char>((12 << 3) | 2));
  AppendVarint(filter.size(), &out);
  out += filter;
  return out;
}

// The deepest negate chain whose request (`request` plus the filter)
// stays within `max_bytes`: each level adds its tag and its length.
inline int64_t DeepestWithin(const knnd::v1::SearchRequest& request,
                             uint64_t max_bytes) {
  const uint64_t base = request.ByteSizeLong() + 1;  // and the filter's tag
  uint64_t size = DeepFilterBytes(1, Nesting::kNegate).size();
  int64_t depth = 1;
  for (;;) {
    const uint64_t next = size + 1 + VarintSize(size);
    if (base + VarintSize(next) + next > max_bytes) return depth;
    size = next;
    ++depth;
  }
}

}  // namespace knnd::testing

#endif  // KNND_TESTS_TESTING_DEEP_FILTER_H_
