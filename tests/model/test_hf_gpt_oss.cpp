// gpt-oss's Hugging Face checkpoints (core/model/hub_layout.h, core/checkpoint/hf_import.h,
// hf_export.h, train_checkpoint.h): the fused experts of the Hub's layout read into moepeak's
// per-expert params (F32 and BF16 stores, one file or an index), the released MXFP4 form decoded
// exactly, export -> import bit for bit, export --quantize mxfp4 -> import as the MXFP4 rounding
// of the weights, the step dump's fused tensors, and every error of the import and the export
// naming what is wrong. Mixtral and Qwen3-MoE keep one Hub tensor per param under its own name.
// At the ZeroParamStore level on one rank (DecoderModel does not build gpt-oss yet); several
// ranks: tests/parallel/test_hf_gpt_oss_ranks.cpp.
//     ctest -R test_hf_gpt_oss --output-on-failure
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint/hf_export.h"
#include "core/checkpoint/hf_import.h"
#include "core/checkpoint/mxfp4.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/train_checkpoint.h"
#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/model/hub_layout.h"
#include "core/model/param_layout.h"
#include "core/model/zero_params.h"
#include "core/runtime/backend.h"
#include "tests/expect_contains.h"
#include "tests/model/hf_gpt_oss_fixture.h"
#include "tests/model/hf_import_testing.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::error_of;
using test_support::HubValues;
using test_support::TempDir;

// One rank's store poisoned with NaN (tests/model/hf_import_testing.h), loaded from a Hub dir.
using test_support::as_stored;

struct Store : test_support::PoisonedStore {
  using PoisonedStore::PoisonedStore;
  void load(const fs::path& dir) { load_hf_weights(HfCheckpoint(dir.string()), params, stream); }
};

// Every param of the store holds its expected values from `hub` bit for bit.
void expect_params_are(Store& store, const HubValues& hub, const ModelConfig& model) {
  const auto& infos = store.params.layout().params();
  for (size_t i = 0; i < infos.size(); ++i) {
    const std::vector<float> expect =
        as_stored(test_support::expected_param(infos[i], hub, model), store.params.dtype());
    const std::vector<float> got = store.value(static_cast<int>(i));
    ASSERT_EQ(got.size(), expect.size()) << infos[i].name;
    EXPECT_EQ(std::memcmp(got.data(), expect.data(), got.size() * 4), 0) << infos[i].name;
  }
}

std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsTensorInfo& info = f.info(name);
  std::vector<char> bytes(info.bytes);
  f.read(name, bytes.data(), bytes.size());
  std::vector<float> out(static_cast<size_t>(info.elements()));
  convert_float_elements(bytes.data(), info.dtype, out.data(), "F32", out.size());
  return out;
}

// ---- the Hub layout ------------------------------------------------------------------------

TEST(HubLayout, GptOssFusesEachLayersExpertsAndKeepsTheRestOneToOne) {
  const ModelConfig m = test_support::small_gpt_oss();
  const ParamLayout layout(m);
  const HubLayout hub(layout);
  const HubValues by_hand = test_support::gpt_oss_hub_values(m);
  ASSERT_EQ(hub.tensors().size(), by_hand.shapes.size());
  for (const HubTensor& t : hub.tensors()) {
    ASSERT_TRUE(by_hand.shapes.count(t.name)) << t.name;
    EXPECT_EQ(t.shape, by_hand.shapes.at(t.name)) << t.name;
    const bool fused = t.name.find(".mlp.experts.") != std::string::npos;
    EXPECT_EQ(hub.is_whole(t), !fused) << t.name;
    EXPECT_EQ(t.mxfp4, t.name.ends_with("gate_up_proj") || t.name.ends_with("down_proj")) << t.name;
    EXPECT_EQ(t.params.size(),
              fused
                  ? (t.name.ends_with("down_proj") || t.name.ends_with("down_proj_bias") ? 4u : 8u)
                  : 1u)
        << t.name;
  }
  // Expert 2's up of layer 1: gate_up_proj[2, h, 2i + 1].
  const int up = layout.layers[1].w3[2];
  EXPECT_EQ(hub.placement(up).offset, 2 * 32 * 64 + 1);
  EXPECT_EQ(hub.placement(up).strides, (std::vector<int64_t>{2, 64}));
  EXPECT_TRUE(hub.has_mxfp4());
}

