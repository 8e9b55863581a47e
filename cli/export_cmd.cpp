// `moepeak export CHECKPOINT OUT [--dtype bfloat16|float32] [--max-shard-size 5GB]
//                [--buffer 64MiB] [--quantize mxfp4]`: a training checkpoint as a Hugging Face
// model of its family that transformers' from_pretrained and `moepeak train --init-from` load
// (core/checkpoint/hf_export.h). CHECKPOINT is a step directory or a checkpoint folder (its
// `latest` is exported). --quantize mxfp4 (gpt_oss) writes the experts' gate_up_proj and
// down_proj as MXFP4 _blocks and _scales with a quantization_config, as OpenAI released gpt-oss.
// The MTP layers a DeepSeek-V3 run carried untrained (core/checkpoint/mtp_layers.h) are written
// as they were released, whatever --dtype.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "core/checkpoint/hf_export.h"
#include "core/error.h"
#include "core/units.h"

namespace moepeak::cli {

void register_export_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "export", "write a checkpoint as a Hugging Face model (safetensors shards + index)");
  static std::string checkpoint, out, dtype = "bfloat16", max_shard = "5GB", buffer = "64MiB",
                                      quantize;
  cmd->add_option("CHECKPOINT", checkpoint, "checkpoint step directory, or a folder with `latest`")
      ->required();
  cmd->add_option("OUT", out, "the Hugging Face model directory to create")->required();
  cmd->add_option("--dtype", dtype, "dtype of the exported weights")
      ->check(CLI::IsMember({"bfloat16", "float32"}))
      ->capture_default_str();
  cmd->add_option("--max-shard-size", max_shard,
                  "largest model-*.safetensors file (5GB = 5e9 bytes, 5GiB = 5*2^30)")
      ->capture_default_str();
  cmd->add_option("--buffer", buffer, "host staging buffer the tensors stream through")
      ->capture_default_str();
  cmd->add_option("--quantize", quantize,
                  "mxfp4: write the experts' gate_up_proj and down_proj as MXFP4 (_blocks and "
                  "_scales, OCP rounding) with config.json's quantization_config, as OpenAI's "
                  "released gpt-oss checkpoints (gpt_oss only; the rest stays --dtype)")
      ->check(CLI::IsMember({"mxfp4"}));
  cmd->callback([&ctx] {
    ctx.action = [] {
      HfExportOptions options;
      options.dtype = dtype == "bfloat16" ? "BF16" : "F32";
      auto bytes_of = [](const std::string& text, const char* flag) {
        std::optional<uint64_t> b = parse_bytes(text);
        if (!b || *b == 0) MOEPEAK_INPUT_ERROR(flag, " ", text, " is not a byte size such as 5GB");
        return *b;
      };
      options.max_shard_bytes = bytes_of(max_shard, "--max-shard-size");
      options.buffer_bytes = bytes_of(buffer, "--buffer");
      options.quantize = quantize;
      const HfExportSummary s = export_hf_checkpoint(checkpoint, out, options);
      spdlog::info("exported {} ({} tensors, {} of {}{}{}) to {} in {} file{}", s.checkpoint,
                   s.tensors, format_bytes(s.total_bytes), dtype,
                   quantize.empty() ? "" : ", experts " + quantize,
                   s.carried_tensors == 0 ? std::string()
                                          : ", " + std::to_string(s.carried_tensors) +
                                                " tensors of untrained MTP layers as released",
                   out, s.files, s.files == 1 ? "" : "s");
      return 0;
    };
  });
}

}  // namespace moepeak::cli
