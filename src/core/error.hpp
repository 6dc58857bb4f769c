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

/// A setting out of its range, found where the setting is used: `key` identifies the quantity
/// (e.g. "token_filter.ratio"), the message names it as the library knows it ("Token
/// Filtering's skip ratio r must be in [0, 1), got 1.5"). A command line maps the key to its
/// option and says "--tf-ratio " + rest().
class OptionError : public Error {
 public:
  OptionError(std::string key, const std::string& name, std::string rest)
      : Error(join(name, rest)), key_(std::move(key)), rest_(std::move(rest)) {}
  /// "<head> <rest>", or "<head><rest>" when rest starts with ':' ("--ruler-lengths: …").
  static std::string join(const std::string& head, const std::string& rest) {
    return head + (rest.rfind(':', 0) == 0 ? "" : " ") + rest;
  }
  const std::string& key() const { return key_; }
  /// The message after the quantity's name.
  const std::string& rest() const { return rest_; }

 private:
  std::string key_, rest_;
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
