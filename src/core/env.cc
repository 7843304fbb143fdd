#include "core/env.h"

#include <cstdlib>
#include <cstring>

#include "flexcp/env.h"
#include "flexcp/status.h"

namespace flexcp {

const std::vector<EnvVar>& env_vars() {
  static const std::vector<EnvVar> vars = {
      {"FLEXCP_COMM_TIMEOUT_S", "120",
       "Seconds a communication wait may last before it fails with a communication error"},
      {"FLEXCP_NCCL_LIB", "libnccl.so.2",
       "The NCCL library the nccl communicator loads (a name the loader finds, or a path)"},
      {"FLEXCP_SM90_BWD_ORDER", "auto",
       "The order of the CUDA backward's item units, read when a plan is made: auto (the plan's "
       "rule), kv-heads (kv head by kv head, busiest tile first in each) or across (busiest "
       "first across the kv heads too, where that is predicted to finish sooner; to measure one "
       "against the other)"},
      {"FLEXCP_SM90_BWD_UNITS", "auto",
       "How the CUDA backward cuts its work into units, read when a plan is made: auto (the "
       "plan's rule), items ((key tile, kv head) items, split where they are few) or heads "
       "(FLEXCP_SM90_BWD_UNIT_HEADS q heads of an item each, partials summed in turn; to "
       "measure one against the other)"},
      {"FLEXCP_SM90_BWD_UNIT_HEADS", "auto",
       "The q heads of one head unit of the CUDA backward, read when a plan is made: auto (the "
       "plan's: 2, or 4 where one head's walk is short), 1, 2, 4 or 8 (at most the group; to "
       "measure one against the other)"},
      {"FLEXCP_SM90_BWD_WALK", "auto",
       "How the CUDA backward's item units walk their q blocks, read when a plan is made: auto "
       "(the plan picks per unit), heads-outer or from-last (every item unit, and item units "
       "unless FLEXCP_SM90_BWD_UNITS asks for heads; to measure one against the other)"},
  };
  return vars;
}

std::string env_value(const char* name) {
  for (const EnvVar& v : env_vars())
    if (std::strcmp(v.name, name) == 0) {
      const char* set = std::getenv(name);
      return set && *set ? set : v.default_value;
    }
  throw Error(Status::kInternal, std::string("environment variable ") + name + " is not declared");
}

double env_double(const char* name) {
  const std::string value = env_value(name);
  char* end = nullptr;
  const double x = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || *end != '\0')
    throw Error(Status::kInvalidArgument,
                std::string(name) + " is '" + value + "', expected a number");
  return x;
}

std::vector<EnvVarInfo> environment_variables() {
  std::vector<EnvVarInfo> out;
  for (const EnvVar& v : env_vars())
    out.push_back({v.name, v.default_value, v.description, env_value(v.name)});
  return out;
}

}  // namespace flexcp
