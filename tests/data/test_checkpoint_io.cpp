// Tests of the checkpoint file layer: safetensors round trips for every dtype (empty tensors and
// metadata included), a file built byte by byte from the format description, corrupted files
// (each error must name the file), atomic writes that leave the old file intact on failure, and
// the HF config.json round trip and field names.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/checkpoint/hf_config.h"
#include "core/checkpoint/safetensors.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/runtime/dtype.h"

namespace moepeak {
namespace {

using test_support::error_of;

class CheckpointIoTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write_bytes(const std::string& name, const std::string& bytes) {
    std::string p = path(name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  static std::string read_bytes(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::vector<std::string> directory_entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_))
      names.push_back(e.path().filename().string());
    return names;
  }

  // A safetensors file from a header text and data bytes, following the format byte by byte.
  static std::string safetensors_bytes(const std::string& header, const std::string& data,
                                       uint64_t declared_size = UINT64_MAX) {
    uint64_t n = declared_size == UINT64_MAX ? header.size() : declared_size;
    std::string bytes;
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    return bytes + header + data;
  }

  test_support::TempDir temp_{"moepeak_test_ckpt"};
  const std::filesystem::path& dir_ = temp_.path();
};

// ---- Safetensors ------------------------------------------------------------------------------

TEST_F(CheckpointIoTest, SafetensorsRoundTripEveryDtype) {
  std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, 1e-30f, -7.0f};
  std::vector<double> f64 = {3.141592653589793, -1e300};
  std::vector<bf16> b16 = {bf16(1.0f), bf16(-0.5f), bf16(65504.0f)};
  std::vector<int32_t> i32 = {-1, 0, 2147483647};
  std::vector<int64_t> i64 = {INT64_MIN, 42};
  std::vector<uint8_t> u8 = {0, 1, 255, 7, 9};
  float scalar = 0.125f;

  SafetensorsWriter w;
  w.add("model.layers.0.weight", DType::f32, {2, 3}, f32.data(), f32.size() * 4);
  w.add("f64", DType::f64, {2}, f64.data(), 16);
  w.add("bf16", DType::bf16, {3}, b16.data(), 6);
  w.add("i32", DType::i32, {3, 1}, i32.data(), 12);
  w.add("i64", DType::i64, {2}, i64.data(), 16);
  w.add("u8", "U8", {5}, u8.data(), 5);
  w.add("empty", DType::f32, {0}, nullptr, 0);
  w.add("empty_2d", DType::bf16, {4, 0}, nullptr, 0);
  w.add("scalar", DType::f32, {}, &scalar, 4);
  w.set_metadata("format", "pt");
  w.set_metadata("moepeak_step", "100");
  const std::string p = path("model.safetensors");
  w.write(p);

  // The header is padded with spaces so the data starts at a multiple of 8.
  const std::string raw = read_bytes(p);
  uint64_t header_size = 0;
  std::memcpy(&header_size, raw.data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + header_size + w.data_bytes());
  EXPECT_EQ(raw.substr(8, header_size), w.header_json());

  SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"model.layers.0.weight", "f64", "bf16", "i32",
                                                 "i64", "u8", "empty", "empty_2d", "scalar"}));
  EXPECT_EQ(f.metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"moepeak_step", "100"}}));

  auto expect_tensor = [&](const std::string& name, const std::string& dtype,
                           std::vector<int64_t> shape, const void* expected, size_t bytes) {
    SCOPED_TRACE(name);
    const SafetensorsTensorInfo& info = f.info(name);
    EXPECT_EQ(info.dtype, dtype);
    EXPECT_EQ(info.shape, shape);
    EXPECT_EQ(info.bytes, bytes);
    std::vector<uint8_t> got(bytes);
    f.read(name, got.data(), bytes);
    if (bytes > 0) {
      EXPECT_EQ(std::memcmp(got.data(), expected, bytes), 0);
    }
  };
  expect_tensor("model.layers.0.weight", "F32", {2, 3}, f32.data(), 24);
  expect_tensor("f64", "F64", {2}, f64.data(), 16);
  expect_tensor("bf16", "BF16", {3}, b16.data(), 6);
  expect_tensor("i32", "I32", {3, 1}, i32.data(), 12);
  expect_tensor("i64", "I64", {2}, i64.data(), 16);
  expect_tensor("u8", "U8", {5}, u8.data(), 5);
  expect_tensor("empty", "F32", {0}, nullptr, 0);
  expect_tensor("empty_2d", "BF16", {4, 0}, nullptr, 0);
  expect_tensor("scalar", "F32", {}, &scalar, 4);
  EXPECT_EQ(f.info("scalar").elements(), 1);
  EXPECT_EQ(dtype_from_safetensors(f.info("bf16").dtype), DType::bf16);
  EXPECT_FALSE(dtype_from_safetensors("U8").has_value());

  std::vector<float> wrong(5);
  EXPECT_CONTAINS(
      error_of([&] { f.read("model.layers.0.weight", wrong.data(), 20); }),
      p + ": tensor \"model.layers.0.weight\" (F32 [2, 3]) is 24 bytes, the destination is 20");
  EXPECT_CONTAINS(error_of([&] { f.info("missing"); }), p + ": no tensor \"missing\"");
}

