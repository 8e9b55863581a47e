// One MoE layer's dispatch, measured (see dispatch_layer.h).
#include "core/measure/dispatch_layer.h"

#include <chrono>
#include <random>

#include "core/error.h"
#include "core/measure/harness.h"
#include "ops/fill.h"

namespace moepeak::measure {

DispatchLayer::DispatchLayer(Backend& backend, Comm& comm, const DispatchLayerShape& s)
    : backend_(backend), comm_(comm), shape_(s) {
  const int64_t N = s.tokens, H = s.hidden, F = s.ffn, E = s.experts, k = s.top_k,
                W = comm.world_size();
  MOEPEAK_CHECK_INPUT(E % W == 0 && k <= E, "a dispatch layer of E = ", E, " experts on W = ", W,
                      " ranks with top-", k, " needs E divisible by W and k <= E");
  std::mt19937_64 rng(4321 + static_cast<uint64_t>(comm.rank()));
  std::uniform_real_distribution<double> uni(-1.0, 1.0);
  x_ = tensor(Shape{N, H}, "dispatch x");
  dout_ = tensor(Shape{N, H}, "dispatch dout");
  out_ = tensor(Shape{N, H}, "dispatch out");
  dx_ = tensor(Shape{N, H}, "dispatch dx");
  weight_ = tensor(Shape{N, k}, "dispatch routing weight");
  dweight_ = tensor(Shape{N, k}, "dispatch d routing weight");
  index_ = OwnedTensor::device(backend, Shape{N, k}, DType::i32, LiveSet::workspace,
                               "dispatch routing index");
  fill_seeded(x_, backend, [&] { return uni(rng); });
  fill_seeded(dout_, backend, [&] { return uni(rng); });
  const SeededRouting routing = seeded_routing(s.routing, N, E, k, s.zipf_s, s.segments, rng);
  size_t at = 0;
  fill_seeded(index_, backend, [&] { return routing.index[at++]; });
  at = 0;
  fill_seeded(weight_, backend, [&] { return routing.weight[at++]; });
  experts_ =
      seeded_local_experts(backend, s.dtype, E, comm.rank(), static_cast<int>(W), H, F, storage_);
}

OwnedTensor DispatchLayer::tensor(Shape shape, const char* what) {
  return OwnedTensor::device(backend_, shape, shape_.dtype, LiveSet::workspace, what);
}

std::vector<double> DispatchLayer::read(const Tensor& t) {
  return read_sampled_rows(t, backend_, backend_.default_stream());
}

DispatchRun DispatchLayer::run(schedules::ExpertDispatch& d, int warmup, int iters,
                               Recompute recompute, bool read_results) {
  Stream& stream = backend_.default_stream();
  DispatchRun r;
  if (recompute == Recompute::output && !recompute_out_.view().defined()) {
    recompute_out_ = tensor(Shape{shape_.tokens, shape_.hidden}, "dispatch recompute out");
  }
  backend_.arena().reset_peaks();
  for (int i = 0; i < warmup + iters; ++i) {
    ops::fill(out_, 0.0, stream);
    ops::fill(dx_, 0.0, stream);
    for (const auto& ex : experts_) {
      for (const Tensor* g : {&ex.dw1, &ex.dw3, &ex.dw2}) ops::fill(*g, 0.0, stream);
    }
    stream.synchronize();
    comm_.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    d.forward(x_, index_, weight_, experts_, out_);
    if (recompute != Recompute::off) {
      d.release();
      d.forward(x_, index_, weight_, experts_,
                recompute == Recompute::output ? recompute_out_.view() : Tensor());
    }
    d.backward(dout_, experts_, dx_, dweight_);
    stream.synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= warmup) r.times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  r.stats = backend_.arena().stats();
  if (read_results) {
    r.out = read(out_);
    r.dx = read(dx_);
    r.dweight = read(dweight_);
    for (const auto& ex : experts_) {
      for (const Tensor* g : {&ex.dw1, &ex.dw3, &ex.dw2}) {
        std::vector<double> v = read(*g);
        r.dw.insert(r.dw.end(), v.begin(), v.end());
      }
    }
  }
  return r;
}

}  // namespace moepeak::measure
