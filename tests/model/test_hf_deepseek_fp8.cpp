// DeepSeek-V3's released checkpoints (core/checkpoint/hf_import.h, hf_import_fp8.cpp,
// mtp_layers.h, hf_export.h): the FP8 weights dequantised on import to the fp32 product of code
// and block scale rounded to the store's dtype (bitwise; partial edge blocks, blocks of 8 and 5,
// one file or three, any element range of a ZeRO shard), every error of the FP8 layout naming the
// file, the tensor or config.json's field and leaving no file behind, and the MTP layers carried
// byte for byte from the Hub checkpoint through the run's checkpoints (hard links, listed with
// checksums in the manifest, kept past keep_latest, relinked on resume, synchronous and
// asynchronous saves) into the export, whose
// config.json keeps num_nextn_predict_layers and has no quantization_config. At the
// ZeroParamStore level on one rank: the decoder does not train deepseek_v3 yet.
//     ctest -R test_hf_deepseek_fp8 --output-on-failure
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint/async_checkpoint.h"
#include "core/checkpoint/hf_export.h"
#include "core/checkpoint/hf_import.h"
#include "core/checkpoint/mtp_layers.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/sharded_checkpoint.h"
#include "core/checkpoint/train_checkpoint.h"
#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/data/data_loader.h"
#include "core/error.h"
#include "core/model/optimizer_params.h"
#include "core/model/param_layout.h"
#include "core/model/zero_params.h"
#include "core/runtime/backend.h"
#include "ops/schedules/optimizer_choice.h"
#include "tests/expect_contains.h"
#include "tests/model/hf_deepseek_fixture.h"
#include "tests/model/hf_import_testing.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::DeepseekHub;
using test_support::error_of;
using test_support::TempDir;

// One rank's store poisoned with NaN (tests/model/hf_import_testing.h) of `model`.
using test_support::as_stored;

struct Store : test_support::PoisonedStore {
  ModelConfig model;
  Store(const ModelConfig& m, DType dtype) : PoisonedStore(m, dtype), model(m) {}
  // As the trainer starts from a Hub checkpoint: the weights, then the MTP layers written into
  // the checkpoint folder `folder`.
  std::optional<CarriedFile> import(const fs::path& dir, const fs::path& folder) {
    const HfCheckpoint hf(dir.string());
    load_hf_weights(hf, params, stream, model.num_nextn_predict_layers);
    if (mtp_stored_names(hf, model).empty()) return std::nullopt;
    fs::create_directories(folder);
    return write_mtp_layers(hf, model, (folder / kMtpLayersFile).string());
  }
};

void expect_params_are(Store& store, const DeepseekHub& hub) {
  const auto& infos = store.params.layout().params();
  ASSERT_EQ(infos.size(), hub.expected.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    const std::vector<float> expect =
        as_stored(hub.expected.at(infos[i].name), store.params.dtype());
    const std::vector<float> got = store.value(static_cast<int>(i));
    ASSERT_EQ(got.size(), expect.size()) << infos[i].name;
    EXPECT_EQ(std::memcmp(got.data(), expect.data(), got.size() * 4), 0) << infos[i].name;
  }
}

// Every file under `dir` (recursively), for "nothing was left".
std::vector<std::string> files_under(const fs::path& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) out.push_back(e.path().string());
  return out;
}

// ---- the FP8 import ------------------------------------------------------------------------

struct Fp8Case {
  int64_t block;
  DType store;
  int files;
};

void PrintTo(const Fp8Case& c, std::ostream* os) {
  *os << "blocks of " << c.block << " into " << dtype_name(c.store) << " from " << c.files
      << " file(s)";
}

class DeepseekFp8Import : public testing::TestWithParam<Fp8Case> {};

