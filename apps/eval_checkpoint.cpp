#include "eval_checkpoint.hpp"

#include "io/hdf5.hpp"
#include "io/run_file.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <sstream>

namespace sparsim::app {

namespace {

constexpr const char* kFormat = "sparsim eval checkpoint";
constexpr std::int64_t kVersion = 1;

template <class T>
bool try_value(const boost::any& v, std::string& out) {
  if (const T* p = boost::any_cast<T>(&v)) {
    std::ostringstream ss;
    ss.precision(17);
    ss << *p;
    out = ss.str();
    return true;
  }
  return false;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string l;
  while (std::getline(ss, l)) out.push_back(l);
  return out;
}

/// The settings lines of `a` that differ from `b`, as "name: X there, Y here".
std::string differences(const std::string& there, const std::string& here) {
  std::map<std::string, std::string> a, b;
  auto split = [](const std::string& s, std::map<std::string, std::string>& m) {
    for (const auto& l : lines(s)) {
      const std::size_t eq = l.find(" = ");
      if (eq != std::string::npos) m[l.substr(0, eq)] = l.substr(eq + 3);
    }
  };
  split(there, a);
  split(here, b);
  std::string d;
  int shown = 0, more = 0;
  auto add = [&](const std::string& k, const std::string& x, const std::string& y) {
    if (shown == 4) {
      ++more;
      return;
    }
    d += fmt::format("{}{} {} there, {} here", d.empty() ? "" : "; ", k, x, y);
    ++shown;
  };
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end())
      add(k, v, "(unset)");
    else if (it->second != v)
      add(k, v, it->second);
  }
  for (const auto& [k, v] : b)
    if (!a.count(k)) add(k, "(unset)", v);
  if (more) d += fmt::format("; and {} more", more);
  return d.empty() ? "the settings were recorded differently" : d;
}

constexpr flops::Phase kPhases[] = {flops::Phase::Prefill, flops::Phase::Decode};

}  // namespace

std::string option_settings(const po::variables_map& vm, const std::set<std::string>& ignore) {
  std::string out;
  for (const auto& [name, val] : vm) {
    if (ignore.count(name)) continue;
    const boost::any& v = val.value();
    std::string s;
    if (v.empty())
      s = "(empty)";
    else if (!(try_value<std::string>(v, s) || try_value<int>(v, s) || try_value<double>(v, s) ||
               try_value<float>(v, s) || try_value<bool>(v, s) || try_value<long>(v, s) ||
               try_value<unsigned>(v, s) || try_value<std::uint64_t>(v, s)))
      fail("internal: option --{} has a value type the checkpoint settings do not know", name);
    out += name + " = " + s + "\n";
  }
  return out;
}

std::string settings_differences(const std::string& there, const std::string& here) {
  return differences(there, here);
}

std::string file_stamp(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return "absent";
  return fmt::format("{} bytes, modified {}.{:09}", static_cast<long long>(st.st_size),
                     static_cast<long long>(st.st_mtim.tv_sec),
                     static_cast<long long>(st.st_mtim.tv_nsec));
}

EvalCheckpoint::EvalCheckpoint(std::string path, std::string settings)
    : path_(std::move(path)), settings_(std::move(settings)) {}

