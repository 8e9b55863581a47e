// A small gpt-oss in the Hub's layout, written by hand, for the Hugging Face import, export and
// step-dump tests (tests/model/test_hf_gpt_oss.cpp, tests/parallel/test_hf_gpt_oss_ranks.cpp).
//
// The Hub's tensors are named and shaped here from transformers' GptOssExperts, not from
// HubLayout, and each param's expected values are read out of them by the layout's definition
// (gate_up_proj[e, h, 2i] = w1[i, h], gate_up_proj[e, h, 2i + 1] = w3[i, h], down_proj[e, i, h] =
// w2[h, i], gate_up_proj_bias[e, 2i] = b1[i], [e, 2i + 1] = b3[i], down_proj_bias[e, h] = b2[h]),
// so the tests hold the placements to it rather than to themselves.
#pragma once

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/checkpoint/hf_config.h"
#include "core/checkpoint/mxfp4.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/shard_io.h"
#include "core/checkpoint/shard_manifest.h"
#include "core/config/config.h"
#include "core/model/param_layout.h"

namespace moepeak::test_support {

// H 32, I 32 (rows of 32: whole MXFP4 blocks both ways), E 4 top-2, 2 layers, 4 heads / 2 kv of
// head_dim 8, vocab 64, untied head, attention biases and sinks.
inline ModelConfig small_gpt_oss(int64_t intermediate = 32) {
  ModelConfig m;
  m.model_type = ModelType::gpt_oss;
  m.vocab_size = 64;
  m.hidden_size = 32;
  m.intermediate_size = intermediate;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 8;
  m.num_local_experts = 4;
  m.num_experts_per_tok = 2;
  m.attention_bias = true;
  m.max_position_embeddings = 64;
  return m;
}

// Hub tensors by name: shape and float32 values.
struct HubValues {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::vector<float>> values;
};

inline bool is_expert_piece(Piece p) {
  return p == Piece::expert_gate || p == Piece::expert_up || p == Piece::expert_down ||
         p == Piece::expert_gate_bias || p == Piece::expert_up_bias || p == Piece::expert_down_bias;
}

inline std::string experts_prefix(int layer) {
  return "model.layers." + std::to_string(layer) + ".mlp.experts.";
}

// Every Hub tensor of `m` with distinct values: element j of the k-th tensor is
// +-(base_k + j + 1) * 2^-12 (exact in f32), alternating in sign.
inline HubValues gpt_oss_hub_values(const ModelConfig& m) {
  const ParamLayout layout(m);
  const int64_t E = m.num_local_experts, H = m.hidden_size, I = m.intermediate_size;
  HubValues hub;
  for (const ParamInfo& p : layout.params()) {
    if (!is_expert_piece(p.piece.piece)) hub.shapes[p.name] = p.shape.dims();
  }
  for (int l = 0; l < m.num_hidden_layers; ++l) {
    const std::string x = experts_prefix(l);
    hub.shapes[x + "gate_up_proj"] = {E, H, 2 * I};
    hub.shapes[x + "gate_up_proj_bias"] = {E, 2 * I};
    hub.shapes[x + "down_proj"] = {E, I, H};
    hub.shapes[x + "down_proj_bias"] = {E, H};
  }
  int64_t base = 0;
  for (const auto& [name, shape] : hub.shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float>& v = hub.values[name];
    for (int64_t j = 0; j < n; ++j) {
      v.push_back(std::ldexp(static_cast<float>(base + j + 1), -12) * (j % 2 ? -1.0f : 1.0f));
    }
    base += n;
  }
  return hub;
}

// Param `p`'s values read out of the Hub tensors by the layout's definition (see above).
inline std::vector<float> expected_param(const ParamInfo& p, const HubValues& hub,
                                         const ModelConfig& m) {
  const int64_t H = m.hidden_size, I = m.intermediate_size;
  const int64_t e = p.piece.expert;
  const std::string x = experts_prefix(p.piece.layer);
  std::vector<float> out;
  switch (p.piece.piece) {
    case Piece::expert_gate:
    case Piece::expert_up: {
      const std::vector<float>& gate_up = hub.values.at(x + "gate_up_proj");
      const int64_t odd = p.piece.piece == Piece::expert_up;
      for (int64_t i = 0; i < I; ++i) {
        for (int64_t h = 0; h < H; ++h) out.push_back(gate_up[(e * H + h) * 2 * I + 2 * i + odd]);
      }
      return out;
    }
    case Piece::expert_down: {
      const std::vector<float>& down = hub.values.at(x + "down_proj");
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < I; ++i) out.push_back(down[(e * I + i) * H + h]);
      }
      return out;
    }
    case Piece::expert_gate_bias:
    case Piece::expert_up_bias: {
      const std::vector<float>& bias = hub.values.at(x + "gate_up_proj_bias");
      const int64_t odd = p.piece.piece == Piece::expert_up_bias;
      for (int64_t i = 0; i < I; ++i) out.push_back(bias[e * 2 * I + 2 * i + odd]);
      return out;
    }
    case Piece::expert_down_bias: {
      const std::vector<float>& bias = hub.values.at(x + "down_proj_bias");
      return std::vector<float>(bias.begin() + e * H, bias.begin() + (e + 1) * H);
    }
    default:
      return hub.values.at(p.name);
  }
}

