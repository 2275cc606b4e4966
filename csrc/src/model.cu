// Loader: validate (model_file.cpp), check that this library runs the model (check_model, also behind
// nq_model_check), one cudaMalloc for all tensor data,
// filled by 4 reader threads: pread from the file (page cache) into double-buffered pinned staging, then
// cudaMemcpyAsync on the thread's own stream. Device pointer of a tensor = dev + (offset - data_offset). On Hopper
// the layout-1 INT4 weights are then repacked in place into the fragment order (repack_int4, int4_frag.cuh).
#include "model.h"
#include "int4_frag.cuh"
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>

namespace nq {

Model::~Model() {
  if (dev) cudaFree(dev);
  if (aux) cudaFree(aux);
  delete file;
}

namespace {

constexpr size_t kChunk = 32ull << 20;  // bytes per staging buffer
constexpr int kReaders = 4;

int upload(const ModelFile& f, uint8_t* dev, uint64_t total) {
  std::atomic<uint64_t> next{0};
  std::atomic<int> status{NQ_OK};
  std::mutex msg_mu;
  std::string msg;
  auto worker = [&]() {
    auto set_err = [&](int code, const std::string& m) {
      int expected = NQ_OK;
      if (status.compare_exchange_strong(expected, code)) {
        std::lock_guard<std::mutex> g(msg_mu);
        msg = m;
      }
    };
    void* buf[2] = {nullptr, nullptr};
    cudaEvent_t ev[2] = {nullptr, nullptr};
    cudaStream_t st = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    for (int i = 0; i < 2 && e == cudaSuccess; i++) {
      e = cudaHostAlloc(&buf[i], kChunk, cudaHostAllocDefault);
      if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming);
    }
    if (e != cudaSuccess) set_err(cuda_status(e), std::string("loader staging setup: ") + cudaGetErrorString(e));
    int it = 0;
    while (status.load() == NQ_OK) {
      const uint64_t off = next.fetch_add(kChunk);
      if (off >= total) break;
      const size_t len = (size_t)std::min<uint64_t>(kChunk, total - off);
      const int b = it++ & 1;
      if ((e = cudaEventSynchronize(ev[b])) != cudaSuccess) { set_err(NQ_E_CUDA, std::string("loader: ") + cudaGetErrorString(e)); break; }
      size_t got = 0;
      while (got < len) {
        const ssize_t r = pread(f.fd, static_cast<char*>(buf[b]) + got, len - got, (off_t)(f.data_offset + off + got));
        if (r <= 0) break;
        got += (size_t)r;
      }
      if (got != len) { set_err(NQ_E_IO, "loader: short read from the model file"); break; }
      if ((e = cudaMemcpyAsync(dev + off, buf[b], len, cudaMemcpyHostToDevice, st)) != cudaSuccess ||
          (e = cudaEventRecord(ev[b], st)) != cudaSuccess) {
        set_err(NQ_E_CUDA, std::string("loader copy: ") + cudaGetErrorString(e));
        break;
      }
    }
    if (st) cudaStreamSynchronize(st);
    for (int i = 0; i < 2; i++) {
      if (ev[i]) cudaEventDestroy(ev[i]);
      if (buf[i]) cudaFreeHost(buf[i]);
    }
    if (st) cudaStreamDestroy(st);
  };
  std::vector<std::thread> th;
  for (int i = 0; i < kReaders; i++) th.emplace_back(worker);
  for (auto& t : th) t.join();
  if (status.load() != NQ_OK) return fail(status.load(), "%s", msg.c_str());
  return NQ_OK;
}

float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float f16_to_f32(uint16_t h) {
  const uint32_t s = (h >> 15) & 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float f;
  if (e == 0) f = std::ldexp((float)m, -24);
  else if (e == 31) f = m ? NAN : INFINITY;
  else f = std::ldexp((float)(m | 0x400), (int)e - 25);
  return s ? -f : f;
}

// Walks the tensors a model needs, checking names, shapes and dtypes. With M.dev == nullptr it only checks
// (check_model); otherwise it also points M's weights into the device copy and converts the 1-D tensors to f32.
struct Builder {
  Model& M;
  const ModelFile& f;
  std::vector<float> aux_host;
  std::vector<std::pair<const float**, size_t>> aux_fix;  // pointer to patch, index into aux

