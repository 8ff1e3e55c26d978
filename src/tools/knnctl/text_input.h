// knnctl build/update --text_file: the rows' texts from a plain text file
// (line i: row i's text) instead of a field already in --payloads. The
// texts become the payload field --text of each row (beside --payloads'
// own fields when given), so that the version keeps them, knnd can return
// them, and a later update rebuilds the text index from the payloads as
// for any text field.
//
// Thread-safety: used by knnctl's main thread.
#ifndef KNND_TOOLS_KNNCTL_TEXT_INPUT_H_
#define KNND_TOOLS_KNNCTL_TEXT_INPUT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace knnd::knnctl {

// A temporary JSON Lines payload file (beside `output`, named as the
// version's temporaries are, so that a killed run's copy is removed by
// the next run for the same output), removed when destroyed.
class TextPayloads {
 public:
  // Writes row i's payload: line i of `payloads` (a JSON object, or a
  // JSON string stored as {"text": ...}; empty path: {}) with the field
  // `field` set to line i of `text_file`. Both files must hold exactly
  // `rows` lines; INVALID_ARGUMENT names the file and line otherwise, or
  // when a payload already holds `field`.
  static absl::StatusOr<std::unique_ptr<TextPayloads>> Write(
      const std::string& payloads, const std::string& text_file,
      const std::string& field, int64_t rows, const std::string& output);
  ~TextPayloads();
  TextPayloads(const TextPayloads&) = delete;
  TextPayloads& operator=(const TextPayloads&) = delete;

  const std::string& path() const { return path_; }

 private:
  explicit TextPayloads(std::string path) : path_(std::move(path)) {}
  const std::string path_;
};

}  // namespace knnd::knnctl

#endif  // KNND_TOOLS_KNNCTL_TEXT_INPUT_H_
