// The C ABI (include/nanoqwen.h): every argument is checked here, once (token ids, context limits, sampling
// parameters, sizes), then the C++ internals run. No exception crosses it.
#include "batch.h"
#include "session.h"
#include "format_contract.h"
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <new>
#include <string>
#include <vector>

struct nq_model { nq::Model* m; };
struct nq_session { nq::Session* s; };
struct nq_batch { nq::Batch* b; };
struct nq_kv_pool { nq::KvPool* p; };

using nq::fail;
static_assert(NQ_KV_PAGE_TOKENS == nq::kPage, "nanoqwen.h's page size is the format contract's");

#define NQ_GUARD_BEGIN try {
#define NQ_GUARD_END                                                                        \
  }                                                                                         \
  catch (const std::bad_alloc&) { return fail(NQ_E_OUT_OF_MEMORY, "out of host memory"); } \
  catch (...) { return fail(NQ_E_INVALID_ARG, "internal error (exception)"); }

namespace {

int check_sampling(const nq_sampling* sp) {
  if (!sp) return NQ_OK;
  if (!std::isfinite(sp->temperature) || sp->temperature < 0.f)
    return fail(NQ_E_INVALID_ARG, "temperature must be a finite number >= 0, got %g", sp->temperature);
  if (sp->top_k < 0) return fail(NQ_E_INVALID_ARG, "top_k must be >= 0, got %d", sp->top_k);
  if (!(sp->top_p > 0.f && sp->top_p <= 1.f)) return fail(NQ_E_INVALID_ARG, "top_p must be in (0, 1], got %g", sp->top_p);
  return NQ_OK;
}

int check_tokens(const nq::Session& s, const int32_t* tokens, int32_t n) {
  const int32_t V = s.m->cfg.vocab_rows;
  for (int32_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= V)
      return fail(NQ_E_INVALID_ARG, "token id %d at index %d out of range [0, %d)", tokens[i], i, V);
  return NQ_OK;
}

// What bounds a session's positions, for the context-full messages.
const char* room(const nq::Session& s) {
  return s.pool && s.capacity() < s.max_ctx ? "the positions its pages hold:" : "max_context";
}

// nq_session_create and nq_session_create_pooled past their own argument checks: a session with a KV cache of its
// own (pool null) or on the pool's pages.
int create_session(nq_model* m, nq::KvPool* pool, int32_t max_context, const nq_sampling* sampling, nq_session** out) {
  const int32_t max_pos = m->m->cfg.max_positions;
  if (max_context <= 0 || max_context > max_pos)
    return fail(NQ_E_INVALID_ARG, "max_context %d out of range [1, %d]", max_context, max_pos);
  NQ_TRY(check_sampling(sampling));
  NQ_GUARD_BEGIN
  nq::Session* s = nullptr;
  NQ_TRY(pool ? nq::session_create_pooled(m->m, pool, max_context, sampling, &s)
              : nq::session_create(m->m, max_context, sampling, &s));
  *out = new nq_session{s};
  return NQ_OK;
  NQ_GUARD_END
}

// The JSON of nq_abi_describe (built once): sizes and offsets from sizeof/offsetof of the real structs, status codes
// from the enum, format facts from the tables of format_contract.h (the constants the loader uses).
std::string describe_json() {
  namespace ct = nq::contract;
  std::string j;
  auto num = [](long long v) { return std::to_string(v); };
  auto field = [&](const char* name, size_t off, const char* type, bool last = false) {
    j += std::string("\"") + name + "\": [" + num((long long)off) + ", \"" + type + "\"]" + (last ? "" : ", ");
  };
  auto ints = [&](const int* v, int n) {
    std::string s = "[";
    for (int i = 0; i < n; i++) s += (i ? ", " : "") + num(v[i]);
    return s + "]";
  };
  j += "{\"abi_version\": " + num(NQ_ABI_VERSION) + ", \"status\": {";
  const std::pair<const char*, int> st[] = {
      {"NQ_OK", NQ_OK}, {"NQ_E_INVALID_ARG", NQ_E_INVALID_ARG}, {"NQ_E_IO", NQ_E_IO}, {"NQ_E_FORMAT", NQ_E_FORMAT},
      {"NQ_E_UNSUPPORTED", NQ_E_UNSUPPORTED}, {"NQ_E_CUDA", NQ_E_CUDA}, {"NQ_E_CONTEXT_FULL", NQ_E_CONTEXT_FULL},
      {"NQ_E_NO_DEVICE", NQ_E_NO_DEVICE}, {"NQ_E_OUT_OF_MEMORY", NQ_E_OUT_OF_MEMORY}};
  for (size_t i = 0; i < sizeof st / sizeof st[0]; i++)
    j += std::string(i ? ", " : "") + "\"" + st[i].first + "\": " + num(st[i].second);
  j += "}, \"structs\": {\"nq_config\": {\"size\": " + num(sizeof(nq_config)) + ", \"fields\": {";
#define NQ_CFG(f, t) field(#f, offsetof(nq_config, f), t)
  NQ_CFG(arch, "i32"); NQ_CFG(n_layers, "i32"); NQ_CFG(hidden_size, "i32"); NQ_CFG(intermediate_size, "i32");
  NQ_CFG(n_heads, "i32"); NQ_CFG(n_kv_heads, "i32"); NQ_CFG(head_dim, "i32"); NQ_CFG(vocab_rows, "i32");
  NQ_CFG(max_positions, "i32"); NQ_CFG(tied_embeddings, "i32"); NQ_CFG(qkv_bias, "i32");
  NQ_CFG(rope_scaling_type, "i32"); NQ_CFG(rope_theta, "f64"); NQ_CFG(rope_scaling_factor, "f32");
  NQ_CFG(rms_norm_eps, "f32"); NQ_CFG(bos_token_id, "i32"); NQ_CFG(eos_token_id, "i32");
  NQ_CFG(pad_token_id, "i32");
  field("rope_original_max_positions", offsetof(nq_config, rope_original_max_positions), "i32", true);
#undef NQ_CFG
  j += "}}, \"nq_sampling\": {\"size\": " + num(sizeof(nq_sampling)) + ", \"fields\": {";
  field("temperature", offsetof(nq_sampling, temperature), "f32");
  field("top_k", offsetof(nq_sampling, top_k), "i32");
  field("top_p", offsetof(nq_sampling, top_p), "f32");
  field("seed", offsetof(nq_sampling, seed), "u64", true);
  j += "}}}, \"format\": {\"magic\": \"" + std::string(ct::kMagic) + "\"";
  for (const ct::Named& v : ct::kScalars) j += std::string(", \"") + v.name + "\": " + num(v.value);
  j += ", \"int4_perm\": " + ints(ct::kInt4Perm, 8);
  j += ", \"int4_group_sizes\": " + ints(ct::kInt4GroupSizes, (int)(sizeof ct::kInt4GroupSizes / sizeof(int)));
  auto group = [&](const char* name, const ct::Named* v, size_t n) {
    j += std::string(", \"") + name + "\": {";
    for (size_t i = 0; i < n; i++) j += std::string(i ? ", \"" : "\"") + v[i].name + "\": " + num(v[i].value);
    j += "}";
  };
#define NQ_GROUP(name, table) group(name, table, sizeof table / sizeof table[0])
  NQ_GROUP("dtypes", ct::kDtypes); NQ_GROUP("archs", ct::kArchs); NQ_GROUP("rope_scaling", ct::kRopeScaling);
  NQ_GROUP("layouts", ct::kLayouts); NQ_GROUP("config_flags", ct::kConfigFlags);
  NQ_GROUP("blob_kinds", ct::kBlobKinds); NQ_GROUP("blob_encodings", ct::kBlobEncodings);
  NQ_GROUP("blob_kind_encodings", ct::kBlobKindEncodings);
  NQ_GROUP("header", ct::kHeaderOffsets); NQ_GROUP("config", ct::kConfigOffsets);
  NQ_GROUP("tensor_entry", ct::kTensorEntryOffsets); NQ_GROUP("blob_entry", ct::kBlobEntryOffsets);
#undef NQ_GROUP
  j += "}}";
  return j;
}

}  // namespace

