// A small DeepSeek-V3 in the layout of its FP8 release, written by hand, for the FP8 import and
// the MTP carrying tests (tests/model/test_hf_deepseek_fp8.cpp).
//
// Every 2-D projection (attention, dense MLP, shared and routed experts; not the embedding, the
// router's mlp.gate.weight or lm_head) is stored as F8_E4M3 codes with an F32 <name>_scale_inv of
// block x block blocks (partial at the edges when a dim is not a multiple of the block), the other
// tensors as BF16 (the router's correction bias as F32, as released). The codes are drawn directly
// (uniform over the 254 non-NaN codes), so the weight each encodes is known without an encoder:
// the float64 product of the code's value — decoded here from its bit fields, independently of
// core/checkpoint/fp8.h — and its block's scale, rounded once to float32 (exact in double: 4 + 24
// significant bits). num_nextn_predict_layers MTP modules follow at model.layers.{L}.* (DeepSeek's
// names: embed_tokens, enorm, hnorm, eh_proj, shared_head.{norm,head} and the last layer's tensors
// renamed), of random bytes in the same dtypes: they are only ever copied.
#pragma once

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/checkpoint/hf_config.h"
#include "core/checkpoint/safetensors.h"
#include "core/config/config.h"
#include "core/model/param_layout.h"

namespace moepeak::test_support {

// 2 layers (the first dense), 8 experts of 12 in 4 groups, 2 shared experts, latent attention
// (q_lora 16, kv_lora 12, nope 8 + rope 4, v 6), H 32, vocab 64, one MTP layer.
inline ModelConfig small_deepseek(int64_t mtp_layers = 1) {
  ModelConfig m;
  m.model_type = ModelType::deepseek_v3;
  m.vocab_size = 64;
  m.hidden_size = 32;
  m.intermediate_size = 40;
  m.moe_intermediate_size = 12;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 4;
  m.q_lora_rank = 16;
  m.kv_lora_rank = 12;
  m.qk_nope_head_dim = 8;
  m.qk_rope_head_dim = 4;
  m.v_head_dim = 6;
  m.head_dim = 12;
  m.num_local_experts = 8;
  m.num_experts_per_tok = 2;
  m.n_group = 4;
  m.topk_group = 2;
  m.routed_scaling_factor = 2.5;
  m.n_shared_experts = 2;
  m.first_k_dense_replace = 1;
  m.rope_interleave = true;
  m.max_position_embeddings = 64;
  m.num_nextn_predict_layers = mtp_layers;
  return m;
}

// float8_e4m3fn from its fields, in double (NaN for 0x7F and 0xFF).
inline double e4m3fn_value(uint8_t code) {
  const int sign = code >> 7, e = (code >> 3) & 15, mantissa = code & 7;
  if (e == 15 && mantissa == 7) return NAN;
  const double v = e == 0 ? std::ldexp(mantissa / 8.0, -6) : std::ldexp(1 + mantissa / 8.0, e - 7);
  return sign ? -v : v;
}

struct StoredTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

struct DeepseekHub {
  ModelConfig model;
  int64_t block = 0;
  std::map<std::string, StoredTensor> stored;          // every tensor as the files hold it
  std::map<std::string, std::vector<float>> expected;  // each param's float32 value
  std::set<std::string> fp8;                           // the params stored as FP8
  std::set<std::string> mtp;                           // the stored names of the MTP tensors
};

inline bool released_as_fp8(const std::string& name, const std::vector<int64_t>& shape) {
  return shape.size() == 2 && !name.ends_with("embed_tokens.weight") && name != "lm_head.weight" &&
         !name.ends_with(".mlp.gate.weight") && !name.ends_with("shared_head.head.weight") &&
         !name.ends_with(".eh_proj.weight");
}

// FP8 codes (no NaN) and scales (2^[-10, -2] times [1, 2)) of `shape` in blocks of `block`; the
// float32 weight they encode.
inline std::vector<float> draw_fp8(std::mt19937& rng, const std::vector<int64_t>& shape,
                                   int64_t block, StoredTensor& codes, StoredTensor& scales) {
  const int64_t rows = shape[0], cols = shape[1];
  const int64_t sr = (rows + block - 1) / block, sc = (cols + block - 1) / block;
  codes = {"F8_E4M3", shape, std::vector<uint8_t>(static_cast<size_t>(rows * cols))};
  for (uint8_t& c : codes.bytes) {
    do {
      c = static_cast<uint8_t>(rng() & 0xFF);
    } while ((c & 0x7F) == 0x7F);
  }
  std::vector<float> s(static_cast<size_t>(sr * sc));
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (float& v : s) v = std::ldexp(mantissa(rng), static_cast<int>(rng() % 9) - 10);
  scales = {"F32", {sr, sc}, std::vector<uint8_t>(s.size() * 4)};
  std::memcpy(scales.bytes.data(), s.data(), scales.bytes.size());
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const size_t at = static_cast<size_t>(i * cols + j);
      w[at] = static_cast<float>(
          e4m3fn_value(codes.bytes[at]) *
          static_cast<double>(s[static_cast<size_t>((i / block) * sc + j / block)]));
    }
  }
  return w;
}