  uint32_t layout(const std::string& name) const {  // int4 layout id of a tensor (0: dense or absent)
    const TensorInfo* t = f.find(name);
    return t ? t->layout_id : 0u;
  }
  const TensorInfo* need(const std::string& name, int& rc) {
    const TensorInfo* t = f.find(name);
    if (!t && rc == NQ_OK) rc = fail(NQ_E_FORMAT, "MissingTensor: %s", name.c_str());
    return t;
  }
  // 1-D tensor of length n -> f32 in aux (converted on the host)
  void vec(const std::string& name, uint64_t n, const float** dst, int& rc) {
    const TensorInfo* t = need(name, rc);
    if (!t) return;
    if (t->ndim != 1 || t->shape[0] != n || t->dtype == DT_INT4G) {
      if (rc == NQ_OK) rc = fail(NQ_E_FORMAT, "ConfigMismatch: %s: expected a 1-D tensor of %llu, found ndim %u shape[0] %llu dtype %u", name.c_str(), (unsigned long long)n, t->ndim, (unsigned long long)t->shape[0], t->dtype);
      return;
    }
    if (!M.dev) return;
    const size_t at = aux_host.size();
    const uint8_t* p = f.map + t->offset;
    for (uint64_t i = 0; i < n; i++) {
      float v;
      if (t->dtype == DT_F32) std::memcpy(&v, p + 4 * i, 4);
      else {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        v = t->dtype == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
      aux_host.push_back(v);
    }
    while (aux_host.size() % 4) aux_host.push_back(0.f);  // keep every vector 16-byte aligned
    aux_fix.push_back({dst, at});
  }
  void lin(const std::string& name, uint64_t N, uint64_t K, LinW* w, int& rc) {
    const TensorInfo* t = need(name, rc);
    if (!t) return;
    if (t->ndim != 2 || t->shape[0] != N || t->shape[1] != K) {
      if (rc == NQ_OK) rc = fail(NQ_E_FORMAT, "ConfigMismatch: %s: expected shape (%llu, %llu), found (%llu, %llu)", name.c_str(), (unsigned long long)N, (unsigned long long)K, (unsigned long long)t->shape[0], (unsigned long long)t->shape[1]);
      return;
    }
    if (t->dtype == DT_F32) {
      if (rc == NQ_OK) rc = fail(NQ_E_UNSUPPORTED, "%s: f32 linear weights are not supported by the CUDA backend (use int4 or f16/bf16)", name.c_str());
      return;
    }
    w->w = M.dev ? M.dev + (t->offset - f.data_offset) : nullptr;
    w->N = (int)N;
    w->K = (int)K;
    w->type = (int)t->dtype;
    if (t->dtype == DT_INT4G) {
      w->group = (int)t->group_size;
      const uint64_t at = t->offset - f.data_offset, scales_at = align128(N * K / 2);
      if (M.dev) w->scales = reinterpret_cast<const __half*>(M.dev + at + scales_at);
      // layout 2 (spec 9.5): the zero points follow the scales at Z = align128(S + N * (K / g) * 2)
      if (M.dev && t->layout_id == contract::kLayoutInt4RowmajorK8Asym)
        w->zeros = M.dev + at + align128(scales_at + N * (K / t->group_size) * 2);
    }
  }
};

// The limits of this library's kernels (attention: head_dim 64/128, <= 8 query heads per KV head; GEMV/GEMM
// tiles: multiples of 64).
int check_supported_config(const nq_config& c) {
  if (c.head_dim != 64 && c.head_dim != 128) return fail(NQ_E_UNSUPPORTED, "head_dim %d: the CUDA backend runs 64 or 128", c.head_dim);
  if (c.hidden_size % 64 || c.intermediate_size % 64 || (c.n_heads * c.head_dim) % 64)
    return fail(NQ_E_UNSUPPORTED, "hidden_size %d, intermediate_size %d and n_heads*head_dim must be multiples of 64", c.hidden_size, c.intermediate_size);
  if (c.n_heads / c.n_kv_heads > 8) return fail(NQ_E_UNSUPPORTED, "more than 8 query heads per KV head");
  return NQ_OK;
}

// Every tensor of the model through `b` (names, shapes, dtypes; dtype/group agreement of fused weights).
int walk_tensors(Builder& b, const nq_config& c) {
  Model& M = b.M;
  const uint64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const uint64_t NQd = c.n_heads * D, NKV = c.n_kv_heads * D;
  int rc = NQ_OK;
  M.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers && rc == NQ_OK; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer& L = M.layers[l];
    b.lin(p + "self_attn.q_proj.weight", NQd, H, &L.q, rc);
    b.lin(p + "self_attn.k_proj.weight", NKV, H, &L.k, rc);
    b.lin(p + "self_attn.v_proj.weight", NKV, H, &L.v, rc);
    b.lin(p + "self_attn.o_proj.weight", H, NQd, &L.o, rc);
    b.lin(p + "mlp.gate_proj.weight", I, H, &L.gate, rc);
    b.lin(p + "mlp.up_proj.weight", I, H, &L.up, rc);
    b.lin(p + "mlp.down_proj.weight", H, I, &L.down, rc);
    b.vec(p + "input_layernorm.weight", H, &L.ln1, rc);
    b.vec(p + "post_attention_layernorm.weight", H, &L.ln2, rc);
    if (c.qkv_bias) {
      b.vec(p + "self_attn.q_proj.bias", NQd, &L.bq, rc);
      b.vec(p + "self_attn.k_proj.bias", NKV, &L.bk, rc);
      b.vec(p + "self_attn.v_proj.bias", NKV, &L.bv, rc);
    }
    const uint32_t lq = b.layout(p + "self_attn.q_proj.weight"), lg = b.layout(p + "mlp.gate_proj.weight");
    if (rc == NQ_OK && (L.q.type != L.k.type || L.q.type != L.v.type || L.q.group != L.k.group || L.q.group != L.v.group ||
                        lq != b.layout(p + "self_attn.k_proj.weight") || lq != b.layout(p + "self_attn.v_proj.weight")))
      rc = fail(NQ_E_UNSUPPORTED, "layer %d: q/k/v weights differ in dtype, group size or int4 layout", l);
    if (rc == NQ_OK && (L.gate.type != L.up.type || L.gate.group != L.up.group || lg != b.layout(p + "mlp.up_proj.weight")))
      rc = fail(NQ_E_UNSUPPORTED, "layer %d: gate/up weights differ in dtype, group size or int4 layout", l);
  }
  b.vec("model.norm.weight", H, &M.final_norm, rc);
  const TensorInfo* emb = b.need("model.embed_tokens.weight", rc);
  if (emb) {
    if (emb->ndim != 2 || emb->shape[0] != (uint64_t)c.vocab_rows || emb->shape[1] != H) {
      if (rc == NQ_OK) rc = fail(NQ_E_FORMAT, "ConfigMismatch: model.embed_tokens.weight: expected shape (%d, %llu)", c.vocab_rows, (unsigned long long)H);
    } else if (emb->dtype == DT_INT4G) {  // valid in the file (e.g. a tied int4 embedding); the row gather reads plain rows
      if (rc == NQ_OK) rc = fail(NQ_E_UNSUPPORTED, "model.embed_tokens.weight: an int4 embedding is not supported by the CUDA backend (the embedding row gather reads f16/bf16/f32 rows)");
    } else {
      M.embed = M.dev ? M.dev + (emb->offset - b.f.data_offset) : nullptr;
      M.embed_dtype = (int)emb->dtype;
    }
  }
  if (c.tied_embeddings) b.lin("model.embed_tokens.weight", c.vocab_rows, H, &M.lm_head, rc);
  else b.lin("lm_head.weight", c.vocab_rows, H, &M.lm_head, rc);
  return rc;
}

// A layout-1 INT4 weight whose shape the fragment order covers
bool frag_candidate(const LinW& W) {
  return W.type == WT_INT4 && W.zeros == nullptr && W.order == ORDER_FILE && frag::shape_ok(W.N, W.K, W.group);
}

// On GPUs where every INT4 kernel reads the fragment order (int4_frag.cuh), repack the model's layout-1 INT4
// weights into it in place, through one scratch of the largest weight (the gate/up pair: both): q/k/v all or none
// (one GEMV launch reads the three), gate and up only as the pair, o, down and an INT4 lm_head alone. Layout 2 and
// shapes the order does not cover keep the file's order and its kernels. The file and its mapping are untouched.
int repack_int4(Model& M) {
  if (!int4_fragment_order_available()) return NQ_OK;
  auto qkv_ok = [](const Layer& L) { return frag_candidate(L.q) && frag_candidate(L.k) && frag_candidate(L.v); };
  auto pair_ok = [](const Layer& L) {
    return frag_candidate(L.gate) && frag_candidate(L.up) && L.gate.N == L.up.N && L.gate.group == L.up.group;
  };
  size_t need = 0;
  for (const Layer& L : M.layers) {
    if (qkv_ok(L)) need = std::max({need, frag_repack_scratch_bytes(L.q), frag_repack_scratch_bytes(L.k), frag_repack_scratch_bytes(L.v)});
    if (pair_ok(L)) need = std::max(need, frag_repack_scratch_bytes(L.gate) + frag_repack_scratch_bytes(L.up));
    for (const LinW* W : {&L.o, &L.down})
      if (frag_candidate(*W)) need = std::max(need, frag_repack_scratch_bytes(*W));
  }
  if (frag_candidate(M.lm_head)) need = std::max(need, frag_repack_scratch_bytes(M.lm_head));
  if (need == 0) return NQ_OK;
  void* scratch = nullptr;
  cudaError_t e = cudaMalloc(&scratch, need);
  if (e != cudaSuccess) return fail(cuda_status(e), "cudaMalloc(%zu bytes) for the INT4 repack: %s", need, cudaGetErrorString(e));
  int rc = NQ_OK;
  for (Layer& L : M.layers) {
    if (rc == NQ_OK && qkv_ok(L))
      for (LinW* W : {&L.q, &L.k, &L.v})
        if (rc == NQ_OK) rc = frag_repack(W, scratch, need, 0);
    if (rc == NQ_OK && pair_ok(L)) rc = frag_repack_pair(&L.gate, &L.up, scratch, need, 0);
    for (LinW* W : {&L.o, &L.down})
      if (rc == NQ_OK && frag_candidate(*W)) rc = frag_repack(W, scratch, need, 0);
  }
  if (rc == NQ_OK && frag_candidate(M.lm_head)) rc = frag_repack(&M.lm_head, scratch, need, 0);
  e = cudaDeviceSynchronize();   // the scratch is reused by every repack on stream 0; free it after the last
  cudaFree(scratch);
  if (rc != NQ_OK) return rc;
  if (e != cudaSuccess) return fail(cuda_status(e), "INT4 repack: %s", cudaGetErrorString(e));
  return NQ_OK;
}

}  // namespace