namespace nq {

int check_session_pages(int pool_pages, int max_pages, int max_ctx, const int32_t* pages, int n, int position) {
  if (n < 0 || n > max_pages)
    return fail(NQ_E_INVALID_ARG, "set_pages: %d pages outside [0, %d] (the session's max_context %d)", n, max_pages,
                max_ctx);
  if (n > 0 && !pages) return fail(NQ_E_INVALID_ARG, "set_pages: NULL page list");
  for (int i = 0; i < n; i++)
    if (pages[i] < 0 || pages[i] >= pool_pages)
      return fail(NQ_E_INVALID_ARG, "set_pages: page id %d at index %d out of range [0, %d)", pages[i], i, pool_pages);
  if (n > 1) {
    std::vector<int32_t> sorted(pages, pages + n);
    std::sort(sorted.begin(), sorted.end());
    const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end()) return fail(NQ_E_INVALID_ARG, "set_pages: page id %d listed twice", *dup);
  }
  const int held = std::min(max_ctx, n * kPage);
  if (position < 0 || position > held)
    return fail(NQ_E_INVALID_ARG, "set_pages: position %d outside [0, %d] (%d pages of %d positions, max_context %d)",
                position, held, n, kPage, max_ctx);
  return NQ_OK;
}

}  // namespace nq

