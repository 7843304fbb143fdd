// Reading the text files users name (a mask spec, document lengths) whole, refusing what cannot be
// one before it is read to the end: more than kMaxTextFileBytes, or a NUL byte (a binary file, or
// a device such as /dev/zero that would never end).
#pragma once

#include <cstddef>
#include <string>

namespace flexcp {

inline constexpr std::size_t kMaxTextFileBytes = std::size_t{1} << 30;  // 1 GiB

// The file's contents. `what` names it in errors ("mask file", "document lengths file"); every
// error is Error(kInvalidArgument) naming the path.
std::string read_text_file(const std::string& path, const char* what);

}  // namespace flexcp
