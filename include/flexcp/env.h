// The environment variables flexcp reads (declared once, read lazily); `flexcp env` lists them.
#pragma once

#include <string>
#include <vector>

#include "flexcp/export.h"

namespace flexcp {

struct EnvVarInfo {
  std::string name;
  std::string default_value;
  std::string description;
  std::string value;  // what flexcp would use now: the set value or the default
};

FLEXCP_API std::vector<EnvVarInfo> environment_variables();

}  // namespace flexcp