TEST_P(DeepseekFp8Import, EveryParamIsTheFp32ProductOfCodeAndScaleRoundedToTheStore) {
  const Fp8Case c = GetParam();
  TempDir dir;
  const ModelConfig m = test_support::small_deepseek();
  const DeepseekHub hub = test_support::deepseek_hub(m, c.block, static_cast<uint32_t>(c.block));
  // The releases' kinds of tensors are there: projections with a partial last block (12 rows
  // of blocks of 8: 1.5 blocks, as DeepSeek's kv_a_proj_with_mqa has 576 = 4.5 x 128) and plain
  // BF16 / F32 tensors.
  ASSERT_TRUE(hub.fp8.count("model.layers.1.mlp.experts.3.up_proj.weight"));
  ASSERT_TRUE(hub.fp8.count("model.layers.0.self_attn.kv_b_proj.weight"));
  EXPECT_FALSE(hub.fp8.count("model.layers.1.mlp.gate.weight"));
  EXPECT_FALSE(hub.fp8.count("lm_head.weight"));
  EXPECT_EQ(hub.stored.at("model.layers.1.mlp.experts.3.up_proj.weight_scale_inv").shape,
            (std::vector<int64_t>{(12 + c.block - 1) / c.block, (32 + c.block - 1) / c.block}));
  test_support::write_deepseek_dir(dir.path() / "hf", hub, c.files,
                                   test_support::fp8_quantization(c.block));
  const HfCheckpoint hf((dir.path() / "hf").string());
  EXPECT_TRUE(hf.fp8());
  EXPECT_EQ(hf.fp8_block().rows, c.block);
  EXPECT_TRUE(hf.is_fp8("model.layers.0.self_attn.q_a_proj.weight"));
  EXPECT_FALSE(hf.is_fp8("model.embed_tokens.weight"));
  EXPECT_FALSE(hf.contains("model.layers.0.self_attn.q_a_proj.weight_scale_inv"));
  Store store(m, c.store);
  store.import(dir.path() / "hf", dir.path() / "ckpt");
  expect_params_are(store, hub);
}

INSTANTIATE_TEST_SUITE_P(Blocks, DeepseekFp8Import,
                         testing::Values(Fp8Case{8, DType::f32, 1}, Fp8Case{8, DType::bf16, 3},
                                         Fp8Case{5, DType::f32, 3}, Fp8Case{5, DType::bf16, 1}));

// A rank's ZeRO shard may start and end anywhere in a tensor: every range reads its part.
TEST(DeepseekFp8Import, AnyElementRangeReadsItsPartOfTheDequantisedTensor) {
  TempDir dir;
  const ModelConfig m = test_support::small_deepseek();
  const int64_t block = 5;
  const DeepseekHub hub = test_support::deepseek_hub(m, block);
  test_support::write_deepseek_dir(dir.path() / "hf", hub, 2, test_support::fp8_quantization(5));
  const HfCheckpoint hf((dir.path() / "hf").string());
  const std::string name = "model.layers.0.self_attn.kv_b_proj.weight";  // (56, 12)
  const std::vector<float>& w = hub.expected.at(name);
  const int64_t n = static_cast<int64_t>(w.size());
  ASSERT_EQ(n, 56 * 12);
  for (const auto& [b, e] : std::vector<std::pair<int64_t, int64_t>>{
           {0, n}, {0, 1}, {5, 7}, {11, 13}, {59, 61}, {100, 437}, {n - 1, n}, {13, 13}}) {
    for (const std::string dtype : {"F32", "BF16"}) {
      std::vector<float> got(static_cast<size_t>(e - b) + 1, NAN);
      std::vector<uint16_t> bits(got.size(), 0xFFFF);
      hf.read_elements(
          name, b, e, dtype,
          dtype == "F32" ? static_cast<void*>(got.data()) : static_cast<void*>(bits.data()));
      if (dtype == "BF16")
        convert_float_elements(bits.data(), "BF16", got.data(), "F32", got.size());
      std::vector<float> want(w.begin() + b, w.begin() + e);
      if (dtype == "BF16") want = as_stored(want, DType::bf16);
      got.pop_back();  // the element past the range stays poisoned
      EXPECT_EQ(got, want) << "[" << b << ", " << e << ") " << dtype;
    }
  }
}

// ---- errors of the FP8 layout ----------------------------------------------------------------

