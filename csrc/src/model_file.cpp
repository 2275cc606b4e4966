#include "model_file.h"
#include "common.h"
#include <cstring>
#include <cmath>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace nq {

namespace {
namespace ct = contract;
constexpr uint64_t kHeaderSize = ct::kFileHeaderSize, kConfigOffset = ct::kConfigOffset;
constexpr uint64_t kTensorEntry = ct::kTensorEntrySize, kBlobEntry = ct::kBlobEntrySize;
constexpr uint64_t kMaxTensors = ct::kMaxTensors, kMaxBlobs = ct::kMaxBlobs, kMaxHeader = ct::kMaxHeaderSize;
constexpr uint64_t kAlign = ct::kAlignment;

template <class T> T rd(const uint8_t* p) { T v; std::memcpy(&v, p, sizeof v); return v; }

uint32_t g_table[8][256];
bool g_table_ready = false;
void init_table() {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    g_table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++) g_table[t][i] = (g_table[t - 1][i] >> 8) ^ g_table[0][g_table[t - 1][i] & 0xff];
  g_table_ready = true;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_hw(const uint8_t* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) { c64 = __builtin_ia32_crc32di(c64, rd<uint64_t>(p)); p += 8; n -= 8; }
  c = (uint32_t)c64;
  while (n--) c = __builtin_ia32_crc32qi(c, *p++);
  return c;
}
#endif
}  // namespace

uint64_t align128(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// CRC32C (Castagnoli, reflected 0x82F63B78, init/final xor 0xFFFFFFFF); `crc` continues a previous value.
uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return ~crc_hw(p, n, c);
#endif
  if (!g_table_ready) init_table();
  while (n >= 8) {
    uint64_t v = rd<uint64_t>(p) ^ c;
    c = g_table[7][v & 0xff] ^ g_table[6][(v >> 8) & 0xff] ^ g_table[5][(v >> 16) & 0xff] ^
        g_table[4][(v >> 24) & 0xff] ^ g_table[3][(v >> 32) & 0xff] ^ g_table[2][(v >> 40) & 0xff] ^
        g_table[1][(v >> 48) & 0xff] ^ g_table[0][v >> 56];
    p += 8; n -= 8;
  }
  while (n--) c = (c >> 8) ^ g_table[0][(c ^ *p++) & 0xff];
  return ~c;
}

ModelFile::~ModelFile() {
  if (map) munmap(const_cast<uint8_t*>(map), size);
  if (fd >= 0) close(fd);
}

const TensorInfo* ModelFile::find(const std::string& name) const {
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : &tensors[it->second];
}

