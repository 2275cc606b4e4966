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
constexpr uint32_t kHeaderSize = ct::kFileHeaderSize, kConfigOffset = ct::kConfigOffset;
constexpr uint32_t kTensorEntry = ct::kTensorEntrySize, kBlobEntry = ct::kBlobEntrySize;
constexpr uint32_t kMaxTensors = ct::kMaxTensors, kMaxBlobs = ct::kMaxBlobs, kMaxHeader = ct::kMaxHeaderSize;
constexpr uint32_t kAlign = ct::kAlignment;

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

using u128 = unsigned __int128;
constexpr u128 kTwo64 = (u128)1 << 64;
// Spec §12: every message starts with the rule's error name, then ": ". Tests read the name before the colon.
#define NQ_FORMAT(name, fmt, ...) fail(NQ_E_FORMAT, name ": " fmt, ##__VA_ARGS__)

// Bytes [from, to) of the map are zero, or the first non-zero offset.
bool all_zero(const uint8_t* b, uint64_t from, uint64_t to, uint64_t* bad) {
  for (uint64_t i = from; i < to; i++)
    if (b[i]) { *bad = i; return false; }
  return true;
}

// The spec's required byte length (§8, §9.2); >= 2^64 means SizeOverflow. Dimensions are >= 1 here.
u128 required_nbytes(const TensorInfo& t) {
  if (t.dtype == DT_INT4G) {  // spec §9.2 (layout 1), §9.6 (layout 2: then padding and uint8 zero points)
    const u128 N = t.shape[0], K = t.shape[1];
    const u128 q = N * K / 2;
    const u128 scales_end = (q + kAlign - 1) / kAlign * kAlign + N * (K / t.group_size) * 2;
    if (t.layout_id == ct::kLayoutInt4RowmajorK8Asym) return (scales_end + kAlign - 1) / kAlign * kAlign + N * (K / t.group_size);
    return scales_end;
  }
  u128 n = t.dtype == DT_F32 ? 4 : 2;
  for (uint32_t d = 0; d < t.ndim; d++) {
    n *= t.shape[d];
    if (n >= kTwo64) return kTwo64;
  }
  return n;
}

bool f32_finite(float x) { return std::isfinite(x); }

