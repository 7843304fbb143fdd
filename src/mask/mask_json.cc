// DESIGN §2's mask spec: {"version": 1, "seqlen_q": .., "seqlen_k": .., "slices": [...]}.
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/text_file.h"
#include "flexcp/mask.h"
#include "flexcp/status.h"

namespace flexcp {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& message) {
  throw Error(Status::kInvalidArgument, "mask spec: " + message);
}

void expect_keys(const json& object, std::initializer_list<const char*> allowed,
                 const std::string& where) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool known = false;
    for (const char* key : allowed) known = known || it.key() == key;
    if (!known) fail(where + "unknown key \"" + it.key() + "\"");
  }
  for (const char* key : allowed)
    if (!object.contains(key)) fail(where + "missing key \"" + key + "\"");
}

// Parses `text`, refusing a key repeated within one object (the JSON reader would keep the last
// silently, so {"seqlen_q": 8, "seqlen_q": 4} would mean 4).
json parse_without_duplicate_keys(const std::string& text) {
  std::vector<std::set<std::string>> open;  // the keys seen in each enclosing object
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) open.emplace_back();
    if (event == json::parse_event_t::object_end) open.pop_back();
    if (event == json::parse_event_t::key && !open.back().insert(parsed.get<std::string>()).second)
      fail("duplicate key \"" + parsed.get<std::string>() + "\" (in an object at depth " +
           std::to_string(depth) + "), expected each key once");
    return true;
  };
  return json::parse(text, check);
}

std::int64_t get_int(const json& value, const std::string& what) {
  if (!value.is_number_integer()) fail(what + " is " + value.dump() + ", expected an integer");
  // Read as the JSON wrote it: an unsigned integer above int64's range must not wrap to a
  // negative one, and nothing past the length limit can be a token index.
  if (value.is_number_unsigned() && value.get<std::uint64_t>() > std::uint64_t(kMaxSeqlen))
    fail(what + " is " + value.dump() + ", expected at most " + std::to_string(kMaxSeqlen) +
         " (kMaxSeqlen)");
  return value.get<std::int64_t>();
}

Range get_range(const json& value, const std::string& what) {
  if (!value.is_array() || value.size() != 2)
    fail(what + " is " + value.dump() + ", expected [begin, end]");
  return {get_int(value[0], what + "[0]"), get_int(value[1], what + "[1]")};
}

}  // namespace

std::string Mask::to_json() const {
  json slices = json::array();
  for (const Slice& s : slices_)
    slices.push_back({{"q", {s.q.begin, s.q.end}},
                      {"k", {s.k.begin, s.k.end}},
                      {"type", mask_type_name(s.type)}});
  json spec = {
      {"version", 1}, {"seqlen_q", seqlen_q_}, {"seqlen_k", seqlen_k_}, {"slices", slices}};
  return spec.dump();
}

Mask Mask::from_json(const std::string& text) {
  json spec;
  try {
    spec = parse_without_duplicate_keys(text);
  } catch (const json::exception& e) {
    // Syntax errors, and numbers the reader cannot hold (found by fuzz/mask_json_fuzz.cc: a
    // number past a double's range threw out_of_range, which ended the process).
    fail(std::string("not valid JSON: ") + e.what());
  }
  if (!spec.is_object())
    fail("top level is " + std::string(spec.type_name()) + ", expected an object");
  expect_keys(spec, {"version", "seqlen_q", "seqlen_k", "slices"}, "");
  const std::int64_t version = get_int(spec["version"], "version");
  if (version != 1) fail("version is " + std::to_string(version) + ", expected 1");
  const std::int64_t seqlen_q = get_int(spec["seqlen_q"], "seqlen_q");
  const std::int64_t seqlen_k = get_int(spec["seqlen_k"], "seqlen_k");
  const json& list = spec["slices"];
  if (!list.is_array()) fail("slices is " + std::string(list.type_name()) + ", expected an array");
  std::vector<Slice> slices;
  slices.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string where = "slice " + std::to_string(i) + ": ";
    const json& item = list[i];
    if (!item.is_object()) fail(where + "is " + item.dump() + ", expected an object");
    expect_keys(item, {"q", "k", "type"}, where);
    if (!item["type"].is_string())
      fail(where + "type is " + item["type"].dump() + ", expected a string");
    Slice s;
    s.q = get_range(item["q"], where + "q");
    s.k = get_range(item["k"], where + "k");
    try {
      s.type = parse_mask_type(item["type"].get<std::string>());
    } catch (const Error& e) {
      fail(where + e.what());
    }
    slices.push_back(s);
  }
  try {
    return Mask(seqlen_q, seqlen_k, std::move(slices));
  } catch (const Error& e) {
    fail(e.what());
  }
}

Mask Mask::from_json_file(const std::string& path) {
  const std::string text = read_text_file(path, "mask file");
  try {
    return from_json(text);
  } catch (const Error& e) {
    throw Error(e.status(), path + ": " + e.what());
  }
}

void Mask::write_json_file(const std::string& path) const {
  std::ofstream out(path);
  out << to_json() << "\n";
  if (!out) throw Error(Status::kInvalidArgument, "mask file '" + path + "' cannot be written");
}

}  // namespace flexcp
