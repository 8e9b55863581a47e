// Hugging Face models in and out (core/checkpoint/hf_export.h, hf_import.h): the float
// conversions (F16 widening exactly, F32 -> BF16 to nearest even), streamed safetensors writes,
// both config.json forms (transformers 4 and 5) and the rope settings refused, the [model] merge
// of model.init_from (keys taken, keys that disagree, training choices kept), export of a trained
// checkpoint (F32 bit for bit, BF16 as the nearest-even rounding, packed by --max-shard-size, an
// index that covers it, nothing left behind on failure) and import (single file or index; F32,
// BF16, F16; an export starts with the same loss the checkpoint's run had at that step; a
// missing, misshapen or foreign tensor is an error naming it; a resumed run ignores init_from).
//     ctest -R test_hf_checkpoint --output-on-failure
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/checkpoint/hf_config.h"
#include "core/checkpoint/hf_export.h"
#include "core/checkpoint/hf_import.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/sharded_checkpoint.h"
#include "core/checkpoint/train_checkpoint.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/model/param_layout.h"
#include "core/train/trainer.h"
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::error_of;
using test_support::TempDir;

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// ---- conversions and the streamed writer --------------------------------------------------

TEST(HfDtypes, F16WidensExactlyAndF32NarrowsToTheNearestEvenBf16) {
  // f16 bit patterns and their exact values: normals, the largest, the smallest normal and
  // subnormal, -0, infinities and a NaN.
  const std::vector<std::pair<uint16_t, float>> cases = {
      {0x3c00, 1.0f},
      {0xc000, -2.0f},
      {0x3555, 0x1.554p-2f},
      {0x7bff, 65504.0f},
      {0x0400, 0x1p-14f},
      {0x0001, 0x1p-24f},
      {0x03ff, 0x1.ff8p-15f},
      {0x8000, -0.0f},
      {0x7c00, std::numeric_limits<float>::infinity()},
      {0xfc00, -std::numeric_limits<float>::infinity()}};
  for (const auto& [bits, value] : cases) {
    float out = 0;
    convert_float_elements(&bits, "F16", &out, "F32", 1);
    EXPECT_EQ(std::memcmp(&out, &value, 4), 0) << std::hex << bits << " -> " << out;
  }
  const uint16_t nan = 0x7e00;
  float out = 0;
  convert_float_elements(&nan, "F16", &out, "F32", 1);
  EXPECT_TRUE(std::isnan(out));

  // F32 -> BF16: ties go to even, others to nearest.
  const std::vector<std::pair<uint32_t, uint16_t>> narrow = {
      {0x3f808000u, 0x3f80},  // halfway, even below
      {0x3f818000u, 0x3f82},  // halfway, even above
      {0x3f808001u, 0x3f81},  // just past halfway
      {0x3f807fffu, 0x3f80}};
  for (const auto& [in, expect] : narrow) {
    const float f = bits_to_float(in);
    uint16_t b = 0;
    convert_float_elements(&f, "F32", &b, "BF16", 1);
    EXPECT_EQ(b, expect) << std::hex << in;
  }
  EXPECT_CONTAINS(error_of([&] { convert_float_elements(&out, "F32", &out, "F16", 1); }),
                  "cannot convert F32 to F16");
}

TEST(SafetensorsStreamed, WritesWhatItProducesAndRefusesAWrongByteCount) {
  TempDir dir;
  const std::vector<float> data = {1, 2, 3, 4, 5, 6};
  SafetensorsWriter w;
  w.add("a", DType::f32, {2}, data.data(), 8);
  w.add_streamed("b", "F32", {2, 2}, [&](FileSink& sink) {
    sink.write(data.data() + 2, 8);  // in two pieces
    sink.write(data.data() + 4, 8);
  });
  const std::string path = (dir.path() / "x.safetensors").string();
  w.write(path);
  SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<float> b(4);
  f.read("b", b.data(), 16);
  EXPECT_EQ(b, std::vector<float>(data.begin() + 2, data.end()));
  float second_row[2];
  f.read_bytes("b", 8, second_row, 8);
  EXPECT_EQ(second_row[0], 5);
  EXPECT_CONTAINS(error_of([&] { f.read_bytes("b", 12, second_row, 8); }), "out of range");

  SafetensorsWriter bad;
  bad.add_streamed("short", "F32", {3}, [&](FileSink& sink) { sink.write(data.data(), 8); });
  const std::string bad_path = (dir.path() / "bad.safetensors").string();
  EXPECT_CONTAINS(error_of([&] { bad.write(bad_path); }), "streamed as 8 bytes");
  EXPECT_FALSE(fs::exists(bad_path)) << "nothing half-written";
}

