// flexcp mask: draws a mask as SVG, each cell shaded by the share of its pairs that are attended.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>

#include "cli_options.h"
#include "commands.h"
#include "flexcp/flexcp.h"

namespace flexcp::tools {
namespace {

struct DrawArgs {
  MaskArgs mask;
  PlanOptions plan = [] {
    PlanOptions o;
    o.world_size = 0;  // world_size > 0: colour by owning rank
    return o;
  }();
  std::string out;
  int cells = 512;
};

constexpr int kShades = 16;  // density levels; equal neighbours merge into one rectangle
constexpr std::int64_t kPicturePixels = 1024;  // cells grow to fill about this many pixels
constexpr int kMargin = 40;

void draw(const DrawArgs& a) {
  auto ends_with = [&](const char* ext) {
    const std::string e(ext);
    return a.out.size() > e.size() && a.out.compare(a.out.size() - e.size(), e.size(), e) == 0;
  };
  if (!ends_with(".svg") && !ends_with(".json"))
    throw Error(Status::kInvalidArgument,
                "flexcp mask: --out " + a.out + ": expected a .svg picture or a .json mask spec");
  const Mask mask = build_mask(a.mask);
  if (ends_with(".json")) {  // the generator's output as DESIGN §2's spec, for other tools
    mask.write_json_file(a.out);
    std::cout << "wrote " << a.out << ": " << mask.slices().size() << " slices\n";
    return;
  }
  const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k();
  if (tq == 0 || tk == 0)
    throw Error(Status::kInvalidArgument, "flexcp mask: the mask is " + std::to_string(tq) + " x " +
                                              std::to_string(tk) +
                                              " tokens: there is nothing to draw");
  // Cell edge in tokens: the longer side gets at most `cells` cells.
  const std::int64_t step = std::max<std::int64_t>(1, (std::max(tq, tk) + a.cells - 1) / a.cells);
  const std::int64_t rows = (tq + step - 1) / step, cols = (tk + step - 1) / step;
  std::vector<std::int64_t> area(static_cast<std::size_t>(rows * cols), 0);
  // With --world: the rank owning each cell's queries, and whether its K/V lives elsewhere.
  std::vector<int> q_rank, kv_rank;
  if (a.plan.world_size > 0) {
    const Dispatch d = make_dispatch(mask, a.plan);
    q_rank.assign(rows, 0);
    kv_rank.assign(cols, 0);
    const std::vector<int> owner = d.global_to_rank_q();
    for (std::int64_t r = 0; r < rows; ++r) q_rank[r] = owner[r * step];
    for (std::size_t i = 0; i < d.kv_chunks.size(); ++i)
      for (std::int64_t c = (d.kv_chunks[i].begin + step - 1) / step; c * step < d.kv_chunks[i].end;
           ++c)
        kv_rank[c] = d.kv_owner[i];
  }
  const bool by_rank = !q_rank.empty();
  const std::int64_t kCellPixels = std::max<std::int64_t>(1, kPicturePixels / std::max(rows, cols));
  // Each slice visits only the cells of its bounding box.
  for (const Slice& s : mask.slices()) {
    if (s.q.empty() || s.k.empty()) continue;
    for (std::int64_t r = s.q.begin / step; r <= (s.q.end - 1) / step; ++r)
      for (std::int64_t c = s.k.begin / step; c <= (s.k.end - 1) / step; ++c)
        area[r * cols + c] += slice_area(s, {r * step, std::min(tq, (r + 1) * step)},
                                         {c * step, std::min(tk, (c + 1) * step)});
  }
  std::ofstream out(a.out);
  const std::int64_t width = std::max<std::int64_t>(cols * kCellPixels + 2 * kMargin, 720),
                     height = rows * kCellPixels + 2 * kMargin;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kMargin << "\" y=\"" << kMargin - 22 << "\">k: 0 .. " << tk
      << " (columns)   area " << mask.area() << " of " << tq * tk << " pairs, "
      << mask.slices().size() << " slices"
      << (by_rank ? "; colour: rank owning the queries (" + std::to_string(a.plan.world_size) +
                        " ranks), hatched: K/V received from another rank"
                  : std::string())
      << "</text>\n"
      << "<text x=\"" << kMargin - 6 << "\" y=\"" << kMargin
      << "\" text-anchor=\"end\" transform=\"rotate(-90 " << kMargin - 6 << " " << kMargin
      << ")\">q: 0 .. " << tq << "</text>\n"
      << "<defs><pattern id=\"moved\" width=\"4\" height=\"4\" patternUnits=\"userSpaceOnUse\">"
      << "<path d=\"M0,4 L4,0\" stroke=\"black\" stroke-opacity=\"0.5\" "
         "stroke-width=\"1\"/></pattern></defs>\n"
      << "<g transform=\"translate(" << kMargin << " " << kMargin << ")\">\n"
      << "<rect width=\"" << cols * kCellPixels << "\" height=\"" << rows * kCellPixels
      << "\" fill=\"none\" stroke=\"#888\"/>\n";
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t cell_rows = std::min(tq, (r + 1) * step) - r * step;
    std::int64_t c = 0;
    while (c < cols) {
      auto shade = [&](std::int64_t col) {
        const std::int64_t cell = cell_rows * (std::min(tk, (col + 1) * step) - col * step);
        const std::int64_t pairs = area[r * cols + col];
        return pairs == 0 ? 0 : 1 + static_cast<int>((kShades - 1) * pairs / cell);
      };
      // Runs of equal shade (and, by rank, equal moved-ness) become one rectangle.
      auto moved = [&](std::int64_t col) { return by_rank && kv_rank[col] != q_rank[r]; };
      const int level = shade(c);
      std::int64_t end = c + 1;
      while (end < cols && shade(end) == level && moved(end) == moved(c)) ++end;
      if (level > 0) {
        const std::string colour =
            by_rank ? "hsl(" + std::to_string(q_rank[r] * 360 / std::max(1, a.plan.world_size)) +
                          ",70%,45%)"
                    : std::string("#1f4e9c");
        const std::string geometry = "x=\"" + std::to_string(c * kCellPixels) + "\" y=\"" +
                                     std::to_string(r * kCellPixels) + "\" width=\"" +
                                     std::to_string((end - c) * kCellPixels) + "\" height=\"" +
                                     std::to_string(kCellPixels) + "\"";
        out << "<rect " << geometry << " fill=\"" << colour << "\" fill-opacity=\""
            << static_cast<double>(level) / kShades << "\"/>\n";
        if (moved(c)) out << "<rect " << geometry << " fill=\"url(#moved)\"/>\n";
      }
      c = end;
    }
  }
  out << "</g>\n</svg>\n";
  if (!out) throw Error(Status::kInvalidArgument, "flexcp mask: cannot write " + a.out);
  std::cout << "wrote " << a.out << ": " << rows << " x " << cols << " cells of " << step
            << " tokens\n";
}

}  // namespace

void add_mask_command(CLI::App& app) {
  auto args = std::make_shared<DrawArgs>();
  CLI::App* cmd = app.add_subcommand("mask", "Draw a mask (SVG) or write its JSON spec");
  add_mask_options(*cmd, args->mask);
  cmd->add_option("--out", args->out, "Output file: .svg (picture) or .json (mask spec)")
      ->required();
  cmd->add_option("--world", args->plan.world_size,
                  "Colour by the rank owning each part (flexcp's plan)")
      ->check(whole_number(1));
  cmd->add_option("--chunk", args->plan.chunk_size, "Chunk size for --world (default: automatic)");
  cmd->add_option("--cells", args->cells, "Cells along the longer side")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->callback([args] { draw(*args); });
}

}  // namespace flexcp::tools