TEST(HubLayout, MixtralAndQwen3KeepOneHubTensorPerParamUnderItsName) {
  ModelConfig qwen;
  qwen.model_type = ModelType::qwen3_moe;
  qwen.moe_intermediate_size = 24;
  qwen.mlp_only_layers = {1};
  for (const ModelConfig& m : {ModelConfig{}, qwen}) {
    const ParamLayout layout(m);
    const HubLayout hub(layout);
    ASSERT_EQ(hub.tensors().size(), layout.params().size());
    for (size_t i = 0; i < layout.params().size(); ++i) {
      const HubTensor& t = hub.tensors()[i];
      EXPECT_EQ(t.name, layout.params()[i].name);
      EXPECT_EQ(t.shape, layout.params()[i].shape.dims());
      EXPECT_TRUE(hub.is_whole(t)) << t.name;
      EXPECT_FALSE(t.mxfp4);
    }
    EXPECT_FALSE(hub.has_mxfp4());
  }
}

// ---- import --------------------------------------------------------------------------------

struct ImportCase {
  DType store;
  std::string file_dtype;
  int files;
};

void PrintTo(const ImportCase& c, std::ostream* os) {
  *os << dtype_name(c.store) << " store from " << c.file_dtype << " in " << c.files << " file(s)";
}

class GptOssImport : public testing::TestWithParam<ImportCase> {};

TEST_P(GptOssImport, EveryParamIsItsStridedElementOfTheFusedTensors) {
  const ImportCase c = GetParam();
  TempDir dir;
  const ModelConfig m = test_support::small_gpt_oss();
  HubValues hub = test_support::gpt_oss_hub_values(m);
  if (c.file_dtype == "BF16") {
    for (auto& [name, v] : hub.values) v = as_stored(v, DType::bf16);  // what the files hold
  }
  test_support::write_hub_dir(dir.path() / "hf", m, hub, c.file_dtype, c.files);
  Store store(m, c.store);
  store.load(dir.path() / "hf");
  expect_params_are(store, hub, m);
}

TEST_P(GptOssImport, Mxfp4ExpertsDecodeExactly) {
  const ImportCase c = GetParam();
  TempDir dir;
  const ModelConfig m = test_support::small_gpt_oss();
  HubValues hub = test_support::gpt_oss_hub_values(m);
  uint32_t seed = 1;
  for (const std::string& name : test_support::expert_weights(m)) {
    test_support::make_mxfp4_exact(hub, name, seed++);
  }
  if (c.file_dtype == "BF16") {
    for (auto& [name, v] : hub.values) v = as_stored(v, DType::bf16);
  }
  test_support::write_hub_dir(dir.path() / "hf", m, hub, c.file_dtype, c.files,
                              test_support::released_mxfp4_config(),
                              test_support::expert_weights(m));
  const HfCheckpoint hf((dir.path() / "hf").string());
  EXPECT_TRUE(hf.quantized());
  EXPECT_TRUE(hf.is_mxfp4("model.layers.1.mlp.experts.down_proj"));
  EXPECT_EQ(hf.shape("model.layers.1.mlp.experts.down_proj"), (std::vector<int64_t>{4, 32, 32}));
  EXPECT_FALSE(hf.contains("model.layers.1.mlp.experts.down_proj_blocks"));
  Store store(m, c.store);
  store.load(dir.path() / "hf");
  expect_params_are(store, hub, m);
}

INSTANTIATE_TEST_SUITE_P(Stores, GptOssImport,
                         testing::Values(ImportCase{DType::f32, "F32", 1},
                                         ImportCase{DType::bf16, "F32", 1},
                                         ImportCase{DType::f32, "BF16", 3},
                                         ImportCase{DType::bf16, "BF16", 2}),
                         [](const testing::TestParamInfo<ImportCase>& info) {
                           return std::string(dtype_name(info.param.store)) + "_from_" +
                                  info.param.file_dtype + "_files" +
                                  std::to_string(info.param.files);
                         });

// ---- export --------------------------------------------------------------------------------

