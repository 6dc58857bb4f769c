#include "recovery/recover.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "core/interrupt.hpp"
#include "core/timer.hpp"
#include "model/synth.hpp"
#include "recovery/hash.hpp"

#include <cmath>
#include <numeric>

namespace sparsim::recovery {

void RecoverOptions::validate() const {
  lora.validate();
  distill.validate();
  adam.validate();
  require(steps >= 1, "recovery steps must be at least 1, got {}", steps);
  require(seq_len >= 2, "recovery sequences need at least 2 tokens, got {}", seq_len);
  require(batch >= 1, "recovery batch must be at least 1 sequence, got {}", batch);
  require(adam.warmup_steps <= steps, "{} warm-up steps exceed the {} steps of the run",
          adam.warmup_steps, steps);
}

SequenceOrder::SequenceOrder(std::size_t n_tokens, int seq_len, std::uint64_t seed)
    : count_(seq_len > 0 ? n_tokens / static_cast<std::size_t>(seq_len) : 0),
      seq_len_(seq_len),
      seed_(seed) {
  require(count_ >= 1, "the training text has {} tokens, fewer than one sequence of {}", n_tokens,
          seq_len);
}

std::size_t SequenceOrder::start(std::int64_t k) {
  const std::int64_t n = static_cast<std::int64_t>(count_);
  const std::int64_t pass = k / n;
  if (pass != pass_) {
    perm_.resize(count_);
    std::iota(perm_.begin(), perm_.end(), std::size_t{0});
    SynthRng rng(mix64(mix64(seed_) ^ static_cast<std::uint64_t>(pass)));
    for (std::size_t i = count_ - 1; i > 0; --i)
      std::swap(perm_[i], perm_[static_cast<std::size_t>(rng.next() % (i + 1))]);
    pass_ = pass;
  }
  return perm_[static_cast<std::size_t>(k % n)] * static_cast<std::size_t>(seq_len_);
}

void check_teacher(const Config& s, const Config& t, const std::string& teacher_fp) {
  require(!t.pruned(),
          "the teacher is itself a pruned model ({}); give the full model the student was pruned "
          "from",
          t.prune.method);
  require(t.vocab == s.vocab,
          "the teacher's vocabulary has {} tokens, the student's {}: distillation compares "
          "their next-token distributions token by token, so they must share a vocabulary",
          t.vocab, s.vocab);
  require(!s.prune.source_fingerprint.empty(),
          "the student records no model it was pruned from (GGUF key "
          "sparsim.prune.source_fingerprint): recover distils a model sparsim pruned from that "
          "model");
  require(s.prune.source_fingerprint == teacher_fp,
          "the student was pruned from the model with fingerprint {}, but the teacher's "
          "fingerprint is {}: give the model it was pruned from",
          s.prune.source_fingerprint, teacher_fp);
  require(t.d_model == s.d_model && t.n_layer == s.n_layer,
          "the teacher ({} layers of width {}) has another shape than the student ({} of {})",
          t.n_layer, t.d_model, s.n_layer, s.d_model);
}

namespace {

/// A loss hook that keeps the logits (evaluation of the adapted model) and returns 0.
template <class E, class T>
class CaptureLogits : public LossHook<E, T> {
 public:
  double loss_and_gradient(const E& exec, const MatT<E, T>& z, const IVec<E>&) override {
    exec.fence();
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), z);
    logits.resize(h.size());
    for (std::size_t r = 0; r < h.extent(0); ++r)
      for (std::size_t c = 0; c < h.extent(1); ++c)
        logits[r * h.extent(1) + c] = static_cast<float>(h(r, c));
    return 0;
  }
  std::vector<float> logits;
};

std::vector<double> flatten(const std::vector<Adapter>& ad) {
  std::vector<double> p;
  for (const Adapter& a : ad) {
    p.insert(p.end(), a.a.begin(), a.a.end());
    p.insert(p.end(), a.b.begin(), a.b.end());
  }
  return p;
}

void unflatten(const std::vector<double>& p, std::vector<Adapter>& ad) {
  std::size_t k = 0;
  for (Adapter& a : ad) {
    for (double& x : a.a) x = p[k++];
    for (double& x : a.b) x = p[k++];
  }
}

}  // namespace