// ---- config.json in both forms -------------------------------------------------------------

nlohmann::json transformers5_form(const ModelConfig& m) {
  nlohmann::json j = mixtral_config_json(m, "bfloat16");
  j.erase("rope_theta");
  j.erase("torch_dtype");
  j["head_dim"] = nullptr;
  return j;
}

TEST(HfConfig, TheTransformers5FormReadsAsThe4Form) {
  ModelConfig m;
  m.head_dim = 0;
  m.rope_theta = 1e6;
  nlohmann::json four = mixtral_config_json(m);
  four.erase("rope_parameters");
  four.erase("dtype");
  const ModelConfig from4 = model_config_from_json(four, "v4/config.json");
  ModelConfig from5 = model_config_from_json(transformers5_form(m), "v5/config.json");
  EXPECT_EQ(from4.head_dim, 16) << "transformers 4 form: written resolved";
  EXPECT_EQ(from5.head_dim, 0) << "\"head_dim\": null: derived";
  from5.head_dim = from5.head_dim_resolved();
  EXPECT_EQ(from4, from5);
  EXPECT_EQ(from5.rope_theta, 1e6);
  EXPECT_EQ(from5.head_dim_resolved(), m.hidden_size / m.num_attention_heads);
}

// RoPE scaling was refused here until the families brought it (tests/model/test_families.cpp
// holds every type); what stays an error is a scaling moepeak cannot read and two thetas.
TEST(HfConfig, RopeScalingAndDisagreeingThetasAreErrorsNamingTheField) {
  const nlohmann::json base = mixtral_config_json(ModelConfig{});
  nlohmann::json linear = base;
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  // As transformers 4 and 5 both do, a non-empty rope_scaling is the scaling.
  const ModelConfig scaled = model_config_from_json(linear, "c.json");
  EXPECT_EQ(scaled.rope_type, RopeType::linear);
  EXPECT_EQ(scaled.rope_factor, 4.0);
  nlohmann::json yarn = base;
  yarn["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}};
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(yarn, "c.json"); }),
                  "rope_type \"yarn\" needs \"factor\" or \"original_max_position_embeddings\"");
  nlohmann::json two = base;
  two["rope_parameters"]["rope_theta"] = 5.0;
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(two, "c.json"); }), "disagree");
  nlohmann::json none = base;
  none.erase("rope_theta");
  none.erase("rope_parameters");
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(none, "c.json"); }),
                  "field \"rope_theta\" is missing");
  nlohmann::json fine = base;
  fine["rope_scaling"] = nullptr;
  EXPECT_NO_THROW(model_config_from_json(fine, "c.json"));
}

// ---- the [model] merge -------------------------------------------------------------------

// A Hugging Face directory with only a config.json (the merge reads nothing else).
fs::path config_only(const TempDir& dir, const nlohmann::json& config) {
  const fs::path p = dir.path() / "hf";
  fs::create_directories(p);
  write_file_atomically((p / "config.json").string(), config.dump(2));
  return p;
}

ModelConfig wide_model() {
  ModelConfig m;
  m.hidden_size = 96;
  m.head_dim = 0;  // 96 / 4 = 24
  m.vocab_size = 40;
  m.rope_theta = 1e6;
  m.router_aux_loss_coef = 0.01;  // output_router_logits true
  return m;
}

TEST(InitFrom, KeysTheUserDidNotSetComeFromConfigJsonWithItsName) {
  TempDir dir;
  const fs::path hf = config_only(dir, transformers5_form(wide_model()));
  const Config cfg = with_init_from_model(
      load_config({}, {"model.init_from=" + hf.string(), "model.vocab_size=40"}));
  EXPECT_EQ(cfg.model.hidden_size, 96);
  EXPECT_EQ(cfg.model.head_dim_resolved(), 24);
  EXPECT_EQ(cfg.model.rope_theta, 1e6);
  EXPECT_EQ(cfg.model.router_aux_loss_coef, 0.01);
  EXPECT_EQ(cfg.origin("model.hidden_size"), (hf / "config.json").string());
  EXPECT_EQ(cfg.origin("model.vocab_size"), "--set model.vocab_size=40") << "set, and agreeing";
  EXPECT_EQ(with_init_from_model(cfg), cfg) << "idempotent";
  EXPECT_EQ(with_init_from_model(load_config({}, {})), load_config({}, {})) << "no init_from";
}

