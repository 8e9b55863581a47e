// `moepeak bench data`: what a token dataset costs a run at start-up — opening it (the loader
// the trainer makes: mapping, header, index) and its first batch — beside one pass over every
// token, which is what the scan at open cost before the ids were checked as windows are read
// (core/data/token_dataset.h).
//
//   moepeak bench data [--config F]... [--set k=v]... [--bytes 10GB] [--format bin|megatron]
//                      [--dir DIR] [--iters 5] [--keep] [--json FILE]
//
// The bench writes the file itself (never the repo): headerless uint16 tokens, or a Megatron
// .bin/.idx with documents of 1 to 4096 tokens, ids seeded below model.vocab_size, `--bytes` of
// tokens, in --dir (default job.run_dir/bench-data; removed afterwards unless --keep). Before each
// timing it drops the file's pages from the page cache (posix_fadvise DONTNEED), so a figure is
// a cold start as far as the kernel lets a process ask. One rank. docs/perf.md has the results.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/config/config.h"
#include "core/data/data_loader.h"
#include "core/data/token_dataset.h"  // defines: open_token_bin, open_megatron_dataset
#include "core/error.h"
#include "core/units.h"

namespace moepeak::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct DataBenchArgs {
  BenchCommonArgs common;
  std::string bytes = "10GB";
  std::string format = "bin";
  std::string dir;
  bool keep = false;
};

// Asks the kernel to forget the file's cached pages (a no-op where it cannot).
void drop_cache(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void write_all(std::ofstream& out, const void* data, size_t bytes, const fs::path& path) {
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) MOEPEAK_INPUT_ERROR(path.string(), ": cannot write (disk full?)");
}

// Writes `tokens` uint16 ids below `vocab` to `bin` in 32 MiB pieces; with `idx`, a Megatron
// index of documents of 1..4096 tokens over them. Returns the document count (0 for .bin).
uint64_t generate(const fs::path& bin, const fs::path* idx, uint64_t tokens, int64_t vocab) {
  std::mt19937_64 rng(20261203);
  std::ofstream out(bin, std::ios::binary | std::ios::trunc);
  if (!out) MOEPEAK_INPUT_ERROR(bin.string(), ": cannot create");
  std::vector<uint16_t> piece(16u << 20);
  const uint64_t limit = static_cast<uint64_t>(std::min<int64_t>(vocab, 65536));
  for (uint64_t done = 0; done < tokens;) {
    const uint64_t n = std::min<uint64_t>(piece.size(), tokens - done);
    for (uint64_t i = 0; i < n; ++i) piece[i] = static_cast<uint16_t>(rng() % limit);
    write_all(out, piece.data(), n * sizeof(uint16_t), bin);
    done += n;
  }
  out.close();
  if (idx == nullptr) return 0;
  std::vector<int32_t> lengths;
  for (uint64_t at = 0; at < tokens;) {
    const uint64_t len = std::min<uint64_t>(1 + rng() % 4096, tokens - at);
    lengths.push_back(static_cast<int32_t>(len));
    at += len;
  }
  const uint64_t S = lengths.size();
  std::ofstream ix(*idx, std::ios::binary | std::ios::trunc);
  if (!ix) MOEPEAK_INPUT_ERROR(idx->string(), ": cannot create");
  const uint64_t version = 1;
  const uint8_t dtype_code = 8;  // uint16
  write_all(ix, "MMIDIDX\0\0", 9, *idx);
  write_all(ix, &version, 8, *idx);
  write_all(ix, &dtype_code, 1, *idx);
  write_all(ix, &S, 8, *idx);
  const uint64_t D = S + 1;  // one sequence per document
  write_all(ix, &D, 8, *idx);
  write_all(ix, lengths.data(), S * 4, *idx);
  std::vector<int64_t> pointers(S), documents(D);
  int64_t byte = 0;
  for (uint64_t s = 0; s < S; ++s) {
    pointers[s] = byte;
    byte += static_cast<int64_t>(lengths[s]) * 2;
    documents[s] = static_cast<int64_t>(s);
  }
  documents[S] = static_cast<int64_t>(S);
  write_all(ix, pointers.data(), S * 8, *idx);
  write_all(ix, documents.data(), D * 8, *idx);
  return S;
}