template <class E>
struct Recoverer<E>::Impl {
  std::shared_ptr<const Weights<E>> student, teacher;
  std::vector<int> stream;
  std::unique_ptr<Engine<E>> teacher_engine;
  Backprop<E, float> bp;
  LoraHook<E, float> hook;
  DistillLoss<E, float> loss;
  AdamW adam;
  StepRecord last;
  Impl(std::shared_ptr<const Weights<E>> s, std::shared_ptr<const Weights<E>> t,
       std::vector<int> str, const RecoverOptions& o, const std::vector<Adapter>& ad, E exec)
      : student(std::move(s)),
        teacher(std::move(t)),
        stream(std::move(str)),
        bp(student, o.seq_len, exec),
        hook(ad, student->cfg.n_layer, o.lora.scale(), o.lora.dropout, o.seq_len, exec),
        loss(o.distill, o.seq_len, student->cfg.vocab, exec),
        adam(o.adam, flatten(ad).size()) {
    if (o.distill.weight > 0)
      teacher_engine = std::make_unique<Engine<E>>(teacher, 1, o.seq_len, nullptr, exec);
    bp.set_projection_hook(&hook);
    bp.set_loss_hook(&loss);
  }
};

template <class E>
Recoverer<E>::Recoverer(std::shared_ptr<const Weights<E>> student,
                        std::shared_ptr<const Weights<E>> teacher, std::vector<int> stream,
                        const RecoverOptions& o, E exec)
    : o_(o), order_(stream.size(), o.seq_len, o.seed) {
  o_.validate();
  require(student != nullptr, "recovery: no student model");
  require(o_.distill.weight == 0 || teacher != nullptr,
          "recovery: distillation (weight {}) needs a teacher model", o_.distill.weight);
  require(o_.seq_len <= student->cfg.context_length,
          "recovery sequences of {} tokens exceed the student's context of {}", o_.seq_len,
          student->cfg.context_length);
  if (teacher)
    require(o_.seq_len <= teacher->cfg.context_length,
            "recovery sequences of {} tokens exceed the teacher's context of {}", o_.seq_len,
            teacher->cfg.context_length);
  for (int t : stream)
    require(t >= 0 && t < student->cfg.vocab, "recovery: token id {} outside the vocabulary", t);
  st_.adapters = init_adapters(*student, o_.lora);
  const std::size_t n = flatten(st_.adapters).size();
  st_.m.assign(n, 0.0);
  st_.v.assign(n, 0.0);
  impl_ = std::make_unique<Impl>(std::move(student), std::move(teacher), std::move(stream), o_,
                                 st_.adapters, exec);
}

template <class E>
Recoverer<E>::~Recoverer() = default;

template <class E>
void Recoverer<E>::restore(RecoveryState s) {
  require(s.step >= 0 && s.step <= o_.steps, "recovery state at step {} of a run of {} steps",
          s.step, o_.steps);
  require(s.adapters.size() == st_.adapters.size(),
          "recovery state holds {} adapters, this run has {}", s.adapters.size(),
          st_.adapters.size());
  for (std::size_t i = 0; i < s.adapters.size(); ++i) {
    const Adapter &a = s.adapters[i], &b = st_.adapters[i];
    require(a.layer == b.layer && a.proj == b.proj && a.rank == b.rank && a.in == b.in &&
                a.out == b.out && a.a.size() == b.a.size() && a.b.size() == b.b.size(),
            "recovery state: adapter {} has another shape ({}×{}, rank {}) than this run's {} "
            "({}×{}, rank {})",
            a.name(), a.out, a.in, a.rank, b.name(), b.out, b.in, b.rank);
  }
  require(s.m.size() == st_.m.size() && s.v.size() == st_.v.size(),
          "recovery state: {} optimizer moments, expected {}", s.m.size(), st_.m.size());
  require(static_cast<int>(s.curve.size()) == s.step,
          "recovery state: a loss curve of {} steps at step {}", s.curve.size(), s.step);
  impl_->adam.restore(s.step, s.m, s.v);
  impl_->hook.upload(s.adapters);
  st_ = std::move(s);
}

