#pragma once
/// Errors: exceptions inside the library, a clear message and a non-zero exit at the edges.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace sparsim {

/// Anything a user or a file got wrong: the message names the key, tensor, offset or option.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A command line that cannot work as given (e.g. an output that would overwrite an input), found
/// before any work started: the command exits with status 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

/// Another setting whose value would make an OptionError's setting work: `key` identifies it,
/// `name` is what the library calls it, `value` the value to give it.
struct SettingFix {
  std::string key, name, value;
};

/// A setting out of its range, found where the setting is used: `key` identifies the quantity
/// (e.g. "token_filter.ratio"), the message names it as the library knows it ("Token
/// Filtering's skip ratio r must be in [0, 1), got 1.5"). A command line maps the key to its
/// option and says "--tf-ratio " + rest(), and a fix's key to its option too. `usage`: the
/// setting cannot work on this command line at all (exit status 2, as a UsageError).
class OptionError : public Error {
 public:
  OptionError(std::string key, const std::string& name, std::string rest, bool usage = false,
              SettingFix fix = {})
      : Error(join(name, rest) + fix_text(fix.name, fix)),
        key_(std::move(key)),
        rest_(std::move(rest)),
        usage_(usage),
        fix_(std::move(fix)) {}
  /// "<head> <rest>", or "<head><rest>" when rest starts with ':' ("--ruler-lengths: …").
  static std::string join(const std::string& head, const std::string& rest) {
    return head + (rest.rfind(':', 0) == 0 ? "" : " ") + rest;
  }
  /// " (<setting> <value>)" for a fix whose setting is called `setting`; "" without a fix.
  static std::string fix_text(const std::string& setting, const SettingFix& fix) {
    return fix.key.empty() ? "" : " (" + setting + " " + fix.value + ")";
  }
  const std::string& key() const { return key_; }
  /// The message after the quantity's name (without the fix).
  const std::string& rest() const { return rest_; }
  bool usage() const { return usage_; }
  const SettingFix& fix() const { return fix_; }

 private:
  std::string key_, rest_;
  bool usage_;
  SettingFix fix_;
};

/// Throws OptionError for the quantity `key` (called `name`) unless `cond` holds; `f`: the
/// message after the name.
template <class... Args>
void require_setting(bool cond, const char* key, const char* name, fmt::format_string<Args...> f,
                     Args&&... args) {
  if (!cond) throw OptionError(key, name, fmt::format(f, std::forward<Args>(args)...));
}

/// Throws sparsim::Error with a fmt-formatted message.
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

/// Throws sparsim::Error unless `cond` holds.
template <class... Args>
void require(bool cond, fmt::format_string<Args...> f, Args&&... args) {
  if (!cond) throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace sparsim
