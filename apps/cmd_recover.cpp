// sparsim recover: recovery of a pruned model by LoRA adapters trained with distillation from
// the model it was pruned from (recovery/recover.hpp), written out as a GGUF model with the
// adapters merged.
#include "common.hpp"
#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "eval_checkpoint.hpp"
#include "io/run_file.hpp"
#include "io/run_guard.hpp"
#include "model/loader.hpp"
#include "model_io.hpp"
#include "records.hpp"
#include "recovery/checkpoint.hpp"
#include "recovery/recover.hpp"
#include "recovery/recovered_gguf.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace sparsim::app {

namespace {

using namespace sparsim::recovery;

/// Options that cannot change the adapters a run produces: left out of the settings a
/// checkpoint is matched by (results do not depend on the thread count, bitwise).
const std::set<std::string> kNotSettings = {"threads",
                                            "progress",
                                            "out",
                                            "run",
                                            "json",
                                            "help",
                                            "checkpoint",
                                            "log-level",
                                            "checkpoint-minutes",
                                            "checkpoint-steps",
                                            "model",
                                            "teacher",
                                            "corpus",
                                            "dump-gradients",
                                            "check-options"};

struct RecoverArgs {
  CommonOptions co;
  std::string model, teacher, corpus = "default", text_field = "text", targets = "q,k,v,o";
  std::string kd_direction = "reverse", schedule = "cosine", warmup = "auto";
  std::string out, run, json, checkpoint = "auto", dump_gradients, progress = "auto";
  double checkpoint_minutes = 5;
  int checkpoint_steps = 0;
  RecoverOptions ro;
};

/// Peak resident memory of this process in bytes (VmHWM), 0 where it cannot be read.
std::uint64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

/// Parses and checks everything that does not need the models; false after --help.
bool parse_recover(int argc, char** argv, RecoverArgs& a, po::variables_map& vm) {
  RecoverOptions& o = a.ro;
  po::options_description d("sparsim recover options");
  d.add_options()("model,m", po::value(&a.model),
                  "the pruned model (a GGUF file sparsim wrote; required)")(
      "teacher", po::value(&a.teacher),
      "the full model the student was pruned from (its fingerprint is checked; required)")(
      "corpus", po::value(&a.corpus)->default_value("default"),
      "training text: a file, a folder, a JSONL file, or default (the installed corpus); "
      "cut into consecutive sequences of --seq-len tokens drawn in a seeded random order")(
      "text-field", po::value(&a.text_field)->default_value("text"),
      "JSONL field holding the text")("steps", po::value(&o.steps)->default_value(100),
                                      "optimizer steps")(
      "seq-len", po::value(&o.seq_len)->default_value(256), "tokens per training sequence")(
      "batch", po::value(&o.batch)->default_value(1),
      "sequences per step (their gradients are averaged)")(
      "lora-rank", po::value(&o.lora.rank)->default_value(8), "LoRA rank r (RAP: 8)")(
      "lora-alpha", po::value(&o.lora.alpha)->default_value(16.0),
      "LoRA alpha: the update is scaled by alpha / r (RAP: 16)")(
      "lora-dropout", po::value(&o.lora.dropout)->default_value(0.05),
      "dropout on the adapter inputs (RAP: 0.05)")(
      "lora-init-b-std", po::value(&o.lora.init_b_std)->default_value(0.0),
      "standard deviation of B's initial entries; 0 (LoRA's B = 0: the run starts from the "
      "pruned model itself); nonzero for gradient checks")(
      "targets", po::value(&a.targets)->default_value("q,k,v,o"),
      "adapted projections, any of q, k, v, o, gate, up, down")(
      "kd-temperature", po::value(&o.distill.temperature)->default_value(2.0),
      "distillation temperature T (RAP: 2)")(
      "kd-weight", po::value(&o.distill.weight)->default_value(1.0),
      "weight w of the distillation term: loss = CE + w·T²·KL (0: cross-entropy only)")(
      "kd-direction", po::value(&a.kd_direction)->default_value("reverse"),
      "reverse: KL(student || teacher), as RAP writes it; forward: KL(teacher || student), "
      "Hinton's")("lr", po::value(&o.adam.lr)->default_value(2e-4), "peak learning rate of AdamW")(
      "schedule", po::value(&a.schedule)->default_value("cosine"),
      "learning rate after the warm-up: cosine, linear (both to 0) or constant")(
      "warmup-steps", po::value(&a.warmup)->default_value("auto"),
      "linear warm-up steps (auto: 5% of --steps, rounded up)")(
      "weight-decay", po::value(&o.adam.weight_decay)->default_value(0.0),
      "AdamW's decoupled weight decay")("max-grad-norm",
                                        po::value(&o.adam.max_grad_norm)->default_value(1.0),
                                        "clip the gradient's global norm to this (0: no clipping)")(
      "seed", po::value(&o.seed)->default_value(1),
      "data order, dropout masks and adapter initialisation")(
      "out,o", po::value(&a.out), "recovered model to write (GGUF; required)")(
      "run", po::value(&a.run), "run file (HDF5): settings, loss curve, adapters, timings")(
      "json", po::value(&a.json), "JSON summary")(
      "checkpoint", po::value(&a.checkpoint)->default_value("auto"),
      "file keeping the adapters and optimizer state, so that running the same command again "
      "continues an interrupted run to bitwise the same model: auto (<--out>.ckpt), off, or a "
      "file name; written every --checkpoint-minutes, every --checkpoint-steps and when the run "
      "is interrupted, removed when it finishes")(
      "checkpoint-minutes", po::value(&a.checkpoint_minutes)->default_value(5.0),
      "minutes between two checkpoint writes")(
      "checkpoint-steps", po::value(&a.checkpoint_steps)->default_value(0),
      "also write the checkpoint every this many steps (0: by time only)")(
      "dump-gradients", po::value(&a.dump_gradients),
      "write the first step's adapters (before the update), sequences, loss and gradients to "
      "this HDF5 file (checks against an independent implementation)")(
      "progress", po::value(&a.progress)->default_value("auto"),
      "progress on stderr: auto (a bar on a terminal, lines otherwise), always, lines, never");
  add_common_options(d, a.co);
  add_check_option(d);
  if (!parse(argc, argv,
             "usage: sparsim recover --model PRUNED.gguf --teacher FULL --corpus C --steps N "
             "--lora-rank r --out RECOVERED.gguf [--run R.h5] [--json S]",
             d, vm))
    return false;
  require(!a.model.empty(), "recover: --model PRUNED.gguf is required");
  require(!a.teacher.empty(), "recover: --teacher FULL (the model it was pruned from) is required");
  require(!a.out.empty(), "recover: --out RECOVERED.gguf is required");
  o.lora.targets = parse_targets(a.targets);
  o.lora.seed = o.seed;
  o.distill.direction = parse_kd_direction(a.kd_direction);
  o.adam.schedule = parse_schedule(a.schedule);
  if (a.warmup == "auto") {
    o.adam.warmup_steps = o.steps >= 1 ? (o.steps + 19) / 20 : 0;
  } else {
    std::size_t pos = 0;
    int w = -1;
    try {
      w = std::stoi(a.warmup, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    require(pos == a.warmup.size() && w >= 0,
            "--warmup-steps must be auto or a number >= 0, got '{}'", a.warmup);
    o.adam.warmup_steps = w;
  }
  o.validate();
  require(std::isfinite(a.checkpoint_minutes) && a.checkpoint_minutes > 0,
          "--checkpoint-minutes must be a positive number, got {}", a.checkpoint_minutes);
  require(a.checkpoint_steps >= 0, "--checkpoint-steps must be >= 0, got {}", a.checkpoint_steps);
  require(a.co.threads >= 0 && a.co.threads <= 4096, "--threads {} is out of range", a.co.threads);
  progress_mode(a.progress, ProgressBar::Mode::Lines);  // checks the value
  return true;
}

void write_gradient_dump(const std::string& path, const RecoverOptions& o,
                         const std::vector<Adapter>& before, const StepRecord& rec,
                         const std::vector<double>& grad,
                         const std::vector<std::vector<int>>& seqs) {
  io::RunFile rf(path);
  io::Group root = rf.root();
  root.set_attr("format", "sparsim recover gradients");
  root.set_attr("scale", o.lora.scale());
  root.set_attr("kd_temperature", o.distill.temperature);
  root.set_attr("kd_weight", o.distill.weight);
  root.set_attr("kd_direction", kd_direction_name(o.distill.direction));
  root.set_attr("lora_dropout", o.lora.dropout);
  root.set_attr("loss", rec.loss);
  root.set_attr("ce", rec.ce);
  root.set_attr("kl", rec.kl);
  std::vector<std::int32_t> toks;
  for (const auto& s : seqs) toks.insert(toks.end(), s.begin(), s.end());
  root.write<std::int32_t>("tokens", toks.data(),
                           {static_cast<hsize_t>(seqs.size()), static_cast<hsize_t>(o.seq_len)},
                           {"", "token ids of the step's sequences"});
  std::size_t k = 0;
  for (const Adapter& a : before) {
    io::Group g = root.create_group("adapters/" + a.name());
    g.write<double>("A", a.a.data(), {static_cast<hsize_t>(a.rank), static_cast<hsize_t>(a.in)});
    g.write<double>("B", a.b.data(), {static_cast<hsize_t>(a.out), static_cast<hsize_t>(a.rank)});
    g.write<double>("grad_A", grad.data() + k,
                    {static_cast<hsize_t>(a.rank), static_cast<hsize_t>(a.in)},
                    {"1", "dL/dA, mean over the step's sequences"});
    k += a.a.size();
    g.write<double>("grad_B", grad.data() + k,
                    {static_cast<hsize_t>(a.out), static_cast<hsize_t>(a.rank)},
                    {"1", "dL/dB, mean over the step's sequences"});
    k += a.b.size();
  }
  rf.commit();
}

/// The checkpoint of a run: read when an interrupted run with the same settings left one,
/// written every few minutes or steps while training and when interrupted.
template <class E>
class TrainingCheckpoint {
 public:
  TrainingCheckpoint(std::string path, std::string settings, Recoverer<E>& rec, int steps)
      : path_(std::move(path)), settings_(std::move(settings)), rec_(rec), steps_(steps) {}

  /// Restores the adapters of the checkpoint, if there is one; returns the step reached.
  int resume() {
    if (path_.empty() || !std::filesystem::exists(path_)) return 0;
    Checkpoint ck = read_checkpoint(path_);
    if (ck.settings != settings_)
      throw UsageError(fmt::format(
          "checkpoint '{}' was written by a run with other settings ({}); delete it to start "
          "afresh, or give this run another --checkpoint",
          path_, settings_differences(ck.settings, settings_)));
    rec_.restore(std::move(ck.state));
    saved_at_ = rec_.state().step;
    log().info("continuing from checkpoint '{}' at step {} of {}", path_, saved_at_, steps_);
    return saved_at_;
  }

  /// Writes the current step (if not written yet); `running`: a test may stop the run there.
  void save(bool running) {
    if (path_.empty() || rec_.state().step == saved_at_) return;
    write_checkpoint(path_, Checkpoint{settings_, rec_.state()});
    saved_at_ = rec_.state().step;
    since_save_.reset();
    interrupt::set_note(fmt::format(
        "the adapters of step {} of {} are kept in '{}': run the same command again to continue",
        saved_at_, steps_, path_));
    if (running) interruption_point("checkpoint-written");
  }

  double minutes_since_save() const { return since_save_.seconds() / 60; }
  int saved_at() const { return saved_at_; }
  const std::string& path() const { return path_; }

  /// The run is complete: the checkpoint goes.
  void remove() const {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }

 private:
  std::string path_, settings_;
  Recoverer<E>& rec_;
  int steps_;
  int saved_at_ = 0;
  Stopwatch since_save_;
};

/// The training steps left, with the progress line, the checkpoints and the gradient dump of
/// step 1.
template <class E>
void train(const RecoverArgs& a, Recoverer<E>& rec, TrainingCheckpoint<E>& ckpt, int resumed_at) {
  const RecoverOptions& o = a.ro;
  ProgressBar bar("recover", progress_mode(a.progress, ProgressBar::Mode::Lines));
  const int todo = o.steps - resumed_at;
  double tok_s = 0, step_s = 0;
  try {
    while (!rec.done()) {
      // a named point per step, so that a test can stop the run at a known step
      interruption_point(fmt::format("step-{}", rec.state().step + 1).c_str());
      std::vector<Adapter> before;
      if (!a.dump_gradients.empty() && rec.state().step == 0) before = rec.state().adapters;
      const StepRecord& r = rec.step();
      if (!before.empty())
        write_gradient_dump(a.dump_gradients, o, before, r, rec.last_gradient(),
                            rec.last_sequences());
      step_s += r.seconds;
      tok_s = static_cast<double>(rec.tokens_per_step()) * (r.step - resumed_at) / step_s;
      bar.update(r.step - resumed_at, todo,
                 fmt::format("step {} loss {:.4f} (CE {:.4f}, KL {:.4f}) {:.0f} tokens/s", r.step,
                             r.loss, r.ce, r.kl, tok_s));
      if (ckpt.minutes_since_save() >= a.checkpoint_minutes ||
          (a.checkpoint_steps > 0 && r.step % a.checkpoint_steps == 0))
        ckpt.save(true);
    }
  } catch (const Interrupted&) {
    bar.finish();
    ckpt.save(false);
    throw;
  } catch (const Error& e) {
    bar.finish();
    fail("{}{}", e.what(),
         ckpt.saved_at() > 0
             ? fmt::format(" (the checkpoint '{}' holds step {})", ckpt.path(), ckpt.saved_at())
             : std::string());
  }
  bar.finish();
}

/// The recovered model's record: what it was trained from and how, and its loss curve.
RecoveryRecord recovery_record(const RecoverOptions& o, const RecoveryState& st,
                               std::int64_t tokens_per_step, const ModelInfo& smi,
                               const ModelInfo& tmi, const Corpus& corpus) {
  RecoveryRecord rr;
  rr.teacher_fingerprint = tmi.fingerprint;
  rr.student_fingerprint = smi.fingerprint;
  rr.corpus_fingerprint = corpus.fingerprint;
  rr.steps = o.steps;
  rr.seq_len = o.seq_len;
  rr.batch = o.batch;
  rr.tokens = tokens_per_step * o.steps;
  rr.rank = o.lora.rank;
  rr.alpha = o.lora.alpha;
  rr.dropout = o.lora.dropout;
  rr.targets = targets_string(o.lora.targets);
  rr.kd_temperature = o.distill.temperature;
  rr.kd_weight = o.distill.weight;
  rr.kd_direction = kd_direction_name(o.distill.direction);
  rr.lr = o.adam.lr;
  rr.schedule = schedule_name(o.adam.schedule);
  rr.warmup_steps = o.adam.warmup_steps;
  rr.seed = o.seed;
  for (const StepRecord& r : st.curve) {
    rr.loss.push_back(r.loss);
    rr.ce.push_back(r.ce);
    rr.kl.push_back(r.kl);
  }
  return rr;
}

/// What the report of a finished run reads besides the options and the models.
struct RecoverOutcome {
  const RecoveryState& st;
  RecoveryRecord rr;
  ModelInfo omi;       ///< the written model
  int resumed_at = 0;  ///< the step the run continued from
  std::size_t corpus_tokens = 0, sequences = 0;
  std::int64_t tokens_per_step = 0;
  double merge_err = 0;  ///< merged against unmerged logits, relative to the largest
  double fwd_s = 0;      ///< forward pass of one step's tokens
  double med_step = 0;   ///< median step of this process
  std::uint64_t peak = 0;

  /// Mean of a step time over this process's steps.
  double mean_of(double StepRecord::*m) const {
    double s = 0;
    int n = 0;
    for (const StepRecord& r : st.curve)
      if (r.step > resumed_at) {
        s += r.*m;
        ++n;
      }
    return n == 0 ? 0.0 : s / n;
  }
  double tokens_per_second() const { return med_step > 0 ? tokens_per_step / med_step : 0.0; }
  double step_over_forward() const { return fwd_s > 0 ? med_step / fwd_s : 0.0; }
};

/// The written model loads, and its logits are the unmerged student's (else it is removed);
/// the forward time of one step's tokens (the batch in one prefill, median of 3) beside.
template <class E>
void check_merged(const RecoverArgs& a, Recoverer<E>& rec, const std::vector<int>& stream, E exec,
                  RecoverOutcome& out) {
  const RecoverOptions& o = a.ro;
  try {
    auto merged = load_model<E>(a.out, LoadOptions{}, &out.omi);
    const std::vector<int> probe(stream.begin(), stream.begin() + o.seq_len);
    const std::vector<float> ref = rec.student_logits(probe);
    Engine<E> eng(merged, o.batch, o.seq_len, nullptr, exec);
    auto got =
        Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), eng.forward({probe}, 0, true));
    double num = 0, den = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      num = std::max(num, std::fabs(static_cast<double>(got.data()[i]) - ref[i]));
      den = std::max(den, std::fabs(static_cast<double>(ref[i])));
    }
    out.merge_err = num / std::max(den, 1e-30);
    require(out.merge_err <= 1e-3,
            "its logits differ from the unmerged adapters' by {:.3g} (relative to the largest)",
            out.merge_err);
    std::vector<std::vector<int>> batch = rec.last_sequences();
    if (batch.empty()) batch.assign(static_cast<std::size_t>(o.batch), probe);
    std::vector<double> ts;
    for (int rep = 0; rep < 3; ++rep) {
      Stopwatch sw;
      eng.forward(batch, 0, true);
      Kokkos::fence();
      ts.push_back(sw.seconds());
    }
    out.fwd_s = median_of(ts);
  } catch (const Error& e) {
    std::error_code ec;
    std::filesystem::remove(a.out, ec);
    fail("recover: the written model {} does not reproduce the trained adapters ({}); removed",
         a.out, e.what());
  }
}