TEST(InitFrom, AKeyThatDisagreesNamesBothValuesAndTrainingChoicesStayTheUsers) {
  TempDir dir;
  const fs::path hf = config_only(dir, mixtral_config_json(wide_model()));
  const std::string from = "model.init_from=" + hf.string();
  const std::string e = error_of([&] {
    with_init_from_model(load_config({}, {from, "model.hidden_size=64"}));
  });
  EXPECT_CONTAINS(e, "model.hidden_size = 64 (--set model.hidden_size=64)");
  EXPECT_CONTAINS(e, (hf / "config.json").string() + " has hidden_size = 96");
  // head_dim = 0 (derived) agrees with the 24 config.json spells out.
  EXPECT_NO_THROW(with_init_from_model(load_config({}, {from, "model.head_dim=0"})));
  const Config mine = with_init_from_model(
      load_config({}, {from, "model.router_aux_loss_coef=0.5", "model.initializer_range=0.1"}));
  EXPECT_EQ(mine.model.router_aux_loss_coef, 0.5);
  EXPECT_EQ(mine.model.initializer_range, 0.1);
  // The merged config is checked like a loaded one.
  EXPECT_CONTAINS(error_of([&] {
                    with_init_from_model(load_config({}, {from, "training.seq_len=1024"}));
                  }),
                  "training.seq_len = 1024");
  EXPECT_CONTAINS(
      error_of([&] { with_init_from_model(load_config({}, {"model.init_from=/no/such/dir"})); }),
      "is not a directory");
}

// Packed documents end at config.json's eos_token_id (an id, or a list whose first is taken);
// the user's model.eos_token_id wins (the pretraining text's EOS may not be the chat model's).
TEST(InitFrom, TheEosTokenIdComesFromConfigJsonAndIsTheUsersToChange) {
  TempDir dir;
  nlohmann::json config = mixtral_config_json(wide_model());
  config["eos_token_id"] = {7, 9};
  const fs::path hf = config_only(dir, config);
  const std::string from = "model.init_from=" + hf.string();
  const Config cfg = with_init_from_model(load_config({}, {from, "training.document_mask=true"}));
  EXPECT_EQ(cfg.model.eos_token_id, 7);
  EXPECT_EQ(model_config_json(cfg.model)["eos_token_id"], 7) << "written back";
  const Config mine = with_init_from_model(
      load_config({}, {from, "training.document_mask=true", "model.eos_token_id=3"}));
  EXPECT_EQ(mine.model.eos_token_id, 3);

  config["eos_token_id"] = nullptr;
  EXPECT_EQ(model_config_from_json(config, "c.json").eos_token_id, -1);
  const fs::path none = config_only(dir, config);
  EXPECT_CONTAINS(error_of([&] {
                    with_init_from_model(load_config(
                        {}, {"model.init_from=" + none.string(), "training.document_mask=true"}));
                  }),
                  "cuts windows at model.eos_token_id, but none is set");
  config["eos_token_id"] = "</s>";
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(config, "c.json"); }),
                  "c.json: eos_token_id is \"</s>\", expected a token id or a list of them");
}

// ---- export and import of trained checkpoints ----------------------------------------------

constexpr int64_t kBatch = 4, kSeq = 16, kVocab = 32;

// A token file of exactly one batch (B*T tokens): every step trains on the same windows, so the
// loss of a step depends on the weights alone.
fs::path one_batch_file(const TempDir& dir) {
  std::vector<uint16_t> tokens(kBatch * kSeq);
  std::mt19937 rng(5);
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng() % kVocab);
  const fs::path p = dir.path() / "one_batch.bin";
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return p;
}

Config run_config(const TempDir& dir, const std::string& name, int64_t steps,
                  std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"job.run_dir=" + dir.path().string(),
                                   "job.name=" + name,
                                   "training.steps=" + std::to_string(steps),
                                   "training.seq_len=" + std::to_string(kSeq),
                                   "training.batch_size=" + std::to_string(kBatch),
                                   "training.dataset=bin",
                                   "training.dataset_path=" + one_batch_file(dir).string(),
                                   "training.shuffle=false",  // every step reads the one batch
                                   "metrics.progress=off",
                                   "runtime.log_level=warn"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config({}, sets);
}

// model.vocab_size etc. are left to config.json when init_from is set, so that config carries
// only the run's keys; the source run sets the model.
const std::vector<std::string> kModel = {"model.vocab_size=" + std::to_string(kVocab),
                                         "model.initializer_range=0.2"};

