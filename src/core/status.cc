#include "flexcp/status.h"

#include "flexcp/version.h"

namespace flexcp {

const char* status_string(Status status) {
  switch (status) {
    case Status::kSuccess:
      return "success";
    case Status::kInvalidArgument:
      return "invalid argument";
    case Status::kInvalidUsage:
      return "invalid usage";
    case Status::kCudaError:
      return "CUDA error";
    case Status::kCommError:
      return "communication error";
    case Status::kNotCompiled:
      return "not compiled";
    case Status::kInternal:
      return "internal error";
  }
  return "unknown status";
}

Error::Error(Status status, const std::string& message)
    : std::runtime_error(message), status_(status) {}

const char* version() {
  return FLEXCP_VERSION_STRING;
}
bool built_with_cuda() {
  return FLEXCP_WITH_CUDA;
}

}  // namespace flexcp