/// The run file's recovery group: settings, timings, the loss curve and the adapters.
void write_recovery_group(io::Group root, const RecoverArgs& a, const RecoverOutcome& out,
                          const Corpus& corpus, double wall_s) {
  const RecoverOptions& o = a.ro;
  const RecoveryState& st = out.st;
  io::Group g = root.create_group("recovery");
  g.set_attr("output", a.out);
  g.set_attr("output_fingerprint", out.omi.fingerprint);
  g.set_attr("corpus", corpus.source);
  g.set_attr("corpus_fingerprint", corpus.fingerprint);
  g.set_attr("corpus_tokens", static_cast<std::int64_t>(out.corpus_tokens));
  g.set_attr("sequences_available", static_cast<std::int64_t>(out.sequences));
  g.set_attr("steps", o.steps);
  g.set_attr("seq_len", o.seq_len);
  g.set_attr("batch", o.batch);
  g.set_attr("tokens", static_cast<std::int64_t>(out.rr.tokens));
  g.set_attr("lora_rank", o.lora.rank);
  g.set_attr("lora_alpha", o.lora.alpha);
  g.set_attr("lora_dropout", o.lora.dropout);
  g.set_attr("lora_init_b_std", o.lora.init_b_std);
  g.set_attr("lora_targets", out.rr.targets);
  g.set_attr("trainable_parameters", static_cast<std::int64_t>(st.m.size()));
  g.set_attr("kd_temperature", o.distill.temperature);
  g.set_attr("kd_weight", o.distill.weight);
  g.set_attr("kd_direction", out.rr.kd_direction);
  g.set_attr("lr", o.adam.lr);
  g.set_attr("schedule", out.rr.schedule);
  g.set_attr("warmup_steps", o.adam.warmup_steps);
  g.set_attr("weight_decay", o.adam.weight_decay);
  g.set_attr("max_grad_norm", o.adam.max_grad_norm);
  g.set_attr("beta1", o.adam.beta1);
  g.set_attr("beta2", o.adam.beta2);
  g.set_attr("adam_eps", o.adam.eps);
  g.set_attr("seed", static_cast<std::int64_t>(o.seed));
  g.set_attr("resumed_at_step", out.resumed_at);
  g.set_attr("merge_check_rel_error", out.merge_err);
  g.set_attr("median_step_seconds", out.med_step);
  g.set_attr("forward_seconds_per_step_tokens", out.fwd_s);
  g.set_attr("step_over_forward", out.step_over_forward());
  g.set_attr("peak_rss_bytes", static_cast<std::int64_t>(out.peak));
  g.set_attr("wall_seconds", wall_s);
  io::Group cg = g.create_group("curve");
  std::vector<std::int64_t> steps;
  for (const StepRecord& r : st.curve) steps.push_back(r.step);
  cg.write<std::int64_t>("step", steps, {"1", "optimizer step"});
  auto col = [&](const char* name, double StepRecord::*m, const char* units, const char* what) {
    std::vector<double> v;
    for (const StepRecord& r : st.curve) v.push_back(r.*m);
    cg.write<double>(name, v, {units, what});
  };
  col("loss", &StepRecord::loss, "nat", "CE + w·T²·KL, mean over the step's sequences");
  col("ce", &StepRecord::ce, "nat", "next-token cross-entropy");
  col("kl", &StepRecord::kl, "nat", "KL divergence at temperature T (without w·T²)");
  col("lr", &StepRecord::lr, "1", "learning rate used");
  col("grad_norm", &StepRecord::grad_norm, "1", "global gradient norm before clipping");
  col("seconds", &StepRecord::seconds, "s",
      "wall time of the step (earlier process's "
      "steps keep their own times)");
  col("teacher_seconds", &StepRecord::teacher_seconds, "s", "teacher forward passes");
  col("forward_seconds", &StepRecord::forward_seconds, "s", "student forward passes");
  col("backward_seconds", &StepRecord::backward_seconds, "s", "student backward passes");
  col("update_seconds", &StepRecord::update_seconds, "s", "gradient download and AdamW");
  io::Group ag = g.create_group("adapters");
  for (const Adapter& ad : st.adapters) {
    io::Group x = ag.create_group(ad.name());
    x.write<double>("A", ad.a.data(), {static_cast<hsize_t>(ad.rank), static_cast<hsize_t>(ad.in)});
    x.write<double>("B", ad.b.data(),
                    {static_cast<hsize_t>(ad.out), static_cast<hsize_t>(ad.rank)});
  }
}