namespace {

// Size the spec requires for a tensor; false on overflow.
bool required_nbytes(const TensorInfo& t, uint64_t* out) {
  if (t.dtype == DT_INT4G) {
    const uint64_t N = t.shape[0], K = t.shape[1];
    if (N > (1ull << 31) || K > (1ull << 31)) return false;
    *out = align128(N * K / 2) + N * (K / t.group_size) * 2;
    return true;
  }
  uint64_t n = t.dtype == DT_F32 ? 4 : 2;
  for (uint32_t d = 0; d < t.ndim; d++) {
    if (t.shape[d] != 0 && n > UINT64_MAX / t.shape[d]) return false;
    n *= t.shape[d];
  }
  *out = n;
  return true;
}

int check_config(const nq_config& c) {
  if (c.arch != (int32_t)ct::kArchQwen2 && c.arch != (int32_t)ct::kArchLlama)
    return fail(NQ_E_FORMAT, "ConfigMismatch: arch: expected %u (qwen2) or %u (llama), found %d", ct::kArchQwen2, ct::kArchLlama, c.arch);
  const int32_t pos[] = {c.n_layers, c.hidden_size, c.intermediate_size, c.n_heads, c.n_kv_heads, c.head_dim,
                         c.vocab_rows, c.max_positions};
  const char* names[] = {"n_layers", "hidden_size", "intermediate_size", "n_heads", "n_kv_heads", "head_dim",
                         "vocab_rows", "max_positions"};
  for (int i = 0; i < 8; i++)
    if (pos[i] <= 0) return fail(NQ_E_FORMAT, "ConfigMismatch: %s must be > 0, found %d", names[i], pos[i]);
  if (c.n_layers > (int32_t)ct::kMaxNLayers)
    return fail(NQ_E_FORMAT, "ConfigMismatch: n_layers must be <= MAX_N_LAYERS (%u), found %d", ct::kMaxNLayers, c.n_layers);
  if (c.n_heads % c.n_kv_heads != 0)
    return fail(NQ_E_FORMAT, "ConfigMismatch: n_heads (%d) is not a multiple of n_kv_heads (%d)", c.n_heads, c.n_kv_heads);
  if (!(c.rms_norm_eps > 0.f) || !std::isfinite(c.rms_norm_eps))
    return fail(NQ_E_FORMAT, "ConfigMismatch: rms_norm_eps must be a finite value > 0");
  if (!(c.rope_theta > 0.0) || !std::isfinite(c.rope_theta))
    return fail(NQ_E_FORMAT, "ConfigMismatch: rope_theta must be a finite value > 0");
  if (c.rope_scaling_type < 0 || c.rope_scaling_type > (int32_t)ct::kRopeYarn)
    return fail(NQ_E_FORMAT, "ConfigMismatch: rope_scaling_type must be %u, %u or %u, found %d", ct::kRopeNone,
                ct::kRopeLinear, ct::kRopeYarn, c.rope_scaling_type);
  if (!std::isfinite(c.rope_scaling_factor))
    return fail(NQ_E_FORMAT, "ConfigMismatch: rope_scaling_factor must be finite");
  return NQ_OK;
}

int parse(ModelFile& f, bool verify) {
  const uint8_t* b = f.map;
  if (f.size < kHeaderSize) return fail(NQ_E_FORMAT, "HeaderTooShort: file is %llu bytes, the header alone is %llu", (unsigned long long)f.size, (unsigned long long)kHeaderSize);
  static_assert(sizeof(ct::kMagic) == 9, "8 magic bytes");
  if (std::memcmp(b + ct::header::magic, ct::kMagic, 8) != 0) return fail(NQ_E_FORMAT, "BadMagic: the first 8 bytes are not '%s'", ct::kMagic);
  namespace H = ct::header;
  const uint32_t version = rd<uint32_t>(b + H::version), header_size = rd<uint32_t>(b + H::header_size);
  const uint64_t file_size = rd<uint64_t>(b + H::file_size), data_offset = rd<uint64_t>(b + H::data_offset);
  const uint32_t n_tensors = rd<uint32_t>(b + H::n_tensors), n_blobs = rd<uint32_t>(b + H::n_blobs);
  const uint32_t header_crc = rd<uint32_t>(b + H::header_crc32c), flags = rd<uint32_t>(b + H::flags);
  if (version != ct::kVersion) return fail(NQ_E_FORMAT, "UnsupportedVersion: version: expected %u, found %u", ct::kVersion, version);
  if (n_tensors > kMaxTensors || n_blobs > kMaxBlobs || header_size > kMaxHeader)
    return fail(NQ_E_FORMAT, "HeaderTooLarge: n_tensors %u (max %llu), n_blobs %u (max %llu), header_size %u (max %llu)", n_tensors,
                (unsigned long long)kMaxTensors, n_blobs, (unsigned long long)kMaxBlobs, header_size, (unsigned long long)kMaxHeader);
  if (header_size < kHeaderSize) return fail(NQ_E_FORMAT, "HeaderTooShort: header_size %u < %llu", header_size, (unsigned long long)kHeaderSize);
  const uint64_t want_hs = kHeaderSize + kTensorEntry * n_tensors + kBlobEntry * n_blobs;
  if (header_size != want_hs) return fail(NQ_E_FORMAT, "HeaderSizeMismatch: header_size: expected %llu, found %u", (unsigned long long)want_hs, header_size);
  if (header_size > f.size) return fail(NQ_E_FORMAT, "TruncatedFile: header_size %u > file size %llu", header_size, (unsigned long long)f.size);
  if (file_size != f.size) return fail(NQ_E_FORMAT, "TruncatedFile: file_size field %llu != actual size %llu", (unsigned long long)file_size, (unsigned long long)f.size);
  if (flags != 0) return fail(NQ_E_FORMAT, "NonZeroReserved: flags: expected 0, found %u", flags);
  {
    constexpr uint32_t at = ct::kHeaderCrcOffset;  // the CRC covers the header with this field as zero
    uint32_t c = crc32c(b, at);
    const uint8_t zero[4] = {0, 0, 0, 0};
    c = crc32c(zero, 4, c);
    c = crc32c(b + at + 4, header_size - at - 4, c);
    if (c != header_crc) return fail(NQ_E_FORMAT, "ChecksumMismatch: header_crc32c: expected 0x%08x, computed 0x%08x", header_crc, c);
  }
  if (data_offset != align128(header_size)) return fail(NQ_E_FORMAT, "MisalignedOffset: data_offset: expected %llu, found %llu", (unsigned long long)align128(header_size), (unsigned long long)data_offset);

  const uint8_t* cb = b + kConfigOffset;
  nq_config& c = f.cfg;
  namespace CF = ct::config;
  c.arch = (int32_t)rd<uint32_t>(cb + CF::arch);
  c.n_layers = (int32_t)rd<uint32_t>(cb + CF::n_layers);
  c.hidden_size = (int32_t)rd<uint32_t>(cb + CF::hidden_size);
  c.intermediate_size = (int32_t)rd<uint32_t>(cb + CF::intermediate_size);
  c.n_heads = (int32_t)rd<uint32_t>(cb + CF::n_heads);
  c.n_kv_heads = (int32_t)rd<uint32_t>(cb + CF::n_kv_heads);
  c.head_dim = (int32_t)rd<uint32_t>(cb + CF::head_dim);
  c.vocab_rows = (int32_t)rd<uint32_t>(cb + CF::vocab_rows);
  c.max_positions = (int32_t)rd<uint32_t>(cb + CF::max_positions);
  const uint32_t cflags = rd<uint32_t>(cb + CF::config_flags);
  c.tied_embeddings = (cflags & ct::kConfigFlagTied) ? 1 : 0;
  c.qkv_bias = (cflags & ct::kConfigFlagQkvBias) ? 1 : 0;
  c.rope_theta = rd<double>(cb + CF::rope_theta);
  c.rope_scaling_type = (int32_t)rd<uint32_t>(cb + CF::rope_scaling_type);
  c.rope_scaling_factor = rd<float>(cb + CF::rope_scaling_factor);
  c.rms_norm_eps = rd<float>(cb + CF::rms_norm_eps);
  c.bos_token_id = rd<int32_t>(cb + CF::bos_token_id);
  c.eos_token_id = rd<int32_t>(cb + CF::eos_token_id);
  c.pad_token_id = rd<int32_t>(cb + CF::pad_token_id);
  if (cflags & ~(ct::kConfigFlagTied | ct::kConfigFlagQkvBias)) return fail(NQ_E_FORMAT, "NonZeroReserved: config_flags has unknown bits 0x%x", cflags);
  NQ_TRY(check_config(c));

  // Directory: tensors then blobs, each item at align128(end of the previous one).
  uint64_t expect = data_offset;
  f.tensors.resize(n_tensors);
  for (uint32_t i = 0; i < n_tensors; i++) {
    const uint8_t* e = b + kHeaderSize + kTensorEntry * i;
    TensorInfo& t = f.tensors[i];
    namespace TE = ct::tensor_entry;
    const void* nul = std::memchr(e + TE::name, 0, ct::kTensorNameSize);
    if (!nul || nul == e) return fail(NQ_E_FORMAT, "BadTensorName: tensor entry %u has an empty or unterminated name", i);
    t.name.assign(reinterpret_cast<const char*>(e), static_cast<const uint8_t*>(nul) - e);
    for (char ch : t.name)
      if (ch < 0x21 || ch > 0x7e) return fail(NQ_E_FORMAT, "BadTensorName: tensor entry %u has a non-printable name", i);
    t.dtype = rd<uint32_t>(e + TE::dtype); t.layout_id = rd<uint32_t>(e + TE::layout_id);
    t.group_size = rd<uint32_t>(e + TE::group_size); t.ndim = rd<uint32_t>(e + TE::ndim);
    const uint32_t shape_at[4] = {TE::shape_0, TE::shape_1, TE::shape_2, TE::shape_3};
    for (int d = 0; d < 4; d++) t.shape[d] = rd<uint64_t>(e + shape_at[d]);
    t.offset = rd<uint64_t>(e + TE::offset); t.nbytes = rd<uint64_t>(e + TE::nbytes); t.crc32c = rd<uint32_t>(e + TE::crc32c);
    const char* nm = t.name.c_str();
    if (t.dtype != DT_F32 && t.dtype != DT_F16 && t.dtype != DT_BF16 && t.dtype != DT_INT4G)
      return fail(NQ_E_FORMAT, "UnknownDType: %s: dtype %u", nm, t.dtype);
    if (t.ndim < 1 || t.ndim > ct::kMaxNdim) return fail(NQ_E_FORMAT, "ConfigMismatch: %s: ndim %u not in 1..%u", nm, t.ndim, ct::kMaxNdim);
    if (t.dtype == DT_INT4G) {
      if (t.layout_id != ct::kLayoutInt4RowmajorK8)
        return fail(NQ_E_FORMAT, "UnknownLayout: %s: int4g needs layout %u, found %u", nm, ct::kLayoutInt4RowmajorK8, t.layout_id);
      if (t.ndim != 2) return fail(NQ_E_FORMAT, "ConfigMismatch: %s: int4g tensors are 2-D, found ndim %u", nm, t.ndim);
      if (!ct::int4_group_ok(t.group_size, (long long)t.shape[1]))
        return fail(NQ_E_FORMAT, "BadGroupSize: %s: group_size %u with K=%llu", nm, t.group_size, (unsigned long long)t.shape[1]);
    } else {
      if (t.layout_id != ct::kLayoutNone) return fail(NQ_E_FORMAT, "UnknownLayout: %s: plain dtype needs layout %u, found %u", nm, ct::kLayoutNone, t.layout_id);
      if (t.group_size != 0) return fail(NQ_E_FORMAT, "BadGroupSize: %s: plain dtype needs group_size 0, found %u", nm, t.group_size);
    }
    uint64_t need = 0;
    if (!required_nbytes(t, &need)) return fail(NQ_E_FORMAT, "SizeOverflow: %s: shape x dtype overflows 64 bits", nm);
    if (need != t.nbytes) return fail(NQ_E_FORMAT, "ByteLengthMismatch: %s: nbytes expected %llu, found %llu", nm, (unsigned long long)need, (unsigned long long)t.nbytes);
    if (t.offset % kAlign) return fail(NQ_E_FORMAT, "MisalignedOffset: %s: offset %llu", nm, (unsigned long long)t.offset);
    if (t.offset < expect) return fail(NQ_E_FORMAT, "OverlappingTensors: %s starts at %llu, before %llu", nm, (unsigned long long)t.offset, (unsigned long long)expect);
    if (t.offset > expect) return fail(NQ_E_FORMAT, "HoleInData: %s starts at %llu, expected %llu", nm, (unsigned long long)t.offset, (unsigned long long)expect);
    if (t.nbytes > f.size || t.offset > f.size - t.nbytes) return fail(NQ_E_FORMAT, "OffsetOutOfRange: %s ends past the file", nm);
    if (f.by_name.count(t.name)) return fail(NQ_E_FORMAT, "DuplicateName: %s", nm);
    f.by_name[t.name] = i;
    expect = align128(t.offset + t.nbytes);
  }
  f.tensors_end = n_tensors ? f.tensors.back().offset + f.tensors.back().nbytes : data_offset;
  uint64_t end = f.tensors_end;
  for (uint32_t i = 0; i < n_blobs; i++) {
    const uint8_t* e = b + kHeaderSize + kTensorEntry * n_tensors + kBlobEntry * i;
    const uint64_t off = rd<uint64_t>(e + ct::blob_entry::offset), nb = rd<uint64_t>(e + ct::blob_entry::nbytes);
    if (off % kAlign) return fail(NQ_E_FORMAT, "MisalignedOffset: blob %u offset %llu", i, (unsigned long long)off);
    if (off < expect) return fail(NQ_E_FORMAT, "OverlappingTensors: blob %u starts before %llu", i, (unsigned long long)expect);
    if (off > expect) return fail(NQ_E_FORMAT, "HoleInData: blob %u starts at %llu, expected %llu", i, (unsigned long long)off, (unsigned long long)expect);
    if (nb > f.size || off > f.size - nb) return fail(NQ_E_FORMAT, "OffsetOutOfRange: blob %u ends past the file", i);
    expect = align128(off + nb);
    end = off + nb;
  }
  if (end != f.size) return fail(NQ_E_FORMAT, "HoleInData: file_size %llu != end of the last item %llu", (unsigned long long)f.size, (unsigned long long)end);
  f.data_offset = data_offset;
  if (verify) {
    for (const TensorInfo& t : f.tensors) {
      const uint32_t got = crc32c(b + t.offset, t.nbytes);
      if (got != t.crc32c) return fail(NQ_E_FORMAT, "ChecksumMismatch: %s: expected 0x%08x, computed 0x%08x", t.name.c_str(), t.crc32c, got);
    }
  }
  return NQ_OK;
}

}  // namespace

int open_model_file(const char* path, bool verify, ModelFile** out) {
  if (!path || !out) return fail(NQ_E_INVALID_ARG, "open_model_file: NULL argument");
  ModelFile* f = new ModelFile();
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) { delete f; return fail(NQ_E_IO, "cannot open %s", path); }
  struct stat st;
  if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode)) { delete f; return fail(NQ_E_IO, "%s is not a regular file", path); }
  f->size = (uint64_t)st.st_size;
  if (f->size < kHeaderSize) { delete f; return fail(NQ_E_FORMAT, "HeaderTooShort: %s is %llu bytes, the header alone is %llu", path, (unsigned long long)st.st_size, (unsigned long long)kHeaderSize); }
  void* m = mmap(nullptr, f->size, PROT_READ, MAP_SHARED, f->fd, 0);
  if (m == MAP_FAILED) { f->map = nullptr; delete f; return fail(NQ_E_IO, "mmap of %s failed", path); }
  f->map = static_cast<const uint8_t*>(m);
  int rc = parse(*f, verify);
  if (rc != NQ_OK) { delete f; return rc; }
  *out = f;
  return NQ_OK;
}

}  // namespace nq