extern "C" {

const char* nq_last_error(void) { return nq::last_error(); }
int nq_abi_version(void) { return NQ_ABI_VERSION; }

const char* nq_abi_describe(void) {
  static const std::string json = describe_json();
  return json.c_str();
}

int nq_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
  return n;
}

int nq_device_memory(uint64_t* free_bytes, uint64_t* total_bytes) {
  if (!free_bytes || !total_bytes) return fail(NQ_E_INVALID_ARG, "nq_device_memory: NULL argument");
  size_t f = 0, t = 0;
  const cudaError_t e = cudaMemGetInfo(&f, &t);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? NQ_E_NO_DEVICE : NQ_E_CUDA,
                "cudaMemGetInfo: %s", cudaGetErrorString(e));
  }
  *free_bytes = f;
  *total_bytes = t;
  return NQ_OK;
}

int nq_model_check(const char* path) {
  if (!path) return fail(NQ_E_INVALID_ARG, "nq_model_check: NULL path");
  NQ_GUARD_BEGIN
  nq::ModelFile* f = nullptr;
  NQ_TRY(nq::open_model_file(path, false, &f));
  const int rc = nq::check_model(*f);
  delete f;
  return rc;
  NQ_GUARD_END
}

int nq_model_open(const char* path, int verify_checksums, nq_model** out) {
  if (!path || !out) return fail(NQ_E_INVALID_ARG, "nq_model_open: NULL argument");
  NQ_GUARD_BEGIN
  nq::Model* m = nullptr;
  NQ_TRY(nq::load_model(path, verify_checksums != 0, &m));
  *out = new nq_model{m};
  return NQ_OK;
  NQ_GUARD_END
}

int nq_model_config(const nq_model* m, nq_config* out) {
  if (!m || !out) return fail(NQ_E_INVALID_ARG, "nq_model_config: NULL argument");
  *out = m->m->cfg;
  return NQ_OK;
}

int nq_model_load_stats(const nq_model* m, double* seconds, uint64_t* device_bytes) {
  if (!m) return fail(NQ_E_INVALID_ARG, "nq_model_load_stats: NULL model");
  if (seconds) *seconds = m->m->load_seconds;
  if (device_bytes) *device_bytes = m->m->dev_bytes;
  return NQ_OK;
}

void nq_model_free(nq_model* m) {
  if (!m) return;
  delete m->m;
  delete m;
}

int nq_session_create(nq_model* m, int32_t max_context, const nq_sampling* sampling, nq_session** out) {
  if (!m || !out) return fail(NQ_E_INVALID_ARG, "nq_session_create: NULL argument");
  return create_session(m, nullptr, max_context, sampling, out);
}

int nq_kv_page_bytes(const nq_model* m, uint64_t* bytes) {
  if (!m || !bytes) return fail(NQ_E_INVALID_ARG, "nq_kv_page_bytes: NULL argument");
  *bytes = nq::kv_page_bytes(m->m->cfg);
  return NQ_OK;
}

int nq_kv_pool_create(nq_model* m, int32_t n_pages, nq_kv_pool** out) {
  if (!m || !out) return fail(NQ_E_INVALID_ARG, "nq_kv_pool_create: NULL argument");
  if (n_pages < 1 || n_pages > NQ_MAX_KV_POOL_PAGES)
    return fail(NQ_E_INVALID_ARG, "KV pool of %d pages outside [1, %d]", n_pages, NQ_MAX_KV_POOL_PAGES);
  NQ_GUARD_BEGIN
  nq::KvPool* p = nullptr;
  NQ_TRY(nq::kv_pool_create(m->m, n_pages, &p));
  *out = new nq_kv_pool{p};
  return NQ_OK;
  NQ_GUARD_END
}