/// The JSON summary (timing: `wall_s`, `threads`, `backend`).
nlohmann::json recover_json(const RecoverArgs& a, const RecoverOutcome& out, const ModelInfo& smi,
                            const Config& sc, const ModelInfo& tmi, const Corpus& corpus,
                            double wall_s, int threads, const std::string& backend) {
  const RecoverOptions& o = a.ro;
  const RecoveryRecord& rr = out.rr;
  nlohmann::json j;
  j["student"] = {{"path", smi.path},
                  {"fingerprint", smi.fingerprint},
                  {"method", sc.prune.method},
                  {"retain", sc.prune.retain}};
  j["teacher"] = {{"path", tmi.path}, {"fingerprint", tmi.fingerprint}};
  j["output"] = {{"path", a.out}, {"fingerprint", out.omi.fingerprint}};
  j["corpus"] = {
      {"path", corpus.source}, {"fingerprint", corpus.fingerprint}, {"tokens", out.corpus_tokens}};
  j["settings"] = {{"steps", o.steps},
                   {"seq_len", o.seq_len},
                   {"batch", o.batch},
                   {"lora_rank", o.lora.rank},
                   {"lora_alpha", o.lora.alpha},
                   {"lora_dropout", o.lora.dropout},
                   {"targets", rr.targets},
                   {"kd_temperature", o.distill.temperature},
                   {"kd_weight", o.distill.weight},
                   {"kd_direction", rr.kd_direction},
                   {"lr", o.adam.lr},
                   {"schedule", rr.schedule},
                   {"warmup_steps", o.adam.warmup_steps},
                   {"weight_decay", o.adam.weight_decay},
                   {"max_grad_norm", o.adam.max_grad_norm},
                   {"seed", o.seed}};
  j["tokens"] = rr.tokens;
  j["trainable_parameters"] = out.st.m.size();
  j["loss_first"] = out.st.curve.front().loss;
  j["loss_last"] = out.st.curve.back().loss;
  j["loss"] = rr.loss;
  j["ce"] = rr.ce;
  j["kl"] = rr.kl;
  j["resumed_at_step"] = out.resumed_at;
  j["timing"] = {{"median_step_seconds", out.med_step},
                 {"teacher_seconds", out.mean_of(&StepRecord::teacher_seconds)},
                 {"forward_seconds", out.mean_of(&StepRecord::forward_seconds)},
                 {"backward_seconds", out.mean_of(&StepRecord::backward_seconds)},
                 {"update_seconds", out.mean_of(&StepRecord::update_seconds)},
                 {"forward_seconds_per_step_tokens", out.fwd_s},
                 {"step_over_forward", out.step_over_forward()},
                 {"tokens_per_second", out.tokens_per_second()},
                 {"wall_seconds", wall_s},
                 {"threads", threads},
                 {"backend", backend}};
  j["peak_rss_bytes"] = out.peak;
  j["merge_check_rel_error"] = out.merge_err;
  return j;
}