// A sharded checkpoint of the small gpt-oss whose params hold `hub`'s values.
fs::path checkpoint_of(const TempDir& dir, const ModelConfig& m, const HubValues& hub) {
  const ParamLayout layout(m);
  std::vector<std::vector<float>> values;
  for (const ParamInfo& p : layout.params()) {
    values.push_back(test_support::expected_param(p, hub, m));
  }
  const fs::path step = dir.path() / "ckpt" / "step_00000007";
  test_support::write_sharded_checkpoint(step, m, values);
  return step;
}

TEST(GptOssExport, WritesTheFusedTensorsAndImportsBackBitForBit) {
  TempDir dir;
  const ModelConfig m = test_support::small_gpt_oss();
  const HubValues hub = test_support::gpt_oss_hub_values(m);
  const fs::path step = checkpoint_of(dir, m, hub);
  HfExportOptions f32;
  f32.dtype = "F32";
  f32.buffer_bytes = 4096;       // many chunks of rows per fused tensor
  f32.max_shard_bytes = 40'000;  // several files
  const fs::path out = dir.path() / "export";
  const HfExportSummary s = export_hf_checkpoint(step.string(), out.string(), f32);
  EXPECT_GT(s.files, 1);
  EXPECT_EQ(s.tensors, static_cast<int64_t>(hub.values.size()));
  const HfCheckpoint hf(out.string());
  EXPECT_FALSE(hf.quantized());
  EXPECT_EQ(hf.tensor_names().size(), hub.values.size());
  for (const auto& [name, values] : hub.values) {
    EXPECT_EQ(hf.shape(name), hub.shapes.at(name)) << name;
    EXPECT_EQ(read_f32(hf.file(name), name), values) << name;
  }
  const nlohmann::json config = read_json_file((out / "config.json").string());
  EXPECT_EQ(config["architectures"][0], "GptOssForCausalLM");
  EXPECT_FALSE(config.contains("quantization_config"));
  for (DType dtype : {DType::f32, DType::bf16}) {
    Store store(m, dtype);
    store.load(out);
    expect_params_are(store, hub, m);
  }

  // BF16: each fused element the nearest-even rounding of its param's.
  const fs::path out16 = dir.path() / "export16";
  HfExportOptions bf16;
  bf16.buffer_bytes = 4096;
  export_hf_checkpoint(step.string(), out16.string(), bf16);
  const HfCheckpoint hf16(out16.string());
  for (const auto& [name, values] : hub.values) {
    EXPECT_EQ(hf16.file(name).info(name).dtype, "BF16");
    EXPECT_EQ(read_f32(hf16.file(name), name), as_stored(values, DType::bf16)) << name;
  }
}