// X (E, a, b) with its last two dims swapped: (E, b, a).
inline std::vector<float> swap_last_two(const std::vector<float>& x,
                                        const std::vector<int64_t>& shape) {
  const int64_t E = shape[0], a = shape[1], b = shape[2];
  std::vector<float> out(x.size());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < a; ++i) {
      for (int64_t j = 0; j < b; ++j) out[(e * b + j) * a + i] = x[(e * a + i) * b + j];
    }
  }
  return out;
}

// Replaces the values of Hub tensor `name` (E, a, b) with values MXFP4 holds exactly: per block
// of 32 of its decode (E, b, a), a random scale in 2^[-6, 5] and random E2M1 codes.
inline void make_mxfp4_exact(HubValues& hub, const std::string& name, uint32_t seed) {
  const std::vector<int64_t>& shape = hub.shapes.at(name);
  std::vector<float>& x = hub.values.at(name);
  std::mt19937 rng(seed);
  std::vector<float> decoded(x.size());
  for (size_t g = 0; g < decoded.size() / kMxfp4BlockSize; ++g) {
    const int exponent = static_cast<int>(rng() % 12) - 6;
    for (int64_t j = 0; j < kMxfp4BlockSize; ++j) {
      decoded[g * kMxfp4BlockSize + j] = std::ldexp(kMxfp4Values[rng() % 16], exponent);
    }
  }
  x = swap_last_two(decoded, {shape[0], shape[2], shape[1]});
}

// MXFP4 of Hub tensor X (E, a, b): blocks and scales of its decode (E, b, a), mxfp4_quantize's.
struct Mxfp4Bytes {
  std::vector<uint8_t> blocks, scales;
  std::vector<int64_t> blocks_shape, scales_shape;
};
inline Mxfp4Bytes mxfp4_of(const std::vector<float>& x, const std::vector<int64_t>& shape) {
  const std::vector<float> decoded = swap_last_two(x, shape);
  const int64_t E = shape[0], rows = shape[2], cols = shape[1];
  Mxfp4Bytes b;
  b.blocks.resize(decoded.size() / 2);
  b.scales.resize(decoded.size() / kMxfp4BlockSize);
  b.blocks_shape = {E, rows, cols / kMxfp4BlockSize, kMxfp4BytesPerBlock};
  b.scales_shape = {E, rows, cols / kMxfp4BlockSize};
  mxfp4_quantize("test", decoded, Shape{E, rows, cols}, b.blocks, b.scales);
  return b;
}