// A checkpoint to break one way at a time: `hub` and `quantization` as written by write().
struct BadFp8 {
  TempDir dir;
  ModelConfig m = test_support::small_deepseek();
  DeepseekHub hub = test_support::deepseek_hub(m, 8);
  nlohmann::json quantization = test_support::fp8_quantization(8);
  fs::path path() const { return dir.path() / "hf"; }
  fs::path folder() const { return dir.path() / "ckpt"; }
  std::string file() const { return (path() / "model.safetensors").string(); }
  // The import's error; checks that it left nothing in the checkpoint folder.
  std::string import_error() {
    fs::remove_all(path());
    test_support::write_deepseek_dir(path(), hub, 1, quantization);
    const std::string e = error_of([&] {
      Store store(m, DType::f32);
      store.import(path(), folder());
    });
    EXPECT_EQ(files_under(folder()), std::vector<std::string>{}) << e;
    return e;
  }
  // The F32 scales of `name` (a weight), to edit.
  float* scales(const std::string& name) {
    return reinterpret_cast<float*>(hub.stored.at(name + "_scale_inv").bytes.data());
  }
};

const std::string kQa = "model.layers.0.self_attn.q_a_proj.weight";     // (16, 32)
const std::string kUp = "model.layers.1.mlp.experts.3.up_proj.weight";  // (12, 32)
const std::string kEmbed = "model.embed_tokens.weight";                 // BF16

TEST(DeepseekFp8Errors, PairsThatDoNotPairAreNamedByFileAndTensor) {
  BadFp8 c;
  c.hub.stored.erase(kQa + "_scale_inv");
  EXPECT_CONTAINS(c.import_error(), c.file() + ": tensor \"" + kQa +
                                        "\" is F8_E4M3 but the checkpoint has no \"" + kQa +
                                        "_scale_inv\"");
  BadFp8 d;  // scales for a tensor that is not there
  d.hub.stored["model.layers.0.self_attn.nothing.weight_scale_inv"] =
      d.hub.stored.at(kQa + "_scale_inv");
  EXPECT_CONTAINS(d.import_error(),
                  d.file() +
                      ": tensor \"model.layers.0.self_attn.nothing.weight_scale_inv\" "
                      "scales no tensor: the checkpoint has no "
                      "\"model.layers.0.self_attn.nothing.weight\"");
  BadFp8 e;  // scales for a BF16 tensor
  e.hub.stored[kEmbed + "_scale_inv"] = e.hub.stored.at(kQa + "_scale_inv");
  EXPECT_CONTAINS(e.import_error(), "tensor \"" + kEmbed + "_scale_inv\" scales \"" + kEmbed +
                                        "\", which is BF16, not F8_E4M3");
  BadFp8 f;  // the grid of another block size: (16, 32) in blocks of 8 needs (2, 4)
  f.hub.stored.at(kQa + "_scale_inv").shape = {4, 2};
  EXPECT_CONTAINS(f.import_error(),
                  f.file() + ": tensor \"" + kQa + "_scale_inv\" has shape (4, 2), but \"" + kQa +
                      "\" (16, 32) in blocks of [8, 8] (" + (f.path() / "config.json").string() +
                      "'s weight_block_size) needs (2, 4)");
  BadFp8 g;  // scales in BF16
  test_support::StoredTensor& s = g.hub.stored.at(kUp + "_scale_inv");
  std::vector<uint8_t> bf16(s.bytes.size() / 2);
  convert_float_elements(s.bytes.data(), "F32", bf16.data(), "BF16", bf16.size() / 2);
  s = {"BF16", s.shape, bf16};
  EXPECT_CONTAINS(g.import_error(), g.file() + ": tensor \"" + kUp +
                                        "_scale_inv\" is BF16; FP8 block scales must be F32");
  BadFp8 h;  // a 1-D FP8 tensor
  test_support::StoredTensor& norm = h.hub.stored.at("model.norm.weight");
  norm = {"F8_E4M3", norm.shape, std::vector<uint8_t>(norm.bytes.size() / 2, 0x38)};
  h.hub.stored["model.norm.weight_scale_inv"] = {"F32", {1}, std::vector<uint8_t>(4, 0)};
  EXPECT_CONTAINS(h.import_error(),
                  "FP8 tensor \"model.norm.weight\" has shape (32); "
                  "block-scaled FP8 weights are 2-D");
}