template <class E>
const StepRecord& Recoverer<E>::step() {
  require(!done(), "recovery: all {} steps are done", o_.steps);
  Impl& im = *impl_;
  const int s = st_.step + 1;
  StepRecord rec;
  rec.step = s;
  rec.lr = learning_rate(o_.adam, s, o_.steps);
  Stopwatch total, sw;
  im.hook.zero_grad();
  im.hook.set_training(true);
  std::vector<std::vector<int>> seqs;
  for (int b = 0; b < o_.batch; ++b) {
    interruption_point("recover");
    const std::size_t first = order_.start(static_cast<std::int64_t>(st_.step) * o_.batch + b);
    const std::vector<int> seq(im.stream.begin() + static_cast<std::ptrdiff_t>(first),
                               im.stream.begin() + static_cast<std::ptrdiff_t>(first) + o_.seq_len);
    seqs.push_back(seq);
    sw.reset();
    if (im.teacher_engine) im.loss.set_teacher(im.teacher_engine->forward({seq}, 0, true));
    Kokkos::fence();
    rec.teacher_seconds += sw.seconds();
    sw.reset();
    im.hook.set_dropout_key(mix64(mix64(o_.seed + 0x5EED) ^ (static_cast<std::uint64_t>(s) << 20) ^
                                  static_cast<std::uint64_t>(b)));
    const double loss = im.bp.forward(seq);
    rec.forward_seconds += sw.seconds();
    require(std::isfinite(loss),
            "the loss of step {} is {} (sequence {} of the step, tokens {} … {} of the training "
            "text): the run stops; the adapters of step {} are the last good ones",
            s, loss, b + 1, first, first + static_cast<std::size_t>(o_.seq_len) - 1, s - 1);
    rec.loss += loss;
    rec.ce += im.loss.last_ce();
    rec.kl += im.loss.last_kl();
    sw.reset();
    im.bp.backward();
    rec.backward_seconds += sw.seconds();
  }
  sw.reset();
  rec.loss /= o_.batch;
  rec.ce /= o_.batch;
  rec.kl /= o_.batch;
  std::vector<double> g = im.hook.gradients();
  for (double& x : g) x /= o_.batch;
  std::vector<double> p = flatten(st_.adapters);
  double ss = 0;
  for (double x : g) ss += x * x;
  require(std::isfinite(ss),
          "the gradient of step {} is not finite (loss {}): the run stops; the adapters of step {} "
          "are the last good ones",
          s, rec.loss, s - 1);
  last_grad_ = g;
  last_seqs_ = std::move(seqs);
  // The update works on copies: the state changes only once the step is complete.
  AdamW next = im.adam;
  rec.grad_norm = next.step(p, g, rec.lr);
  for (double x : p)
    require(std::isfinite(x),
            "step {} made an adapter value non-finite (learning rate {}): the "
            "run stops; the adapters of step {} are the last good ones",
            s, rec.lr, s - 1);
  im.adam = std::move(next);
  unflatten(p, st_.adapters);
  st_.m = im.adam.m();
  st_.v = im.adam.v();
  im.hook.upload(st_.adapters);
  rec.update_seconds = sw.seconds();
  rec.seconds = total.seconds();
  st_.step = s;
  st_.curve.push_back(rec);
  return st_.curve.back();
}

template <class E>
std::vector<float> Recoverer<E>::student_logits(const std::vector<int>& tokens) {
  Impl& im = *impl_;
  CaptureLogits<E, float> cap;
  im.hook.set_training(false);
  im.bp.set_loss_hook(&cap);
  try {
    im.bp.forward(tokens);
  } catch (...) {
    im.bp.set_loss_hook(&im.loss);
    im.hook.set_training(true);
    throw;
  }
  im.bp.set_loss_hook(&im.loss);
  im.hook.set_training(true);
  return cap.logits;
}

#define SPARSIM_INSTANTIATE_RECOVERER(E) template class Recoverer<E>;
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_RECOVERER)

}  // namespace sparsim::recovery