int nq_kv_pool_poison(nq_kv_pool* p, const int32_t* pages, int32_t n) {
  if (!p) return fail(NQ_E_INVALID_ARG, "nq_kv_pool_poison: NULL pool");
  if (n < 0 || n > p->p->n_pages || (n > 0 && !pages))
    return fail(NQ_E_INVALID_ARG, "kv_pool_poison: %d pages outside [0, %d] or a NULL list", n, p->p->n_pages);
  for (int32_t i = 0; i < n; i++)
    if (pages[i] < 0 || pages[i] >= p->p->n_pages)
      return fail(NQ_E_INVALID_ARG, "kv_pool_poison: page id %d at index %d out of range [0, %d)", pages[i], i,
                  p->p->n_pages);
  NQ_GUARD_BEGIN
  return nq::kv_pool_poison(p->p, pages, n);
  NQ_GUARD_END
}

void nq_kv_pool_free(nq_kv_pool* p) {
  if (!p) return;
  nq::kv_pool_release(p->p);
  delete p;
}

int nq_session_create_pooled(nq_model* m, nq_kv_pool* pool, int32_t max_context, const nq_sampling* sampling,
                             nq_session** out) {
  if (!m || !pool || !out) return fail(NQ_E_INVALID_ARG, "nq_session_create_pooled: NULL argument");
  if (pool->p->m != m->m) return fail(NQ_E_INVALID_ARG, "nq_session_create_pooled: the pool belongs to another model");
  return create_session(m, pool->p, max_context, sampling, out);
}

// A session held by a pipelined batched step (nq_decode_batch_launch, not yet waited) takes no call that reads or
// writes its state until that step is waited; growing its page table at its position is the one exception.
static int refuse_in_flight(const nq_session* s, const char* what) {
  if (!s->s->in_flight) return NQ_OK;
  return fail(NQ_E_INVALID_ARG, "%s: the session is in a batched step in flight (nq_decode_batch_wait first)", what);
}

int nq_session_set_pages(nq_session* s, const int32_t* pages, int32_t n_pages, int32_t position) {
  if (!s) return fail(NQ_E_INVALID_ARG, "nq_session_set_pages: NULL session");
  nq::Session* ss = s->s;
  if (!ss->pool)
    return fail(NQ_E_INVALID_ARG, "set_pages: the session has a KV cache of its own (nq_session_create), not a pool's");
  NQ_TRY(nq::check_session_pages(ss->pool->n_pages, ss->max_pages, ss->max_ctx, pages, n_pages, position));
  if (position != ss->pos) NQ_TRY(refuse_in_flight(s, "set_pages at another position"));
  NQ_GUARD_BEGIN
  return nq::session_set_pages(ss, pages, n_pages, position);
  NQ_GUARD_END
}

int nq_session_set_sampling(nq_session* s, const nq_sampling* sampling) {
  if (!s) return fail(NQ_E_INVALID_ARG, "nq_session_set_sampling: NULL session");
  NQ_TRY(refuse_in_flight(s, "set_sampling"));
  NQ_TRY(check_sampling(sampling));
  return nq::session_set_sampling(s->s, sampling);
}

int nq_session_reset(nq_session* s) {
  if (!s) return fail(NQ_E_INVALID_ARG, "nq_session_reset: NULL session");
  NQ_TRY(refuse_in_flight(s, "reset"));
  return nq::session_reset(s->s);
}

int nq_session_position(const nq_session* s, int32_t* pos) {
  if (!s || !pos) return fail(NQ_E_INVALID_ARG, "nq_session_position: NULL argument");
  *pos = s->s->pos;
  return NQ_OK;
}

int nq_prefill(nq_session* s, const int32_t* tokens, int32_t n) {
  if (!s || !tokens) return fail(NQ_E_INVALID_ARG, "nq_prefill: NULL argument");
  NQ_TRY(refuse_in_flight(s, "prefill"));
  if (n <= 0) return fail(NQ_E_INVALID_ARG, "prefill: no tokens");
  NQ_TRY(check_tokens(*s->s, tokens, n));
  if ((long long)s->s->pos + n > s->s->capacity())
    return fail(NQ_E_CONTEXT_FULL, "context full: position %d + %d tokens > %s %d", s->s->pos, n, room(*s->s),
                s->s->capacity());
  NQ_GUARD_BEGIN
  return nq::session_prefill(s->s, tokens, n, nullptr);
  NQ_GUARD_END
}