TEST(DeepseekFp8Errors, ScalesThatAreNotFinitePositiveAndNanCodesNameTheBlockOrElement) {
  for (const float bad : {NAN, INFINITY, -0.5f, 0.0f}) {
    BadFp8 c;
    c.scales(kUp)[1 * 4 + 3] = bad;  // block (1, 3): rows 8..11, the partial block row
    const std::string e = c.import_error();
    EXPECT_CONTAINS(e, c.file() + ": tensor \"" + kUp + "_scale_inv\": block (1, 3) has scale ");
    EXPECT_CONTAINS(e, "; FP8 block scales must be finite and positive");
  }
  BadFp8 c;
  c.hub.stored.at(kUp).bytes[9 * 32 + 30] = 0xFF;
  EXPECT_CONTAINS(c.import_error(), c.file() + ": tensor \"" + kUp +
                                        "\": element (9, 30) is 0xFF, float8_e4m3fn's NaN");
}

TEST(DeepseekFp8Errors, QuantizationConfigsAndFp8WithoutThemNameConfigJsonAndTheField) {
  const std::string config = "config.json";
  BadFp8 c;
  c.quantization = nullptr;  // FP8 tensors, no quantization_config
  EXPECT_CONTAINS(c.import_error(), "\" is F8_E4M3, but " + (c.path() / config).string() +
                                        " has no quantization_config; FP8 weights need "
                                        "quant_method \"fp8\"");
  c.quantization = {{"quant_method", "awq"}};
  EXPECT_CONTAINS(c.import_error(), (c.path() / config).string() +
                                        ": quantization_config.quant_method is \"awq\"; moepeak "
                                        "reads only \"mxfp4\"");
  c.quantization = test_support::fp8_quantization(8);
  c.quantization["fmt"] = "e5m2";
  EXPECT_CONTAINS(c.import_error(), (c.path() / config).string() +
                                        ": quantization_config.fmt is \"e5m2\"; moepeak reads "
                                        "FP8 weights as \"e4m3\"");
  for (const nlohmann::json& size :
       {nlohmann::json{128, 64}, nlohmann::json{0, 0}, nlohmann::json{8}, nlohmann::json{"8", "8"},
        nlohmann::json(nullptr)}) {
    c.quantization = test_support::fp8_quantization(8);
    if (size.is_null()) {
      c.quantization.erase("weight_block_size");
    } else {
      c.quantization["weight_block_size"] = size;
    }
    SCOPED_TRACE(size.dump());
    EXPECT_CONTAINS(c.import_error(), (c.path() / config).string() +
                                          ": quantization_config.weight_block_size must be two "
                                          "equal positive integers [b, b]");
  }
  // Without fmt (transformers' FineGrainedFP8Config writes none) e4m3 is meant.
  c.quantization = test_support::fp8_quantization(8);
  c.quantization.erase("fmt");
  fs::remove_all(c.path());
  test_support::write_deepseek_dir(c.path(), c.hub, 1, c.quantization);
  Store store(c.m, DType::f32);
  EXPECT_NO_THROW(store.import(c.path(), c.folder()));
}

TEST(DeepseekMtpErrors, LayersPastTheMtpOnesAndMtpLayersTheModelDoesNotHaveAreForeign) {
  BadFp8 c;  // a second MTP layer where config.json has one
  c.hub.stored["model.layers.3.enorm.weight"] = c.hub.stored.at("model.layers.2.enorm.weight");
  EXPECT_CONTAINS(c.import_error(),
                  c.file() +
                      ": tensor \"model.layers.3.enorm.weight\" is not a weight of this "
                      "model (deepseek_v3 with the [model] shape and its 1 MTP layer(s))");
  BadFp8 d;  // the MTP layer of a model that says it has none
  d.m.num_nextn_predict_layers = 0;
  EXPECT_CONTAINS(d.import_error(),
                  "is not a weight of this model (deepseek_v3 with the [model] "
                  "shape); is the checkpoint of another architecture?");
  EXPECT_EQ(mtp_layer_of("model.layers.2.enorm.weight", 2, 1), 2);
  EXPECT_EQ(mtp_layer_of("model.layers.1.enorm.weight", 2, 1), -1);
  EXPECT_EQ(mtp_layer_of("model.layers.2.enorm.weight", 2, 0), -1);
  EXPECT_EQ(mtp_layer_of("model.layers.2", 2, 1), -1);
  EXPECT_EQ(mtp_layer_of("model.layers..x", 2, 1), -1);
  EXPECT_EQ(mtp_layer_of("lm_head.weight", 2, 1), -1);
}

