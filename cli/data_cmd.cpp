// `moepeak data prepare --tokenizer MODEL_DIR|tokenizer.json|tokenizer.model --input FILE...
//                       --output PREFIX [--split 99,1] [--workers N] [--format auto|text|jsonl]
//                       [--json-key text] [--chunk-size 16MiB] [--eos TOKEN] [--bos] [--no-eos]
//                       [--json FILE]`:
// text or JSONL to a Megatron .bin/.idx dataset that `moepeak train` reads
// (training.dataset = "megatron"; core/prepare/prepare.h). A progress line on stderr when it is the
// user's terminal (core/progress_line.h; a log line every 10 s otherwise), then a `#`-commented
// table of what was written.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"  // defines: now_utc
#include "cli/commands.h"
#include "core/error.h"
#include "core/prepare/prepare.h"
#include "core/progress_line.h"
#include "core/units.h"

namespace moepeak::cli {

namespace {

struct PrepareArgs {
  std::string tokenizer, output, split, format = "auto", json_key = "text", chunk = "16MiB", json;
  std::string eos;
  std::vector<std::string> inputs;
  int workers = 0;
  bool bos = false, no_eos = false;
};

std::vector<int> parse_split(const std::string& text) {
  std::vector<int> parts;
  if (text.empty()) return parts;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    try {
      size_t used = 0;
      parts.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      MOEPEAK_INPUT_ERROR("--split ", text, ": '", item, "' is not a whole number (as in 99,1)");
    }
  }
  return parts;
}

// A progress line redrawn on the user's terminal (core/progress_line.h's automatic rule, on
// stderr), or a log line at most every 10 s.
struct ProgressPrinter {
  bool tty = draws_progress(ProgressMode::automatic, STDERR_FILENO);
  double last_logged = 0;
  void operator()(const PrepareProgress& p) {
    const double fraction =
        p.total_bytes ? static_cast<double>(p.bytes_read) / static_cast<double>(p.total_bytes) : 1;
    const double mb_per_s = p.seconds > 0 ? static_cast<double>(p.bytes_read) / 1e6 / p.seconds : 0;
    if (tty) {
      constexpr int kWidth = 30;
      std::string bar(static_cast<size_t>(fraction * kWidth), '=');
      bar.resize(kWidth, ' ');
      std::fprintf(stderr, "\r\033[K[%s] %5.1f%%  %llu documents  %llu tokens  %.1f MB/s",
                   bar.c_str(), 100 * fraction, static_cast<unsigned long long>(p.documents),
                   static_cast<unsigned long long>(p.tokens), mb_per_s);
      std::fflush(stderr);
    } else if (p.seconds - last_logged >= 10) {
      last_logged = p.seconds;
      spdlog::info("{:.1f}% of the input, {} documents, {} tokens, {:.1f} MB/s", 100 * fraction,
                   p.documents, p.tokens, mb_per_s);
    }
  }
  void finish() const {
    if (tty) std::fputs("\r\033[K", stderr);
  }
};

void print_result(const PrepareResult& r, const PrepareArgs& args) {
  std::printf("# moepeak data prepare: %s (%s) -> %s\n", r.tokenizer.c_str(),
              r.tokenizer_kind.c_str(), args.output.c_str());
  std::printf("# %s; vocabulary %lld, %s tokens, EOS %d; %d worker threads\n", now_utc().c_str(),
              static_cast<long long>(r.vocab_size),
              std::string(token_storage_name(r.storage)).c_str(), r.eos_id, r.workers);
  std::printf("# %-6s %12s %14s %12s  %s\n", "part", "documents", "tokens", "bin_bytes", "prefix");
  for (const PreparedPart& p : r.parts) {
    std::printf("  %-6s %12llu %14llu %12llu  %s\n", p.name.c_str(),
                static_cast<unsigned long long>(p.documents),
                static_cast<unsigned long long>(p.tokens),
                static_cast<unsigned long long>(p.bin_bytes), p.prefix.c_str());
  }
  uint64_t tokens = 0;
  for (const PreparedPart& p : r.parts) tokens += p.tokens;
  std::printf("# input %s in %.2f s: %.1f MB/s, %.0f tokens/s; %llu empty documents skipped\n",
              format_bytes(r.input_bytes).c_str(), r.seconds,
              r.seconds > 0 ? static_cast<double>(r.input_bytes) / 1e6 / r.seconds : 0.0,
              r.seconds > 0 ? static_cast<double>(tokens) / r.seconds : 0.0,
              static_cast<unsigned long long>(r.skipped_empty));
}

void write_json(const PrepareResult& r, const std::string& path) {
  nlohmann::json parts = nlohmann::json::array();
  for (const PreparedPart& p : r.parts) {
    parts.push_back({{"part", p.name},
                     {"prefix", p.prefix},
                     {"documents", p.documents},
                     {"tokens", p.tokens},
                     {"bin_bytes", p.bin_bytes}});
  }
  const nlohmann::json j = {{"parts", parts},
                            {"tokenizer", r.tokenizer},
                            {"tokenizer_kind", r.tokenizer_kind},
                            {"eos_id", r.eos_id},
                            {"vocab_size", r.vocab_size},
                            {"token_type", token_storage_name(r.storage)},
                            {"workers", r.workers},
                            {"input_bytes", r.input_bytes},
                            {"skipped_empty", r.skipped_empty},
                            {"seconds", r.seconds}};
  std::ofstream(path) << j.dump(2) << "\n";
}

}  // namespace

