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
// A float32 array's header is under a kilobyte; a length past this is a damaged file, not one to
// allocate for.
constexpr std::size_t kMaxHeader = std::size_t{1} << 20;
// No dimension of the tensors the tool reads (tokens, heads, head dim) passes this.
constexpr std::int64_t kMaxDim = std::int64_t{1} << 31;

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
  if (!in) fail(path, "header is truncated");
  if (header_len > kMaxHeader)
    fail(path, "header length is " + std::to_string(header_len) + " bytes, expected at most " +
                   std::to_string(kMaxHeader) + " (a damaged file?)");
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
  const std::string shape = "(" + m[1].str() + ")";
  std::stringstream dims(m[1].str());
  std::string item;
  std::int64_t count = 1;
  while (std::getline(dims, item, ',')) {
    const auto first = item.find_first_not_of(' '), last = item.find_last_not_of(' ');
    if (first == std::string::npos) continue;  // the empty item after a trailing comma: (6,)
    const std::string digits = item.substr(first, last - first + 1);
    // Whole decimal numbers only: (6x,4,16) is not (6,4,16), and (-64,4,16) is not a shape.
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 10 ||
        std::stoll(digits) > kMaxDim)
      fail(path, "shape " + shape + " has the dimension '" + digits +
                     "', expected whole numbers from 0 to " + std::to_string(kMaxDim));
    a.shape.push_back(std::stoll(digits));
    // Checked against the file's size below, before anything is allocated; here only kept from
    // overflowing (a value count past 2^60 cannot be a file's anyway).
    constexpr std::int64_t kMaxCount = std::int64_t{1} << 60;
    if (a.shape.back() > 0 && count > kMaxCount / a.shape.back())
      fail(path, "shape " + shape +
                     " is more than 2^60 values, expected an array that fits in a "
                     "file");
    count *= a.shape.back();
  }
  const std::streamoff data_begin = in.tellg();
  in.seekg(0, std::ios::end);
  const std::streamoff data_bytes = in.tellg() - data_begin;
  in.seekg(data_begin);
  if (count * static_cast<std::int64_t>(sizeof(float)) != static_cast<std::int64_t>(data_bytes))
    fail(path, "shape " + shape + " is " + std::to_string(count) + " float32 values (" +
                   std::to_string(count * static_cast<std::int64_t>(sizeof(float))) +
                   " bytes), but the file holds " + std::to_string(data_bytes) + " bytes of data");
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
