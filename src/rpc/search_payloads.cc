#include "knnd/rpc/search_payloads.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "knnd/rpc/result_fields.h"

namespace knnd {

absl::StatusOr<absl::optional<PayloadSelection>> RequestedPayloads(
    const knnd::v1::SearchRequest& request, const IndexSnapshot& snapshot) {
  if (!request.has_payloads()) return absl::nullopt;
  absl::StatusOr<PayloadSelection> selection =
      SelectRequested(request.payloads(), snapshot);
  if (!selection.ok()) return selection.status();
  return absl::optional<PayloadSelection>(std::move(*selection));
}

absl::StatusOr<PayloadSelection> SelectRequested(
    const knnd::v1::PayloadRequest& asked, const IndexSnapshot& snapshot) {
  if (!asked.all_fields() && asked.fields().empty()) {
    return absl::InvalidArgumentError(
        "payloads asks for no field: set all_fields or name the fields");
  }
  const std::vector<std::string> fields(asked.fields().begin(),
                                        asked.fields().end());
  return snapshot.SelectPayloads(asked.all_fields(), fields);
}

int64_t PayloadFieldBytes(int64_t size) {
  using google::protobuf::io::CodedOutputStream;
  return CodedOutputStream::VarintSize32(
             static_cast<uint32_t>(
                 knnd::v1::SearchResponse::kPayloadsFieldNumber)
             << 3) +
         CodedOutputStream::VarintSize64(static_cast<uint64_t>(size)) + size;
}

absl::Status AnswerTooLarge(int64_t answer_bytes, int64_t payload_bytes,
                            int64_t max_send_message_bytes) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "the answer with its payloads would be ", answer_bytes, " bytes (",
      payload_bytes, " of payloads), more than max_send_message_bytes=",
      max_send_message_bytes,
      "; ask for fewer payload fields, a smaller k or fewer queries"));
}

absl::StatusOr<int64_t> AddPayloads(const IndexSnapshot& snapshot,
                                    const PayloadSelection& selection,
                                    int64_t max_send_message_bytes,
                                    knnd::v1::SearchResponse* response) {
  const ResultColumn<int64_t> ids = ReadResults(*response).ids;
  const int64_t entries = std::max<int64_t>(ids.size(), 0);
  std::vector<int64_t> sizes(static_cast<size_t>(entries));
  int64_t payload_bytes = 0;
  int64_t answer_bytes = static_cast<int64_t>(response->ByteSizeLong());
  for (int64_t i = 0; i < entries; ++i) {
    sizes[i] = snapshot.PayloadJsonBytes(ids[i], selection);
    payload_bytes += sizes[i];
    answer_bytes += PayloadFieldBytes(sizes[i]);
  }
  if (answer_bytes > max_send_message_bytes) {
    return AnswerTooLarge(answer_bytes, payload_bytes, max_send_message_bytes);
  }
  auto* payloads = response->mutable_payloads();
  payloads->Reserve(static_cast<int>(entries));
  for (int64_t i = 0; i < entries; ++i) {
    std::string* json = payloads->Add();
    json->reserve(static_cast<size_t>(sizes[i]));
    snapshot.AppendPayload(ids[i], selection, json);
  }
  return payload_bytes;
}

}  // namespace knnd