TEST(GptOssExport, QuantizeMxfp4WritesTheReleasedLayoutAndImportsAsTheMxfp4Rounding) {
  TempDir dir;
  const ModelConfig m = test_support::small_gpt_oss();
  const HubValues hub = test_support::gpt_oss_hub_values(m);
  const fs::path step = checkpoint_of(dir, m, hub);
  HfExportOptions options;
  options.dtype = "F32";
  options.quantize = "mxfp4";
  options.buffer_bytes = 4096;
  const fs::path out = dir.path() / "export";
  const HfExportSummary s = export_hf_checkpoint(step.string(), out.string(), options);
  const std::set<std::string> packed = test_support::expert_weights(m);
  EXPECT_EQ(s.tensors, static_cast<int64_t>(hub.values.size() + packed.size()));
  const nlohmann::json config = read_json_file((out / "config.json").string());
  EXPECT_EQ(config["quantization_config"], test_support::released_mxfp4_config());
  EXPECT_EQ(config["torch_dtype"], "float32");

  // The files: X_blocks and X_scales as mxfp4_quantize gives the whole decode; the rest plain.
  const nlohmann::json index = read_json_file((out / "model.safetensors.index.json").string());
  HubValues rounded = hub;
  for (const std::string& name : packed) {
    const test_support::Mxfp4Bytes expect =
        test_support::mxfp4_of(hub.values.at(name), hub.shapes.at(name));
    for (const auto& [part, bytes, shape] :
         {std::tuple{"_blocks", &expect.blocks, &expect.blocks_shape},
          std::tuple{"_scales", &expect.scales, &expect.scales_shape}}) {
      const std::string tensor = name + part;
      const SafetensorsFile f =
          SafetensorsFile::open((out / index["weight_map"][tensor].get<std::string>()).string());
      EXPECT_EQ(f.info(tensor).dtype, "U8");
      EXPECT_EQ(f.info(tensor).shape, *shape) << tensor;
      std::vector<uint8_t> got(bytes->size());
      f.read(tensor, got.data(), got.size());
      EXPECT_EQ(got, *bytes) << tensor;
    }
    // The values an MXFP4 reader sees: the decode of those bytes, its last two dims swapped.
    std::vector<float> decoded(hub.values.at(name).size());
    mxfp4_dequantize(name, expect.blocks,
                     Shape{4, expect.blocks_shape[1], expect.blocks_shape[2], 16}, expect.scales,
                     Shape{4, expect.scales_shape[1], expect.scales_shape[2]}, decoded);
    const std::vector<int64_t>& x = hub.shapes.at(name);
    rounded.values[name] = test_support::swap_last_two(decoded, {x[0], x[2], x[1]});
    EXPECT_NE(rounded.values[name], hub.values.at(name)) << "the rounding changes some weights";
  }
  EXPECT_TRUE(index["weight_map"].contains("model.layers.0.mlp.experts.gate_up_proj_bias"));
  EXPECT_FALSE(index["weight_map"].contains("model.layers.0.mlp.experts.gate_up_proj"));
  for (DType dtype : {DType::f32, DType::bf16}) {
    Store store(m, dtype);
    store.load(out);
    expect_params_are(store, rounded, m);
  }
}

TEST(GptOssExport, QuantizeIsRefusedForAnotherFamilyAndForRowsThatAreNotWholeBlocks) {
  TempDir dir;
  HfExportOptions options;
  options.quantize = "mxfp4";
  ModelConfig mixtral;
  mixtral.vocab_size = 32;
  const ParamLayout layout(mixtral);
  std::vector<std::vector<float>> zeros;
  for (const ParamInfo& p : layout.params()) {
    zeros.emplace_back(static_cast<size_t>(p.shape.numel()), 0.0f);
  }
  test_support::write_sharded_checkpoint(dir.path() / "mixtral", mixtral, zeros);
  EXPECT_CONTAINS(error_of([&] {
                    export_hf_checkpoint((dir.path() / "mixtral").string(),
                                         (dir.path() / "out").string(), options);
                  }),
                  "export --quantize mxfp4: the mixtral family has no MXFP4 tensors");
  // I = 16: down_proj (E, 16, 32) is stored as its decode (E, 32, 16), rows of 16.
  const ModelConfig narrow = test_support::small_gpt_oss(16);
  const fs::path step = checkpoint_of(dir, narrow, test_support::gpt_oss_hub_values(narrow));
  EXPECT_CONTAINS(
      error_of(
          [&] { export_hf_checkpoint(step.string(), (dir.path() / "out").string(), options); }),
      "tensor \"model.layers.0.mlp.experts.down_proj\" (4, 16, 32) is stored as its (4, 32, 16), "
      "whose rows of 16 are not whole MXFP4 blocks of 32");
  EXPECT_FALSE(fs::exists(dir.path() / "out"));
}

// ---- the step dump -------------------------------------------------------------------------