bool EvalCheckpoint::read(EvalProgress& into, int n_layer) const {
  if (::access(path_.c_str(), F_OK) != 0) return false;
  io::H5File f = io::H5File::open_read(path_);
  io::Group root = f.root();
  require(root.has_attr("format") && root.get_attr<std::string>("format") == kFormat,
          "'{}' is not an eval checkpoint", path_);
  require(root.get_attr<std::int64_t>("version") == kVersion,
          "checkpoint '{}' has format version {}, this sparsim reads {}", path_,
          root.get_attr<std::int64_t>("version"), kVersion);
  const std::string there = root.get_attr<std::string>("settings");
  if (there != settings_)
    throw UsageError(fmt::format(
        "checkpoint '{}' was written by a run with other settings ({}); delete it to start "
        "afresh, or give this run another --checkpoint",
        path_, differences(there, settings_)));

  PplResult& r = into.ppl;
  io::Group w = root.open_group("windows");
  r.window_nll = w.read<double>("window_nll");
  r.window_tokens = w.read<std::uint64_t>("window_tokens");
  r.window_start = w.read<std::uint64_t>("window_start");
  r.nll_sum = w.get_attr<double>("nll_sum");
  r.tokens_scored = static_cast<std::uint64_t>(w.get_attr<std::int64_t>("tokens_scored"));
  r.argmax_hits = static_cast<std::uint64_t>(w.get_attr<std::int64_t>("argmax_hits"));
  require(
      r.window_tokens.size() == r.window_nll.size() && r.window_start.size() == r.window_nll.size(),
      "checkpoint '{}': the window datasets differ in length", path_);

  io::Group lg = root.open_group("ledger");
  const auto fd = lg.read<double>("flops_dense"), fr = lg.read<double>("flops_realised"),
             bd = lg.read<double>("bytes_dense"), br = lg.read<double>("bytes_realised");
  const auto ln = lg.read<std::uint64_t>("launches");
  const auto kn = lg.has("kernels") ? lg.read<std::uint64_t>("kernels") : ln;
  const std::size_t cells = static_cast<std::size_t>(n_layer + 1) * 2 * flops::kNumOps;
  require(fd.size() == cells && fr.size() == cells && bd.size() == cells && br.size() == cells &&
              ln.size() == cells && kn.size() == cells,
          "checkpoint '{}': the FLOP ledger does not match a model of {} layers", path_, n_layer);
  into.ledger = flops::Ledger(n_layer);
  std::size_t i = 0;
  for (int l = -1; l < n_layer; ++l)
    for (flops::Phase ph : kPhases)
      for (int o = 0; o < flops::kNumOps; ++o, ++i) {
        flops::Ledger::Totals t;
        t.flops_dense = fd[i];
        t.flops_realised = fr[i];
        t.bytes_dense = bd[i];
        t.bytes_realised = br[i];
        t.launches = ln[i];
        t.kernels = kn[i];
        into.ledger.set(ph, static_cast<flops::Op>(o), l, t);
      }
  if (lg.has("calls")) {  // forward calls and token rows per phase
    const auto calls = lg.read<std::int64_t>("calls"), toks = lg.read<std::int64_t>("tokens");
    require(calls.size() == 2 && toks.size() == 2, "checkpoint '{}': bad ledger call counts",
            path_);
    for (std::size_t p = 0; p < 2; ++p) into.ledger.set_calls(kPhases[p], calls[p], toks[p]);
  }

  into.masker.reset();
  if (root.has_group("masker")) {
    io::Group mg = root.open_group("masker");
    const auto tokens = mg.read<std::uint64_t>("tokens"), kept = mg.read<std::uint64_t>("kept"),
               total = mg.read<std::uint64_t>("total"), hist = mg.read<std::uint64_t>("hist");
    const auto sum = mg.read<double>("sum"), mn = mg.read<double>("min"),
               mx = mg.read<double>("max");
    const std::size_t n = static_cast<std::size_t>(n_layer) * kNumProj;
    constexpr std::size_t B = sparsity::ProjStats::kBins;
    require(tokens.size() == n && kept.size() == n && total.size() == n && sum.size() == n &&
                mn.size() == n && mx.size() == n && hist.size() == n * B,
            "checkpoint '{}': the masker statistics do not match a model of {} layers", path_,
            n_layer);
    sparsity::MaskerStats ms;
    ms.stats.resize(static_cast<std::size_t>(n_layer));
    for (std::size_t k = 0; k < n; ++k) {
      sparsity::ProjStats& s = ms.stats[k / kNumProj][k % kNumProj];
      s.tokens = tokens[k];
      s.kept = kept[k];
      s.total = total[k];
      s.sum = sum[k];
      s.min = mn[k];
      s.max = mx[k];
      std::copy(hist.begin() + static_cast<std::ptrdiff_t>(k * B),
                hist.begin() + static_cast<std::ptrdiff_t>((k + 1) * B), s.hist.begin());
    }
    ms.token_sparsity = mg.read<double>("token_sparsity");
    into.masker = std::move(ms);
  }
  return true;
}