/// The lines on stdout.
std::string recover_text(const RecoverArgs& a, const RecoverOutcome& out, const ModelInfo& smi,
                         const ModelInfo& tmi, double wall_s) {
  const RecoverOptions& o = a.ro;
  const RecoveryState& st = out.st;
  return fmt::format(
      "recovered {} -> {}\n  teacher {} (fingerprint {})\n  {} steps of {} × {} tokens ({} "
      "tokens), LoRA rank {} on {}, T = {:g}, w = {:g}\n  loss {:.4f} -> {:.4f} (CE {:.4f} -> "
      "{:.4f}, KL {:.4f} -> {:.4f})\n  step {:.2f} s median ({:.0f} tokens/s: teacher {:.2f} s, "
      "forward {:.2f} s, backward {:.2f} s, update {:.2f} s); forward of the same tokens "
      "{:.2f} s, ratio {:.2f}\n  peak memory {:.0f} MiB, merged vs unmerged logits {:.2e}, "
      "output fingerprint {}\n  wall seconds {:.1f}{}\n",
      smi.path, a.out, tmi.path, tmi.fingerprint, o.steps, o.batch, o.seq_len, out.rr.tokens,
      o.lora.rank, out.rr.targets, o.distill.temperature, o.distill.weight, st.curve.front().loss,
      st.curve.back().loss, st.curve.front().ce, st.curve.back().ce, st.curve.front().kl,
      st.curve.back().kl, out.med_step, out.tokens_per_second(),
      out.mean_of(&StepRecord::teacher_seconds), out.mean_of(&StepRecord::forward_seconds),
      out.mean_of(&StepRecord::backward_seconds), out.mean_of(&StepRecord::update_seconds),
      out.fwd_s, out.step_over_forward(), static_cast<double>(out.peak) / (1 << 20), out.merge_err,
      out.omi.fingerprint, wall_s,
      out.resumed_at > 0 ? fmt::format(" (continued from step {})", out.resumed_at) : "");
}

