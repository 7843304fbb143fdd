// Environment variables flexcp reads: declared once here (name, default, description), read
// lazily, listed by `flexcp env`.
#pragma once

#include <string>
#include <vector>

namespace flexcp {

struct EnvVar {
  const char* name;
  const char* default_value;
  const char* description;
};

const std::vector<EnvVar>& env_vars();
// The variable's value, or its declared default; throws Error(kInternal) for an undeclared name.
std::string env_value(const char* name);
double env_double(const char* name);

}  // namespace flexcp