void EvalCheckpoint::write(const EvalProgress& p) const {
  io::RunFile rf(path_);
  io::Group root = rf.root();
  root.set_attr("format", kFormat);
  root.set_attr("version", kVersion);
  root.set_attr("settings", settings_);
  root.set_attr("sparsim_version", SPARSIM_VERSION);

  io::Group w = root.create_group("windows");
  w.set_attr("nll_sum", p.ppl.nll_sum);
  w.set_attr("tokens_scored", static_cast<std::int64_t>(p.ppl.tokens_scored));
  w.set_attr("argmax_hits", static_cast<std::int64_t>(p.ppl.argmax_hits));
  w.write<double>("window_nll", p.ppl.window_nll, {"nat", "summed NLL of the scored tokens"});
  w.write<std::uint64_t>("window_tokens", p.ppl.window_tokens, {"token", "tokens scored"});
  w.write<std::uint64_t>("window_start", p.ppl.window_start,
                         {"token", "window start offset in the corpus token stream"});

  const int L = p.ledger.num_layers();
  std::vector<double> fd, fr, bd, br;
  std::vector<std::uint64_t> ln, kn;
  for (int l = -1; l < L; ++l)
    for (flops::Phase ph : kPhases)
      for (int o = 0; o < flops::kNumOps; ++o) {
        const auto t = p.ledger.at(ph, static_cast<flops::Op>(o), l);
        fd.push_back(t.flops_dense);
        fr.push_back(t.flops_realised);
        bd.push_back(t.bytes_dense);
        br.push_back(t.bytes_realised);
        ln.push_back(t.launches);
        kn.push_back(t.kernels);
      }
  io::Group lg = root.create_group("ledger");
  lg.set_attr("layout", "[layer + 1][phase][op], phases prefill, decode");
  lg.write<double>("flops_dense", fd);
  lg.write<double>("flops_realised", fr);
  lg.write<double>("bytes_dense", bd);
  lg.write<double>("bytes_realised", br);
  lg.write<std::uint64_t>("launches", ln);
  lg.write<std::uint64_t>("kernels", kn);
  std::vector<std::int64_t> calls, toks;
  for (flops::Phase ph : kPhases) {
    calls.push_back(p.ledger.calls(ph));
    toks.push_back(p.ledger.tokens(ph));
  }
  lg.write<std::int64_t>("calls", calls);
  lg.write<std::int64_t>("tokens", toks);

  if (p.masker) {
    std::vector<std::uint64_t> tokens, kept, total, hist;
    std::vector<double> sum, mn, mx;
    for (const auto& layer : p.masker->stats)
      for (const sparsity::ProjStats& s : layer) {
        tokens.push_back(s.tokens);
        kept.push_back(s.kept);
        total.push_back(s.total);
        sum.push_back(s.sum);
        mn.push_back(s.min);
        mx.push_back(s.max);
        hist.insert(hist.end(), s.hist.begin(), s.hist.end());
      }
    io::Group mg = root.create_group("masker");
    mg.write<std::uint64_t>("tokens", tokens);
    mg.write<std::uint64_t>("kept", kept);
    mg.write<std::uint64_t>("total", total);
    mg.write<std::uint64_t>("hist", hist);
    mg.write<double>("sum", sum);
    mg.write<double>("min", mn);
    mg.write<double>("max", mx);
    mg.write<double>("token_sparsity", p.masker->token_sparsity);
  }
  rf.commit();
}

void EvalCheckpoint::remove() const {
  ::unlink(path_.c_str());
}

}  // namespace sparsim::app
