#pragma once
/// Errors: exceptions inside the library, a clear message and a non-zero exit at the edges.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

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