// ---- the MTP layers through checkpoints and the export ----------------------------------------

// A run's state on one rank: the store, an AdamW and a data loader, to save checkpoints with.
struct TrainState {
  Store store;
  std::unique_ptr<schedules::Optimizer> optimizer;
  std::unique_ptr<DataLoader> loader;
  explicit TrainState(const ModelConfig& m) : store(m, DType::f32) {
    optimizer = schedules::make_optimizer(*store.backend, optimizer_params(store.params),
                                          OptimizerConfig{}, 1);
    TrainingConfig training;
    training.batch_size = 2;
    training.seq_len = 8;
    loader = make_data_loader(training, m, 1);
  }
  void save(const fs::path& folder, int64_t step, const std::optional<CarriedFile>& carried) {
    save_checkpoint(folder.string(), step, store.model, store.params, *optimizer, *loader,
                    store.stream, /*keep_latest=*/1, 1 << 20, carried);
  }
};

// Every MTP tensor of `hub` is in the Hugging Face directory `out` with its dtype, shape and bytes,
// and `out` has no other tensor of an MTP layer.
void expect_mtp_carried(const DeepseekHub& hub, const fs::path& out) {
  const HfCheckpoint hf(out.string());
  std::set<std::string> found;
  for (const std::string& name : hf.stored_names()) {
    if (mtp_layer_of(name, hub.model.num_hidden_layers, 8) < 0) continue;
    found.insert(name);
    const SafetensorsFile& f = hf.stored_file(name);
    ASSERT_TRUE(hub.stored.count(name)) << name;
    const test_support::StoredTensor& t = hub.stored.at(name);
    EXPECT_EQ(f.info(name).dtype, t.dtype) << name;
    EXPECT_EQ(f.info(name).shape, t.shape) << name;
    std::vector<uint8_t> bytes(f.info(name).bytes);
    f.read(name, bytes.data(), bytes.size());
    EXPECT_EQ(bytes, t.bytes) << name;
  }
  EXPECT_EQ(found, hub.mtp);
}