int check_model(const ModelFile& f) {
  NQ_TRY(check_supported_config(f.cfg));
  Model dry;  // no device memory: the walk only checks
  Builder b{dry, f, {}, {}};
  const int rc = walk_tensors(b, f.cfg);
  dry.file = nullptr;
  return rc;
}

int load_model(const char* path, bool verify, Model** out) {
  const auto t0 = std::chrono::steady_clock::now();
  ModelFile* f = nullptr;
  NQ_TRY(open_model_file(path, verify, &f));
  Model* M = new Model();
  M->file = f;
  M->cfg = f->cfg;
  const nq_config& c = f->cfg;
  auto bail = [&](int rc) { delete M; return rc; };
  if (const int rc = check_model(*f)) return bail(rc);
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) return bail(fail(NQ_E_NO_DEVICE, "no CUDA device"));
  if (const int rc = gemv_prepare()) return bail(rc);

  M->dev_bytes = f->tensors_end - f->data_offset;
  {
    cudaError_t e = cudaMalloc(&M->dev, M->dev_bytes);
    if (e != cudaSuccess) return bail(fail(cuda_status(e), "cudaMalloc(%llu bytes) for the weights: %s", (unsigned long long)M->dev_bytes, cudaGetErrorString(e)));
  }
  Builder b{*M, *f, {}, {}};
  if (const int rc = walk_tensors(b, c)) return bail(rc);

  const int urc = upload(*f, M->dev, M->dev_bytes);
  if (urc != NQ_OK) return bail(urc);
  if (const int rc = repack_int4(*M)) return bail(rc);
  {
    cudaError_t e = cudaMalloc(&M->aux, std::max<size_t>(4, b.aux_host.size() * 4));
    if (e == cudaSuccess) e = cudaMemcpy(M->aux, b.aux_host.data(), b.aux_host.size() * 4, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return bail(fail(cuda_status(e), "aux upload: %s", cudaGetErrorString(e)));
  }
  for (auto& fx : b.aux_fix) *fx.first = M->aux + fx.second;
  M->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *out = M;
  return NQ_OK;
}

}  // namespace nq
