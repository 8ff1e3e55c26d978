// MappedBlockLists: a read-only faiss::InvertedLists over FastScan lists in a
// memory mapping (knnd's FastScan layout, fastscan_format.h). Internal to
// src/faiss/.
#ifndef KNND_FAISS_MAPPED_BLOCK_LISTS_H_
#define KNND_FAISS_MAPPED_BLOCK_LISTS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <faiss/invlists/InvertedLists.h>

namespace knnd {

// The inverted lists of an IndexIVFFastScan, pointing into mapped memory:
// list_size / get_codes / get_ids return the mapped bytes themselves (no
// heap copy). Each list's codes are FAISS's packed 32-vector blocks,
// round_up(n, 32) * code_size bytes starting 32-byte aligned (the layout
// guarantees 64), which is what IndexIVFFastScan's kernels read.
//
// Ownership: holds `keepalive` (the mapping) so that the lists stay valid for
// as long as FAISS holds this object; the index it is installed in
// (IndexIVF::replace_invlists with own = true) deletes it.
//
// Thread-safety: immutable; every const method may be called from any number
// of threads. The mutating InvertedLists methods throw FaissException
// (read-only): FastScan add/remove must go through a rebuild.
class MappedBlockLists final : public faiss::InvertedLists {
 public:
  struct List {
    size_t n = 0;
    const uint8_t* codes = nullptr;  // round_up(n, 32) * code_size bytes
    const idx_t* ids = nullptr;      // n ids
  };

  // `block_code_bytes` is the code_size of the FastScan index (bytes per
  // vector inside a block); InvertedLists::code_size is set to
  // INVALID_CODE_SIZE as for faiss::BlockInvertedLists, because the codes are
  // not stored one vector after the other.
  MappedBlockLists(size_t block_code_bytes, std::vector<List> lists,
                   std::shared_ptr<const void> keepalive);
  ~MappedBlockLists() override;

  size_t block_code_bytes() const { return block_code_bytes_; }

  size_t list_size(size_t list_no) const override;
  const uint8_t* get_codes(size_t list_no) const override;
  const idx_t* get_ids(size_t list_no) const override;

  size_t add_entries(size_t list_no, size_t n_entry, const idx_t* ids,
                     const uint8_t* code) override;
  void update_entries(size_t list_no, size_t offset, size_t n_entry,
                      const idx_t* ids, const uint8_t* code) override;
  void resize(size_t list_no, size_t new_size) override;

 private:
  const size_t block_code_bytes_;
  const std::vector<List> lists_;
  const std::shared_ptr<const void> keepalive_;
};

}  // namespace knnd

#endif  // KNND_FAISS_MAPPED_BLOCK_LISTS_H_
