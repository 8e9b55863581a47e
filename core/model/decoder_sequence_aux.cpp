// DecoderModel's sequence-wise balance loss (DecoderSpec::aux_loss_per_sequence; DeepSeek-V3,
// arXiv 2412.19437 eq. 17-20, docs/models.md): per MoE layer and per sequence b of T tokens,
//   s'_t = s_t / sum_j s_{t,j}              the token's sigmoid scores (router op's probs),
//                                           normalised over every expert, unbiased
//   f_e  = E / (k T) * #{t : e among t's chosen experts}      a count: no gradient
//   P_e  = 1/T sum_t s'_{t,e}
//   L_b  = sum_e f_e P_e
// and the loss is router_aux_loss_coef times the mean of L_b over the B sequences of the batch,
// summed over the MoE layers. Every position counts, scored or not. Its gradient in s' is
// g_{b,e} = coef / B * f_e / T for each token of sequence b, which
// ops::router_sequence_aux_backward takes to the logits.
//
// NOTES: under Ulysses a rank holds T/Sp positions of each of its sequence group's B_g
// sequences (rows [b T/Sp, (b + 1) T/Sp) of its tokens are sequence b's), so each rank sums its
// rows and the sequence group adds the sums (one all-reduce of 2 B_g E doubles per layer) before
// f and P are formed; the group's rank 0 alone keeps the group's share of the loss, which
// DecoderModel::run adds over the world. Sums are in double; W ranks agree with one rank to
// rounding, not bitwise. Like the load-balancing loss, the loss is a micro-batch's: with
// gradient accumulation each micro-batch adds its own mean over its B sequences.
#include <algorithm>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/model/decoder.h"
#include "core/model/decoder_activations.h"
#include "ops/router.h"

namespace moepeak {

void DecoderModel::accumulate_sequence_balance(int layer, const LayerActivations& a) {
  const MlpSpec& mlp = spec_.layers[layer].mlp;
  const int64_t N = a.probs.view().size(0), E = mlp.experts, k = mlp.router.top_k;
  const int64_t Bg = ulysses_.batch, rows = ulysses_.local_seq(), T = ulysses_.seq_len;
  const int64_t B = Bg * layout_.degrees().sequence_groups();  // the batch's sequences
  MOEPEAK_CHECK(N == Bg * rows, "layer ", layer, ": ", N, " router rows for ", Bg, " sequences of ",
                rows, " tokens on this rank");
  const std::vector<double> scores = copy_to_host_as_double(a.probs.view(), backend_, stream_);
  const std::vector<double> chosen = copy_to_host_as_double(a.topk_index.view(), backend_, stream_);
  // [0, Bg E): the chosen counts per sequence and expert; [Bg E, 2 Bg E): the sums of s'.
  std::vector<double> sums(static_cast<size_t>(2 * Bg * E), 0.0);
  double* counts = sums.data();
  double* normalised = sums.data() + Bg * E;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t b = n / rows;
    const double* s = scores.data() + n * E;
    double total = 0;
    for (int64_t e = 0; e < E; ++e) total += s[e];
    for (int64_t e = 0; e < E; ++e) normalised[b * E + e] += s[e] / total;
    for (int64_t j = 0; j < k; ++j) counts[b * E + static_cast<int64_t>(chosen[n * k + j])] += 1;
  }
  Comm& group = layout_.sequence();
  if (group.world_size() > 1) all_reduce_host(group, backend_, stream_, sums);
  const double coef = spec_.aux_loss_coef, Td = static_cast<double>(T);
  std::vector<double>& g = sequence_aux_grad_[static_cast<size_t>(layer)];
  g.assign(static_cast<size_t>(Bg * E), 0.0);
  double loss = 0;
  for (int64_t b = 0; b < Bg; ++b) {
    double per_sequence = 0;
    for (int64_t e = 0; e < E; ++e) {
      const double f = static_cast<double>(E) / (static_cast<double>(k) * Td) * counts[b * E + e];
      per_sequence += f * (normalised[b * E + e] / Td);
      g[static_cast<size_t>(b * E + e)] = coef / static_cast<double>(B) * f / Td;
    }
    loss += per_sequence;
  }
  if (group.rank() == 0) sequence_aux_loss_ += coef * loss / static_cast<double>(B);
}

void DecoderModel::sequence_balance_backward(int layer, const LayerActivations& a,
                                             const Tensor& drouter) {
  const std::vector<double>& g = sequence_aux_grad_[static_cast<size_t>(layer)];
  MOEPEAK_CHECK(!g.empty(), "layer ", layer,
                ": the sequence-wise balance loss's backward without its forward");
  const int64_t E = spec_.layers[layer].mlp.experts;
  const int64_t Bg = static_cast<int64_t>(g.size()) / E;
  // (B_g, E) in the model's dtype: rounded once, as the load-balancing loss's aux_dprobs_.
  OwnedTensor dprobs = device(Shape{Bg, E}, LiveSet::workspace, "sequence aux d probs");
  copy_from_host_as(g, dprobs.view(), backend_, stream_);
  ops::router_sequence_aux_backward(a.probs.view(), dprobs.view(), drouter, stream_);
}

}  // namespace moepeak
