// Scoped environment variables for tests: the library reads its A/B overrides (FA4_BWD_*, FA4_FWD_*) at every
// call, so a test sets one for a scope and the previous value (or its absence) comes back after.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace fa4::testing {

// Sets an environment variable for a scope, or unsets it (value null), then restores it.
class EnvOverride {
 public:
  EnvOverride(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~EnvOverride() {
    if (saved_)
      setenv(name_, saved_->c_str(), 1);
    else
      unsetenv(name_);
  }
  EnvOverride(const EnvOverride&) = delete;
  EnvOverride& operator=(const EnvOverride&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

}  // namespace fa4::testing
