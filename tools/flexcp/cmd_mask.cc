// flexcp mask: draws a mask as SVG, each cell shaded by the share of its pairs that are attended.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "flexcp/flexcp.h"
#include "mask_args.h"

namespace flexcp::tools {
namespace {

struct DrawArgs {
  MaskArgs mask;
  std::string out;
  int cells = 512;
};

constexpr int kShades = 16;  // density levels; equal neighbours merge into one rectangle
constexpr int kCellPixels = 1;
constexpr int kMargin = 40;

void draw(const DrawArgs& a) {
  const bool svg = a.out.size() > 4 && a.out.substr(a.out.size() - 4) == ".svg";
  if (!svg)
    throw Error(Status::kInvalidArgument,
                "flexcp mask: --out " + a.out + ": only .svg output is supported");
  const Mask mask = build_mask(a.mask);
  const std::int64_t tq = mask.seqlen_q(), tk = mask.seqlen_k();
  // Cell edge in tokens: the longer side gets at most `cells` cells.
  const std::int64_t step = std::max<std::int64_t>(1, (std::max(tq, tk) + a.cells - 1) / a.cells);
  const std::int64_t rows = (tq + step - 1) / step, cols = (tk + step - 1) / step;
  std::vector<std::int64_t> area(static_cast<std::size_t>(rows * cols), 0);
  // Each slice visits only the cells of its bounding box.
  for (const Slice& s : mask.slices()) {
    if (s.q.empty() || s.k.empty()) continue;
    for (std::int64_t r = s.q.begin / step; r <= (s.q.end - 1) / step; ++r)
      for (std::int64_t c = s.k.begin / step; c <= (s.k.end - 1) / step; ++c)
        area[r * cols + c] += slice_area(s, {r * step, std::min(tq, (r + 1) * step)},
                                         {c * step, std::min(tk, (c + 1) * step)});
  }
  std::ofstream out(a.out);
  const std::int64_t width = cols * kCellPixels + 2 * kMargin,
                     height = rows * kCellPixels + 2 * kMargin;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kMargin << "\" y=\"" << kMargin - 22 << "\">k: 0 .. " << tk
      << " (columns)   area " << mask.area() << " of " << tq * tk << " pairs, "
      << mask.slices().size() << " slices</text>\n"
      << "<text x=\"" << kMargin - 6 << "\" y=\"" << kMargin
      << "\" text-anchor=\"end\" transform=\"rotate(-90 " << kMargin - 6 << " " << kMargin
      << ")\">q: 0 .. " << tq << "</text>\n"
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
      const int level = shade(c);
      std::int64_t end = c + 1;
      while (end < cols && shade(end) == level) ++end;
      if (level > 0)
        out << "<rect x=\"" << c * kCellPixels << "\" y=\"" << r * kCellPixels << "\" width=\""
            << (end - c) * kCellPixels << "\" height=\"" << kCellPixels
            << "\" fill=\"#1f4e9c\" fill-opacity=\"" << static_cast<double>(level) / kShades
            << "\"/>\n";
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
  CLI::App* cmd = app.add_subcommand("mask", "Draw a mask (SVG)");
  add_mask_options(*cmd, args->mask);
  cmd->add_option("--out", args->out, "Output file (.svg)")->required();
  cmd->add_option("--cells", args->cells, "Cells along the longer side")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->callback([args] { draw(*args); });
}

}  // namespace flexcp::tools
