#include "knnd/faiss/fastscan_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include <faiss/IndexIVFPQFastScan.h>
#include <faiss/IndexPreTransform.h>
#include <faiss/impl/io.h>
#include <faiss/index_io.h>
#include <faiss/invlists/BlockInvertedLists.h>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/fastscan_checks.h"
#include "knnd/faiss/fastscan_format.h"
#include "knnd/faiss/faiss_types.h"
#include "knnd/faiss/mapped_block_lists.h"

namespace knnd {
namespace {

using faiss_types::CatchFaiss;

uint64_t RoundUp(uint64_t a, uint64_t b) { return (a + b - 1) / b * b; }

// Appends to a file; the first failure is kept and reported by Close().
class FileAppender {
 public:
  explicit FileAppender(const std::string& path)
      : path_(path), file_(std::fopen(path.c_str(), "wb")) {
    if (file_ == nullptr) error_ = errno;
  }
  ~FileAppender() {
    if (file_ != nullptr) std::fclose(file_);
  }

  void Append(const void* data, size_t n) {
    if (error_ == 0 && n > 0 && std::fwrite(data, 1, n, file_) != n) {
      error_ = errno;
    }
    written_ += n;
  }
  void AppendZeros(size_t n) {
    static const uint8_t kZeros[4096] = {};
    for (size_t left = n; left > 0;) {
      const size_t take = std::min(left, sizeof kZeros);
      Append(kZeros, take);
      left -= take;
    }
  }
  void PadTo(uint64_t offset) { AppendZeros(offset - written_); }
  uint64_t written() const { return written_; }

  absl::Status Close() {
    if (file_ != nullptr && std::fclose(file_) != 0 && error_ == 0) {
      error_ = errno;
    }
    file_ = nullptr;
    if (error_ == 0) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", path_, ": ", std::strerror(error_)));
  }