struct TrainedCheckpoint {
  TempDir dir{"moepeak_hf"};
  TrainResult run;
  fs::path step2;
  TrainedCheckpoint() {
    std::vector<std::string> sets = kModel;
    sets.push_back("checkpoint.enable=true");
    sets.push_back("checkpoint.interval=2");
    run = train(run_config(dir, "source", 3, sets), {});
    step2 = fs::path(run.run_dir) / "checkpoints" / checkpoint_dir_name(2);
  }
};

TEST(Export, F32HoldsTheCheckpointWeightsBitForBitInShardsNoLargerThanAsked) {
  TrainedCheckpoint src;
  HfExportOptions options;
  options.dtype = "F32";
  options.max_shard_bytes = 60'000;
  options.buffer_bytes = 4096;  // many chunks per tensor
  const fs::path out = src.dir.path() / "export";
  const HfExportSummary s = export_hf_checkpoint(src.step2.string(), out.string(), options);
  EXPECT_GT(s.files, 1);

  const nlohmann::json index = read_json(out / "model.safetensors.index.json");
  const nlohmann::json config = read_json(out / "config.json");
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["dtype"], "float32");
  EXPECT_EQ(config["architectures"][0], "MixtralForCausalLM");
  EXPECT_TRUE(read_json(out / "generation_config.json").is_object());
  EXPECT_EQ(model_config_from_json(config, "export"),
            read_config_json((src.step2 / "config.json").string()));

  ShardedCheckpoint ck(src.step2.string());
  const ParamLayout layout(model_config_from_json(config, "export"));
  uint64_t total = 0;
  std::map<std::string, uint64_t> file_bytes;
  for (const ParamInfo& p : layout.params()) {
    const std::string file = index["weight_map"].at(p.name).get<std::string>();
    SafetensorsFile f = SafetensorsFile::open((out / file).string());
    const SafetensorsTensorInfo& info = f.info(p.name);
    EXPECT_EQ(info.dtype, "F32");
    EXPECT_EQ(info.shape, p.shape.dims());
    std::vector<char> bytes(info.bytes);
    f.read(p.name, bytes.data(), bytes.size());
    EXPECT_EQ(bytes, ck.read(p.name)) << p.name;
    total += info.bytes;
    file_bytes[file] += info.bytes;
    EXPECT_EQ(f.metadata().at("format"), "pt");
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), layout.params().size());
  EXPECT_EQ(file_bytes.size(), static_cast<size_t>(s.files));
  const uint64_t largest_tensor = kVocab * 64 * 4;
  for (const auto& [file, bytes] : file_bytes) {
    EXPECT_LE(bytes, std::max<uint64_t>(options.max_shard_bytes, largest_tensor)) << file;
  }
  char first[64];
  std::snprintf(first, sizeof(first), "model-00001-of-%05d.safetensors", s.files);
  EXPECT_TRUE(file_bytes.count(first)) << first;
}

TEST(Export, Bf16IsTheNearestEvenRoundingOfEveryWeight) {
  TrainedCheckpoint src;
  const fs::path out = src.dir.path() / "export";
  // The checkpoint folder: its `latest` (step 3) is exported.
  const HfExportSummary s =
      export_hf_checkpoint((src.step2.parent_path()).string(), out.string(), {});
  EXPECT_EQ(fs::path(s.checkpoint).filename(), checkpoint_dir_name(3));
  EXPECT_EQ(s.files, 1);
  EXPECT_EQ(read_json(out / "config.json")["torch_dtype"], "bfloat16");
  ShardedCheckpoint ck(s.checkpoint);
  const HfCheckpoint hf(out.string());
  for (const std::string& name : hf.tensor_names()) {
    const std::vector<char> f32 = ck.read(name);
    const size_t n = f32.size() / 4;
    std::vector<uint16_t> expect(n), got(n);
    convert_float_elements(f32.data(), "F32", expect.data(), "BF16", n);
    hf.file(name).read(name, got.data(), n * 2);
    EXPECT_EQ(got, expect) << name;
  }
}