TEST(DeepseekMtp, CarriedByteForByteFromTheHubThroughCheckpointsToTheExport) {
  TempDir dir;
  const ModelConfig m = test_support::small_deepseek();
  const DeepseekHub hub = test_support::deepseek_hub(m, 8, 3);
  ASSERT_GT(hub.mtp.size(), 20u);
  EXPECT_TRUE(hub.mtp.count("model.layers.2.mlp.experts.7.down_proj.weight_scale_inv"));
  test_support::write_deepseek_dir(dir.path() / "hf", hub, 3, test_support::fp8_quantization(8));
  TrainState run(m);
  const fs::path folder = dir.path() / "ckpt";
  const std::optional<CarriedFile> carried = run.store.import(dir.path() / "hf", folder);
  ASSERT_TRUE(carried.has_value());
  EXPECT_EQ(carried->path, (folder / kMtpLayersFile).string());
  EXPECT_EQ(carried->info.name, kMtpLayersFile);
  EXPECT_EQ(carried->info.bytes, fs::file_size(folder / kMtpLayersFile));
  expect_params_are(run.store, hub);

  // Two saves with keep_latest 1: the first step goes, the file stays in the second and in the
  // folder, one inode linked from both.
  run.save(folder, 1, carried);
  run.save(folder, 2, carried);
  const fs::path step2 = folder / checkpoint_dir_name(2);
  EXPECT_FALSE(fs::exists(folder / checkpoint_dir_name(1)));
  ASSERT_TRUE(fs::exists(step2 / kMtpLayersFile));
  EXPECT_TRUE(fs::equivalent(step2 / kMtpLayersFile, folder / kMtpLayersFile));
  EXPECT_EQ(fs::hard_link_count(folder / kMtpLayersFile), 2u);
  const ShardedCheckpoint saved(step2.string());
  ASSERT_EQ(saved.manifest().carried.size(), 1u);
  EXPECT_EQ(saved.manifest().carried[0], carried->info);
  EXPECT_NO_THROW(verify_carried_file(step2.string(), saved.manifest().carried[0]));

  // The export: the model's weights in BF16, the MTP tensors as stored, config.json without a
  // quantization_config but with num_nextn_predict_layers.
  HfExportOptions options;
  options.buffer_bytes = 4096;
  options.max_shard_bytes = 20'000;  // the MTP tensors spread over several files
  const fs::path out = dir.path() / "export";
  const HfExportSummary s = export_hf_checkpoint(step2.string(), out.string(), options);
  EXPECT_EQ(s.carried_tensors, static_cast<int64_t>(hub.mtp.size()));
  EXPECT_EQ(s.tensors, static_cast<int64_t>(hub.expected.size() + hub.mtp.size()));
  EXPECT_GT(s.files, 2);
  expect_mtp_carried(hub, out);
  const nlohmann::json config = read_json_file((out / "config.json").string());
  EXPECT_EQ(config["model_type"], "deepseek_v3");
  EXPECT_EQ(config["num_nextn_predict_layers"], 1);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  EXPECT_FALSE(config.contains("quantization_config"));
  {
    const HfCheckpoint hf(out.string());
    EXPECT_FALSE(hf.fp8());
    EXPECT_EQ(hf.stored_file(kQa).info(kQa).dtype, "BF16");
    EXPECT_EQ(hf.stored_file("model.layers.2.self_attn.q_a_proj.weight")
                  .info("model.layers.2.self_attn.q_a_proj.weight")
                  .dtype,
              "F8_E4M3");
  }

  // --init-from the export: the weights are the BF16 rounding of the imported ones, and the MTP
  // tensors (F8 without a quantization_config: carried, not dequantised) go on unchanged.
  TrainState again(m);
  const std::optional<CarriedFile> carried_again =
      again.store.import(out, dir.path() / "ckpt_again");
  ASSERT_TRUE(carried_again.has_value());
  DeepseekHub rounded = hub;
  for (auto& [name, v] : rounded.expected) v = as_stored(v, DType::bf16);
  expect_params_are(again.store, rounded);

  // Resumed from step 2 into another folder: the file is relinked there, saved and exported alike.
  const std::optional<CarriedFile> resumed =
      relink_mtp_layers(step2.string(), (dir.path() / "resumed").string());
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->info, carried->info);
  EXPECT_TRUE(fs::equivalent(resumed->path, folder / kMtpLayersFile));
  run.save(dir.path() / "resumed", 3, resumed);
  const fs::path out3 = dir.path() / "export3";
  export_hf_checkpoint((dir.path() / "resumed").string(), out3.string(), {});
  expect_mtp_carried(hub, out3);

  // An asynchronous save links it when it commits.
  {
    AsyncCheckpointWriter writer(*run.store.backend);
    writer.start((dir.path() / "async").string(), checkpoint_dir_name(5), 5, m, run.store.params,
                 *run.optimizer, *run.loader, run.store.stream, 1, 1 << 20, carried);
    writer.finish(run.store.params, *run.optimizer, run.store.stream);
    const fs::path step5 = dir.path() / "async" / checkpoint_dir_name(5);
    EXPECT_TRUE(fs::equivalent(step5 / kMtpLayersFile, folder / kMtpLayersFile));
    EXPECT_EQ(ShardedCheckpoint(step5.string()).manifest().carried,
              std::vector<ShardFileInfo>{carried->info});
  }

  // A run without a carried file saves none, and its export has no MTP tensors.
  run.save(dir.path() / "plain", 4, std::nullopt);
  EXPECT_FALSE(fs::exists(dir.path() / "plain" / checkpoint_dir_name(4) / kMtpLayersFile));
  EXPECT_FALSE(relink_mtp_layers((dir.path() / "plain" / checkpoint_dir_name(4)).string(),
                                 (dir.path() / "plain2").string()));
  const HfExportSummary plain = export_hf_checkpoint((dir.path() / "plain").string(),
                                                     (dir.path() / "export_plain").string(), {});
  EXPECT_EQ(plain.carried_tensors, 0);

  // A corrupt carried file fails the export, which leaves nothing; a missing one too.
  {
    std::fstream f(step2 / kMtpLayersFile, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    const char c = static_cast<char>(f.get());
    f.seekp(-3, std::ios::end);
    f.put(static_cast<char>(~c));
  }
  const fs::path bad = dir.path() / "export_bad";
  EXPECT_CONTAINS(error_of([&] { export_hf_checkpoint(step2.string(), bad.string(), {}); }),
                  (step2 / kMtpLayersFile).string() + ": bytes [");
  EXPECT_FALSE(fs::exists(bad));
  fs::remove(step2 / kMtpLayersFile);
  EXPECT_CONTAINS(error_of([&] { export_hf_checkpoint(step2.string(), bad.string(), {}); }),
                  "mtp_layers.safetensors, a carried file its manifest.json lists, is missing");
  EXPECT_CONTAINS(
      error_of([&] { relink_mtp_layers(step2.string(), (dir.path() / "resumed2").string()); }),
      "missing; the checkpoint's manifest.json lists it as a carried file");
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().rfind(".tmp_export", 0), std::string::npos) << e.path();
  }
}

