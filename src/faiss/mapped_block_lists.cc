#include "knnd/faiss/mapped_block_lists.h"

#include <utility>

#include <faiss/impl/FaissAssert.h>

namespace knnd {

MappedBlockLists::MappedBlockLists(size_t block_code_bytes,
                                   std::vector<List> lists,
                                   std::shared_ptr<const void> keepalive)
    : faiss::InvertedLists(lists.size(),
                           faiss::InvertedLists::INVALID_CODE_SIZE),
      block_code_bytes_(block_code_bytes),
      lists_(std::move(lists)),
      keepalive_(std::move(keepalive)) {}

MappedBlockLists::~MappedBlockLists() = default;

size_t MappedBlockLists::list_size(size_t list_no) const {
  FAISS_THROW_IF_NOT_FMT(list_no < lists_.size(),
                         "list %zu out of range (nlist %zu)", list_no,
                         lists_.size());
  return lists_[list_no].n;
}

const uint8_t* MappedBlockLists::get_codes(size_t list_no) const {
  FAISS_THROW_IF_NOT_FMT(list_no < lists_.size(),
                         "list %zu out of range (nlist %zu)", list_no,
                         lists_.size());
  return lists_[list_no].codes;
}

const MappedBlockLists::idx_t* MappedBlockLists::get_ids(
    size_t list_no) const {
  FAISS_THROW_IF_NOT_FMT(list_no < lists_.size(),
                         "list %zu out of range (nlist %zu)", list_no,
                         lists_.size());
  return lists_[list_no].ids;
}

size_t MappedBlockLists::add_entries(size_t, size_t, const idx_t*,
                                     const uint8_t*) {
  FAISS_THROW_MSG("knnd MappedBlockLists are read-only (mapped file)");
}

void MappedBlockLists::update_entries(size_t, size_t, size_t, const idx_t*,
                                      const uint8_t*) {
  FAISS_THROW_MSG("knnd MappedBlockLists are read-only (mapped file)");
}

void MappedBlockLists::resize(size_t, size_t) {
  FAISS_THROW_MSG("knnd MappedBlockLists are read-only (mapped file)");
}

}  // namespace knnd