TEST_F(CheckpointIoTest, SafetensorsWriterRejectsBadTensors) {
  float x[4] = {};
  SafetensorsWriter w;
  w.add("x", DType::f32, {4}, x, 16);
  EXPECT_CONTAINS(error_of([&] { w.add("x", DType::f32, {4}, x, 16); }), "\"x\" added twice");
  EXPECT_CONTAINS(error_of([&] { w.add("y", DType::f32, {5}, x, 16); }),
                  "tensor \"y\": shape [5] of F32 is 20 bytes, but 16 bytes were given");
  EXPECT_CONTAINS(error_of([&] { w.add("z", DType::f32, {-1}, x, 16); }), "bad shape [-1]");
  EXPECT_CONTAINS(error_of([&] { w.add("q", "F8_E5M2", {4}, x, 4); }), "unknown dtype \"F8_E5M2\"");
  EXPECT_CONTAINS(error_of([&] { w.add("__metadata__", DType::f32, {4}, x, 16); }), "reserved");
}

TEST_F(CheckpointIoTest, ReadsAHandWrittenFile) {
  // Header (no padding: the format does not require it), then the data section:
  //   a: F32 [2]   at [0, 8)   = 1.5, -2.0
  //   b: I64 [1]   at [8, 16)  = 258
  //   c: U8  [3]   at [16, 19) = 1, 2, 3
  //   d: BF16 [2]  at [19, 23) = 1.0, -2.0 (0x3F80, 0xC000)
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("c":{"dtype":"U8","shape":[3],"data_offsets":[16,19]},)"
      R"("d":{"dtype":"BF16","shape":[2],"data_offsets":[19,23]}})";
  const std::string data = std::string("\x00\x00\xc0\x3f", 4) + std::string("\x00\x00\x00\xc0", 4) +
                           std::string("\x02\x01\x00\x00\x00\x00\x00\x00", 8) +
                           std::string("\x01\x02\x03", 3) + std::string("\x80\x3f\x00\xc0", 4);
  const std::string p = write_bytes("hand.safetensors", safetensors_bytes(header, data));

  SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"b", "a", "c", "d"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  float a[2];
  f.read("a", a, sizeof(a));
  EXPECT_EQ(a[0], 1.5f);
  EXPECT_EQ(a[1], -2.0f);
  int64_t b = 0;
  f.read("b", &b, 8);
  EXPECT_EQ(b, 258);
  uint8_t c[3];
  f.read("c", c, 3);
  EXPECT_EQ(c[0] + 10 * c[1] + 100 * c[2], 321);
  bf16 d[2];
  f.read("d", d, 4);
  EXPECT_EQ(static_cast<float>(d[0]), 1.0f);
  EXPECT_EQ(static_cast<float>(d[1]), -2.0f);
  EXPECT_EQ(f.info("d").file_offset, 8 + header.size() + 19);
}

