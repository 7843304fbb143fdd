#include "npy.h"

#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include "flexcp/status.h"

namespace flexcp::tools {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;
constexpr std::size_t kAlign = 64;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(Status::kInvalidArgument, path + ": " + what);
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot be read");
  char magic[kMagicLen + 2];
  if (!in.read(magic, sizeof magic) || std::memcmp(magic, kMagic, kMagicLen) != 0)
    fail(path, "is not a .npy file");
  std::size_t header_len = 0;
  if (magic[kMagicLen] == 1) {
    unsigned char len[2];
    in.read(reinterpret_cast<char*>(len), 2);
    header_len = len[0] | (len[1] << 8);
  } else {
    unsigned char len[4];
    in.read(reinterpret_cast<char*>(len), 4);
    header_len = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<std::size_t>(len[3]) << 24);
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len)))
    fail(path, "header is truncated");
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'")) || m[1] != "<f4")
    fail(path, "dtype is " + (m.size() > 1 ? m[1].str() : std::string("unknown")) +
                   ", expected float32 ('<f4')");
  if (!std::regex_search(header, std::regex("'fortran_order':\\s*False")))
    fail(path, "is in Fortran order, expected C order");
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    fail(path, "has no shape");
  NpyArray a;
  std::stringstream dims(m[1].str());
  std::string item;
  std::int64_t count = 1;
  while (std::getline(dims, item, ',')) {
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    a.shape.push_back(std::stoll(item));
    count *= a.shape.back();
  }
  a.data.resize(static_cast<std::size_t>(count));
  if (!in.read(reinterpret_cast<char*>(a.data.data()),
               static_cast<std::streamsize>(count * sizeof(float))))
    fail(path, "holds fewer values than its shape says");
  return a;
}

void write_npy(const std::string& path, const std::vector<std::int64_t>& shape, const float* data) {
  std::string dims;
  std::int64_t count = 1;
  for (std::int64_t s : shape) dims += std::to_string(s) + ", ", count *= s;
  if (shape.size() > 1) dims.resize(dims.size() - 1);  // (a, b) but (a,)
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const std::size_t total = kMagicLen + 2 + 2 + header.size() + 1;
  header.append((kAlign - total % kAlign) % kAlign, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write(kMagic, kMagicLen);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                static_cast<unsigned char>(header.size() >> 8)};
  out.write(reinterpret_cast<const char*>(len), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(data),
            static_cast<std::streamsize>(count * sizeof(float)));
  if (!out) throw Error(Status::kInvalidArgument, path + ": cannot be written");
}

}  // namespace flexcp::tools
