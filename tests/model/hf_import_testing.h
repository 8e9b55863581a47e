// What the Hugging Face import tests share (test_hf_gpt_oss, test_hf_deepseek_fp8): a one-rank
// ZeroParamStore whose values start as NaN, so that a param the import does not write shows, and
// float32 values as a store of a dtype holds them.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/checkpoint/safetensors.h"
#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/model/zero_params.h"
#include "core/runtime/backend.h"

namespace moepeak::test_support {

// One rank's ZeroParamStore of `model` in `dtype`, its values poisoned with NaN.
struct PoisonedStore {
  std::unique_ptr<Backend> backend = Backend::create(BackendOptions{});
  Stream& stream = backend->default_stream();
  std::unique_ptr<Comm> comm = make_comm(*backend, RankInfo{});
  ZeroParamStore params;
  PoisonedStore(const ModelConfig& model, DType dtype) : params(*backend, model, dtype, *comm) {
    const auto& infos = params.layout().params();
    for (size_t i = 0; i < infos.size(); ++i) {
      const std::vector<float> nan(static_cast<size_t>(infos[i].shape.numel()), NAN);
      std::vector<char> bytes(nan.size() * dtype_size(dtype));
      convert_float_elements(nan.data(), "F32", bytes.data(), safetensors_dtype_name(dtype),
                             nan.size());
      params.load_full(static_cast<int>(i), bytes.data(), stream);
    }
  }
  // Param i's full values as floats.
  std::vector<float> value(int i) {
    const std::vector<char> bytes = params.gather_full(i, stream);
    std::vector<float> out(bytes.size() / dtype_size(params.dtype()));
    convert_float_elements(bytes.data(), safetensors_dtype_name(params.dtype()), out.data(), "F32",
                           out.size());
    return out;
  }
};

// `values` rounded to `dtype` (f32 or bf16) and back: the store's view of float32 values.
inline std::vector<float> as_stored(const std::vector<float>& values, DType dtype) {
  if (dtype == DType::f32) return values;
  std::vector<uint16_t> bf16(values.size());
  std::vector<float> out(values.size());
  convert_float_elements(values.data(), "F32", bf16.data(), "BF16", values.size());
  convert_float_elements(bf16.data(), "BF16", out.data(), "F32", values.size());
  return out;
}

}  // namespace moepeak::test_support