 private:
  const std::string path_;
  std::FILE* file_;
  int error_ = 0;
  uint64_t written_ = 0;
};

// One list as the writer reads it from the index's InvertedLists.
struct SourceList {
  uint64_t n = 0;
  const uint8_t* codes = nullptr;  // whole blocks
  const faiss::Index::idx_t* ids = nullptr;
};

absl::StatusOr<std::vector<SourceList>> SourceLists(
    const faiss::IndexIVFPQFastScan& ivf, const std::string& path) {
  auto refuse = [&path](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", path, ": ", why));
  };
  const faiss::InvertedLists* il = ivf.invlists;
  if (il == nullptr || il->nlist != ivf.nlist) {
    return refuse("the index has no inverted lists of nlist entries");
  }
  const auto* block = dynamic_cast<const faiss::BlockInvertedLists*>(il);
  const auto* mapped = dynamic_cast<const MappedBlockLists*>(il);
  if (block != nullptr) {
    if (block->n_per_block != kFastScanBlockVectors ||
        block->block_size != kFastScanBlockVectors * ivf.code_size) {
      return refuse(absl::StrCat("BlockInvertedLists with n_per_block ",
                                 block->n_per_block, " and block_size ",
                                 block->block_size, " (expected 32 and ",
                                 32 * ivf.code_size, ")"));
    }
  } else if (mapped == nullptr || mapped->block_code_bytes() != ivf.code_size) {
    return refuse(absl::StrCat("inverted lists of type ",
                               faiss_types::TypeOf(il),
                               " (FastScan lists are BlockInvertedLists)"));
  }
  std::vector<SourceList> lists(ivf.nlist);
  uint64_t total = 0;
  for (size_t l = 0; l < ivf.nlist; ++l) {
    SourceList& s = lists[l];
    s.n = il->list_size(l);
    if (s.n == 0) continue;
    s.codes = il->get_codes(l);
    s.ids = il->get_ids(l);
    if (block != nullptr &&
        block->codes[l].size() < FastScanPaddedCodeBytes(s.n, ivf.code_size)) {
      return refuse(absl::StrCat("list ", l, " has ", s.n,
                                 " vectors but only ", block->codes[l].size(),
                                 " code bytes"));
    }
    total += s.n;
  }
  if (total != static_cast<uint64_t>(ivf.ntotal)) {
    return refuse(absl::StrCat("the lists hold ", total,
                               " vectors, the index's ntotal is ", ivf.ntotal));
  }
  return lists;
}

// A list's new contents: the vectors of `lists` that `relabel` keeps (a
// new id >= 0; -1 drops one), in their order and with their new ids, then
// the vectors of `appended` (lists of an index with the same quantizers;
// empty for none) in theirs, repacked: the codes moved one 4-bit element
// at a time into new blocks (FAISS's packed layout interleaves 32 vectors
// per block, so a vector's codes cannot be copied as one run;
// fastscan_format.h's accessors, not FAISS 1.7.3's, which are wrong from
// sub-quantizer 16 on). `storage` owns the new bytes; the returned lists
// point into it.
struct PartStorage {
  std::vector<std::vector<uint8_t>> codes;
  std::vector<std::vector<faiss::Index::idx_t>> ids;
};

using Relabel = std::function<int64_t(int64_t)>;

std::vector<SourceList> MergeLists(const faiss::IndexIVFPQFastScan& ivf,
                                   const std::vector<SourceList>& lists,
                                   const Relabel& relabel,
                                   const std::vector<SourceList>& appended,
                                   PartStorage& storage) {
  storage.codes.assign(lists.size(), {});
  storage.ids.assign(lists.size(), {});
  std::vector<SourceList> part(lists.size());
  for (size_t l = 0; l < lists.size(); ++l) {
    const SourceList& src = lists[l];
    std::vector<faiss::Index::idx_t>& ids = storage.ids[l];
    std::vector<uint64_t> kept;
    for (uint64_t i = 0; i < src.n; ++i) {
      const int64_t id = relabel(src.ids[i]);
      if (id < 0) continue;
      kept.push_back(i);
      ids.push_back(id);
    }
    const SourceList none;
    const SourceList& extra = appended.empty() ? none : appended[l];
    const uint64_t n = kept.size() + extra.n;
    if (n == 0) continue;
    std::vector<uint8_t>& codes = storage.codes[l];
    codes.assign(FastScanPaddedCodeBytes(n, ivf.code_size), 0);
    for (uint64_t j = 0; j < kept.size(); ++j) {
      for (size_t sq = 0; sq < ivf.M2; ++sq) {
        SetPackedCode(codes.data(), ivf.M2, j, sq,
                      GetPackedCode(src.codes, ivf.M2, kept[j], sq));
      }
    }
    for (uint64_t j = 0; j < extra.n; ++j) {
      for (size_t sq = 0; sq < ivf.M2; ++sq) {
        SetPackedCode(codes.data(), ivf.M2, kept.size() + j, sq,
                      GetPackedCode(extra.codes, ivf.M2, j, sq));
      }
      ids.push_back(extra.ids[j]);
    }
    part[l] = SourceList{n, codes.data(), ids.data()};
  }
  return part;
}

// A shell of `ivf` holding exactly the fields faiss::write_index writes for
// an IndexIVFPQFastScan ("IwPf": the index header, nlist, nprobe, the
// quantizer, the direct map, by_residual, code_size, bbs, M2, implem, qbs2,
// the PQ, the lists), sharing the quantizer and pointing at `lists`. Not a
// copy construction: FAISS 1.7.3's AlignedTable copy passes a null pointer
// to memcpy for the empty precomputed table, undefined behaviour.
void FillWriteShell(const faiss::IndexIVFPQFastScan& ivf,
                    faiss::InvertedLists* lists, int64_t ntotal,
                    faiss::IndexIVFPQFastScan& shell) {
  shell.d = ivf.d;
  shell.ntotal = ntotal;
  shell.is_trained = ivf.is_trained;
  shell.metric_type = ivf.metric_type;
  shell.metric_arg = ivf.metric_arg;
  shell.nlist = ivf.nlist;
  shell.nprobe = ivf.nprobe;
  shell.quantizer = ivf.quantizer;
  shell.own_fields = false;  // the quantizer stays the original's
  shell.direct_map = ivf.direct_map;
  shell.by_residual = ivf.by_residual;
  shell.code_size = ivf.code_size;
  shell.bbs = ivf.bbs;
  shell.M = ivf.M;
  shell.M2 = ivf.M2;
  shell.nbits = ivf.nbits;
  shell.ksub = ivf.ksub;
  shell.implem = ivf.implem;
  shell.qbs2 = ivf.qbs2;
  shell.pq = ivf.pq;
  shell.invlists = lists;
  shell.own_invlists = false;
}

// The FAISS index serialised with empty BlockInvertedLists, through a
// shell and a shallow copy of the transform (the index itself is not
// modified). Empty lists rather than none: FAISS's reader warns on stderr
// about an index without lists.
// `ntotal` is the count the file holds (the part's, for a shard).
std::vector<uint8_t> SerializeWithEmptyLists(const FastScanParts& parts,
                                             int64_t ntotal) {
  const faiss::IndexIVFPQFastScan& ivf = *parts.ivf;
  faiss::BlockInvertedLists empty(ivf.nlist, kFastScanBlockVectors,
                                  kFastScanBlockVectors * ivf.code_size);
  faiss::IndexIVFPQFastScan ivf_copy;
  FillWriteShell(ivf, &empty, ntotal, ivf_copy);
  faiss::VectorIOWriter writer;
  if (parts.layers.pre != nullptr) {
    faiss::IndexPreTransform pre_copy(*parts.layers.pre);
    pre_copy.own_fields = false;
    pre_copy.ntotal = ntotal;
    pre_copy.index = &ivf_copy;
    faiss::write_index(&pre_copy, &writer);
  } else {
    faiss::write_index(&ivf_copy, &writer);
  }
  return std::move(writer.data);
}

// The list table and header for `lists` after a blob of `blob` bytes.
FastScanHeader PlanLayout(const faiss::Index& index,
                          const faiss::IndexIVFPQFastScan& ivf,
                          const std::vector<SourceList>& lists,
                          const std::vector<uint8_t>& blob,
                          std::vector<FastScanListEntry>& table) {
  FastScanHeader h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, kFastScanMagic, sizeof h.magic);
  h.format_version = kFastScanFormatVersion;
  h.header_bytes = kFastScanHeaderBytes;
  h.table_offset = kFastScanHeaderBytes;
  h.nlist = ivf.nlist;
  h.blob_offset = RoundUp(h.table_offset + h.nlist * kFastScanListEntryBytes, 8);
  h.blob_bytes = blob.size();
  h.lists_offset = RoundUp(h.blob_offset + h.blob_bytes, kFastScanListAlignment);
  h.code_size = ivf.code_size;
  h.block_vectors = kFastScanBlockVectors;
  h.list_alignment = kFastScanListAlignment;
  h.metric = static_cast<uint32_t>(ivf.metric_type);
  h.dim = static_cast<uint32_t>(index.d);
  table.assign(h.nlist, FastScanListEntry{0, 0, 0});
  uint64_t cursor = h.lists_offset;
  for (uint64_t l = 0; l < h.nlist; ++l) {
    const uint64_t n = lists[l].n;
    table[l].n = n;
    if (n == 0) continue;
    table[l].codes_offset = cursor;
    table[l].ids_offset = cursor + FastScanPaddedCodeBytes(n, h.code_size);
    cursor = RoundUp(table[l].ids_offset + n * sizeof(int64_t),
                     kFastScanListAlignment);
    h.ntotal += n;
  }
  h.file_bytes = cursor;
  h.lists_bytes = cursor - h.lists_offset;
  h.meta_checksum = FastScanMetaChecksum(
      h,
      {reinterpret_cast<const uint8_t*>(table.data()),
       table.size() * sizeof(FastScanListEntry)},
      blob);
  return h;
}

// Writes `index`, or with `relabel` its vectors relabelled (some dropped)
// and those of `appended` (an index of the same quantizers) after them.
absl::Status Write(const faiss::Index& index, const std::string& path,
                   const Relabel* relabel, const faiss::Index* appended) {
  FastScanParts parts;
  if (std::string why = CheckFastScanIndex(index, parts); !why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot write ", path, " as a knnd FastScan index: ", why));
  }
  const faiss::IndexIVFPQFastScan& ivf = *parts.ivf;
  absl::StatusOr<std::vector<SourceList>> lists = SourceLists(ivf, path);
  if (!lists.ok()) return lists.status();
  std::vector<SourceList> extra;
  if (appended != nullptr) {
    FastScanParts appended_parts;
    if (std::string why = CheckFastScanIndex(*appended, appended_parts);
        !why.empty() || appended_parts.ivf->nlist != ivf.nlist ||
        appended_parts.ivf->code_size != ivf.code_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot write ", path, ": the vectors to append are not encoded "
          "by the same quantizers", why.empty() ? "" : ": ", why));
    }
    absl::StatusOr<std::vector<SourceList>> appended_lists =
        SourceLists(*appended_parts.ivf, path);
    if (!appended_lists.ok()) return appended_lists.status();
    extra = std::move(*appended_lists);
  }
  PartStorage storage;
  if (relabel != nullptr) {
    *lists = MergeLists(ivf, *lists, *relabel, extra, storage);
  }
  int64_t ntotal = 0;
  for (const SourceList& list : *lists) ntotal += list.n;
  const std::vector<uint8_t> blob = SerializeWithEmptyLists(parts, ntotal);
  std::vector<FastScanListEntry> table;
  const FastScanHeader h = PlanLayout(index, ivf, *lists, blob, table);

  FileAppender out(path);
  out.Append(&h, sizeof h);
  out.Append(table.data(), table.size() * sizeof(FastScanListEntry));
  out.PadTo(h.blob_offset);
  out.Append(blob.data(), blob.size());
  out.PadTo(h.lists_offset);
  const size_t block_bytes = kFastScanBlockVectors * ivf.code_size;
  std::vector<uint8_t> last_block(block_bytes);
  for (const SourceList& src : *lists) {
    if (src.n == 0) continue;
    // Whole blocks as they are; the last one with the slots past n zeroed,
    // so that equal indexes give equal files.
    const uint64_t full = src.n / kFastScanBlockVectors;
    out.Append(src.codes, full * block_bytes);
    if (const uint64_t rest = src.n % kFastScanBlockVectors; rest != 0) {
      std::memcpy(last_block.data(), src.codes + full * block_bytes,
                  block_bytes);
      for (uint64_t v = rest; v < kFastScanBlockVectors; ++v) {
        for (size_t sq = 0; sq < ivf.M2; ++sq) {
          SetPackedCode(last_block.data(), ivf.M2, v, sq, 0);
        }
      }
      out.Append(last_block.data(), block_bytes);
    }
    out.Append(src.ids, src.n * sizeof(int64_t));
    out.PadTo(RoundUp(out.written(), kFastScanListAlignment));
  }
  if (absl::Status s = out.Close(); !s.ok()) return s;
  if (out.written() != h.file_bytes) {
    return absl::InternalError(absl::StrCat("writing ", path, ": wrote ",
                                            out.written(), " bytes, planned ",
                                            h.file_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFastScanFile(const faiss::Index& index,
                               const std::string& path) {
  return CatchFaiss(absl::StatusCode::kInternal,
                    absl::StrCat("writing FastScan index file ", path),
                    [&] { return Write(index, path, nullptr, nullptr); });
}

absl::Status WriteFastScanFilePart(const faiss::Index& index,
                                   const std::string& path, IdRange range) {
  const Relabel keep_range = [range](int64_t id) {
    return range.Contains(id) ? id : int64_t{-1};
  };
  return CatchFaiss(absl::StatusCode::kInternal,
                    absl::StrCat("writing FastScan index file ", path),
                    [&] { return Write(index, path, &keep_range, nullptr); });
}

absl::Status WriteFastScanFileUpdate(const faiss::Index& base,
                                     absl::Span<const int64_t> new_id_of,
                                     const faiss::Index& appended,
                                     const std::string& path) {
  const Relabel renumber = [new_id_of](int64_t id) {
    return id >= 0 && id < static_cast<int64_t>(new_id_of.size())
               ? new_id_of[id]
               : int64_t{-1};
  };
  return CatchFaiss(absl::StatusCode::kInternal,
                    absl::StrCat("writing FastScan index file ", path),
                    [&] { return Write(base, path, &renumber, &appended); });
}

std::unique_ptr<faiss::Index> EmptyFastScanCopy(const faiss::Index& index) {
  FastScanParts parts;
  if (!CheckFastScanIndex(index, parts).empty()) return nullptr;
  const std::vector<uint8_t> blob = SerializeWithEmptyLists(parts, 0);
  faiss::VectorIOReader reader;
  reader.data = blob;
  std::unique_ptr<faiss::Index> copy;
  if (!CatchFaiss(absl::StatusCode::kInternal, "copying a FastScan index",
                  [&] { copy.reset(faiss::read_index(&reader)); })
           .ok()) {
    return nullptr;
  }
  return copy;
}

}  // namespace knnd
