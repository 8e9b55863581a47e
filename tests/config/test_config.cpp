// Tests of the config system: defaults vs configs/tiny.toml, every kind of error (with file, line
// and key), several files and --set overrides with their origins, the TOML round trip, and
// docs/config.md covering every schema key.
#include <gtest/gtest.h>

#include <stdlib.h>
#include "tests/expect_contains.h"
#include "tests/source_dir.h"
#include "tests/temp_dir.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/error.h"
#include "core/units.h"

namespace moepeak {
namespace {

const std::string kSourceDir = test_support::source_dir();

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ConfigTest : public ::testing::Test {
 protected:
  // Writes `text` to a file in the temp dir and returns its path.
  std::string write(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  // The message of the moepeak::Error that loading throws; fails the test when none is thrown.
  static std::string load_error(const std::vector<std::string>& files,
                                const std::vector<std::string>& overrides = {}) {
    try {
      load_config(files, overrides);
    } catch (const Error& e) {
      return e.message();
    }
    ADD_FAILURE() << "load_config did not throw";
    return "";
  }

  test_support::TempDir temp_{"moepeak_test_config"};
  const std::filesystem::path& dir_ = temp_.path();
};

// ---- Defaults -------------------------------------------------------------------------------

TEST_F(ConfigTest, NoFilesGivesTheEmbeddedDefault) {
  Config cfg = load_config({}, {});
  EXPECT_TRUE(cfg.same_settings(Config{}));
  EXPECT_TRUE(cfg.origins.empty());
  EXPECT_EQ(cfg.origin("model.hidden_size"), "default");
  EXPECT_EQ(cfg.model.head_dim_resolved(), 16);
  EXPECT_EQ(cfg.training.dataset, DatasetKind::copy);
  EXPECT_EQ(cfg.runtime.device_memory_bytes(), std::optional<uint64_t>(2 * GiB));
  EXPECT_EQ(cfg.runtime.pinned_memory_bytes(), std::optional<uint64_t>(1 * GiB));
  EXPECT_EQ(cfg.schedules.sco_host_budget_bytes(), std::nullopt);  // auto
  EXPECT_EQ(cfg.job.run_path(), "runs/moepeak");
}

TEST_F(ConfigTest, TinyTomlEqualsTheEmbeddedDefaultFieldByField) {
  const std::string tiny = kSourceDir + "/configs/tiny.toml";
  Config from_file = load_config({tiny}, {});
  Config defaults = load_config({}, {});
  for (const std::string& key : config_keys()) {
    EXPECT_EQ(config_value_toml(from_file, key), config_value_toml(defaults, key)) << key;
    // Written out in full: every key is set by the file.
    EXPECT_NE(from_file.origin(key), "default") << key << " is missing from configs/tiny.toml";
    EXPECT_CONTAINS(from_file.origin(key), "tiny.toml:");
  }
  EXPECT_TRUE(from_file.same_settings(defaults));
}

TEST_F(ConfigTest, EnumNamesAreTheConfigSpelling) {
  EXPECT_EQ(enum_name(DispatchSchedule::pipelined_llep), "pipelined_llep");
  EXPECT_EQ(enum_name(BackendChoice::automatic), "auto");
  EXPECT_EQ(enum_from_name<OptimizerPlacement>("offload_stream"),
            OptimizerPlacement::offload_stream);
  EXPECT_EQ(enum_from_name<OptimizerPlacement>("offload"), std::nullopt);
}

// ---- Errors in files ------------------------------------------------------------------------

TEST_F(ConfigTest, UnknownKeyNamesFileLineAndSuggestion) {
  std::string path = write("x.toml", "[model]\nhidden_size = 64\n\nhiden_size = 32\n");
  std::string msg = load_error({path});
  EXPECT_CONTAINS(msg, path + ":4: unknown key 'model.hiden_size' (did you mean 'hidden_size'?)");
}

TEST_F(ConfigTest, KeyInTheWrongSectionPointsToItsSection) {
  std::string path = write("x.toml", "[model]\nseq_len = 64\n");
  std::string msg = load_error({path});
  EXPECT_CONTAINS(msg, path + ":2: unknown key 'model.seq_len'");
  EXPECT_CONTAINS(msg, "training.seq_len");
}

TEST_F(ConfigTest, UnknownSectionIsAnError) {
  std::string path = write("x.toml", "[job]\nseed = 1\n[modle]\nhidden_size = 64\n");
  std::string msg = load_error({path});
  EXPECT_CONTAINS(msg, path + ":3: unknown section [modle] (did you mean [model]?)");
}

TEST_F(ConfigTest, KeyOutsideAnySectionIsAnError) {
  std::string path = write("x.toml", "seed = 3\n");
  EXPECT_CONTAINS(load_error({path}), path + ":1: key 'seed' is outside any section");
  path = write("y.toml", "\nfoo = 3\n");
  EXPECT_CONTAINS(load_error({path}), path + ":2: unknown key 'foo' outside any section");
}

TEST_F(ConfigTest, ValueWhereASectionIsExpectedIsAnError) {
  std::string path = write("x.toml", "model = 3\n");
  EXPECT_CONTAINS(load_error({path}), path + ":1: 'model' is a section");
}

TEST_F(ConfigTest, TableWhereAValueIsExpectedIsAnError) {
  std::string path = write("x.toml", "[model]\nvocab_size = 300\n[model.hidden_size]\nx = 1\n");
  EXPECT_CONTAINS(load_error({path}), "model.hidden_size: expected an integer, got a table");
}

TEST_F(ConfigTest, WrongTypeNamesLineKeyAndValue) {
  std::string path = write("x.toml", "[job]\nseed = 1\n[model]\nhidden_size = \"64\"\n");
  EXPECT_CONTAINS(load_error({path}),
                  path + ":4: model.hidden_size: expected an integer, got string \"64\"");

  path = write("float_for_int.toml", "[training]\nsteps = 10.0\n");
  EXPECT_CONTAINS(load_error({path}), path + ":2: training.steps: expected an integer, got float");

  path = write("int_for_bool.toml", "[checkpoint]\nenable = 1\n");
  EXPECT_CONTAINS(load_error({path}), "checkpoint.enable: expected a boolean");

  path = write("int_for_string.toml", "[job]\nname = 7\n");
  EXPECT_CONTAINS(load_error({path}), "job.name: expected a string, got integer 7");
}

TEST_F(ConfigTest, IntegerIsAcceptedForAFloatKey) {
  std::string path = write("x.toml", "[model]\nrope_theta = 500000\n[training]\nmax_norm = 0\n");
  Config cfg = load_config({path}, {});
  EXPECT_EQ(cfg.model.rope_theta, 500000.0);
  EXPECT_EQ(cfg.training.max_norm, 0.0);
}

TEST_F(ConfigTest, OutOfRangeValuesAreErrors) {
  std::string path = write("x.toml", "[training]\nbatch_size = 4\nsteps = 0\n");
  EXPECT_CONTAINS(load_error({path}), path + ":3: training.steps must be >= 1, got 0");

  path = write("beta.toml", "[optimizer]\nbeta2 = 1.0\n");
  EXPECT_CONTAINS(load_error({path}), path + ":2: optimizer.beta2 must be in [0, 1), got 1.0");

  path = write("theta.toml", "[model]\nrope_theta = 0\n");
  EXPECT_CONTAINS(load_error({path}), "model.rope_theta must be > 0, got 0.0");

  path = write("numa.toml", "[runtime]\nnuma_node = -2\n");
  EXPECT_CONTAINS(load_error({path}), "runtime.numa_node must be >= -1, got -2");

  path = write("nan.toml", "[optimizer]\nlr = nan\n");
  EXPECT_CONTAINS(load_error({path}), "optimizer.lr must be a finite number");

  EXPECT_CONTAINS(load_error({}, {"lr_scheduler.min_lr_ratio=1.5"}),
                  "lr_scheduler.min_lr_ratio must be in [0, 1], got 1.5");
  EXPECT_CONTAINS(load_error({}, {"optimizer.staging_slots=1"}),
                  "optimizer.staging_slots must be >= 2, got 1");
}

TEST_F(ConfigTest, BadEnumValueListsTheAllowedValues) {
  std::string path = write("x.toml", "[schedules]\ndispatch = \"pipelined\"\n");
  std::string msg = load_error({path});
  EXPECT_CONTAINS(msg, path +
                           ":2: schedules.dispatch must be one of standard, llep, "
                           "pipelined_llep; got \"pipelined\"");

  path = write("dtype.toml", "[training]\ndtype = \"fp16\"\n");
  EXPECT_CONTAINS(load_error({path}), "training.dtype must be one of auto, float32, bfloat16");
}

TEST_F(ConfigTest, StringRulesAreChecked) {
  EXPECT_CONTAINS(load_error({}, {"job.name=a/b"}),
                  "job.name may contain only letters, digits, '.', '_' and '-', got \"a/b\"");
  EXPECT_CONTAINS(load_error({}, {"job.name="}), "job.name must not be empty");
}

TEST_F(ConfigTest, ByteSizes) {
  std::string path = write("x.toml", "[runtime]\ndevice_memory = \"2 gigs\"\n");
  EXPECT_CONTAINS(load_error({path}), path + ":2: runtime.device_memory must be a byte size");
  EXPECT_CONTAINS(load_error({}, {"runtime.device_memory=0"}),
                  "runtime.device_memory must be > 0 bytes");
  EXPECT_CONTAINS(load_error({}, {"schedules.sco_host_budget=-1GiB"}),
                  "schedules.sco_host_budget must be a byte size");

  path = write("ok.toml",
               "[runtime]\ndevice_memory = \"512MiB\"\npinned_memory = 4096\n"
               "[schedules]\nsco_host_budget = \"16GiB\"\n");
  Config cfg = load_config({path}, {"runtime.device_memory=auto"});
  EXPECT_EQ(cfg.runtime.device_memory_bytes(), std::nullopt);
  EXPECT_EQ(cfg.runtime.pinned_memory, "4096");
  EXPECT_EQ(cfg.runtime.pinned_memory_bytes(), std::optional<uint64_t>(4096));
  EXPECT_EQ(cfg.schedules.sco_host_budget_bytes(), std::optional<uint64_t>(16 * GiB));
}

TEST_F(ConfigTest, CrossFieldRulesNameBothKeysAndOrigins) {
  std::string path = write("x.toml", "[model]\nnum_attention_heads = 6\nnum_key_value_heads = 4\n");
  std::string msg = load_error({path});
  EXPECT_CONTAINS(msg, "model.num_attention_heads = 6 (" + path + ":2)");
  EXPECT_CONTAINS(msg, "model.num_key_value_heads = 4 (" + path + ":3)");

  msg = load_error({}, {"model.num_experts_per_tok=5"});
  EXPECT_CONTAINS(msg, "model.num_experts_per_tok = 5 (--set model.num_experts_per_tok=5)");
  EXPECT_CONTAINS(msg, "model.num_local_experts = 4 (default)");

  msg = load_error({}, {"model.head_dim=0", "model.hidden_size=66"});
  EXPECT_CONTAINS(msg, "model.hidden_size = 66");
  EXPECT_CONTAINS(msg, "is not a multiple of model.num_attention_heads = 4");

  msg = load_error({}, {"model.head_dim=0", "model.hidden_size=60"});  // 60 / 4 = 15
  EXPECT_CONTAINS(msg, "= 15, which must be even (RoPE rotates pairs)");

  EXPECT_CONTAINS(load_error({}, {"model.head_dim=7"}),
                  "model.head_dim = 7 (--set model.head_dim=7) must be even");

  msg = load_error({}, {"training.seq_len=1024"});
  EXPECT_CONTAINS(msg,
                  "training.seq_len = 1024 (--set training.seq_len=1024) must be <= "
                  "model.max_position_embeddings = 512 (default)");

  msg = load_error({}, {"training.dataset=bin"});
  EXPECT_CONTAINS(msg, "training.dataset = \"bin\"");
  EXPECT_CONTAINS(msg, "training.dataset_path is empty");

  // Fine once the other key follows: the rules are checked after every file and override.
  Config cfg = load_config(
      {}, {"model.head_dim=0", "training.dataset=bin", "training.dataset_path=data/tokens.bin"});
  EXPECT_EQ(cfg.model.head_dim_resolved(), 16);
  EXPECT_EQ(cfg.training.dataset_path, "data/tokens.bin");
}

TEST_F(ConfigTest, PackedDocumentsNeedTheirBoundaries) {
  std::string msg = load_error({}, {"training.document_mask=true"});
  EXPECT_CONTAINS(msg, "training.document_mask = true (--set training.document_mask=true)");
  EXPECT_CONTAINS(msg, "cuts windows at model.eos_token_id, but none is set (default)");
  msg = load_error({}, {"training.reset_position_ids=true"});
  EXPECT_CONTAINS(msg, "training.reset_position_ids = true");

  EXPECT_CONTAINS(load_error({}, {"model.eos_token_id=256"}),
                  "model.eos_token_id = 256 (--set model.eos_token_id=256) is not a token of "
                  "model.vocab_size = 256");

  msg = load_error({}, {"training.document_mask=true", "training.document_boundaries=index",
                        "training.dataset=bin", "training.dataset_path=t.bin"});
  EXPECT_CONTAINS(msg, "training.document_boundaries = \"index\"");
  EXPECT_CONTAINS(msg, "training.dataset = \"bin\"");
  EXPECT_CONTAINS(msg, "is not one; use document_boundaries = \"eos\"");

  msg = load_error({}, {"training.reset_position_ids=true", "model.eos_token_id=2",
                        "model.rope_type=dynamic", "model.rope_factor=2"});
  EXPECT_CONTAINS(msg, "model.rope_type = \"dynamic\"");
  EXPECT_CONTAINS(msg, "a window of documents restarting their positions");

  const Config eos = load_config({}, {"training.document_mask=true", "model.eos_token_id=2"});
  EXPECT_TRUE(eos.training.document_mask);
  EXPECT_EQ(eos.model.eos_token_id, 2);
  const Config index =
      load_config({}, {"training.document_mask=true", "training.document_boundaries=index",
                       "training.dataset=megatron", "training.dataset_path=web"});
  EXPECT_EQ(index.training.document_boundaries, DocumentBoundaries::index);
}

TEST_F(ConfigTest, MissingFileIsNamed) {
  std::string path = (dir_ / "absent.toml").string();
  EXPECT_CONTAINS(load_error({path}), "config file '" + path + "' not found");
}

TEST_F(ConfigTest, TomlSyntaxErrorNamesFileLineAndColumn) {
  std::string path = write("x.toml", "[model]\nhidden_size = 64\nvocab_size = \n");
  std::string msg = load_error({path});
  EXPECT_CONTAINS(msg, path + ":3:");
  EXPECT_CONTAINS(msg, "TOML syntax error");
}

// ---- Several files and overrides ------------------------------------------------------------

TEST_F(ConfigTest, LaterFilesOverrideEarlierKeysAndOriginsFollow) {
  std::string base = write("base.toml",
                           "[model]\nhidden_size = 128\nnum_hidden_layers = 4\n"
                           "[training]\nsteps = 50\n");
  std::string cluster = write("cluster.toml", "# cluster fragment\n[training]\n\nsteps = 500\n");
  Config cfg = load_config({base, cluster}, {});
  EXPECT_EQ(cfg.model.hidden_size, 128);
  EXPECT_EQ(cfg.model.num_hidden_layers, 4);
  EXPECT_EQ(cfg.training.steps, 500);
  EXPECT_EQ(cfg.origin("model.hidden_size"), base + ":2");
  EXPECT_EQ(cfg.origin("model.num_hidden_layers"), base + ":3");
  EXPECT_EQ(cfg.origin("training.steps"), cluster + ":4");
  EXPECT_EQ(cfg.origin("training.batch_size"), "default");
  EXPECT_EQ(cfg.origins.count("training.batch_size"), 0u);
}

TEST_F(ConfigTest, SetOverridesFiles) {
  std::string base = write("base.toml", "[training]\nsteps = 50\n[model]\nrope_theta = 10000\n");
  Config cfg = load_config({base}, {"training.steps=7", "model.rope_theta=1e6",
                                    "checkpoint.enable=true", "training.steps = 9"});
  EXPECT_EQ(cfg.training.steps, 9);  // the last --set wins
  EXPECT_EQ(cfg.origin("training.steps"), "--set training.steps = 9");
  EXPECT_EQ(cfg.model.rope_theta, 1e6);
  EXPECT_EQ(cfg.origin("model.rope_theta"), "--set model.rope_theta=1e6");
  EXPECT_TRUE(cfg.checkpoint.enable);
}

TEST_F(ConfigTest, SetTakesRawTextForStringKeys) {
  Config cfg =
      load_config({}, {"job.name=run7", "training.dtype=float32", "job.description=\"quoted text\"",
                       "job.run_dir=/scratch/runs", "schedules.dispatch=pipelined_llep",
                       "job.description=a b c", "runtime.device_memory=4096"});
  EXPECT_EQ(cfg.job.name, "run7");
  EXPECT_EQ(cfg.training.dtype, ComputeDtype::float32);
  EXPECT_EQ(cfg.job.run_dir, "/scratch/runs");
  EXPECT_EQ(cfg.schedules.dispatch, DispatchSchedule::pipelined_llep);
  EXPECT_EQ(cfg.job.description, "a b c");
  EXPECT_EQ(cfg.runtime.device_memory_bytes(), std::optional<uint64_t>(4096));
  EXPECT_EQ(load_config({}, {"job.description=\"quoted text\""}).job.description, "quoted text");
  EXPECT_EQ(load_config({}, {"job.name=1234"}).job.name, "1234");
}

TEST_F(ConfigTest, MalformedSetIsQuoted) {
  EXPECT_CONTAINS(load_error({}, {"training.steps"}),
                  "--set training.steps: expected section.key=value");
  EXPECT_CONTAINS(load_error({}, {"steps=3"}), "--set steps=3: expected section.key=value");
  EXPECT_CONTAINS(load_error({}, {"steps=3"}), "did you mean 'training.steps'?");
  EXPECT_CONTAINS(load_error({}, {"=3"}), "--set =3: expected section.key=value");
  EXPECT_CONTAINS(load_error({}, {"trainig.steps=3"}),
                  "--set trainig.steps=3: unknown section [trainig] (did you mean [training]?)");
  EXPECT_CONTAINS(load_error({}, {"training.stpes=3"}),
                  "--set training.stpes=3: unknown key 'training.stpes' (did you mean 'steps'?)");
  EXPECT_CONTAINS(load_error({}, {"training.steps=abc"}),
                  "--set training.steps=abc: training.steps: expected an integer, got 'abc'");
  EXPECT_CONTAINS(load_error({}, {"training.steps=1.5"}),
                  "training.steps: expected an integer, got float 1.5");
  EXPECT_CONTAINS(load_error({}, {"checkpoint.enable=yes"}),
                  "checkpoint.enable: expected a boolean");
  EXPECT_CONTAINS(load_error({}, {"training.steps=0"}),
                  "--set training.steps=0: training.steps must be >= 1, got 0");
}

// ---- Printing -------------------------------------------------------------------------------

TEST_F(ConfigTest, TomlRoundTripReloadsEqualSettings) {
  Config cfg = load_config(
      {}, {"job.name=round.trip-1", "job.description=say \"hi\"\\ now", "model.rope_theta=1e6",
           "model.rms_norm_eps=1e-6", "model.router_aux_loss_coef=0.01", "model.head_dim=0",
           "training.max_norm=0.3", "training.dataset=megatron", "training.dataset_path=d/x.bin",
           "schedules.llep_lambda=1.25", "schedules.sco_host_budget=16GiB", "optimizer.lr=0.0001",
           "optimizer.eps=1e-12", "checkpoint.enable=true", "runtime.numa_node=1",
           "runtime.backend=cpu", "optimizer.placement=offload_stream"});
  cfg.job.description += "\nsecond line\ttab";  // control characters survive too

  for (bool with_origins : {false, true}) {
    std::string text = config_to_toml(cfg, with_origins);
    std::string path = write(with_origins ? "shown.toml" : "plain.toml", text);
    Config reloaded = load_config({path}, {});
    EXPECT_TRUE(reloaded.same_settings(cfg)) << text;
    for (const std::string& key : config_keys()) {
      EXPECT_EQ(config_value_toml(reloaded, key), config_value_toml(cfg, key)) << key;
    }
  }
}

TEST_F(ConfigTest, OriginsArePrintedAsComments) {
  std::string base = write("base.toml", "[training]\nsteps = 50\n");
  Config cfg = load_config({base}, {"model.hidden_size=128"});
  std::string shown = config_to_toml(cfg, true);
  EXPECT_CONTAINS(shown, "# " + base + ":2\n");
  EXPECT_CONTAINS(shown, "# --set model.hidden_size=128\n");
  EXPECT_CONTAINS(shown, "hidden_size = 128");
  // Defaults carry no comment.
  EXPECT_CONTAINS(shown, "\nbatch_size = 8\n");
  std::string plain = config_to_toml(cfg, false);
  EXPECT_EQ(plain.find(base), std::string::npos);
}

TEST_F(ConfigTest, ValueOfAnUnknownKeyThrows) {
  EXPECT_THROW(config_value_toml(Config{}, "model.nope"), Error);
  EXPECT_THROW(config_value_toml(Config{}, "model"), Error);
  EXPECT_EQ(config_value_toml(Config{}, "schedules.vocab"), "\"materialized\"");
  EXPECT_EQ(config_value_toml(Config{}, "model.rope_theta"), "10000.0");
}

// ---- Documentation --------------------------------------------------------------------------

constexpr const char* kGeneratedMarker =
    "<!-- generated by config_reference_markdown(); do not edit below this line -->\n";

// With MOEPEAK_UPDATE_DOCS=1 in the environment, rewrites the generated part of docs/config.md.
void update_docs_if_asked(const std::string& docs_path) {
  const char* update = std::getenv("MOEPEAK_UPDATE_DOCS");
  if (!update || std::string(update) != "1") return;
  std::string docs = read_file(docs_path);
  size_t marker = docs.find(kGeneratedMarker);
  ASSERT_NE(marker, std::string::npos) << "no generated-section marker in " << docs_path;
  docs.resize(marker + std::string(kGeneratedMarker).size());
  std::ofstream(docs_path) << docs << "\n" << config_reference_markdown();
}

TEST_F(ConfigTest, DocsListEveryKeyWithItsDefaultAndMeaning) {
  const std::string docs_path = kSourceDir + "/docs/config.md";
  update_docs_if_asked(docs_path);
  const std::string docs = read_file(docs_path);
  std::istringstream reference(config_reference_markdown());
  std::string line;
  int rows = 0;
  while (std::getline(reference, line)) {
    if (line.rfind("| `", 0) == 0 || line.rfind("### [", 0) == 0) {
      ++rows;
      EXPECT_NE(docs.find(line + "\n"), std::string::npos)
          << "docs/config.md lacks (or has a stale version of) this line; run the test with "
             "MOEPEAK_UPDATE_DOCS=1 to regenerate its reference tables:\n"
          << line;
    }
  }
  EXPECT_EQ(rows, static_cast<int>(config_keys().size()) + 11);  // a row per key + 11 headings
  for (const std::string& key : config_keys()) {
    std::string name = key.substr(key.find('.') + 1);
    EXPECT_NE(docs.find("| `" + name + "` |"), std::string::npos) << key;
  }
}

}  // namespace
}  // namespace moepeak