// Rule 11: the ModelConfig rules of §5, in the reference reader's order; the raw u32 fields, not yet narrowed.
int check_config(const uint8_t* cb, nq_config& c) {
  namespace CF = ct::config;
  uint64_t bad = 0;
  if (!all_zero(cb, ct::kConfigUsedSize, ct::kConfigSize, &bad))
    return NQ_FORMAT("NonZeroReserved", "config reserved bytes [%u, %u): non-zero byte at config offset %llu", ct::kConfigUsedSize,
                     ct::kConfigSize, (unsigned long long)bad);
  const uint32_t cflags = rd<uint32_t>(cb + CF::config_flags);
  if (cflags & ~(ct::kConfigFlagTied | ct::kConfigFlagQkvBias))
    return NQ_FORMAT("NonZeroReserved", "config_flags: expected only bits 0-1, found 0x%08x", cflags);
  const uint32_t arch = rd<uint32_t>(cb + CF::arch), rs_type = rd<uint32_t>(cb + CF::rope_scaling_type);
  if (arch != ct::kArchQwen2 && arch != ct::kArchLlama)
    return NQ_FORMAT("ConfigMismatch", "arch: expected %u (qwen2) or %u (llama), found %u", ct::kArchQwen2, ct::kArchLlama, arch);
  if (rs_type > ct::kRopeYarn)
    return NQ_FORMAT("ConfigMismatch", "rope_scaling_type: expected %u, %u or %u, found %u", ct::kRopeNone, ct::kRopeLinear,
                     ct::kRopeYarn, rs_type);
  const uint32_t at[8] = {CF::n_layers, CF::hidden_size, CF::intermediate_size, CF::n_heads, CF::n_kv_heads, CF::head_dim,
                          CF::vocab_rows, CF::max_positions};
  const char* names[8] = {"n_layers", "hidden_size", "intermediate_size", "n_heads", "n_kv_heads", "head_dim",
                          "vocab_rows", "max_positions"};
  uint32_t v[8];
  for (int i = 0; i < 8; i++) {
    v[i] = rd<uint32_t>(cb + at[i]);
    if (v[i] == 0) return NQ_FORMAT("ConfigMismatch", "%s: expected an integer in 1..2^32-1, found 0", names[i]);
  }
  const uint32_t n_layers = v[0], hidden = v[1], n_heads = v[3], n_kv = v[4], head_dim = v[5], vocab = v[6];
  if (n_layers > ct::kMaxNLayers)
    return NQ_FORMAT("ConfigMismatch", "n_layers: expected <= MAX_N_LAYERS = %u, found %u", ct::kMaxNLayers, n_layers);
  if (n_heads % n_kv) return NQ_FORMAT("ConfigMismatch", "n_kv_heads: expected a divisor of n_heads=%u, found %u", n_heads, n_kv);
  if (head_dim % 2) return NQ_FORMAT("ConfigMismatch", "head_dim: expected an even number, found %u", head_dim);
  if (arch == ct::kArchQwen2 && (uint64_t)head_dim * n_heads != hidden)
    return NQ_FORMAT("ConfigMismatch", "head_dim: expected hidden_size/n_heads = %u/%u for qwen2, found %u", hidden, n_heads, head_dim);
  const double theta = rd<double>(cb + CF::rope_theta);
  if (!(std::isfinite(theta) && theta > 0.0)) return NQ_FORMAT("ConfigMismatch", "rope_theta: expected a finite number > 0, found %g", theta);
  const float factor = rd<float>(cb + CF::rope_scaling_factor);
  const uint32_t orig = rd<uint32_t>(cb + CF::rope_original_max_positions);
  if (!f32_finite(factor)) return NQ_FORMAT("ConfigMismatch", "rope_scaling_factor: expected a finite number, found %g", (double)factor);
  if (rs_type == ct::kRopeNone) {
    if (factor != 1.0f) return NQ_FORMAT("ConfigMismatch", "rope_scaling_factor: expected 1.0 with no RoPE scaling, found %g", (double)factor);
    if (orig != 0) return NQ_FORMAT("ConfigMismatch", "rope_original_max_positions: expected 0 with no RoPE scaling, found %u", orig);
  } else if (rs_type == ct::kRopeLinear) {
    if (!(factor > 0.f)) return NQ_FORMAT("ConfigMismatch", "rope_scaling_factor: expected > 0 for linear scaling, found %g", (double)factor);
  } else {
    if (!(factor >= 1.f)) return NQ_FORMAT("ConfigMismatch", "rope_scaling_factor: expected >= 1 for yarn, found %g", (double)factor);
    if (orig < 1) return NQ_FORMAT("ConfigMismatch", "rope_original_max_positions: expected >= 1 for yarn, found %u", orig);
  }
  const float eps = rd<float>(cb + CF::rms_norm_eps);
  if (!(f32_finite(eps) && eps > 0.f)) return NQ_FORMAT("ConfigMismatch", "rms_norm_eps: expected a finite number > 0, found %g", (double)eps);
  const uint32_t tok_at[3] = {CF::bos_token_id, CF::eos_token_id, CF::pad_token_id};
  const char* tok_names[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
  int32_t tok[3];
  for (int i = 0; i < 3; i++) {
    tok[i] = rd<int32_t>(cb + tok_at[i]);
    if (!(tok[i] == -1 || (tok[i] >= 0 && (uint32_t)tok[i] < vocab)))
      return NQ_FORMAT("ConfigMismatch", "%s: expected -1 or an id in 0..vocab_rows-1=%u, found %d", tok_names[i], vocab - 1, tok[i]);
  }
  c.arch = (int32_t)arch;
  c.n_layers = (int32_t)n_layers;
  // Narrowed to the ABI's int32; a value above INT32_MAX is valid in the file and refused later as unsupported.
  c.hidden_size = (int32_t)hidden; c.intermediate_size = (int32_t)v[2]; c.n_heads = (int32_t)n_heads;
  c.n_kv_heads = (int32_t)n_kv; c.head_dim = (int32_t)head_dim; c.vocab_rows = (int32_t)vocab; c.max_positions = (int32_t)v[7];
  c.tied_embeddings = (cflags & ct::kConfigFlagTied) ? 1 : 0;
  c.qkv_bias = (cflags & ct::kConfigFlagQkvBias) ? 1 : 0;
  c.rope_theta = theta;
  c.rope_original_max_positions = (int32_t)std::min<uint32_t>(orig, INT32_MAX);
  c.rope_scaling_type = (int32_t)rs_type;
  c.rope_scaling_factor = factor;
  c.rms_norm_eps = eps;
  c.bos_token_id = tok[0]; c.eos_token_id = tok[1]; c.pad_token_id = tok[2];
  return NQ_OK;
}

// §7's tensor set for a config, tested by parsing a name (constant time in n_layers).
struct LayerTensor { const char* suffix; char rows, cols; bool bias; };  // 'H', 'I', 'Q', 'K' (kv) or 0 (1-D)
constexpr LayerTensor kLayerTensors[] = {
    {"input_layernorm.weight", 'H', 0, false},     {"self_attn.q_proj.weight", 'Q', 'H', false},
    {"self_attn.k_proj.weight", 'K', 'H', false},  {"self_attn.v_proj.weight", 'K', 'H', false},
    {"self_attn.q_proj.bias", 'Q', 0, true},       {"self_attn.k_proj.bias", 'K', 0, true},
    {"self_attn.v_proj.bias", 'K', 0, true},       {"self_attn.o_proj.weight", 'H', 'Q', false},
    {"post_attention_layernorm.weight", 'H', 0, false}, {"mlp.gate_proj.weight", 'I', 'H', false},
    {"mlp.up_proj.weight", 'I', 'H', false},       {"mlp.down_proj.weight", 'H', 'I', false},
};
constexpr char kLayerPrefix[] = "model.layers.";

uint64_t dim_of(char sym, const nq_config& c) {
  const uint64_t H = (uint32_t)c.hidden_size, I = (uint32_t)c.intermediate_size, D = (uint32_t)c.head_dim;
  switch (sym) {
    case 'H': return H;
    case 'I': return I;
    case 'Q': return (uint64_t)(uint32_t)c.n_heads * D;
    case 'K': return (uint64_t)(uint32_t)c.n_kv_heads * D;
    default: return (uint32_t)c.vocab_rows;
  }
}

// The shape (ndim, dims) §7 gives `name`; false when the name is not in the set.
bool expected_shape(const nq_config& c, const std::string& name, uint32_t* ndim, uint64_t dims[2]) {
  if (name == "model.embed_tokens.weight" || (name == "lm_head.weight" && !c.tied_embeddings)) {
    *ndim = 2; dims[0] = dim_of('V', c); dims[1] = dim_of('H', c);
    return true;
  }
  if (name == "model.norm.weight") { *ndim = 1; dims[0] = dim_of('H', c); return true; }
  const size_t np = sizeof(kLayerPrefix) - 1;
  if (name.compare(0, np, kLayerPrefix) != 0) return false;
  const size_t dot = name.find('.', np);
  if (dot == std::string::npos || dot == np) return false;
  const std::string index = name.substr(np, dot - np);
  if (index.size() > 3 || (index.size() > 1 && index[0] == '0')) return false;  // n_layers <= 256: at most 3 digits
  uint32_t i = 0;
  for (char ch : index) {
    if (ch < '0' || ch > '9') return false;
    i = i * 10 + (uint32_t)(ch - '0');
  }
  if (i >= (uint32_t)c.n_layers) return false;
  const std::string suffix = name.substr(dot + 1);
  for (const LayerTensor& t : kLayerTensors) {
    if (suffix != t.suffix || (t.bias && !c.qkv_bias)) continue;
    dims[0] = dim_of(t.rows, c);
    *ndim = t.cols ? 2 : 1;
    if (t.cols) dims[1] = dim_of(t.cols, c);
    return true;
  }
  return false;
}

// The name at position `k` of §7's canonical order (embed, layer 0..n-1, norm, lm_head).
std::string canonical_name(const nq_config& c, uint64_t k) {
  if (k == 0) return "model.embed_tokens.weight";
  k -= 1;
  const uint64_t P = c.qkv_bias ? 12 : 9;
  const uint64_t per_layer = (uint64_t)c.n_layers * P;
  if (k < per_layer) {
    uint64_t j = k % P;
    for (const LayerTensor& t : kLayerTensors) {
      if (t.bias && !c.qkv_bias) continue;
      if (j-- == 0) return kLayerPrefix + std::to_string(k / P) + "." + t.suffix;
    }
  }
  return k == per_layer ? "model.norm.weight" : "lm_head.weight";
}

struct BlobInfo { uint32_t kind; uint64_t offset, nbytes; uint32_t crc32c; };

// Rules 1-39 of spec §12, in the spec's order (the first failing rule is reported); 38-39 only with `verify`.
int parse(ModelFile& f, bool verify) {
  const uint8_t* b = f.map;
  const uint64_t L = f.size;
  namespace H = ct::header;
  if (L < 8) return NQ_FORMAT("HeaderTooShort", "file: expected at least %u bytes, found %llu", kHeaderSize, (unsigned long long)L);  // 1
  static_assert(sizeof(ct::kMagic) == 9, "8 magic bytes");
  if (std::memcmp(b + H::magic, ct::kMagic, 8) != 0) return NQ_FORMAT("BadMagic", "magic: the first 8 bytes are not '%s'", ct::kMagic);  // 2
  if (L < kHeaderSize)  // 3
    return NQ_FORMAT("HeaderTooShort", "file: expected at least %u bytes for the FileHeader, found %llu", kHeaderSize, (unsigned long long)L);
  const uint32_t version = rd<uint32_t>(b + H::version), header_size = rd<uint32_t>(b + H::header_size);
  const uint64_t file_size = rd<uint64_t>(b + H::file_size), data_offset = rd<uint64_t>(b + H::data_offset);
  const uint32_t n_tensors = rd<uint32_t>(b + H::n_tensors), n_blobs = rd<uint32_t>(b + H::n_blobs);
  const uint32_t header_crc = rd<uint32_t>(b + H::header_crc32c), flags = rd<uint32_t>(b + H::flags);
  if (version != ct::kVersion) return NQ_FORMAT("UnsupportedVersion", "version: expected %u, found %u", ct::kVersion, version);  // 4
  if (header_size < kHeaderSize) return NQ_FORMAT("HeaderTooShort", "header_size: expected >= %u, found %u", kHeaderSize, header_size);  // 5
  if (n_tensors > kMaxTensors) return NQ_FORMAT("HeaderTooLarge", "n_tensors: expected <= %u, found %u", kMaxTensors, n_tensors);  // 6
  if (n_blobs > kMaxBlobs) return NQ_FORMAT("HeaderTooLarge", "n_blobs: expected <= %u, found %u", kMaxBlobs, n_blobs);
  if (header_size > kMaxHeader) return NQ_FORMAT("HeaderTooLarge", "header_size: expected <= %u, found %u", kMaxHeader, header_size);
  const uint64_t want_hs = (uint64_t)kHeaderSize + (uint64_t)kTensorEntry * n_tensors + (uint64_t)kBlobEntry * n_blobs;
  if (header_size != want_hs)  // 7
    return NQ_FORMAT("HeaderSizeMismatch", "header_size: expected 256 + 136*%u + 64*%u = %llu, found %u", n_tensors, n_blobs,
                     (unsigned long long)want_hs, header_size);
  if (header_size > L)  // 8
    return NQ_FORMAT("TruncatedFile", "file: expected at least header_size=%u bytes, found %llu", header_size, (unsigned long long)L);
  {  // 9: the CRC covers the header with its own field as zero
    constexpr uint32_t at = ct::kHeaderCrcOffset;
    const uint8_t zero[4] = {0, 0, 0, 0};
    uint32_t c = crc32c(b, at);
    c = crc32c(zero, 4, c);
    c = crc32c(b + at + 4, header_size - at - 4, c);
    if (c != header_crc) return NQ_FORMAT("ChecksumMismatch", "header_crc32c: expected 0x%08x (stored), computed 0x%08x", header_crc, c);
  }
  if (flags != 0) return NQ_FORMAT("NonZeroReserved", "flags: expected 0, found 0x%08x", flags);  // 10
  uint64_t bad = 0;
  if (!all_zero(b, ct::kHeaderReservedStart, kHeaderSize, &bad))
    return NQ_FORMAT("NonZeroReserved", "header reserved bytes [%u, %u): non-zero byte at %llu", ct::kHeaderReservedStart, kHeaderSize,
                     (unsigned long long)bad);
  NQ_TRY(check_config(b + kConfigOffset, f.cfg));  // 11
  const nq_config& cfg = f.cfg;
  if (file_size > L) return NQ_FORMAT("TruncatedFile", "file_size: expected %llu bytes, found %llu", (unsigned long long)file_size, (unsigned long long)L);  // 12
  if (file_size < L)  // 13
    return NQ_FORMAT("TrailingBytes", "file_size: expected %llu bytes, found %llu (%llu trailing bytes)", (unsigned long long)file_size,
                     (unsigned long long)L, (unsigned long long)(L - file_size));
  const uint64_t want_do = align128(header_size);
  if (data_offset % kAlign) return NQ_FORMAT("MisalignedOffset", "data_offset: expected a multiple of %u, found %llu", kAlign, (unsigned long long)data_offset);  // 14
  if (data_offset < want_do)  // 15
    return NQ_FORMAT("OverlappingTensors", "data_offset: expected align128(header_size) = %llu, found %llu", (unsigned long long)want_do,
                     (unsigned long long)data_offset);
  if (data_offset > want_do)
    return NQ_FORMAT("HoleInData", "data_offset: expected align128(header_size) = %llu, found %llu", (unsigned long long)want_do,
                     (unsigned long long)data_offset);
  if (data_offset > file_size)  // 15b
    return NQ_FORMAT("OffsetOutOfRange", "data_offset: expected <= file_size %llu, found %llu", (unsigned long long)file_size,
                     (unsigned long long)data_offset);
  if (!all_zero(b, header_size, data_offset, &bad))  // 16
    return NQ_FORMAT("NonZeroPadding", "padding after the directory: non-zero byte at %llu", (unsigned long long)bad);

  // Placement of one data item (rules 27 and 33), then the zero padding before it; advances prev_end/cursor.
  uint64_t cursor = data_offset, prev_end = data_offset;
  auto place = [&](const char* what, uint64_t off, uint64_t nb) -> int {
    if ((u128)off + nb >= kTwo64) return NQ_FORMAT("SizeOverflow", "%s: offset + nbytes expected < 2^64", what);
    if (off % kAlign) return NQ_FORMAT("MisalignedOffset", "%s: offset expected a multiple of %u, found %llu", what, kAlign, (unsigned long long)off);
    if (off < cursor)
      return NQ_FORMAT("OverlappingTensors", "%s: offset expected %llu, found %llu (overlapping the previous item)", what,
                       (unsigned long long)cursor, (unsigned long long)off);
    if (off > cursor)
      return NQ_FORMAT("HoleInData", "%s: offset expected %llu, found %llu (a hole)", what, (unsigned long long)cursor, (unsigned long long)off);
    if (off + nb > file_size)
      return NQ_FORMAT("OffsetOutOfRange", "%s: end expected <= file_size %llu, found %llu", what, (unsigned long long)file_size,
                       (unsigned long long)(off + nb));
    if (!all_zero(b, prev_end, off, &bad)) return NQ_FORMAT("NonZeroPadding", "padding before %s: non-zero byte at %llu", what, (unsigned long long)bad);
    prev_end = off + nb;
    cursor = align128(prev_end);
    return NQ_OK;
  };

  namespace TE = ct::tensor_entry;
  f.tensors.resize(n_tensors);
  for (uint32_t i = 0; i < n_tensors; i++) {  // 17-28, one entry at a time
    const uint8_t* e = b + kHeaderSize + kTensorEntry * i;
    TensorInfo& t = f.tensors[i];
    const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(e + TE::name, 0, ct::kTensorNameSize));
    if (!nul) return NQ_FORMAT("BadTensorName", "tensor entry %u: expected a NUL within %u bytes, found none", i, ct::kTensorNameSize);
    if (nul == e + TE::name) return NQ_FORMAT("BadTensorName", "tensor entry %u: empty name", i);
    for (const uint8_t* q = e + TE::name; q < nul; q++)
      if (*q < 0x21 || *q > 0x7e) return NQ_FORMAT("BadTensorName", "tensor entry %u: name byte 0x%02x is not printable ASCII 0x21..0x7E", i, *q);
    if (!all_zero(e, nul - e, TE::name + ct::kTensorNameSize, &bad))
      return NQ_FORMAT("BadTensorName", "tensor entry %u: non-zero byte in the NUL padding of its name", i);
    t.name.assign(reinterpret_cast<const char*>(e + TE::name), nul - (e + TE::name));
    const char* nm = t.name.c_str();
    if (f.by_name.count(t.name)) return NQ_FORMAT("DuplicateName", "tensor %s (entry %u): a duplicate of an earlier entry", nm, i);  // 18
    f.by_name[t.name] = i;
    t.dtype = rd<uint32_t>(e + TE::dtype); t.layout_id = rd<uint32_t>(e + TE::layout_id);
    t.group_size = rd<uint32_t>(e + TE::group_size); t.ndim = rd<uint32_t>(e + TE::ndim);
    const uint32_t shape_at[4] = {TE::shape_0, TE::shape_1, TE::shape_2, TE::shape_3};
    for (int d = 0; d < 4; d++) t.shape[d] = rd<uint64_t>(e + shape_at[d]);
    t.offset = rd<uint64_t>(e + TE::offset); t.nbytes = rd<uint64_t>(e + TE::nbytes); t.crc32c = rd<uint32_t>(e + TE::crc32c);
    if (t.dtype > DT_INT4G) return NQ_FORMAT("UnknownDType", "tensor %s: dtype expected 0..3, found %u", nm, t.dtype);  // 19
    if (t.ndim < 1 || t.ndim > ct::kMaxNdim) return NQ_FORMAT("BadShape", "tensor %s: ndim expected 1..%u, found %u", nm, ct::kMaxNdim, t.ndim);  // 20
    for (uint32_t d = t.ndim; d < 4; d++)  // 21
      if (t.shape[d]) return NQ_FORMAT("NonZeroReserved", "tensor %s: unused shape slot %u expected 0", nm, d);
    if (rd<uint32_t>(e + TE::reserved)) return NQ_FORMAT("NonZeroReserved", "tensor %s: reserved expected 0", nm);
    if (t.dtype == DT_INT4G ? (t.layout_id != ct::kLayoutInt4RowmajorK8 && t.layout_id != ct::kLayoutInt4RowmajorK8Asym)
                            : t.layout_id != ct::kLayoutNone)  // 22
      return NQ_FORMAT("UnknownLayout", "tensor %s: layout_id expected %s, found %u", nm, t.dtype == DT_INT4G ? "1 or 2" : "0", t.layout_id);
    for (uint32_t d = 0; d < t.ndim; d++)  // 23
      if (t.shape[d] == 0) return NQ_FORMAT("BadShape", "tensor %s: every dimension expected >= 1, dimension %u is 0", nm, d);
    if (t.dtype == DT_INT4G && t.ndim != 2) return NQ_FORMAT("BadShape", "tensor %s: int4g ndim expected 2, found %u", nm, t.ndim);
    if (t.dtype == DT_INT4G) {  // 24
      if (t.shape[1] > (uint64_t)INT64_MAX || !ct::int4_group_ok(t.group_size, (long long)t.shape[1]))
        return NQ_FORMAT("BadGroupSize", "tensor %s: group_size %u with K=%llu (32, 64, 128 or 256, dividing K)", nm, t.group_size,
                         (unsigned long long)t.shape[1]);
    } else if (t.group_size != 0) {
      return NQ_FORMAT("BadGroupSize", "tensor %s: group_size expected 0 for a plain dtype, found %u", nm, t.group_size);
    }
    const u128 need = required_nbytes(t);
    if (need >= kTwo64) return NQ_FORMAT("SizeOverflow", "tensor %s: byte length expected < 2^64", nm);  // 25
    if ((uint64_t)need != t.nbytes)  // 26
      return NQ_FORMAT("ByteLengthMismatch", "tensor %s: nbytes expected %llu, found %llu", nm, (unsigned long long)need, (unsigned long long)t.nbytes);
    const std::string what = "tensor " + t.name;
    NQ_TRY(place(what.c_str(), t.offset, t.nbytes));  // 27
    if (t.dtype == DT_INT4G) {  // 28
      const uint64_t q = t.shape[0] * t.shape[1] / 2;
      if (!all_zero(b, t.offset + q, t.offset + align128(q), &bad))
        return NQ_FORMAT("NonZeroPadding", "tensor %s: padding between qweight and scales: non-zero byte at %llu", nm, (unsigned long long)bad);
      if (t.layout_id == ct::kLayoutInt4RowmajorK8Asym) {
        const uint64_t scales_end = align128(q) + t.shape[0] * (t.shape[1] / t.group_size) * 2;
        if (!all_zero(b, t.offset + scales_end, t.offset + align128(scales_end), &bad))
          return NQ_FORMAT("NonZeroPadding", "tensor %s: padding between scales and zeros: non-zero byte at %llu", nm, (unsigned long long)bad);
      }
    }
  }
  f.tensors_end = prev_end;

  namespace BE = ct::blob_entry;
  std::vector<BlobInfo> blobs;
  bool seen_kind[ct::kBlobKindMax + 1] = {};
  for (uint32_t i = 0; i < n_blobs; i++) {  // 29-33, one entry at a time
    const uint8_t* e = b + kHeaderSize + kTensorEntry * n_tensors + kBlobEntry * i;
    BlobInfo bl{rd<uint32_t>(e + BE::kind), rd<uint64_t>(e + BE::offset), rd<uint64_t>(e + BE::nbytes), rd<uint32_t>(e + BE::crc32c)};
    const uint32_t enc = rd<uint32_t>(e + BE::encoding);
    if (bl.kind < 1 || bl.kind > ct::kBlobKindMax)
      return NQ_FORMAT("UnknownBlobKind", "blob entry %u: kind expected 1..%u, found %u", i, ct::kBlobKindMax, bl.kind);  // 29
    const char* kn = ct::kBlobKindNames[bl.kind];
    if (seen_kind[bl.kind]) return NQ_FORMAT("DuplicateName", "blob %s (entry %u): a second blob of this kind", kn, i);  // 30
    seen_kind[bl.kind] = true;
    if (enc != ct::kEncodingOfBlobKind[bl.kind])  // 31
      return NQ_FORMAT("BadBlobEncoding", "blob %s: encoding expected %u, found %u", kn, ct::kEncodingOfBlobKind[bl.kind], enc);
    if (enc == ct::kBlobEncodingJsonUtf8 && bl.nbytes == 0)  // 31b
      return NQ_FORMAT("BadBlobEncoding", "blob %s: nbytes expected >= 1 (a JSON blob holds one JSON value), found 0", kn);
    if (!all_zero(e, ct::kBlobReservedStart, kBlobEntry, &bad)) return NQ_FORMAT("NonZeroReserved", "blob %s: reserved bytes [%u, %u) expected zero", kn, ct::kBlobReservedStart, kBlobEntry);  // 32
    const std::string what = std::string("blob ") + kn;
    NQ_TRY(place(what.c_str(), bl.offset, bl.nbytes));  // 33
    blobs.push_back(bl);
  }
  if (file_size != prev_end)  // 34
    return NQ_FORMAT("HoleInData", "file_size: expected the end of the last item = %llu, found %llu", (unsigned long long)prev_end,
                     (unsigned long long)file_size);

  for (const TensorInfo& t : f.tensors) {  // 35-36, one entry at a time
    uint32_t ndim = 0;
    uint64_t dims[2] = {0, 0};
    if (!expected_shape(cfg, t.name, &ndim, dims))
      return NQ_FORMAT("UnknownTensorName", "tensor %s: not a name of this config (n_layers=%d, tied=%d, qkv_bias=%d)", t.name.c_str(),
                       cfg.n_layers, cfg.tied_embeddings, cfg.qkv_bias);
    if (t.ndim != ndim || t.shape[0] != dims[0] || (ndim == 2 && t.shape[1] != dims[1]))
      return NQ_FORMAT("ConfigMismatch", "tensor %s: shape expected (%llu%s%llu) from the config, found ndim %u (%llu, %llu)", t.name.c_str(),
                       (unsigned long long)dims[0], ndim == 2 ? ", " : "", ndim == 2 ? (unsigned long long)dims[1] : 0ull, t.ndim,
                       (unsigned long long)t.shape[0], (unsigned long long)t.shape[1]);
  }
  const uint64_t want_count = 2 + (uint64_t)cfg.n_layers * (cfg.qkv_bias ? 12 : 9) + (cfg.tied_embeddings ? 0 : 1);
  if (n_tensors < want_count) {  // 37: the names are distinct members, so a short count means one is absent
    for (uint64_t k = 0; k <= n_tensors; k++) {
      const std::string name = canonical_name(cfg, k);
      if (!f.by_name.count(name))
        return NQ_FORMAT("MissingTensor", "tensor %s: absent (the config requires %llu tensors, the file holds %u)", name.c_str(),
                         (unsigned long long)want_count, n_tensors);
    }
  }
  f.data_offset = data_offset;
  if (!verify) return NQ_OK;
  for (const TensorInfo& t : f.tensors) {  // 38: tensors, then blobs
    const uint32_t got = crc32c(b + t.offset, t.nbytes);
    if (got != t.crc32c) return NQ_FORMAT("ChecksumMismatch", "tensor %s: crc32c expected 0x%08x (stored), computed 0x%08x", t.name.c_str(), t.crc32c, got);
  }
  for (const BlobInfo& bl : blobs) {
    const uint32_t got = crc32c(b + bl.offset, bl.nbytes);
    if (got != bl.crc32c)
      return NQ_FORMAT("ChecksumMismatch", "blob %s: crc32c expected 0x%08x (stored), computed 0x%08x", ct::kBlobKindNames[bl.kind], bl.crc32c, got);
  }
  for (const TensorInfo& t : f.tensors) {  // 39: int4g scales have the f16 sign bit clear and exponent != 0x1F
    if (t.dtype != DT_INT4G) continue;
    const uint64_t count = t.shape[0] * (t.shape[1] / t.group_size);
    const uint64_t scales_at = align128(t.shape[0] * t.shape[1] / 2);
    const uint8_t* s = b + t.offset + scales_at;
    for (uint64_t j = 0; j < count; j++) {
      const uint16_t h = rd<uint16_t>(s + 2 * j);
      if ((h & 0x8000) || (h & 0x7c00) == 0x7c00)
        return NQ_FORMAT("BadScale", "tensor %s: scale %llu has bits 0x%04x (negative, -0, inf or NaN)", t.name.c_str(), (unsigned long long)j, h);
    }
    if (t.layout_id != ct::kLayoutInt4RowmajorK8Asym) continue;  // 39b: layout-2 zero points are codes 0..15
    const uint8_t* z = b + t.offset + align128(scales_at + 2 * count);
    for (uint64_t j = 0; j < count; j++)
      if (z[j] > ct::kInt4MaxCode)
        return NQ_FORMAT("BadZero", "tensor %s: zero point %llu expected 0..%u, found %u", t.name.c_str(), (unsigned long long)j, ct::kInt4MaxCode, z[j]);
  }
  return NQ_OK;
}