TEST(Export, AnExistingOutputIsRefusedAndACorruptCheckpointLeavesNothing) {
  TrainedCheckpoint src;
  const fs::path out = src.dir.path() / "export";
  fs::create_directories(out / "something");
  EXPECT_CONTAINS(error_of([&] { export_hf_checkpoint(src.step2.string(), out.string(), {}); }),
                  "already exists");
  // Flip one byte of the only shard file: the export fails naming it, and leaves no directory.
  const fs::path shard = src.step2 / "shard-00000.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(200);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(200);
    f.write(&c, 1);
  }
  const fs::path out2 = src.dir.path() / "export2";
  EXPECT_CONTAINS(error_of([&] { export_hf_checkpoint(src.step2.string(), out2.string(), {}); }),
                  "shard-00000.bin");
  EXPECT_FALSE(fs::exists(out2));
  for (const auto& e : fs::directory_iterator(src.dir.path())) {
    EXPECT_EQ(e.path().filename().string().rfind(".tmp_export", 0), std::string::npos) << e.path();
  }
}

TEST(Import, AnExportStartsWithTheLossItsCheckpointsRunHadAtThatStep) {
  TrainedCheckpoint src;
  HfExportOptions f32;
  f32.dtype = "F32";
  const fs::path out = src.dir.path() / "export";
  export_hf_checkpoint(src.step2.string(), out.string(), f32);
  // Step 3 of the source run trained on the weights of its step-2 checkpoint, on the same batch
  // as every step: the imported run's first step sees those weights and that batch.
  const TrainResult imported =
      train(run_config(src.dir, "imported", 1, {"model.init_from=" + out.string()}), {});
  ASSERT_EQ(imported.losses.size(), 1u);
  EXPECT_EQ(imported.losses[0], src.run.losses[2]) << "bitwise: same weights, batch and layout";

  // A BF16 export loads as its rounded weights: a loss near, not equal to, the F32 one.
  const fs::path out16 = src.dir.path() / "export16";
  export_hf_checkpoint(src.step2.string(), out16.string(), {});
  const TrainResult rounded =
      train(run_config(src.dir, "imported16", 1, {"model.init_from=" + out16.string()}), {});
  EXPECT_NE(rounded.losses[0], imported.losses[0]);
  EXPECT_NEAR(rounded.losses[0], imported.losses[0], 0.05 * imported.losses[0]);

  // A resumed run continues from its own checkpoint; init_from then only names the model.
  Config resumed = run_config(src.dir, "source", 3, {"model.init_from=" + out16.string()});
  resumed.checkpoint.enable = true;
  TrainOptions options;
  options.resume_from = src.step2.string();
  const TrainResult r = train(resumed, options);
  ASSERT_EQ(r.losses.size(), 1u);
  EXPECT_EQ(r.losses[0], src.run.losses[2]);
}

