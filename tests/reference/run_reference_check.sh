#!/usr/bin/env bash
# test_hf_reference: moepeak's step-1 loss and gradients against an independent float64 numpy
# reference of transformers' <Family>ForCausalLM (hf_reference.py, check_step_dump.py): Mixtral,
# Qwen3-MoE, gpt-oss and DeepSeek-V3, with each RoPE scaling.
#   bash run_reference_check.sh path/to/moepeak
# Each case trains one step of a small model with --dump-step and checks the dump. Needs Debian's
# /usr/bin/python3 with python3-numpy (a PATH python3 may lack numpy).
set -euo pipefail

moepeak=${1:?usage: run_reference_check.sh path/to/moepeak}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=/usr/bin/python3

if ! "$python" -c 'import numpy' 2>/dev/null; then
  echo "run_reference_check: $python cannot import numpy (install the Debian package python3-numpy)" >&2
  exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/moepeak_hf_ref.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Common to every case: one step of a small model, weights with std 0.2 so that every part of
# the model (attention pattern, router choices, norms) visibly shapes the loss.
common=(--set training.steps=1 --set training.seq_len=16 --set training.batch_size=2
        --set model.vocab_size=64 --set model.initializer_range=0.2 --set metrics.progress=off)

failures=0
run_case() {
  local name=$1; shift
  echo "=== case $name: $*"
  if ! "$moepeak" train "${common[@]}" --set job.run_dir="$tmp/runs_$name" "$@" \
       --dump-step "$tmp/dump_$name" >"$tmp/train_$name.log" 2>&1; then
    echo "moepeak train failed for case $name:" >&2
    cat "$tmp/train_$name.log" >&2
    failures=$((failures + 1))
    return
  fi
  if ! "$python" "$here/check_step_dump.py" "$tmp/dump_$name"; then
    failures=$((failures + 1))
  fi
}

# The embedded default model (2 layers, 4 heads / 2 kv heads, 4 experts top-2), reduced vocabulary.
run_case gqa2
# Every query head on one kv head, and no activation checkpointing (a different backward path).
run_case mqa_nockpt --set model.num_key_value_heads=1 --set schedules.checkpoint=none
# Other shapes: full multi-head attention, head_dim != hidden/heads, 5 experts top-3, 3 layers,
# a large norm eps and a small rope theta (so their placement matters), longer sequences.
run_case mha_shapes --set model.num_key_value_heads=4 --set model.head_dim=8 \
  --set model.num_local_experts=5 --set model.num_experts_per_tok=3 --set model.num_hidden_layers=3 \
  --set model.rms_norm_eps=0.01 --set model.rope_theta=100 --set training.seq_len=24
# Mixtral's auxiliary load-balancing loss (config.json then says output_router_logits = true).
run_case aux_loss --set model.router_aux_loss_coef=0.2

# Qwen3-MoE (config.json model_type qwen3_moe): q/k norms per head, experts narrower than the
# dense width, head_dim apart from hidden / heads, a large eps so the norms' placement matters.
qwen3=(--set model.model_type=qwen3_moe --set model.moe_intermediate_size=48 --set model.head_dim=8
       --set model.rms_norm_eps=0.01)
run_case qwen3 "${qwen3[@]}"
# Dense layers by list and by step, top-k weights not renormalised, the aux loss over the MoE
# layers only, no checkpointing.
run_case qwen3_dense_aux "${qwen3[@]}" --set model.num_hidden_layers=4   --set "model.mlp_only_layers=[0]" --set model.decoder_sparse_step=2   --set model.norm_topk_prob=false --set model.router_aux_loss_coef=0.2   --set schedules.checkpoint=none
# A tied head (no lm_head.weight in the dump), for Qwen3-MoE and for Mixtral.
run_case qwen3_tied "${qwen3[@]}" --set model.tie_word_embeddings=true
run_case mixtral_tied --set model.tie_word_embeddings=true
# q/k/v/o biases (Qwen3-MoE's attention_bias).
run_case qwen3_bias "${qwen3[@]}" --set model.attention_bias=true

# gpt-oss (config.json model_type gpt_oss): q/k/v/o biases, sinks, even layers sliding with a
# window of 5 of the 16 positions, the router's bias and top-k-then-softmax, expert biases and a
# clamp that binds (limit 0.5), yarn without truncation; its experts fused in the dump as on the
# Hub. Then with the aux loss, a window of 1 and no checkpointing.
gpt_oss=(--set model.model_type=gpt_oss --set model.attention_bias=true --set model.head_dim=8
         --set model.sliding_window=5 --set model.swiglu_limit=0.5 --set model.num_hidden_layers=3)
run_case gpt_oss "${gpt_oss[@]}" --set model.rope_type=yarn --set model.rope_factor=8 \
  --set model.rope_original_max_position_embeddings=8 --set model.rope_truncate=false \
  --set model.rope_theta=1000