TEST(GptOssStepDump, WeightsAndGradsAreTheHubsFusedTensors) {
  TempDir dir;
  const ModelConfig m = test_support::small_gpt_oss();
  const HubValues hub = test_support::gpt_oss_hub_values(m);
  Store store(m, DType::f32);
  test_support::write_hub_dir(dir.path() / "hf", m, hub);
  store.load(dir.path() / "hf");
  // Gradients: the weights negated and halved (distinct, and not the weights).
  HubValues grads = hub;
  for (auto& [name, v] : grads.values) {
    for (float& x : v) x *= -0.5f;
  }
  const auto& infos = store.params.layout().params();
  for (size_t i = 0; i < infos.size(); ++i) {
    const std::vector<float> g = test_support::expected_param(infos[i], grads, m);
    store.params.load_full(static_cast<int>(i), g.data(), store.params.flat_grads(), store.stream);
  }
  const std::vector<int64_t> ids(8, 3), labels(8, 5);
  write_step_dump((dir.path() / "dump").string(), m, store.params, ids, labels, 2, 4, 1.5,
                  store.stream);
  for (const auto& [file, expect] :
       {std::pair<const char*, const HubValues*>{"model.safetensors", &hub},
        std::pair<const char*, const HubValues*>{"grads.safetensors", &grads}}) {
    const SafetensorsFile f = SafetensorsFile::open((dir.path() / "dump" / file).string());
    EXPECT_EQ(f.names().size(), expect->values.size()) << file;
    for (const auto& [name, values] : expect->values) {
      EXPECT_EQ(f.info(name).shape, expect->shapes.at(name)) << file << " " << name;
      EXPECT_EQ(read_f32(f, name), values) << file << " " << name;
    }
  }
}

// ---- errors --------------------------------------------------------------------------------

// A Hub directory of the small gpt-oss, `edit`ed: tensors by name (values kept), config.json.
struct BadCheckpoint {
  TempDir dir;
  ModelConfig m = test_support::small_gpt_oss();
  HubValues hub = test_support::gpt_oss_hub_values(m);
  nlohmann::json quantization = test_support::released_mxfp4_config();
  std::set<std::string> mxfp4 = test_support::expert_weights(m);
  BadCheckpoint() {
    for (const std::string& name : mxfp4) test_support::make_mxfp4_exact(hub, name, 3);
  }
  fs::path path() const { return dir.path() / "hf"; }
  void write() {
    fs::remove_all(path());
    test_support::write_hub_dir(path(), m, hub, "F32", 1, quantization, mxfp4);
  }
  // Rewrites model.safetensors without the tensors in `drop`, with what `add` adds.
  void rewrite(const std::set<std::string>& drop,
               const std::function<void(SafetensorsWriter&)>& add = {}) {
    const std::string file = (path() / "model.safetensors").string();
    SafetensorsFile f = SafetensorsFile::open(file);
    std::vector<std::vector<char>> keep;
    SafetensorsWriter w;
    if (add) add(w);
    for (const std::string& name : f.names()) {
      if (drop.count(name)) continue;
      keep.emplace_back(f.info(name).bytes);
      f.read(name, keep.back().data(), keep.back().size());
      w.add(name, f.info(name).dtype, f.info(name).shape, keep.back().data(), keep.back().size());
    }
    w.write(file + ".new");
    fs::rename(file + ".new", file);
  }
  std::string load_error(const ModelConfig& model) {
    return error_of([&] {
      Store store(model, DType::f32);
      store.load(path());
    });
  }
  std::string load_error() { return load_error(m); }
};

TEST(GptOssImportErrors, MissingMisshapenAndForeignTensorsAreNamedByTheirHubNames) {
  BadCheckpoint c;
  c.mxfp4.clear();
  c.quantization = nullptr;
  c.write();
  const std::string gate_up = "model.layers.1.mlp.experts.gate_up_proj";
  c.rewrite({gate_up});
  EXPECT_CONTAINS(c.load_error(), "has no tensor \"" + gate_up + "\", a weight of this gpt_oss");
  const std::vector<float> small(4 * 32 * 30, 1.0f);
  c.write();
  c.rewrite({gate_up}, [&](SafetensorsWriter& w) {
    w.add(gate_up, DType::f32, {4, 32, 30}, small.data(), small.size() * 4);
  });
  EXPECT_CONTAINS(c.load_error(), "model.safetensors: tensor \"" + gate_up +
                                      "\" has shape (4, 32, 30) but this model's is (4, 32, 64)");
  // moepeak's own per-expert names are not the Hub's.
  c.write();
  const std::vector<float> w1(32 * 32, 1.0f);
  c.rewrite({}, [&](SafetensorsWriter& w) {
    w.add("model.layers.0.mlp.experts.0.gate_proj.weight", DType::f32, {32, 32}, w1.data(),
          w1.size() * 4);
  });
  EXPECT_CONTAINS(c.load_error(),
                  "tensor \"model.layers.0.mlp.experts.0.gate_proj.weight\" is not a weight of "
                  "this model (gpt_oss");
  // MXFP4 pairs without a quantization_config are no weights either, and say what is missing.
  c.mxfp4 = test_support::expert_weights(c.m);
  c.write();
  c.quantization = nullptr;
  write_file_atomically((c.path() / "config.json").string(),
                        model_config_json(c.m, "float32").dump());
  EXPECT_CONTAINS(c.load_error(),
                  "tensor \"model.layers.0.mlp.experts.gate_up_proj\" is there as "
                  "MXFP4 (_blocks and _scales), which needs " +
                      (c.path() / "config.json").string() +
                      "'s quantization_config with quant_method \"mxfp4\"");
}