// Writes a Hugging Face directory of the model's weights (seeded normals) in `dtype`, as one
// file or `files` files with an index; returns the F32 values each tensor should load as.
std::map<std::string, std::vector<float>> write_hf(const fs::path& dir, const ModelConfig& model,
                                                   const std::string& dtype, int files,
                                                   const nlohmann::json& config) {
  fs::create_directories(dir);
  write_file_atomically((dir / "config.json").string(), config.dump(2));
  const ParamLayout layout(model);
  std::map<std::string, std::vector<float>> expected;
  std::vector<std::vector<char>> raw;
  std::vector<SafetensorsWriter> writers(files);
  nlohmann::json weight_map;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  raw.reserve(layout.params().size());
  for (size_t i = 0; i < layout.params().size(); ++i) {
    const ParamInfo& p = layout.params()[i];
    const size_t n = static_cast<size_t>(p.shape.numel());
    std::vector<float> values(n);
    for (float& v : values) v = normal(rng);
    const size_t element = safetensors_element_size(dtype);
    std::vector<char> bytes(n * element);
    if (dtype == "F16") {
      // Any f16 bit pattern of a finite value in [-2, 2): built from random bits directly.
      for (size_t j = 0; j < n; ++j) {
        const uint16_t h = static_cast<uint16_t>((rng() & 0x83ff) | ((rng() % 16) << 10));
        std::memcpy(bytes.data() + 2 * j, &h, 2);
      }
    } else {
      convert_float_elements(values.data(), "F32", bytes.data(), dtype, n);
    }
    std::vector<float> as_f32(n);
    convert_float_elements(bytes.data(), dtype, as_f32.data(), "F32", n);
    expected[p.name] = as_f32;
    raw.push_back(std::move(bytes));
    const int k = static_cast<int>(i % files);
    writers[k].add(p.name, dtype, p.shape.dims(), raw.back().data(), raw.back().size());
    weight_map[p.name] = "part-" + std::to_string(k) + ".safetensors";
  }
  if (files == 1) {
    writers[0].write((dir / "model.safetensors").string());
  } else {
    for (int k = 0; k < files; ++k)
      writers[k].write((dir / ("part-" + std::to_string(k) + ".safetensors")).string());
    write_file_atomically(
        (dir / "model.safetensors.index.json").string(),
        nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
  }
  return expected;
}

struct ImportCase {
  std::string dtype;
  int files;
  bool transformers5;
};

class ImportFormats : public testing::TestWithParam<ImportCase> {};

TEST_P(ImportFormats, EveryWeightLoadsAsItsF32Value) {
  const ImportCase c = GetParam();
  TempDir dir;
  ModelConfig model;
  model.vocab_size = kVocab;
  const nlohmann::json config =
      c.transformers5 ? transformers5_form(model) : mixtral_config_json(model);
  const fs::path hf = dir.path() / "hf";
  const auto expected = write_hf(hf, model, c.dtype, c.files, config);
  TrainOptions options;
  options.dump_step_dir = (dir.path() / "dump").string();
  train(run_config(dir, "import", 1, {"model.init_from=" + hf.string()}), options);
  SafetensorsFile dumped =
      SafetensorsFile::open((dir.path() / "dump" / "model.safetensors").string());
  for (const auto& [name, values] : expected) {
    std::vector<float> got(values.size());
    dumped.read(name, got.data(), got.size() * 4);
    EXPECT_EQ(std::memcmp(got.data(), values.data(), got.size() * 4), 0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ImportFormats,
                         testing::Values(ImportCase{"F32", 1, false}, ImportCase{"BF16", 3, true},
                                         ImportCase{"F16", 2, false}, ImportCase{"BF16", 1, true}),
                         [](const testing::TestParamInfo<ImportCase>& info) {
                           return info.param.dtype + "_files" + std::to_string(info.param.files) +
                                  (info.param.transformers5 ? "_transformers5" : "_transformers4");
                         });

TEST(Import, AMissingMisshapenOrForeignTensorIsAnErrorNamingIt) {
  TempDir dir;
  ModelConfig model;
  model.vocab_size = kVocab;
  const fs::path hf = dir.path() / "hf";
  write_hf(hf, model, "F32", 1, mixtral_config_json(model));
  const Config cfg = run_config(dir, "import", 1, {"model.init_from=" + hf.string()});
  auto rewrite = [&](const std::function<void(SafetensorsWriter&, const SafetensorsFile&)>& edit) {
    const std::string path = (hf / "model.safetensors").string();
    SafetensorsFile f = SafetensorsFile::open(path);
    std::vector<std::vector<char>> keep;
    SafetensorsWriter w;
    edit(w, f);
    for (const std::string& name : f.names()) {
      if (name == "model.norm.weight") continue;  // edit() decides about it
      keep.emplace_back(f.info(name).bytes);
      f.read(name, keep.back().data(), keep.back().size());
      w.add(name, f.info(name).dtype, f.info(name).shape, keep.back().data(), keep.back().size());
    }
    w.write(path + ".new");
    fs::rename(path + ".new", path);
  };
  const std::vector<float> ones(64, 1.0f);
  rewrite([&](SafetensorsWriter& w, const SafetensorsFile&) {
    w.add("model.norm.weight", DType::f32, {32}, ones.data(), 128);
  });
  std::string e = error_of([&] { train(cfg, {}); });
  EXPECT_CONTAINS(e, "model.safetensors: tensor \"model.norm.weight\" has shape (32)");
  rewrite([](SafetensorsWriter&, const SafetensorsFile&) {});
  EXPECT_CONTAINS(error_of([&] { train(cfg, {}); }), "has no tensor \"model.norm.weight\"");
  rewrite([&](SafetensorsWriter& w, const SafetensorsFile&) {
    w.add("model.norm.weight", DType::f32, {64}, ones.data(), 256);
    w.add("model.layers.0.self_attn.rotary_emb.inv_freq", DType::f32, {8}, ones.data(), 32);
  });
  EXPECT_CONTAINS(error_of([&] { train(cfg, {}); }),
                  "tensor \"model.layers.0.self_attn.rotary_emb.inv_freq\" is not a weight");
  // An index naming a file that is not there.
  write_file_atomically((hf / "model.safetensors.index.json").string(),
                        R"({"weight_map": {"lm_head.weight": "gone.safetensors"}})");
  EXPECT_CONTAINS(error_of([&] { train(cfg, {}); }), "names gone.safetensors");
}

}  // namespace
}  // namespace moepeak