int run_bench_data(const DataBenchArgs& args, const Context& ctx) {
  Config cfg = load_config_for_command(args.common.config, ctx);
  const std::optional<uint64_t> bytes = parse_bytes(args.bytes);
  if (!bytes || *bytes < 4096) MOEPEAK_INPUT_ERROR("--bytes ", args.bytes, ": at least 4KB");
  if (args.format != "bin" && args.format != "megatron") {
    MOEPEAK_INPUT_ERROR("--format ", args.format, ": bin or megatron");
  }
  const bool megatron = args.format == "megatron";
  const fs::path dir =
      args.dir.empty() ? fs::path(cfg.job.run_dir) / "bench-data" : fs::path(args.dir);
  fs::create_directories(dir);
  const fs::path bin = dir / "bench-tokens.bin", idx = dir / "bench-tokens.idx";
  const uint64_t tokens = *bytes / 2;

  std::printf("# moepeak bench data: %s of uint16 tokens (%llu), %s, in %s; %s\n",
              format_bytes(tokens * 2).c_str(), static_cast<unsigned long long>(tokens),
              megatron ? "Megatron .bin/.idx" : "headerless .bin", dir.c_str(), now_utc().c_str());
  auto t0 = Clock::now();
  const uint64_t documents = generate(bin, megatron ? &idx : nullptr, tokens, cfg.model.vocab_size);
  const double create_s = seconds_since(t0);

  cfg.training.dataset = megatron ? DatasetKind::megatron : DatasetKind::bin;
  cfg.training.dataset_path = bin.string();
  cfg.training.token_dtype = TokenDtype::uint16;
  const int64_t B = cfg.training.batch_size, T = cfg.training.seq_len;
  std::vector<int64_t> ids(static_cast<size_t>(B * T)), labels(ids.size());
  std::vector<double> open_s, first_s;
  for (int i = 0; i < args.common.iters; ++i) {
    drop_cache(bin);
    if (megatron) drop_cache(idx);
    t0 = Clock::now();
    std::unique_ptr<DataLoader> loader = make_data_loader(cfg.training, cfg.model, cfg.job.seed);
    open_s.push_back(seconds_since(t0));
    t0 = Clock::now();
    loader->next_batch(ids.data(), labels.data());
    first_s.push_back(seconds_since(t0));
  }
  // One pass over every token, checked as a window is (what the scan at open used to cost).
  drop_cache(bin);
  t0 = Clock::now();
  const TokenDataset dataset = megatron ? open_megatron_dataset(bin.string())
                                        : open_token_bin(bin.string(), TokenDtype::uint16);
  std::vector<int64_t> block(1u << 20);
  for (uint64_t at = 0; at < dataset.token_count(); at += block.size()) {
    const uint64_t n = std::min<uint64_t>(block.size(), dataset.token_count() - at);
    dataset.read_cyclic(at, n, block.data(), cfg.model.vocab_size);
  }
  const double pass_s = seconds_since(t0);

  std::printf("# %-12s %14s %12s %12s\n", "what", "bytes", "time_s", "GB/s");
  auto row = [&](const char* what, uint64_t b, double s) {
    std::printf("  %-12s %14llu %12.6f %12.3f\n", what, static_cast<unsigned long long>(b), s,
                s > 0 ? static_cast<double>(b) / s / 1e9 : 0.0);
  };
  row("create", tokens * 2, create_s);
  row("open", 0, median(open_s));
  row("first_batch", static_cast<uint64_t>(B * (T + 1)) * 2, median(first_s));
  row("full_pass", tokens * 2, pass_s);
  const std::string docs = megatron ? ", " + std::to_string(documents) + " documents" : "";
  std::printf(
      "# open and first_batch: medians of %d cold starts (batch %lld x seq %lld%s); "
      "full_pass: every token read and checked once, cold\n",
      args.common.iters, static_cast<long long>(B), static_cast<long long>(T), docs.c_str());
  if (!args.common.json_path.empty()) {
    nlohmann::json rows = nlohmann::json::array();
    for (auto [name, s] :
         {std::pair{"create", create_s}, std::pair{"open", median(open_s)},
          std::pair{"first_batch", median(first_s)}, std::pair{"full_pass", pass_s}}) {
      rows.push_back({{"schedule", name},
                      {"time_s", s},
                      {"peak_bytes", nullptr},
                      {"bound_bytes", nullptr},
                      {"max_rel_err", 0.0}});
    }
    nlohmann::json shape = {{"bytes", tokens * 2},    {"tokens", tokens}, {"format", args.format},
                            {"documents", documents}, {"batch", B},       {"seq_len", T}};
    write_bench_json(args.common.json_path, "data", 1, shape, rows);
  }
  if (!args.keep) {
    std::error_code ec;
    fs::remove(bin, ec);
    fs::remove(idx, ec);
  }
  return 0;
}

}  // namespace

void register_bench_data(CLI::App& bench, Context& ctx) {
  static DataBenchArgs args;
  args.common.iters = 5;
  auto* sub = bench.add_subcommand(
      "data", "a token dataset's start-up cost (open, first batch) against one pass over it");
  add_bench_common_options(*sub, args.common);
  sub->add_option("--bytes", args.bytes, "size of the generated token file (e.g. 10GB)")
      ->capture_default_str();
  sub->add_option("--format", args.format, "bin (headerless uint16) or megatron (.bin/.idx)")
      ->capture_default_str();
  sub->add_option("--dir", args.dir, "where to write it (default: job.run_dir/bench-data)");
  sub->add_flag("--keep", args.keep, "keep the generated file");
  sub->callback([&ctx] { ctx.action = [&ctx] { return run_bench_data(args, ctx); }; });
}

}  // namespace moepeak::cli