run_case gpt_oss_w1_aux "${gpt_oss[@]}" --set model.sliding_window=1 \
  --set model.router_aux_loss_coef=0.2 --set schedules.checkpoint=none

# DeepSeek-V3 (config.json model_type deepseek_v3): multi-head latent attention (the q bottleneck,
# the kv latent, q/k heads of 8 + 4 rotary dims, value heads of 6, interleaved RoPE, yarn with
# mscale_all_dim scaling the softmax), the first layer dense, sigmoid routing top-2 from the best 2
# of 4 groups of 2 with weights times 2.5, 2 shared experts; a large eps so that the latent norms'
# own eps (1e-6) is told apart from it. Then a plain q_proj, rotate_half pairs, no group limit,
# unnormalised weights and no checkpointing. (Non-zero correction biases: run_hf_roundtrip.sh.)
# Then the sequence-wise balance loss.
deepseek=(--set model.model_type=deepseek_v3 --set model.num_hidden_layers=3
          --set model.num_key_value_heads=4 --set model.head_dim=12 --set model.q_lora_rank=16
          --set model.kv_lora_rank=12 --set model.qk_nope_head_dim=8 --set model.qk_rope_head_dim=4
          --set model.v_head_dim=6 --set model.num_local_experts=8 --set model.n_group=4
          --set model.topk_group=2 --set model.routed_scaling_factor=2.5
          --set model.n_shared_experts=2 --set model.first_k_dense_replace=1
          --set model.moe_intermediate_size=12 --set model.intermediate_size=40
          --set model.rope_interleave=true --set model.rms_norm_eps=0.01)
run_case deepseek_v3 "${deepseek[@]}" --set model.rope_type=yarn --set model.rope_factor=4 \
  --set model.rope_original_max_position_embeddings=8 --set model.rope_mscale=1.0 \
  --set model.rope_mscale_all_dim=1.0
run_case deepseek_v3_plain "${deepseek[@]}" --set model.q_lora_rank=0 \
  --set model.rope_interleave=false --set model.n_group=1 --set model.topk_group=1 \
  --set model.norm_topk_prob=false --set schedules.checkpoint=none
# DeepSeek-V3's sequence-wise balance loss (alpha 0.3; config.json then carries DeepSeek's own
# "seq_aux" and "aux_loss_alpha"), its forward recomputed under checkpointing.
run_case deepseek_v3_seq_aux "${deepseek[@]}" --set model.router_aux_loss_coef=0.3

# Packed documents: the copy task's windows over a vocabulary of 8 cut after each token 3 (7 and 4
# documents in the two rows: an EOS at 0, consecutive EOS, one at T - 1), attention within each
# document, the EOS's label unscored; the dump holds
# the positions and document starts, which the reference applies (position_ids into RoPE, a
# document mask beside the causal one). gpt-oss with positions restarting (the window and sinks
# inside each document), DeepSeek-V3's latent attention with the window's positions.
documents=(--set model.vocab_size=8 --set model.eos_token_id=3 --set training.document_mask=true)
run_case documents_gpt_oss "${gpt_oss[@]}" "${documents[@]}" \
  --set training.reset_position_ids=true --set model.sliding_window=3
run_case documents_deepseek_v3 "${deepseek[@]}" "${documents[@]}"

# RoPE scaling, each type as transformers' modeling_rope_utils.py computes it (small theta and
# original contexts so that every frequency band of the 16-dim heads is moved).
run_case rope_linear --set model.rope_type=linear --set model.rope_factor=4 --set model.rope_theta=100
# dynamic NTK: sequences of 24 past max_position_embeddings 16 take the recomputed base.
run_case rope_dynamic --set model.rope_type=dynamic --set model.rope_factor=2   --set model.rope_theta=100 --set model.max_position_embeddings=16 --set training.seq_len=24
run_case rope_yarn "${qwen3[@]}" --set model.rope_type=yarn --set model.rope_factor=8   --set model.rope_original_max_position_embeddings=8 --set model.rope_theta=1000
# gpt-oss's form: no truncation of the ramp; and DeepSeek's: mscale over mscale_all_dim.
run_case rope_yarn_notrunc --set model.rope_type=yarn --set model.rope_factor=32   --set model.rope_original_max_position_embeddings=4 --set model.rope_truncate=false   --set model.rope_beta_fast=8 --set model.rope_theta=1500
run_case rope_yarn_mscale --set model.rope_type=yarn --set model.rope_factor=40   --set model.rope_original_max_position_embeddings=4 --set model.rope_mscale=1.0   --set model.rope_mscale_all_dim=0.707
run_case rope_llama3 "${qwen3[@]}" --set model.rope_type=llama3 --set model.rope_factor=8   --set model.rope_original_max_position_embeddings=16 --set model.rope_low_freq_factor=1   --set model.rope_high_freq_factor=4 --set model.rope_theta=500

if ((failures)); then
  echo "test_hf_reference: $failures case(s) failed" >&2
  exit 1
fi
echo "test_hf_reference: all cases passed"
