// The C ABI (include/nanoqwen.h): argument checks, then the C++ internals. No exception crosses it.
#include "session.h"
#include <new>

struct nq_model { nq::Model* m; };
struct nq_session { nq::Session* s; };

using nq::fail;

#define NQ_GUARD_BEGIN try {
#define NQ_GUARD_END                                                                  \
  }                                                                                   \
  catch (const std::bad_alloc&) { return fail(NQ_E_INVALID_ARG, "out of host memory"); } \
  catch (...) { return fail(NQ_E_INVALID_ARG, "internal error (exception)"); }

extern "C" {

const char* nq_last_error(void) { return nq::last_error(); }
int nq_abi_version(void) { return NQ_ABI_VERSION; }

int nq_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
  return n;
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
  NQ_GUARD_BEGIN
  nq::Session* s = nullptr;
  NQ_TRY(nq::session_create(m->m, max_context, sampling, &s));
  *out = new nq_session{s};
  return NQ_OK;
  NQ_GUARD_END
}

int nq_session_set_sampling(nq_session* s, const nq_sampling* sampling) {
  if (!s) return fail(NQ_E_INVALID_ARG, "nq_session_set_sampling: NULL session");
  return nq::session_set_sampling(s->s, sampling);
}

int nq_session_reset(nq_session* s) {
  if (!s) return fail(NQ_E_INVALID_ARG, "nq_session_reset: NULL session");
  return nq::session_reset(s->s);
}

int nq_session_position(const nq_session* s, int32_t* pos) {
  if (!s || !pos) return fail(NQ_E_INVALID_ARG, "nq_session_position: NULL argument");
  *pos = s->s->pos;
  return NQ_OK;
}

int nq_prefill(nq_session* s, const int32_t* tokens, int32_t n) {
  if (!s || !tokens) return fail(NQ_E_INVALID_ARG, "nq_prefill: NULL argument");
  NQ_GUARD_BEGIN
  return nq::session_prefill(s->s, tokens, n, nullptr);
  NQ_GUARD_END
}

int nq_decode(nq_session* s, int32_t token) {
  if (!s) return fail(NQ_E_INVALID_ARG, "nq_decode: NULL session");
  return nq::session_decode(s->s, token);
}

int nq_get_logits(nq_session* s, float* out, int32_t n) {
  if (!s || !out) return fail(NQ_E_INVALID_ARG, "nq_get_logits: NULL argument");
  if (n != s->s->m->cfg.vocab_rows) return fail(NQ_E_INVALID_ARG, "nq_get_logits: n=%d, vocab_rows=%d", n, s->s->m->cfg.vocab_rows);
  if (!s->s->have_logits) return fail(NQ_E_INVALID_ARG, "nq_get_logits: no current logits (prefill or decode first)");
  NQ_CUDA(cudaStreamSynchronize(s->s->st));
  NQ_CUDA(cudaMemcpy(out, s->s->logits, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
  return NQ_OK;
}

int nq_logits_all(nq_session* s, const int32_t* tokens, int32_t n, float* out) {
  if (!s || !tokens || !out) return fail(NQ_E_INVALID_ARG, "nq_logits_all: NULL argument");
  NQ_GUARD_BEGIN
  NQ_TRY(nq::session_reset(s->s));
  return nq::session_prefill(s->s, tokens, n, out);
  NQ_GUARD_END
}

int nq_generate(nq_session* s, int32_t max_new, const int32_t* stop_ids, int32_t n_stop, nq_token_callback cb,
                void* user, int32_t* out_tokens, int32_t* n_out) {
  if (!s || !n_out || (n_stop > 0 && !stop_ids) || n_stop < 0) return fail(NQ_E_INVALID_ARG, "nq_generate: bad argument");
  NQ_GUARD_BEGIN
  return nq::session_generate(s->s, max_new, stop_ids, n_stop, cb, user, out_tokens, n_out);
  NQ_GUARD_END
}

void nq_session_free(nq_session* s) {
  if (!s) return;
  delete s->s;
  delete s;
}

}  // extern "C"
