// knnd's on-disk layout for IVF-PQ FastScan indexes (4-bit codes), whose
// inverted lists can be memory-mapped, and its validation. No FAISS here:
// the layout is bytes; fastscan_writer.h writes it, fastscan_index.h loads
// it. docs/fastscan_format.md describes it for operators.
//
// FAISS 1.7.3 keeps FastScan lists in BlockInvertedLists ("ilbl"), which its
// reader always copies to the heap. This layout stores the same index as
// (1) the FAISS index serialised by faiss::write_index with every inverted
// list empty (coarse centroids, PQ codebooks, any pre-transform) and (2)
// every list's packed codes and ids at offsets where a read-only
// InvertedLists over the mapping (mapped_block_lists.h) hands them to
// FAISS's SIMD kernels in place.
//
// Format version 1. Integers little-endian; offsets from the file's start.
//
//   [0, 128)       FastScanHeader (below)
//   [128, T)       list table: nlist entries of FastScanListEntry
//                    {u64 n, u64 codes_offset, u64 ids_offset}   (24 bytes)
//                  T = 128 + 24 * nlist
//   [B, B+blob)    FAISS blob: faiss::write_index of the index with its
//                  inverted lists replaced by empty BlockInvertedLists
//                  (nlist lists of 0 vectors, 32 per block); B =
//                  round_up(T, 8)
//   [L, end)       list data, L = round_up(B + blob, 64). For each list with
//                  n > 0, in list order:
//                    codes at codes_offset (64-byte aligned):
//                      round_up(n, 32) * code_size bytes, FAISS's packed
//                      block layout (pq4_pack_codes, bbs 32); the slots of
//                      the last block past n are zero
//                    ids at ids_offset = codes_offset + that many bytes:
//                      n int64
//                    zero bytes up to the next 64-byte boundary
//                  A list with n == 0 has codes_offset == ids_offset == 0.
//
// FastScanHeader (128 bytes):
//   off  size  field
//     0     8  magic            "KNNDFSIX"
//     8     4  format_version   1
//    12     4  header_bytes     128
//    16     8  file_bytes       size of the whole file
//    24     8  table_offset     128
//    32     8  nlist
//    40     8  blob_offset      B
//    48     8  blob_bytes
//    56     8  lists_offset     L
//    64     8  lists_bytes      file_bytes - L
//    72     8  ntotal           sum of the lists' n
//    80     8  code_size        bytes per vector in a block (M rounded up to
//                               even, / 2)
//    88     4  block_vectors    32 (FAISS's bbs)
//    92     4  list_alignment   64
//    96     4  metric           faiss::MetricType (0 inner product, 1 L2)
//   100     4  dim              input dimension of the (outer) index
//   104     8  meta_checksum    FNV-1a 64 over the 128 header bytes (this
//                               field taken as 0), then the table, then the
//                               blob. The list data is not checksummed here
//                               (it is most of the file and is paged in only
//                               as searched); the sidecar's CRC-32 covers the
//                               whole file.
//   112    16  reserved         zero
//
// Readers refuse any other format_version; a new layout gets a new version.
//
// Thread-safety: pure functions.
#ifndef KNND_FAISS_FASTSCAN_FORMAT_H_
#define KNND_FAISS_FASTSCAN_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace knnd {

inline constexpr char kFastScanMagic[8] = {'K', 'N', 'N', 'D',
                                           'F', 'S', 'I', 'X'};
inline constexpr uint32_t kFastScanFormatVersion = 1;
inline constexpr uint64_t kFastScanHeaderBytes = 128;
inline constexpr uint64_t kFastScanListEntryBytes = 24;
inline constexpr uint32_t kFastScanBlockVectors = 32;
inline constexpr uint32_t kFastScanListAlignment = 64;

#pragma pack(push, 1)
struct FastScanHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t header_bytes;
  uint64_t file_bytes;
  uint64_t table_offset;
  uint64_t nlist;
  uint64_t blob_offset;
  uint64_t blob_bytes;
  uint64_t lists_offset;
  uint64_t lists_bytes;
  uint64_t ntotal;
  uint64_t code_size;
  uint32_t block_vectors;
  uint32_t list_alignment;
  uint32_t metric;
  uint32_t dim;
  uint64_t meta_checksum;
  uint8_t reserved[16];
};
struct FastScanListEntry {
  uint64_t n;
  uint64_t codes_offset;
  uint64_t ids_offset;
};
#pragma pack(pop)
static_assert(sizeof(FastScanHeader) == kFastScanHeaderBytes, "header size");
static_assert(sizeof(FastScanListEntry) == kFastScanListEntryBytes,
              "list entry size");

// The parsed, validated structure of a FastScan file. `blob` points into
// the bytes given to ParseFastScanLayout.
struct FastScanLayout {
  FastScanHeader header;
  std::vector<FastScanListEntry> lists;  // nlist entries
  absl::Span<const uint8_t> blob;
};

// True when the file at `path` starts with kFastScanMagic (false when it
// cannot be read: the caller's own open reports why).
bool IsFastScanFile(const std::string& path);

// Validates everything about `file` that does not need FAISS: magic,
// version, sizes, checksum, and every list's offsets and padded lengths
// (inside the list region, 64-byte aligned codes, ids right after the
// padded codes, lists in order and not overlapping, sum of n == ntotal).
// DATA_LOSS "index file PATH is corrupt: ..." naming the field for damaged
// or truncated bytes; FAILED_PRECONDITION for a format version this build
// does not read.
absl::StatusOr<FastScanLayout> ParseFastScanLayout(
    absl::Span<const uint8_t> file, absl::string_view path);

// Bytes of a list's packed codes: round_up(n, 32) * code_size.
uint64_t FastScanPaddedCodeBytes(uint64_t n, uint64_t code_size);

// One 4-bit code in FAISS's packed block layout (pq4_pack_codes with blocks
// of 32 vectors): in each block, each pair of sub-quantizers (2p, 2p+1)
// takes 32 bytes, 16 per sub-quantizer; byte j of those 16 holds vector
// v = (j even ? j / 2 : 8 + j / 2) of the block in its low nibble and
// vector v + 16 in its high nibble. knnd computes the address itself:
// FAISS 1.7.3's pq4_get_packed_element / pq4_set_packed_element return
// wrong elements for sub-quantizers 16 and up.
// `nsq`: sub-quantizers rounded up to even (M2); `vector`: the vector's
// position in its list; `sq` < nsq.
uint8_t GetPackedCode(const uint8_t* blocks, uint64_t nsq, uint64_t vector,
                      uint64_t sq);
void SetPackedCode(uint8_t* blocks, uint64_t nsq, uint64_t vector,
                   uint64_t sq, uint8_t code);

// The header's meta_checksum for this header (its own checksum field taken
// as 0), list table bytes and blob bytes.
uint64_t FastScanMetaChecksum(const FastScanHeader& header,
                              absl::Span<const uint8_t> table,
                              absl::Span<const uint8_t> blob);

}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_FORMAT_H_