int nq_decode(nq_session* s, int32_t token) {
  if (!s) return fail(NQ_E_INVALID_ARG, "nq_decode: NULL session");
  NQ_TRY(refuse_in_flight(s, "decode"));
  NQ_TRY(check_tokens(*s->s, &token, 1));
  if (s->s->pos + 1 > s->s->capacity())
    return fail(NQ_E_CONTEXT_FULL, "context full: position %d + 1 token > %s %d", s->s->pos, room(*s->s),
                s->s->capacity());
  return nq::session_decode(s->s, token);
}

int nq_get_logits(nq_session* s, float* out, int32_t n) {
  if (!s || !out) return fail(NQ_E_INVALID_ARG, "nq_get_logits: NULL argument");
  NQ_TRY(refuse_in_flight(s, "get_logits"));
  if (n != s->s->m->cfg.vocab_rows) return fail(NQ_E_INVALID_ARG, "nq_get_logits: n=%d, vocab_rows=%d", n, s->s->m->cfg.vocab_rows);
  if (!s->s->have_logits) return fail(NQ_E_INVALID_ARG, "nq_get_logits: no current logits (prefill or decode first)");
  NQ_CUDA(cudaStreamSynchronize(s->s->st));
  NQ_CUDA(cudaMemcpy(out, s->s->logits, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
  return NQ_OK;
}

int nq_logits_all(nq_session* s, const int32_t* tokens, int32_t n, float* out) {
  if (!s || !tokens || !out) return fail(NQ_E_INVALID_ARG, "nq_logits_all: NULL argument");
  NQ_TRY(refuse_in_flight(s, "logits_all"));
  if (n <= 0) return fail(NQ_E_INVALID_ARG, "logits_all: no tokens");
  NQ_TRY(check_tokens(*s->s, tokens, n));
  if (n > s->s->capacity())
    return fail(NQ_E_CONTEXT_FULL, "context full: %d tokens > %s %d", n, room(*s->s), s->s->capacity());
  NQ_GUARD_BEGIN
  NQ_TRY(nq::session_reset(s->s));
  return nq::session_prefill(s->s, tokens, n, out);
  NQ_GUARD_END
}

int nq_generate(nq_session* s, int32_t max_new, const int32_t* stop_ids, int32_t n_stop, nq_token_callback cb,
                void* user, int32_t* out_tokens, int32_t* n_out) {
  if (!s || !n_out || (n_stop > 0 && !stop_ids) || n_stop < 0) return fail(NQ_E_INVALID_ARG, "nq_generate: bad argument");
  NQ_TRY(refuse_in_flight(s, "generate"));
  *n_out = 0;
  if (max_new < 0) return fail(NQ_E_INVALID_ARG, "max_new %d < 0", max_new);
  if (max_new > 0) {
    if (!s->s->have_logits) return fail(NQ_E_INVALID_ARG, "generate: no logits yet (prefill first)");
    if (s->s->pos >= s->s->capacity())
      return fail(NQ_E_CONTEXT_FULL, "context full at position %d (%s %d)", s->s->pos, room(*s->s), s->s->capacity());
  }
  NQ_GUARD_BEGIN
  return nq::session_generate(s->s, max_new, stop_ids, n_stop, cb, user, out_tokens, n_out);
  NQ_GUARD_END
}

int nq_sample_steered(nq_session* s, const int32_t* bias_ids, const float* bias_values, int32_t n_bias,
                      const int32_t* token_mask, int32_t n_mask_words, float presence_penalty, float frequency_penalty,
                      int32_t top_n, int32_t* out_token, float* out_logprob, int32_t* out_top_ids,
                      float* out_top_logprobs, int32_t* out_n_top) {
  if (!s || !out_token) return fail(NQ_E_INVALID_ARG, "nq_sample_steered: NULL argument");
  NQ_TRY(refuse_in_flight(s, "sample_steered"));
  const int32_t V = s->s->m->cfg.vocab_rows;
  if (!s->s->have_logits) return fail(NQ_E_INVALID_ARG, "sample_steered: no current logits (prefill or decode first)");
  if (n_bias < 0 || n_bias > NQ_MAX_LOGIT_BIAS || (n_bias > 0 && (!bias_ids || !bias_values)))
    return fail(NQ_E_INVALID_ARG, "sample_steered: n_bias %d outside [0, %d] or NULL bias arrays", n_bias, NQ_MAX_LOGIT_BIAS);
  for (int32_t j = 0; j < n_bias; j++) {
    if (bias_ids[j] < 0 || bias_ids[j] >= V)
      return fail(NQ_E_INVALID_ARG, "sample_steered: bias token id %d out of range [0, %d)", bias_ids[j], V);
    if (!std::isfinite(bias_values[j])) return fail(NQ_E_INVALID_ARG, "sample_steered: bias value %g is not finite", bias_values[j]);
    for (int32_t k = 0; k < j; k++)
      if (bias_ids[k] == bias_ids[j]) return fail(NQ_E_INVALID_ARG, "sample_steered: bias token id %d given twice", bias_ids[j]);
  }
  if (token_mask) {
    const int32_t words = (V + 31) / 32;
    if (n_mask_words != words)
      return fail(NQ_E_INVALID_ARG, "sample_steered: token mask of %d words, vocab_rows %d needs %d", n_mask_words, V, words);
    bool any = false;
    for (int32_t w = 0; w < words && !any; w++) {
      const uint32_t valid = (w == words - 1 && V % 32) ? ((1u << (V % 32)) - 1u) : 0xFFFFFFFFu;
      any = ((uint32_t)token_mask[w] & valid) != 0;
    }
    if (!any) return fail(NQ_E_INVALID_ARG, "sample_steered: the token mask allows no token");
  }
  if (!std::isfinite(presence_penalty) || !std::isfinite(frequency_penalty))
    return fail(NQ_E_INVALID_ARG, "sample_steered: penalties must be finite");
  if (top_n < -1 || top_n > NQ_MAX_TOP_LOGPROBS)
    return fail(NQ_E_INVALID_ARG, "sample_steered: top_n %d outside [-1, %d]", top_n, NQ_MAX_TOP_LOGPROBS);
  if (top_n >= 0 && (!out_logprob || !out_n_top || (top_n > 0 && (!out_top_ids || !out_top_logprobs))))
    return fail(NQ_E_INVALID_ARG, "sample_steered: NULL logprob output");
  NQ_GUARD_BEGIN
  return nq::session_sample_steered(s->s, bias_ids, bias_values, n_bias, token_mask, presence_penalty,
                                    frequency_penalty, top_n, out_token, out_logprob, out_top_ids, out_top_logprobs,
                                    out_n_top);
  NQ_GUARD_END
}

void nq_session_free(nq_session* s) {
  if (!s) return;
  delete s->s;
  delete s;
}

int nq_batch_create(nq_model* m, int32_t max_batch, nq_batch** out) {
  if (!m || !out) return fail(NQ_E_INVALID_ARG, "nq_batch_create: NULL argument");
  if (max_batch < 1 || max_batch > NQ_MAX_BATCH)
    return fail(NQ_E_INVALID_ARG, "max_batch %d out of range [1, %d]", max_batch, NQ_MAX_BATCH);
  NQ_GUARD_BEGIN
  nq::Batch* b = nullptr;
  NQ_TRY(nq::batch_create(m->m, max_batch, &b));
  *out = new nq_batch{b};
  return NQ_OK;
  NQ_GUARD_END
}

// The sessions of one batched step: n in [1, max_batch] distinct sessions of b's model with room for one more
// position; tokens in range except rows fed by chain (chain[i] >= 0: a row of the most recent step, each at most
// once). in_flight_ok: a session may still be in a launched step (it continues there).
static int batch_sessions(nq_batch* b, nq_session* const* sessions, const int32_t* tokens, const int32_t* chain,
                          int32_t n, bool in_flight_ok, const char* what, std::vector<nq::Session*>& ss) {
  if (n < 1 || n > b->b->max_batch) return fail(NQ_E_INVALID_ARG, "%s: n %d out of range [1, %d]", what, n, b->b->max_batch);
  ss.resize(n);
  for (int32_t i = 0; i < n; i++) {
    if (!sessions[i]) return fail(NQ_E_INVALID_ARG, "%s: session %d is NULL", what, i);
    nq::Session* s = sessions[i]->s;
    if (s->m != b->b->m) return fail(NQ_E_INVALID_ARG, "%s: session %d belongs to another model", what, i);
    for (int32_t j = 0; j < i; j++)
      if (ss[j] == s) return fail(NQ_E_INVALID_ARG, "%s: session %d appears twice (also at %d)", what, i, j);
    if (s->in_flight && !in_flight_ok)
      return fail(NQ_E_INVALID_ARG, "%s: session %d is in a batched step in flight (nq_decode_batch_wait first)", what, i);
    if (chain && chain[i] >= 0) {
      if (chain[i] >= b->b->last_n)
        return fail(NQ_E_INVALID_ARG, "%s: chain[%d] = %d, the most recent step had %d rows", what, i, chain[i], b->b->last_n);
      for (int32_t j = 0; j < i; j++)
        if (chain[j] == chain[i]) return fail(NQ_E_INVALID_ARG, "%s: chain[%d] = chain[%d] = %d", what, i, j, chain[i]);
    } else {
      if (chain && chain[i] != -1) return fail(NQ_E_INVALID_ARG, "%s: chain[%d] = %d (-1 or a row)", what, i, chain[i]);
      NQ_TRY(check_tokens(*s, tokens + i, 1));
    }
    if (s->pos + 1 > s->capacity())
      return fail(NQ_E_CONTEXT_FULL, "context full: session %d at position %d, %s %d", i, s->pos, room(*s), s->capacity());
    ss[i] = s;
  }
  return NQ_OK;
}

int nq_decode_batch(nq_batch* b, nq_session* const* sessions, const int32_t* tokens, int32_t n, int32_t* next_tokens,
                    float* logits, int32_t n_logits) {
  if (!b || !sessions || !tokens || !next_tokens) return fail(NQ_E_INVALID_ARG, "nq_decode_batch: NULL argument");
  if (n_logits < 0 || n_logits > n || (n_logits > 0) != (logits != nullptr))
    return fail(NQ_E_INVALID_ARG, "nq_decode_batch: n_logits %d outside [0, n = %d] or disagrees with logits (%s)",
                n_logits, n, logits ? "given" : "NULL");
  if (!b->b->flight.empty())
    return fail(NQ_E_INVALID_ARG, "nq_decode_batch: %d launched steps not waited (nq_decode_batch_wait first)",
                (int)b->b->flight.size());
  NQ_GUARD_BEGIN
  std::vector<nq::Session*> ss;
  NQ_TRY(batch_sessions(b, sessions, tokens, nullptr, n, false, "nq_decode_batch", ss));
  return nq::batch_decode(b->b, ss.data(), tokens, n, next_tokens, logits, n_logits);
  NQ_GUARD_END
}

int nq_decode_batch_launch(nq_batch* b, nq_session* const* sessions, const int32_t* tokens, const int32_t* chain,
                           int32_t n) {
  if (!b || !sessions || !tokens) return fail(NQ_E_INVALID_ARG, "nq_decode_batch_launch: NULL argument");
  if ((int)b->b->flight.size() >= nq::Batch::kSlots)
    return fail(NQ_E_INVALID_ARG, "nq_decode_batch_launch: %d steps in flight already (nq_decode_batch_wait first)",
                (int)b->b->flight.size());
  NQ_GUARD_BEGIN
  std::vector<nq::Session*> ss;
  NQ_TRY(batch_sessions(b, sessions, tokens, chain, n, true, "nq_decode_batch_launch", ss));
  return nq::batch_launch(b->b, ss.data(), tokens, chain, n, nullptr, 0);
  NQ_GUARD_END
}

int nq_decode_batch_wait(nq_batch* b, int32_t* next_tokens, int32_t n) {
  if (!b || !next_tokens) return fail(NQ_E_INVALID_ARG, "nq_decode_batch_wait: NULL argument");
  if (b->b->flight.empty()) return fail(NQ_E_INVALID_ARG, "nq_decode_batch_wait: no launched step to wait for");
  if (n != b->b->flight.front().n)
    return fail(NQ_E_INVALID_ARG, "nq_decode_batch_wait: n %d, the step had %d rows", n, b->b->flight.front().n);
  NQ_GUARD_BEGIN
  return nq::batch_wait(b->b, next_tokens, n);
  NQ_GUARD_END
}

void nq_batch_free(nq_batch* b) {
  if (!b) return;
  delete b->b;
  delete b;
}

}  // extern "C"