TEST(GptOssImportErrors, Mxfp4PairsThatDoNotPairOrDecodeToTheModelsShape) {
  BadCheckpoint c;
  c.write();
  const std::string down = "model.layers.0.mlp.experts.down_proj";
  c.rewrite({down + "_scales"});
  EXPECT_CONTAINS(c.load_error(), "tensor \"" + down + "_blocks\" has no \"" + down +
                                      "_scales\" in the checkpoint");
  c.write();
  c.rewrite({down + "_blocks"});
  EXPECT_CONTAINS(c.load_error(), "tensor \"" + down + "_scales\" has no \"" + down + "_blocks\"");
  // Scales of another shape than the blocks'.
  c.write();
  const std::vector<uint8_t> scales(4 * 32 * 2, 127);
  c.rewrite({down + "_scales"}, [&](SafetensorsWriter& w) {
    w.add(down + "_scales", "U8", {4, 32, 2}, scales.data(), scales.size());
  });
  EXPECT_CONTAINS(c.load_error(), "mxfp4 tensor \"" + down +
                                      "\": scales shape (4, 32, 2) is not "
                                      "blocks shape (4, 32, 1, 16) without its last dim");
  // A pair that decodes to another shape than the model's: blocks and scales of (4, 64, 32).
  c.write();
  const std::vector<uint8_t> blocks(4 * 64 * 16, 0x11), scales64(4 * 64, 127);
  c.rewrite({down + "_blocks", down + "_scales"}, [&](SafetensorsWriter& w) {
    w.add(down + "_blocks", "U8", {4, 64, 1, 16}, blocks.data(), blocks.size());
    w.add(down + "_scales", "U8", {4, 64, 1}, scales64.data(), scales64.size());
  });
  EXPECT_CONTAINS(c.load_error(), "tensor \"" + down +
                                      "\" has shape (4, 32, 64) (its MXFP4 "
                                      "decode with the last two dims swapped) but this model's is "
                                      "(4, 32, 32)");
  // Bytes that are not U8.
  c.write();
  const std::vector<float> wide(4 * 32, 1.0f);
  c.rewrite({down + "_scales"}, [&](SafetensorsWriter& w) {
    w.add(down + "_scales", DType::f32, {4, 32, 1}, wide.data(), wide.size() * 4);
  });
  EXPECT_CONTAINS(c.load_error(),
                  "MXFP4 tensor \"" + down + "_scales\" is F32; its bytes must be U8");
  // X beside its pair.
  c.write();
  const std::vector<float> plain(4 * 32 * 32, 1.0f);
  c.rewrite({}, [&](SafetensorsWriter& w) {
    w.add(down, DType::f32, {4, 32, 32}, plain.data(), plain.size() * 4);
  });
  EXPECT_CONTAINS(c.load_error(), "holds both \"" + down + "\" and its MXFP4 pair");
  // A scale of 255 (NaN in E8M0) in expert 3's row 5.
  c.write();
  std::vector<uint8_t> nan_scale(4 * 32, 127);
  nan_scale[3 * 32 + 5] = 255;
  c.rewrite({down + "_scales"}, [&](SafetensorsWriter& w) {
    w.add(down + "_scales", "U8", {4, 32, 1}, nan_scale.data(), nan_scale.size());
  });
  const std::string e = c.load_error();
  EXPECT_CONTAINS(e, "row (3, 5) of (4, 32, 32)");
  EXPECT_CONTAINS(e, "mxfp4 tensor \"" + down + "\": scale (0) is 255, NaN in E8M0");
}

