// rope_scaling: the RoPE scaling types of Hugging Face transformers (modeling_rope_utils.py,
// ROPE_INIT_FUNCTIONS and the RoPE config validation) turned into the op's RopeParams
// (ops/rope_params.h) on the host, once per call site. The config layer fills RopeScaling from a
// model's `rope_scaling` / `rope_parameters`; this file knows nothing of config files.
//
// What each type computes (dim = rotary_dim, inv_i = theta^(-2i/dim), i < dim/2):
//   default   inv_i; attention factor 1
//   linear    inv_i / factor; attention factor 1
//   dynamic   (NTK) with L = seq_len, the batch's sequence length (its largest position + 1):
//             base = theta * (factor * L / max_pos - (factor - 1))^(dim / (dim - 2)) when
//             L > max_position_embeddings, else theta; inv_i = base^(-2i/dim); attention factor 1
//   yarn      orig = original_max_position_embeddings (default max_position_embeddings);
//             corr(r) = dim * ln(orig / (r * 2 pi)) / (2 ln theta); low = corr(beta_fast),
//             high = corr(beta_slow), floor/ceil'd when truncate; low = max(low, 0),
//             high = min(high, dim - 1); high += 0.001 when low == high; the ramp and the blend
//             of inv_i / factor with inv_i as rope_inv_freq says. Attention factor:
//             attention_factor when given; else get_mscale(factor, mscale) /
//             get_mscale(factor, mscale_all_dim) when both are given and non-zero; else
//             get_mscale(factor, 1), with get_mscale(s, m) = 0.1 * m * ln(s) + 1 (1 for s <= 1)
//   llama3    the wavelength bands of rope_inv_freq with orig = original_max_position_embeddings
//             (default max_position_embeddings); attention factor 1
// Everything is double. transformers computes the scalars as Python floats (double) and the
// per-frequency tensors (inv_freq, the yarn ramp) in fp32, so moepeak's frequencies are
// transformers' formulas exactly, and transformers' values up to fp32 rounding.
//
// NOTES: yarn's `factor`. transformers 4 (from its DeepSeek-V3 support on) replaced the
// configured factor by max_position_embeddings / original_max_position_embeddings whenever the
// latter was in rope_scaling; transformers 5 uses the configured factor (and only warns when that
// ratio differs and is not 1), and derives factor = max_position_embeddings / original only when
// factor is missing. moepeak does what transformers 5 does: `factor` when given; else max_pos /
// orig when original_max_position_embeddings is given; else an error. For the published yarn
// configs (gpt-oss: 131072 / 4096 = 32; DeepSeek-V3: 163840 / 4096 = 40) both versions agree.
// beta_fast and beta_slow follow transformers' `or` (absent or 0: 32 and 1); mscale and
// mscale_all_dim count as given only when non-zero, as transformers' `if mscale and
// mscale_all_dim`.
//
// NOTES: dynamic is stateless here. transformers' dynamic_rope_update keeps the largest length it
// has seen (it recomputes only when L grows past it, and resets only below max_pos), so at
// inference its base depends on the calls before; here each call uses its own L, which is the same
// on a fresh model and whenever L does not shrink.
//
// Errors (moepeak::Error of the input kind, naming the rope_scaling field and its value): where
// transformers' validation only warns, moepeak refuses: a missing required field (factor; llama3's
// low_freq_factor and high_freq_factor), factor < 1, high_freq_factor <= low_freq_factor,
// low_freq_factor <= 0, beta_fast < beta_slow or a negative beta, attention_factor <= 0,
// original_max_position_embeddings <= 0, a non-finite value; theta <= 0, rotary_dim odd or <= 0
// (dynamic: <= 2, the exponent dim/(dim-2)), max_position_embeddings <= 0 and seq_len < 0 where
// the type reads them. rotary_dim against the head's width is checked by the op.
// Test: tests/ops/test_rope_scaling.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "ops/rope_params.h"

namespace moepeak::ops {

// "default", "linear", "dynamic", "yarn", "llama3": transformers' rope_type strings.
const char* rope_type_name(RopeType type);
// The type of a transformers rope_type string; nullopt for any other (longrope, "su", ...).
std::optional<RopeType> rope_type_from_name(std::string_view name);

// A model config's RoPE scaling fields (transformers' rope_scaling / rope_parameters), each
// optional as there; which ones a type reads is in the table above.
struct RopeScaling {
  RopeType type = RopeType::default_;
  std::optional<double> factor;
  std::optional<int64_t> original_max_position_embeddings;
  std::optional<double> beta_fast;  // yarn; absent or 0: 32
  std::optional<double> beta_slow;  // yarn; absent or 0: 1
  bool truncate = true;             // yarn: floor / ceil the ramp's bounds
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  std::optional<double> attention_factor;  // yarn
  std::optional<double> low_freq_factor;   // llama3
  std::optional<double> high_freq_factor;  // llama3
  bool operator==(const RopeScaling&) const = default;
};

// The op's parameters for one call site: theta (rope_theta), rotary_dim (the rotated width of a
// head: head_dim, or head_dim * partial_rotary_factor), max_position_embeddings (the model's),
// seq_len (dynamic only: the batch's largest position + 1) and the pair layout. Throws as listed
// above.
RopeParams rope_params(const RopeScaling& scaling, double theta, int64_t rotary_dim,
                       int64_t max_position_embeddings, int64_t seq_len, bool interleaved);

}  // namespace moepeak::ops
