#include "core/text_file.h"

#include <cstring>
#include <fstream>
#include <vector>

#include "flexcp/status.h"

namespace flexcp {

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(Status::kInvalidArgument, std::string(what) + " '" + path + "' cannot be read");
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  std::vector<char> chunk(kChunk);
  std::string text;
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(kChunk));
    const auto got = static_cast<std::size_t>(in.gcount());
    const char* nul = static_cast<const char*>(std::memchr(chunk.data(), '\0', got));
    if (nul != nullptr)
      throw Error(Status::kInvalidArgument,
                  std::string(what) + " '" + path + "' holds a NUL byte at offset " +
                      std::to_string(text.size() + static_cast<std::size_t>(nul - chunk.data())) +
                      ": not a text file");
    if (text.size() + got > kMaxTextFileBytes)
      throw Error(Status::kInvalidArgument, std::string(what) + " '" + path +
                                                "' is larger than 1 GiB, expected a text file of "
                                                "at most that size");
    text.append(chunk.data(), got);
  }
  if (in.bad())
    throw Error(Status::kInvalidArgument, std::string(what) + " '" + path + "': read error");
  return text;
}

}  // namespace flexcp