TEST(GptOssImportErrors, QuantizationConfigsMoepeakCannotRead) {
  BadCheckpoint c;
  c.quantization = {{"quant_method", "gptq"}, {"bits", 4}};
  c.write();
  EXPECT_CONTAINS(c.load_error(),
                  "config.json: quantization_config.quant_method is \"gptq\"; "
                  "moepeak reads only \"mxfp4\"");
  c.quantization = "mxfp4";
  c.write();
  EXPECT_CONTAINS(c.load_error(), "config.json: quantization_config must be an object");
  c.quantization = {{"quant_method", "mxfp4"}, {"modules_to_not_convert", "lm_head"}};
  c.write();
  EXPECT_CONTAINS(c.load_error(), "modules_to_not_convert must be a list of module names");
  // A listed module held as MXFP4 (a pattern from the start, up to a module boundary).
  for (const std::string listed : {"model.layers.*.mlp.experts", "model.layers.0", "experts"}) {
    c.quantization = {{"quant_method", "mxfp4"}, {"modules_to_not_convert", {listed}}};
    c.write();
    SCOPED_TRACE(listed);
    EXPECT_CONTAINS(c.load_error(),
                    "modules_to_not_convert lists its module \"model.layers.0."
                    "mlp.experts\"");
  }
  // Not a boundary: "model.layers.0.mlp.exp" lists nothing, so the import goes through.
  c.quantization = {{"quant_method", "mxfp4"},
                    {"modules_to_not_convert", {"model.layers.0.mlp.exp", "model.layers.1.mlp.r"}}};
  c.write();
  Store ok(c.m, DType::f32);
  EXPECT_NO_THROW(ok.load(c.path()));
  c.quantization = {{"quant_method", "mxfp4"}, {"modules_to_not_convert", {"model.layers.(0"}}};
  c.write();
  EXPECT_CONTAINS(c.load_error(), "holds \"model.layers.(0\", which is not a regular expression");
  // MXFP4 where the family marks none: the biases, and any tensor of a mixtral.
  c.quantization = test_support::released_mxfp4_config();
  c.mxfp4.insert("model.layers.0.mlp.experts.gate_up_proj_bias");
  c.hub.shapes["model.layers.0.mlp.experts.gate_up_proj_bias"] = {4, 32, 2};  // (E, 2I) as 3-D
  c.write();
  EXPECT_CONTAINS(c.load_error(),
                  "tensor \"model.layers.0.mlp.experts.gate_up_proj_bias\" is "
                  "MXFP4 (_blocks and _scales), but moepeak dequantises only");
  TempDir mixtral_dir;
  ModelConfig mixtral;
  mixtral.vocab_size = 32;
  nlohmann::json config = model_config_json(mixtral, "float32");
  config["quantization_config"] = test_support::released_mxfp4_config();
  fs::create_directories(mixtral_dir.path() / "hf");
  write_file_atomically((mixtral_dir.path() / "hf" / "config.json").string(), config.dump());
  SafetensorsWriter none;
  none.write((mixtral_dir.path() / "hf" / "model.safetensors").string());
  EXPECT_CONTAINS(error_of([&] {
                    Store store(mixtral, DType::f32);
                    store.load(mixtral_dir.path() / "hf");
                  }),
                  "config.json: quantization_config (quant_method \"mxfp4\") on a mixtral "
                  "checkpoint; moepeak dequantises MXFP4 only");
}

TEST(GptOssImportErrors, InitFromReadsAReleasedConfigJsonWithItsQuantizationConfig) {
  BadCheckpoint c;
  c.write();
  nlohmann::json config = read_json_file((c.path() / "config.json").string());
  config.erase("torch_dtype");  // as OpenAI's files: the dtype is the tensors'
  write_file_atomically((c.path() / "config.json").string(), config.dump());
  const Config cfg = with_init_from_model(
      load_config({}, {"model.init_from=" + c.path().string(), "training.seq_len=16"}));
  EXPECT_EQ(cfg.model.model_type, ModelType::gpt_oss);
  EXPECT_EQ(cfg.model.intermediate_size, 32);
  EXPECT_EQ(cfg.model.num_local_experts, 4);
}

}  // namespace
}  // namespace moepeak