TEST(DeepseekMtp, NothingIsWrittenWithoutMtpTensors) {
  TempDir dir;
  const ModelConfig m = test_support::small_deepseek(0);
  const DeepseekHub hub = test_support::deepseek_hub(m, 8);
  EXPECT_TRUE(hub.mtp.empty());
  test_support::write_deepseek_dir(dir.path() / "hf", hub, 1, test_support::fp8_quantization(8));
  Store store(m, DType::bf16);
  const HfCheckpoint hf((dir.path() / "hf").string());
  load_hf_weights(hf, store.params, store.stream, 0);
  EXPECT_FALSE(write_mtp_layers(hf, m, (dir.path() / "mtp.safetensors").string()));
  EXPECT_FALSE(fs::exists(dir.path() / "mtp.safetensors"));
  expect_params_are(store, hub);
}

TEST(ShardManifestCarried, CarriedFilesRoundTripAndAreValidatedLikeFiles) {
  ShardManifest m;
  m.block_bytes = 100;
  m.carried.push_back({"mtp_layers.safetensors", 150, {{100, 7}, {50, 9}}});
  const ShardManifest back = ShardManifest::parse(m.to_json(), "manifest.json");
  ASSERT_EQ(back.carried.size(), 1u);
  EXPECT_EQ(back.carried[0].name, "mtp_layers.safetensors");
  EXPECT_EQ(back.carried[0].blocks, m.carried[0].blocks);
  // None: the manifest a checkpoint always had.
  EXPECT_EQ(ShardManifest{}.to_json().find("carried_files"), std::string::npos);
  ShardManifest bad = m;
  bad.carried[0].bytes = 151;
  EXPECT_CONTAINS(error_of([&] { bad.validate("manifest.json"); }),
                  "the checksum blocks of file mtp_layers.safetensors cover 150 bytes of its 151");
  bad = m;
  bad.files.push_back({"mtp_layers.safetensors", 0, {}});
  EXPECT_CONTAINS(error_of([&] { bad.validate("manifest.json"); }),
                  "file mtp_layers.safetensors listed twice");
  bad = m;
  bad.carried[0].name = "../x";
  EXPECT_CONTAINS(error_of([&] { bad.validate("manifest.json"); }), "is not a plain name");
}

}  // namespace
}  // namespace moepeak