TEST_F(CheckpointIoTest, CorruptedFilesNameTheFile) {
  float x[4] = {1, 2, 3, 4};
  SafetensorsWriter w;
  w.add("w", DType::f32, {4}, x, 16);
  const std::string good = path("good.safetensors");
  w.write(good);
  const std::string bytes = read_bytes(good);
  auto open_error = [&](const std::string& name, const std::string& content) {
    const std::string p = write_bytes(name, content);
    return std::make_pair(p, error_of([&] { SafetensorsFile::open(p); }));
  };

  auto [p1, e1] = open_error("tiny", bytes.substr(0, 5));
  EXPECT_CONTAINS(e1, p1 + ": truncated: 5 bytes, too short for the 8-byte header size");

  auto [p2, e2] = open_error("truncated", bytes.substr(0, bytes.size() - 4));
  EXPECT_CONTAINS(
      e2,
      p2 + ": tensor \"w\": data_offsets [0, 16] are out of range: the data section has 12 bytes");

  const std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  auto [p3, e3] = open_error("past_eof", safetensors_bytes(header, std::string(16, '\0'), 1000));
  EXPECT_CONTAINS(e3, p3 + ": header size 1000 runs past the end of the file (" +
                          std::to_string(8 + header.size() + 16) + " bytes)");

  auto [p4, e4] = open_error(
      "range", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                                 std::string(16, '\0')));
  EXPECT_CONTAINS(e4, p4 + ": tensor \"w\": data_offsets [8, 24] are out of range");

  auto [p5, e5] = open_error(
      "shape", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})",
                                 std::string(16, '\0')));
  EXPECT_CONTAINS(
      e5, p5 + ": tensor \"w\": shape [3] of F32 needs 12 bytes but data_offsets [0, 16] hold 16");

  auto [p6, e6] = open_error(
      "overlap",
      safetensors_bytes(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          std::string(12, '\0')));
  EXPECT_CONTAINS(e6, p6 + ": tensors \"a\" [0, 8) and \"b\" [4, 12) overlap");

  auto [p7, e7] = open_error(
      "dtype", safetensors_bytes(R"({"w":{"dtype":"F8_E5M2","shape":[4],"data_offsets":[0,4]}})",
                                 std::string(4, '\0')));
  EXPECT_CONTAINS(e7, p7 + ": tensor \"w\": unknown dtype \"F8_E5M2\"");

  auto [p8, e8] = open_error("json", safetensors_bytes("{\"w\": [1, 2", ""));
  EXPECT_CONTAINS(e8, p8 + ": the header is not valid JSON");

  auto [p9, e9] =
      open_error("fields", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[0]}})", ""));
  EXPECT_CONTAINS(e9, p9 + ": tensor \"w\": missing \"data_offsets\"");

  auto [p10, e10] = open_error(
      "negative",
      safetensors_bytes(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", ""));
  EXPECT_CONTAINS(
      e10, p10 + ": tensor \"w\": \"shape\" [-1] has an entry that is not a non-negative integer");

  auto [p11, e11] = open_error("metadata", safetensors_bytes(R"({"__metadata__":{"k":1}})", ""));
  EXPECT_CONTAINS(e11, p11 + ": metadata \"k\" is not a string");

  const std::string missing = path("missing.safetensors");
  EXPECT_CONTAINS(error_of([&] { SafetensorsFile::open(missing); }), missing + ": cannot open");
}

// ---- Atomic writes ----------------------------------------------------------------------------

TEST_F(CheckpointIoTest, AtomicWriteReplacesTheFile) {
  const std::string p = path("state.bin");
  write_file_atomically(p, "first");
  EXPECT_EQ(read_bytes(p), "first");
  write_file_atomically(p, [](FileSink& out) {
    out.write("sec");
    out.write("ond");
    EXPECT_EQ(out.bytes_written(), 6u);
  });
  EXPECT_EQ(read_bytes(p), "second");
  EXPECT_EQ(directory_entries(), std::vector<std::string>{"state.bin"})
      << "no temporary file is left";
}

TEST_F(CheckpointIoTest, FailedAtomicWriteLeavesTheOldFile) {
  const std::string p = path("model.safetensors");
  write_file_atomically(p, "old contents");

  // The producer throws half-way: the target keeps its old contents, the temp file is gone.
  EXPECT_THROW(write_file_atomically(p,
                                     [](FileSink& out) {
                                       out.write("half of the new fi");
                                       MOEPEAK_THROW("simulated failure while writing");
                                     }),
               Error);
  EXPECT_EQ(read_bytes(p), "old contents");
  EXPECT_EQ(directory_entries(), std::vector<std::string>{"model.safetensors"});

  // Any other exception behaves the same.
  EXPECT_THROW(write_file_atomically(p, [](FileSink&) { throw std::runtime_error("boom"); }),
               std::runtime_error);
  EXPECT_EQ(read_bytes(p), "old contents");
  EXPECT_EQ(directory_entries().size(), 1u);

  // A directory that does not exist, or a target that is a directory: an Error naming the path.
  const std::string nowhere = path("no_such_dir/model.safetensors");
  EXPECT_CONTAINS(error_of([&] { write_file_atomically(nowhere, "x"); }),
                  nowhere + ": cannot create a temporary file in " + path("no_such_dir"));
  std::filesystem::create_directory(path("a_dir"));
  EXPECT_CONTAINS(error_of([&] { write_file_atomically(path("a_dir"), "x"); }),
                  path("a_dir") + ": is a directory");

  // The safetensors writer goes through the same path.
  float x[2] = {1, 2};
  SafetensorsWriter w;
  w.add("x", DType::f32, {2}, x, 8);
  EXPECT_CONTAINS(error_of([&] { w.write(nowhere); }), nowhere);
  EXPECT_FALSE(std::filesystem::exists(path("no_such_dir")));
}

TEST_F(CheckpointIoTest, AtomicWriteIntoReadOnlyDirectoryFails) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  const std::string ro = path("readonly");
  create_directories(ro);
  write_file_atomically(ro + "/f", "old");
  std::filesystem::permissions(
      ro, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  EXPECT_CONTAINS(error_of([&] { write_file_atomically(ro + "/f", "new"); }),
                  ro + "/f: cannot create a temporary file");
  std::filesystem::permissions(ro, std::filesystem::perms::owner_all);
  EXPECT_EQ(read_bytes(ro + "/f"), "old");
}

TEST_F(CheckpointIoTest, CreateDirectories) {
  const std::string nested = path("a/b/c");
  create_directories(nested);
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  create_directories(nested);  // existing is fine
  write_bytes("file", "x");
  EXPECT_CONTAINS(error_of([&] { create_directories(path("file/sub")); }),
                  path("file/sub") + ": cannot create directory");
  EXPECT_CONTAINS(error_of([&] { create_directories(path("file")); }),
                  path("file") + ": cannot create directory");
}

// ---- config.json ------------------------------------------------------------------------------

TEST_F(CheckpointIoTest, ConfigJsonFieldNames) {
  ModelConfig m;
  m.head_dim = 0;  // written resolved
  nlohmann::json j = mixtral_config_json(m);
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(j["model_type"], "mixtral");
  EXPECT_EQ(j["vocab_size"], m.vocab_size);
  EXPECT_EQ(j["hidden_size"], m.hidden_size);
  EXPECT_EQ(j["intermediate_size"], m.intermediate_size);
  EXPECT_EQ(j["num_hidden_layers"], m.num_hidden_layers);
  EXPECT_EQ(j["num_attention_heads"], m.num_attention_heads);
  EXPECT_EQ(j["num_key_value_heads"], m.num_key_value_heads);
  EXPECT_EQ(j["head_dim"], m.hidden_size / m.num_attention_heads);
  EXPECT_EQ(j["num_local_experts"], m.num_local_experts);
  EXPECT_EQ(j["num_experts_per_tok"], m.num_experts_per_tok);
  EXPECT_EQ(j["max_position_embeddings"], m.max_position_embeddings);
  EXPECT_EQ(j["rope_theta"], m.rope_theta);
  EXPECT_EQ(j["rms_norm_eps"], m.rms_norm_eps);
  EXPECT_EQ(j["router_aux_loss_coef"], 0.0);
  EXPECT_EQ(j["output_router_logits"], false);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["initializer_range"], m.initializer_range);
  EXPECT_EQ(j["attention_dropout"], 0.0);
  EXPECT_TRUE(j["sliding_window"].is_null());
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_EQ(j["dtype"], "float32");  // transformers 5's name
  EXPECT_EQ(j["rope_parameters"]["rope_theta"], m.rope_theta);
  EXPECT_EQ(j["rope_parameters"]["rope_type"], "default");
  EXPECT_EQ(j.size(), 24u);

  m.router_aux_loss_coef = 0.02;
  EXPECT_EQ(mixtral_config_json(m)["output_router_logits"], true);
}