#undef NQ_FORMAT

}  // namespace

int open_model_file(const char* path, bool verify, ModelFile** out) {
  if (!path || !out) return fail(NQ_E_INVALID_ARG, "open_model_file: NULL argument");
  ModelFile* f = new ModelFile();
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) { delete f; return fail(NQ_E_IO, "cannot open %s", path); }
  struct stat st;
  if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode)) { delete f; return fail(NQ_E_IO, "%s is not a regular file", path); }
  f->size = (uint64_t)st.st_size;
  if (f->size == 0) { delete f; return fail(NQ_E_FORMAT, "HeaderTooShort: %s is empty", path); }  // rule 1; mmap needs a byte
  void* m = mmap(nullptr, f->size, PROT_READ, MAP_SHARED, f->fd, 0);
  if (m == MAP_FAILED) { f->map = nullptr; delete f; return fail(NQ_E_IO, "mmap of %s failed", path); }
  f->map = static_cast<const uint8_t*>(m);
  int rc = parse(*f, verify);
  // Every format rule passed; the ABI's nq_config holds the dimensions as int32.
  const nq_config& c = f->cfg;
  const int32_t dims[] = {c.hidden_size, c.intermediate_size, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_rows, c.max_positions};
  for (int32_t d : dims)
    if (rc == NQ_OK && d <= 0) rc = fail(NQ_E_UNSUPPORTED, "%s: a config dimension above 2^31-1 is not supported", path);
  if (rc != NQ_OK) { delete f; return rc; }
  *out = f;
  return NQ_OK;
}

}  // namespace nq