void register_data_command(CLI::App& app, Context& ctx) {
  auto* data = app.add_subcommand("data", "prepare training data");
  data->require_subcommand(1);
  auto* cmd = data->add_subcommand(
      "prepare",
      "tokenize text or JSONL (a tokenizer.json or SentencePiece model) into a Megatron "
      ".bin/.idx");
  static PrepareArgs args;
  cmd->add_option("--tokenizer", args.tokenizer,
                  "a model directory as downloaded (its tokenizer.json, else tokenizer.model), a "
                  "tokenizer.json, or a SentencePiece tokenizer.model")
      ->required();
  cmd->add_option("--eos", args.eos,
                  "the token that ends every document (default: tokenizer_config.json's "
                  "eos_token, else config.json's eos_token_id, else the model's)");
  cmd->add_option("--input", args.inputs, "text or JSONL files, in order")->required();
  cmd->add_option("--output", args.output,
                  "output prefix: PREFIX.bin/.idx, or PREFIX-train/-eval[/-test] with --split")
      ->required();
  cmd->add_option("--split", args.split,
                  "document ratio train,eval[,test] (99,1: every 100th document is held out)");
  cmd->add_option("--workers", args.workers, "tokenizing threads (0 = every hardware thread)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--format", args.format,
                  "input format: auto (.jsonl/.json are JSONL), text (blank-line separated "
                  "documents) or jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}))
      ->capture_default_str();
  cmd->add_option("--json-key", args.json_key, "the JSONL field holding a document's text")
      ->capture_default_str();
  cmd->add_option("--chunk-size", args.chunk, "text tokenized at a time (bounds the memory)")
      ->capture_default_str();
  cmd->add_flag("--bos", args.bos, "prepend the model's BOS to every document");
  cmd->add_flag("--no-eos", args.no_eos, "do not append EOS to every document");
  cmd->add_option("--json", args.json, "also write the summary as JSON to this file");
  cmd->callback([&ctx] {
    ctx.action = [] {
      PrepareOptions options;
      options.tokenizer = args.tokenizer;
      options.eos_token = args.eos;
      options.inputs = args.inputs;
      options.output = args.output;
      options.split = parse_split(args.split);
      options.workers = args.workers;
      options.format = args.format == "text"    ? InputFormat::text
                       : args.format == "jsonl" ? InputFormat::jsonl
                                                : InputFormat::automatic;
      options.json_key = args.json_key;
      const std::optional<uint64_t> chunk = parse_bytes(args.chunk);
      if (!chunk || *chunk == 0)
        MOEPEAK_INPUT_ERROR("--chunk-size ", args.chunk, " is not a byte size such as 16MiB");
      options.chunk_bytes = static_cast<size_t>(*chunk);
      options.prepend_bos = args.bos;
      options.append_eos = !args.no_eos;
      ProgressPrinter progress;
      options.progress = [&progress](const PrepareProgress& p) { progress(p); };
      const PrepareResult result = prepare_dataset(options);
      progress.finish();
      print_result(result, args);
      if (!args.json.empty()) write_json(result, args.json);
      return 0;
    };
  });
}

}  // namespace moepeak::cli