/// Load, train, write and check the recovered model, report.
template <class E>
int run_recover(const RecoverArgs& a, const po::variables_map& vm, const ResolvedModel& student_m,
                const ResolvedModel& teacher_m, const std::string& ckpt_path, const Corpus& corpus,
                const Runtime& rt, E exec, int argc, char** argv) {
  const RecoverOptions& o = a.ro;
  Stopwatch wall;
  ModelInfo smi, tmi;
  std::shared_ptr<const Weights<E>> student = load_model<E>(student_m.path, LoadOptions{}, &smi);
  std::shared_ptr<const Weights<E>> teacher = load_model<E>(teacher_m.path, LoadOptions{}, &tmi);
  const Config& sc = student->cfg;
  try {
    check_teacher(sc, teacher->cfg, tmi.fingerprint);
  } catch (const Error& e) {
    fail("teacher {} cannot teach {}: {}", tmi.path, smi.path, e.what());
  }
  interruption_point("tokenize");
  const Tokenizer tok = tokenizer_for(student_m.path);
  const std::vector<int> stream = corpus_stream(corpus, tok);
  Recoverer<E> rec(student, o.distill.weight > 0 ? teacher : nullptr, stream, o, exec);
  log().info(
      "recover: {} adapters (rank {}, targets {}), {} trainable parameters; {} sequences "
      "of {} tokens in the training text ({} tokens)",
      rec.state().adapters.size(), o.lora.rank, a.targets, rec.state().m.size(), rec.sequences(),
      o.seq_len, stream.size());
  if (o.distill.weight == 0) teacher.reset();

  // The checkpoint of an interrupted run with the same settings.
  const std::string backend = resolve_backend(a.co.backend);
  const std::string settings =
      fmt::format(
          "sparsim = {}\nstudent.fingerprint = {}\nteacher.fingerprint = {}\n"
          "corpus.fingerprint = {}\ncorpus.tokens = {}\nbackend = {}\n",
          SPARSIM_VERSION, smi.fingerprint, tmi.fingerprint, corpus.fingerprint, stream.size(),
          backend) +
      option_settings(vm, kNotSettings);
  TrainingCheckpoint<E> ckpt(ckpt_path, settings, rec, o.steps);
  const int resumed_at = ckpt.resume();
  require(a.dump_gradients.empty() || resumed_at == 0,
          "--dump-gradients records the first step, but the checkpoint '{}' is past it", ckpt_path);
  train(a, rec, ckpt, resumed_at);
  const RecoveryState& st = rec.state();

  // The recovered model: adapters merged, checked against the unmerged student.
  interruption_point("write");
  RecoverOutcome out{st, recovery_record(o, st, rec.tokens_per_step(), smi, tmi, corpus), {}};
  write_recovered_gguf(student_m.path, st.adapters, o.lora.scale(), out.rr, a.out);
  interrupt::output_written(a.out);
  check_merged(a, rec, stream, exec, out);
  out.resumed_at = resumed_at;
  out.corpus_tokens = stream.size();
  out.sequences = rec.sequences();
  out.tokens_per_step = rec.tokens_per_step();
  std::vector<double> step_times;
  for (const StepRecord& r : st.curve)
    if (r.step > resumed_at) step_times.push_back(r.seconds);
  out.med_step = median_of(step_times);
  out.peak = peak_rss_bytes();

  if (!a.run.empty()) {
    io::RunFile rf(a.run);
    io::Group root = rf.root();
    write_run_header(root, argc, argv, backend, rt.threads(), smi, sc, DType::F32);
    if (sc.pruned() || sc.low_rank_kv()) write_prune_group(root, sc);
    io::Group tg = root.create_group("teacher");
    tg.set_attr("path", tmi.path);
    tg.set_attr("fingerprint", tmi.fingerprint);
    write_recovery_group(root, a, out, corpus, wall.seconds());
    rf.commit();
    interrupt::output_written(a.run);
  }
  if (!a.json.empty()) {
    nlohmann::json j =
        recover_json(a, out, smi, sc, tmi, corpus, wall.seconds(), rt.threads(), backend);
    j["command"] = command_line(argc, argv);
    io::write_file_atomically(a.json, io::json_file_text(j));
    interrupt::output_written(a.json);
  }
  ckpt.remove();
  std::cout << recover_text(a, out, smi, tmi, wall.seconds());
  return 0;
}

}  // namespace

