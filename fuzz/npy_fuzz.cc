// libFuzzer target: the tool's .npy reader. Any file either throws flexcp::Error or reads as an
// array whose value count is its shape's product; nothing else is allowed.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "flexcp/status.h"
#include "npy.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The reader takes a path: the input goes to a file of this process's own.
  static const std::string path = "/tmp/flexcp-npy-fuzz-" + std::to_string(getpid()) + ".npy";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const flexcp::tools::NpyArray a = flexcp::tools::read_npy(path);
    std::size_t count = 1;
    for (std::int64_t d : a.shape) count *= static_cast<std::size_t>(d);
    if (count != a.data.size()) std::abort();
  } catch (const flexcp::Error&) {
  }
  return 0;
}
