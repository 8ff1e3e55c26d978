#include "knnd/faiss/fastscan_format.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/faiss_types.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the FastScan layout is little-endian and read in place");

namespace knnd {
namespace {

using faiss_types::CorruptIndexFile;

uint64_t RoundUp(uint64_t a, uint64_t b) { return (a + b - 1) / b * b; }

bool AddOk(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}
bool MulOk(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// FNV-1a 64 of `bytes`, continuing from `hash`.
uint64_t Fnv1a64(absl::Span<const uint8_t> bytes, uint64_t hash) {
  for (const uint8_t b : bytes) {
    hash ^= b;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

// The header fields that have one valid value, and the region bounds.
absl::Status CheckHeader(const FastScanHeader& h, uint64_t size,
                         absl::string_view path) {
  if (std::memcmp(h.magic, kFastScanMagic, sizeof h.magic) != 0) {
    return CorruptIndexFile(path, "bad magic (not a knnd FastScan file)");
  }
  if (h.format_version != kFastScanFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "index file ", path, ": FastScan format_version ", h.format_version,
        " is not supported (this build reads version ",
        kFastScanFormatVersion, ")"));
  }
  if (h.header_bytes != kFastScanHeaderBytes) {
    return CorruptIndexFile(path, absl::StrCat("header_bytes ", h.header_bytes,
                                               ", expected ",
                                               kFastScanHeaderBytes));
  }
  for (uint8_t r : h.reserved) {
    if (r != 0) return CorruptIndexFile(path, "reserved header bytes are not 0");
  }
  if (h.file_bytes != size) {
    return CorruptIndexFile(
        path, absl::StrCat("header file_bytes ", h.file_bytes,
                           " but the file has ", size,
                           " bytes (truncated or appended to)"));
  }
  if (h.block_vectors != kFastScanBlockVectors) {
    return CorruptIndexFile(path, absl::StrCat("block_vectors ",
                                               h.block_vectors, ", expected ",
                                               kFastScanBlockVectors));
  }
  if (h.list_alignment != kFastScanListAlignment) {
    return CorruptIndexFile(path, absl::StrCat("list_alignment ",
                                               h.list_alignment, ", expected ",
                                               kFastScanListAlignment));
  }
  if (h.code_size == 0 || h.code_size > (uint64_t{1} << 16)) {
    return CorruptIndexFile(
        path, absl::StrCat("code_size ", h.code_size, " outside [1, 65536]"));
  }
  if (h.metric != 0 && h.metric != 1) {
    return CorruptIndexFile(path, absl::StrCat("metric ", h.metric,
                                               " is neither 0 (inner product) "
                                               "nor 1 (L2)"));
  }
  if (h.table_offset != kFastScanHeaderBytes) {
    return CorruptIndexFile(path, absl::StrCat("table_offset ", h.table_offset,
                                               ", expected ",
                                               kFastScanHeaderBytes));
  }
  // Regions, in file order: header, table, blob, lists.
  if (h.nlist == 0 ||
      h.nlist > (size - h.table_offset) / kFastScanListEntryBytes) {
    return CorruptIndexFile(path, absl::StrCat("nlist ", h.nlist,
                                               ": the list table does not fit "
                                               "in the ",
                                               size, "-byte file"));
  }
  const uint64_t table_end = h.table_offset + h.nlist * kFastScanListEntryBytes;
  uint64_t blob_end;
  if (h.blob_offset < table_end || h.blob_offset % 8 != 0 ||
      !AddOk(h.blob_offset, h.blob_bytes, &blob_end) || blob_end > size) {
    return CorruptIndexFile(
        path, absl::StrCat("blob [", h.blob_offset, ", +", h.blob_bytes,
                           ") is not inside the file after the list table "
                           "(ends at ",
                           table_end, ", file ", size, " bytes)"));
  }
  if (h.blob_bytes == 0) return CorruptIndexFile(path, "blob_bytes is 0");
  uint64_t lists_end;
  if (h.lists_offset < blob_end ||
      h.lists_offset % kFastScanListAlignment != 0 ||
      !AddOk(h.lists_offset, h.lists_bytes, &lists_end) || lists_end != size) {
    return CorruptIndexFile(
        path, absl::StrCat("list region [", h.lists_offset, ", +",
                           h.lists_bytes,
                           ") must start 64-byte aligned after the blob (ends "
                           "at ",
                           blob_end, ") and end at the file's end (", size,
                           ")"));
  }
  return absl::OkStatus();
}

// One list's offsets; `cursor` is the first byte it may use and advances
// past it.
absl::Status CheckList(const FastScanListEntry& e, uint64_t l,
                       uint64_t code_size, uint64_t size, uint64_t& cursor,
                       absl::string_view path) {
  if (e.n == 0) {
    if (e.codes_offset != 0 || e.ids_offset != 0) {
      return CorruptIndexFile(
          path, absl::StrCat("list ", l, " is empty but has codes_offset ",
                             e.codes_offset, " ids_offset ", e.ids_offset,
                             " (must be 0)"));
    }
    return absl::OkStatus();
  }
  if (e.n > size) {  // every vector takes more than one byte
    return CorruptIndexFile(path, absl::StrCat("list ", l, " n ", e.n,
                                               " exceeds the file size ",
                                               size));
  }
  if (e.codes_offset % kFastScanListAlignment != 0) {
    return CorruptIndexFile(path, absl::StrCat("list ", l, " codes_offset ",
                                               e.codes_offset,
                                               " is not 64-byte aligned"));
  }
  if (e.codes_offset < cursor) {
    return CorruptIndexFile(
        path, absl::StrCat("list ", l, " codes_offset ", e.codes_offset,
                           " overlaps the previous list or region (next free "
                           "byte ",
                           cursor, ")"));
  }
  uint64_t code_bytes, ids_bytes, codes_end, ids_end;
  if (!MulOk(RoundUp(e.n, kFastScanBlockVectors), code_size, &code_bytes) ||
      !AddOk(e.codes_offset, code_bytes, &codes_end) ||
      !MulOk(e.n, sizeof(int64_t), &ids_bytes)) {
    return CorruptIndexFile(path, absl::StrCat("list ", l, " n ", e.n,
                                               " overflows the list sizes"));
  }
  if (e.ids_offset != codes_end) {
    return CorruptIndexFile(
        path, absl::StrCat("list ", l, " ids_offset ", e.ids_offset,
                           ", expected codes_offset + round_up(n, 32) * "
                           "code_size = ",
                           codes_end));
  }
  if (!AddOk(e.ids_offset, ids_bytes, &ids_end) || ids_end > size) {
    return CorruptIndexFile(
        path, absl::StrCat("list ", l, " (n ", e.n, ") ends at byte ", ids_end,
                           ", past the end of the ", size, "-byte file"));
  }
  cursor = ids_end;
  return absl::OkStatus();
}

}  // namespace

bool IsFastScanFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[sizeof kFastScanMagic];
  const bool read_all = read(fd, magic, sizeof magic) ==
                        static_cast<ssize_t>(sizeof magic);
  close(fd);
  return read_all && std::memcmp(magic, kFastScanMagic, sizeof magic) == 0;
}

namespace {

// Byte offset of the code, and whether it is the byte's high nibble.
uint64_t PackedCodeByte(uint64_t nsq, uint64_t vector, uint64_t sq,
                        bool* high) {
  const uint64_t in_block = vector % kFastScanBlockVectors;
  const uint64_t lane = in_block % 16;
  *high = in_block >= 16;
  const uint64_t byte_in_run = lane < 8 ? 2 * lane : 2 * (lane - 8) + 1;
  return vector / kFastScanBlockVectors * kFastScanBlockVectors * nsq / 2 +
         sq / 2 * 32 + (sq % 2) * 16 + byte_in_run;
}

}  // namespace

uint8_t GetPackedCode(const uint8_t* blocks, uint64_t nsq, uint64_t vector,
                      uint64_t sq) {
  bool high = false;
  const uint8_t byte = blocks[PackedCodeByte(nsq, vector, sq, &high)];
  return high ? byte >> 4 : byte & 15;
}

void SetPackedCode(uint8_t* blocks, uint64_t nsq, uint64_t vector,
                   uint64_t sq, uint8_t code) {
  bool high = false;
  uint8_t& byte = blocks[PackedCodeByte(nsq, vector, sq, &high)];
  byte = high ? static_cast<uint8_t>((byte & 0x0f) | (code << 4))
              : static_cast<uint8_t>((byte & 0xf0) | (code & 15));
}

uint64_t FastScanPaddedCodeBytes(uint64_t n, uint64_t code_size) {
  return RoundUp(n, kFastScanBlockVectors) * code_size;
}

uint64_t FastScanMetaChecksum(const FastScanHeader& header,
                              absl::Span<const uint8_t> table,
                              absl::Span<const uint8_t> blob) {
  FastScanHeader h = header;
  h.meta_checksum = 0;
  uint64_t sum = Fnv1a64({reinterpret_cast<const uint8_t*>(&h), sizeof h},
                         0xcbf29ce484222325ULL);
  sum = Fnv1a64(table, sum);
  return Fnv1a64(blob, sum);
}

absl::StatusOr<FastScanLayout> ParseFastScanLayout(
    absl::Span<const uint8_t> file, absl::string_view path) {
  const uint64_t size = file.size();
  if (size < kFastScanHeaderBytes) {
    return CorruptIndexFile(path, absl::StrCat("the file is ", size,
                                               " bytes, shorter than the ",
                                               kFastScanHeaderBytes,
                                               "-byte FastScan header"));
  }
  FastScanLayout layout;
  FastScanHeader& h = layout.header;
  std::memcpy(&h, file.data(), sizeof h);
  if (absl::Status s = CheckHeader(h, size, path); !s.ok()) return s;
  const uint64_t table_bytes = h.nlist * kFastScanListEntryBytes;
  const absl::Span<const uint8_t> table =
      file.subspan(h.table_offset, table_bytes);
  layout.blob = file.subspan(h.blob_offset, h.blob_bytes);
  const uint64_t checksum = FastScanMetaChecksum(h, table, layout.blob);
  if (checksum != h.meta_checksum) {
    return CorruptIndexFile(
        path, absl::StrCat("meta_checksum mismatch (the header says ",
                           absl::Hex(h.meta_checksum),
                           ", header, list table and blob hash to ",
                           absl::Hex(checksum), ")"));
  }
  layout.lists.resize(h.nlist);
  std::memcpy(layout.lists.data(), table.data(), table.size());
  uint64_t cursor = h.lists_offset;  // lists are in order, no overlap
  uint64_t total = 0;
  for (uint64_t l = 0; l < h.nlist; ++l) {
    const FastScanListEntry& e = layout.lists[l];
    if (absl::Status s = CheckList(e, l, h.code_size, size, cursor, path);
        !s.ok()) {
      return s;
    }
    total += e.n;
  }
  if (total != h.ntotal) {
    return CorruptIndexFile(path, absl::StrCat("the lists hold ", total,
                                               " vectors but the header's "
                                               "ntotal is ",
                                               h.ntotal));
  }
  return layout;
}

}  // namespace knnd