int cmd_recover(int argc, char** argv) {
  RecoverArgs a;
  po::variables_map vm;
  if (!parse_recover(argc, argv, a, vm)) return 0;
  std::string ckpt_path;
  if (a.checkpoint == "auto")
    ckpt_path = a.out + ".ckpt";
  else if (a.checkpoint != "off")
    ckpt_path = a.checkpoint;
  require(a.checkpoint != "", "--checkpoint: give auto, off or a file name");
  if (options_checked(vm)) return 0;
  const ResolvedModel student_m = resolve_model(a.model), teacher_m = resolve_model(a.teacher);
  require(detect_model_format(student_m.path) == ModelFormat::Gguf,
          "recover: {} is not a GGUF model; the recovered model is written from the student's "
          "GGUF tensors and tokenizer",
          student_m.path);
  io::guard_run({{"--model", student_m.path},
                 {"--teacher", teacher_m.path},
                 {"--corpus", corpus_input_path(a.corpus)}},
                {{"--out", a.out},
                 {"--run", a.run},
                 {"--json", a.json},
                 {"--dump-gradients", a.dump_gradients},
                 {a.checkpoint == "auto" ? "the checkpoint (--checkpoint auto)" : "--checkpoint",
                  ckpt_path, false, true}});
  const Corpus corpus = load_corpus_arg(a.corpus, CorpusOptions{a.text_field});
  Runtime rt(a.co);
  return with_backend(a.co.backend, [&](auto exec) {
    return run_recover(a, vm, student_m, teacher_m, ckpt_path, corpus, rt, exec, argc, argv);
  });
}

}  // namespace sparsim::app
