// A model resident on the device: the file's tensor data in one allocation, norms/biases as f32.
#pragma once
#include <vector>
#include "model_file.h"
#include "kernels.h"

namespace nq {

struct Layer {
  LinW q, k, v, o, gate, up, down;
  const float *ln1 = nullptr, *ln2 = nullptr;            // input_layernorm, post_attention_layernorm (H) f32
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // q/k/v biases f32, or null
};

struct Model {
  ModelFile* file = nullptr;
  nq_config cfg{};
  uint8_t* dev = nullptr;        // tensor data [data_offset, tensors_end) of the file, same relative layout
  uint64_t dev_bytes = 0;
  float* aux = nullptr;          // 1-D tensors converted to f32
  std::vector<Layer> layers;
  const void* embed = nullptr;
  int embed_dtype = 0;
  LinW lm_head;
  const float* final_norm = nullptr;
  double load_seconds = 0.0;
  ~Model();
};

// Checks that this library runs the validated file (kernel limits, every tensor present with the shape and dtype
// it needs); NQ_E_UNSUPPORTED / NQ_E_FORMAT with the reason. No device needed.
int check_model(const ModelFile& f);
int load_model(const char* path, bool verify, Model** out);

}  // namespace nq
