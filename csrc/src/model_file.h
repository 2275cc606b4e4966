// Host side of a .nanoqwen file: mmap, header/directory parsing and the spec's validation rules
// (spec/nanoqwen-format.md). No CUDA here, so the rules are testable without a GPU.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <unordered_map>
#include "nanoqwen.h"
#include "format_contract.h"

namespace nq {

enum DType : uint32_t {
  DT_F32 = contract::kDTypeF32, DT_F16 = contract::kDTypeF16, DT_BF16 = contract::kDTypeBf16, DT_INT4G = contract::kDTypeInt4g
};

struct TensorInfo {
  std::string name;
  uint32_t dtype = 0, layout_id = 0, group_size = 0, ndim = 0;
  uint64_t shape[4] = {0, 0, 0, 0};
  uint64_t offset = 0, nbytes = 0;  // absolute file offset, byte length
  uint32_t crc32c = 0;
};

struct ModelFile {
  int fd = -1;
  const uint8_t* map = nullptr;  // whole file, read-only
  uint64_t size = 0;
  uint64_t data_offset = 0;      // first data item (tensors start here)
  uint64_t tensors_end = 0;      // end of the last tensor (blobs follow; not uploaded)
  nq_config cfg{};
  std::vector<TensorInfo> tensors;
  std::unordered_map<std::string, size_t> by_name;

  ~ModelFile();
  const TensorInfo* find(const std::string& name) const;
};

// Opens, maps and validates. On failure returns a NQ_E_* code with the message set; *out untouched.
int open_model_file(const char* path, bool verify_checksums, ModelFile** out);

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
uint64_t align128(uint64_t n);

}  // namespace nq