TEST_F(CheckpointIoTest, ConfigJsonRoundTrip) {
  ModelConfig m;
  m.vocab_size = 32000;
  m.hidden_size = 96;
  m.head_dim = 32;
  m.rope_theta = 1e6;
  m.rms_norm_eps = 1e-6;
  m.router_aux_loss_coef = 0.02;
  m.initializer_range = 0.01;
  const std::string p = path("config.json");
  write_config_json(p, m, DType::f32);
  EXPECT_EQ(read_config_json(p), m);
  EXPECT_EQ(model_config_from_json(nlohmann::json::parse(read_bytes(p)), p), m);
  EXPECT_EQ(read_bytes(p).back(), '\n');

  ModelConfig defaults;
  EXPECT_EQ(model_config_from_json(mixtral_config_json(defaults), "x"), defaults);
}

TEST_F(CheckpointIoTest, ConfigJsonErrorsNameSourceAndField) {
  const nlohmann::json good = mixtral_config_json(ModelConfig{});
  nlohmann::json missing = good;
  missing.erase("num_local_experts");
  EXPECT_EQ(error_of([&] { model_config_from_json(missing, "ckpt/config.json"); }),
            "ckpt/config.json: field \"num_local_experts\" is missing");
  nlohmann::json typed = good;
  typed["hidden_size"] = "64";
  EXPECT_EQ(error_of([&] { model_config_from_json(typed, "ckpt/config.json"); }),
            "ckpt/config.json: field \"hidden_size\" must be an integer, got string \"64\"");
  nlohmann::json fractional = good;
  fractional["num_hidden_layers"] = 2.5;
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(fractional, "c.json"); }),
                  "c.json: field \"num_hidden_layers\" must be an integer");
  nlohmann::json theta = good;
  theta["rope_theta"] = nullptr;
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(theta, "c.json"); }),
                  "c.json: field \"rope_theta\" must be a number, got null");
  nlohmann::json type = good;
  type["model_type"] = "llama";
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(type, "c.json"); }),
                  "c.json: field \"model_type\"");
  // A tied head is a model every family may have (it used to be refused here).
  nlohmann::json tied = good;
  tied["tie_word_embeddings"] = true;
  EXPECT_TRUE(model_config_from_json(tied, "c.json").tie_word_embeddings);
  nlohmann::json window = good;
  window["sliding_window"] = 16;
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(window, "c.json"); }),
                  "\"sliding_window\" is 16");
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(nlohmann::json::array(), "c.json"); }),
                  "c.json: expected a JSON object");
  const std::string bad = write_bytes("bad.json", "{not json");
  EXPECT_CONTAINS(error_of([&] { read_config_json(bad); }), bad + ": not valid JSON");
}

TEST_F(CheckpointIoTest, ConfigJsonOptionalFieldsFollowTransformers) {
  // A minimal config as an older Mixtral checkpoint has it: no head_dim, aux coefficient set
  // but output_router_logits absent (false), so the auxiliary loss is off.
  nlohmann::json j = mixtral_config_json(ModelConfig{});
  j.erase("head_dim");
  j.erase("initializer_range");
  j.erase("output_router_logits");
  j["router_aux_loss_coef"] = 0.001;
  ModelConfig m = model_config_from_json(j, "c.json");
  EXPECT_EQ(m.head_dim, 0);
  EXPECT_EQ(m.head_dim_resolved(), 16);
  EXPECT_EQ(m.initializer_range, 0.02);
  EXPECT_EQ(m.router_aux_loss_coef, 0.0);
  j["output_router_logits"] = true;
  EXPECT_EQ(model_config_from_json(j, "c.json").router_aux_loss_coef, 0.001);
  j["head_dim"] = nullptr;
  EXPECT_EQ(model_config_from_json(j, "c.json").head_dim, 0);
}

}  // namespace
}  // namespace moepeak
