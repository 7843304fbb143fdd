// Errors: every failure is a flexcp::Error carrying a Status code and a message that names the
// argument, the value and what was expected. The library never calls exit().
#pragma once

#include <stdexcept>
#include <string>

#include "flexcp/export.h"

namespace flexcp {

enum class Status {
  kSuccess = 0,
  kInvalidArgument,  // a value the caller passed is out of its domain
  kInvalidUsage,     // calls in the wrong order or combination
  kCudaError,        // the CUDA runtime reported an error
  kCommError,        // a communicator failed or timed out
  kNotCompiled,      // the requested kernel instantiation was pruned from this build
  kInternal,         // a broken invariant inside flexcp: a bug
};

// "invalid argument", "not compiled", ... One string per code.
FLEXCP_API const char* status_string(Status status);

class FLEXCP_API Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message);
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

// The library version, e.g. "0.1.0", and whether CUDA sources were compiled in.
FLEXCP_API const char* version();
FLEXCP_API bool built_with_cuda();

}  // namespace flexcp
