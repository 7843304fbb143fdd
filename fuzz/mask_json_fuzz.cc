// libFuzzer target: the mask JSON reader with its validation (DESIGN §2). Any input either throws
// flexcp::Error or gives a valid mask whose JSON reads back as the same mask; nothing else (a
// crash, another exception, a sanitizer report) is allowed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "flexcp/mask.h"
#include "flexcp/status.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const flexcp::Mask mask = flexcp::Mask::from_json(text);
    const flexcp::Mask again = flexcp::Mask::from_json(mask.to_json());
    if (again.to_json() != mask.to_json() || again.area() != mask.area()) std::abort();
  } catch (const flexcp::Error&) {
  }
  return 0;
}