// Writes a Hugging Face directory of `hub` for `m`: config.json (the family's, plus
// `quantization` as quantization_config unless null), the tensors in `dtype` (F32 or BF16) in
// one model.safetensors or `files` files with an index; those in `mxfp4` as X_blocks, X_scales.
inline void write_hub_dir(const std::filesystem::path& dir, const ModelConfig& m,
                          const HubValues& hub, const std::string& dtype = "F32", int files = 1,
                          const nlohmann::json& quantization = nullptr,
                          const std::set<std::string>& mxfp4 = {}) {
  std::filesystem::create_directories(dir);
  nlohmann::json config = model_config_json(m, dtype == "F32" ? "float32" : "bfloat16");
  if (!quantization.is_null()) config["quantization_config"] = quantization;
  write_file_atomically((dir / "config.json").string(), config.dump(2));
  std::vector<SafetensorsWriter> writers(static_cast<size_t>(files));
  std::vector<std::vector<uint8_t>> raw;
  raw.reserve(3 * hub.values.size());
  nlohmann::json weight_map = nlohmann::json::object();
  int k = 0;
  auto add = [&](const std::string& name, const std::string& type,
                 const std::vector<int64_t>& shape, std::vector<uint8_t> bytes) {
    raw.push_back(std::move(bytes));
    writers[static_cast<size_t>(k % files)].add(name, type, shape, raw.back().data(),
                                                raw.back().size());
    weight_map[name] = "part-" + std::to_string(k % files) + ".safetensors";
  };
  for (const auto& [name, values] : hub.values) {
    const std::vector<int64_t>& shape = hub.shapes.at(name);
    if (mxfp4.count(name)) {
      Mxfp4Bytes b = mxfp4_of(values, shape);
      add(name + "_blocks", "U8", b.blocks_shape, std::move(b.blocks));
      add(name + "_scales", "U8", b.scales_shape, std::move(b.scales));
    } else {
      std::vector<uint8_t> bytes(values.size() * safetensors_element_size(dtype));
      convert_float_elements(values.data(), "F32", bytes.data(), dtype, values.size());
      add(name, dtype, shape, std::move(bytes));
    }
    ++k;
  }
  if (files == 1) {
    writers[0].write((dir / "model.safetensors").string());
    return;
  }
  for (int f = 0; f < files; ++f) {
    writers[static_cast<size_t>(f)].write(
        (dir / ("part-" + std::to_string(f) + ".safetensors")).string());
  }
  write_file_atomically((dir / "model.safetensors.index.json").string(),
                        nlohmann::json{{"weight_map", weight_map}}.dump());
}

// The quantization_config of OpenAI's released gpt-oss config.json.
inline nlohmann::json released_mxfp4_config() {
  return {
      {"quant_method", "mxfp4"},
      {"modules_to_not_convert",
       {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}};
}

// The experts' weights of every layer (gate_up_proj, down_proj: what the releases hold MXFP4).
inline std::set<std::string> expert_weights(const ModelConfig& m) {
  std::set<std::string> names;
  for (int l = 0; l < m.num_hidden_layers; ++l) {
    names.insert(experts_prefix(l) + "gate_up_proj");
    names.insert(experts_prefix(l) + "down_proj");
  }
  return names;
}

// A sharded checkpoint step directory of `m` (as a save writes one: a shard file, manifest.json
// with the weights, config.json) holding `values` (per param, layout order) in F32.
inline void write_sharded_checkpoint(const std::filesystem::path& dir, const ModelConfig& m,
                                     const std::vector<std::vector<float>>& values) {
  std::filesystem::create_directories(dir);
  const ParamLayout layout(m);
  ShardManifest manifest;
  manifest.block_bytes = 1 << 20;
  manifest.metadata = {{"step", 7}};
  ShardFileWriter writer((dir / "shard-00000.bin").string(), 4096, manifest.block_bytes);
  for (size_t i = 0; i < layout.params().size(); ++i) {
    const ParamInfo& p = layout.params()[i];
    const uint64_t at = writer.append(values[i].data(), values[i].size() * 4);
    manifest.tensors.push_back({p.name, DType::f32, p.shape.dims(), {{0, at, 0, p.shape.numel()}}});
  }
  manifest.files.push_back(writer.finish());
  manifest.validate("test checkpoint");
  write_file_atomically((dir / "manifest.json").string(), manifest.to_json());
  write_config_json((dir / "config.json").string(), m, DType::f32);
}

}  // namespace moepeak::test_support