// A tensor of random values (std 0.2, norms around 1) stored as `dtype` (BF16 or F32); its
// float32 value.
inline std::vector<float> draw_plain(std::mt19937& rng, const std::string& name,
                                     const std::vector<int64_t>& shape, const std::string& dtype,
                                     StoredTensor& out) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::normal_distribution<float> normal(0.0f, 0.2f);
  const bool norm = name.find("norm") != std::string::npos;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng) + (norm ? 1.0f : 0.0f);
  out = {dtype, shape, std::vector<uint8_t>(v.size() * safetensors_element_size(dtype))};
  convert_float_elements(v.data(), "F32", out.bytes.data(), dtype, v.size());
  convert_float_elements(out.bytes.data(), dtype, v.data(), "F32", v.size());
  return v;
}

// The checkpoint of `m` with FP8 blocks of `block` (0: no FP8, every tensor BF16).
inline DeepseekHub deepseek_hub(const ModelConfig& m, int64_t block, uint32_t seed = 1) {
  DeepseekHub hub;
  hub.model = m;
  hub.block = block;
  std::mt19937 rng(seed);
  const ParamLayout layout(m);
  auto add = [&](const std::string& name, const std::vector<int64_t>& shape, bool mtp) {
    std::vector<float> value;
    if (block > 0 && released_as_fp8(name, shape)) {
      value = draw_fp8(rng, shape, block, hub.stored[name], hub.stored[name + "_scale_inv"]);
      if (!mtp) hub.fp8.insert(name);
      if (mtp) hub.mtp.insert(name + "_scale_inv");
    } else {
      const bool f32 = name.ends_with("e_score_correction_bias");
      value = draw_plain(rng, name, shape, f32 ? "F32" : "BF16", hub.stored[name]);
    }
    if (mtp) {
      hub.mtp.insert(name);
    } else {
      hub.expected[name] = value;
    }
  };
  for (const ParamInfo& p : layout.params()) add(p.name, p.shape.dims(), false);
  const std::string last = "model.layers." + std::to_string(m.num_hidden_layers - 1) + ".";
  const int64_t H = m.hidden_size, V = m.vocab_size;
  for (int64_t j = 0; j < m.num_nextn_predict_layers; ++j) {
    const std::string at = "model.layers." + std::to_string(m.num_hidden_layers + j) + ".";
    add(at + "embed_tokens.weight", {V, H}, true);
    add(at + "enorm.weight", {H}, true);
    add(at + "hnorm.weight", {H}, true);
    add(at + "eh_proj.weight", {H, 2 * H}, true);
    add(at + "shared_head.norm.weight", {H}, true);
    add(at + "shared_head.head.weight", {V, H}, true);
    for (const ParamInfo& p : layout.params()) {
      if (p.name.rfind(last, 0) == 0) add(at + p.name.substr(last.size()), p.shape.dims(), true);
    }
  }
  return hub;
}

// The quantization_config of DeepSeek-V3's released config.json, with blocks of `block`.
inline nlohmann::json fp8_quantization(int64_t block) {
  return {{"activation_scheme", "dynamic"},
          {"fmt", "e4m3"},
          {"quant_method", "fp8"},
          {"weight_block_size", {block, block}}};
}

// Writes `hub` as a Hugging Face directory: config.json (the family's, plus `quantization` as
// quantization_config unless null), the tensors in one model.safetensors or `files` files (round
// robin in name order, so a weight and its scales may lie in different files) with an index.
inline void write_deepseek_dir(const std::filesystem::path& dir, const DeepseekHub& hub,
                               int files = 1, const nlohmann::json& quantization = nullptr) {
  std::filesystem::create_directories(dir);
  nlohmann::json config = model_config_json(hub.model, "bfloat16");
  if (!quantization.is_null()) config["quantization_config"] = quantization;
  write_file_atomically((dir / "config.json").string(), config.dump(2));
  std::vector<SafetensorsWriter> writers(static_cast<size_t>(files));
  nlohmann::json weight_map = nlohmann::json::object();
  int k = 0;
  for (const auto& [name, t] : hub.stored) {
    writers[static_cast<size_t>(k % files)].add(name, t.dtype, t.shape, t.bytes.data(),
                                                t.bytes.size());
    weight_map[name] = "model-" + std::to_string(k % files) + ".safetensors";
    ++k;
  }
  if (files == 1) {
    writers[0].write((dir / "model.safetensors").string());
    return;
  }
  for (int f = 0; f < files; ++f) {
    writers[static_cast<size_t>(f)].write(
        (dir / ("model-" + std::to_string(f) + ".safetensors")).string());
  }
  write_file_atomically((dir / "model.safetensors.index.json").string(),
                        nlohmann::json{{"weight_map", weight_map}}.dump());
}

}  // namespace moepeak::test_support
