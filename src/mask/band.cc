#include "flexcp/band.h"

#include <algorithm>
#include <set>

namespace flexcp {
namespace {

// Far outside any sequence, yet far from overflow when offsets are added.
constexpr std::int64_t kFar = std::int64_t{1} << 60;

// Slope-0 sides keep their constant in both fields, so begin_min (end_max) is always the true
// minimum (maximum) of the side; intersection and transposition rely on it.
Band normalized(Band b) {
  if (b.begin_slope == 0) b.begin_min = b.begin_off = std::max(b.begin_min, b.begin_off);
  if (b.end_slope == 0) b.end_max = b.end_off = std::min(b.end_max, b.end_off);
  return b;
}

// Calls f(a, b, c, d) for consecutive row pieces [a, b) covering [x0, x1) on which the clipped
// row length end(x) - begin(x) is the linear function c + d * x (d in {-1, 0, 1}).
template <class F>
void for_each_linear_piece(const Band& band, std::int64_t x0, std::int64_t x1, std::int64_t y0,
                           std::int64_t y1, F&& f) {
  x0 = std::max(x0, band.row_begin);
  x1 = std::min(x1, band.row_end);
  if (x0 >= x1) return;
  const std::int64_t bmin = std::max(band.begin_min, y0);
  const std::int64_t emax = std::min(band.end_max, y1);
  // begin(x) switches from the clamp to the linear term at x = bmin - begin_off; end(x) switches
  // from the linear term to the clamp at x = emax - end_off.
  std::int64_t cuts[4] = {x0, 0, 0, 0};
  int num_cuts = 1;
  auto add_cut = [&](std::int64_t x) {
    if (x > x0 && x < x1) cuts[num_cuts++] = x;
  };
  if (band.begin_slope) add_cut(bmin - band.begin_off);
  if (band.end_slope) add_cut(emax - band.end_off);
  if (num_cuts == 3 && cuts[2] < cuts[1]) std::swap(cuts[1], cuts[2]);
  cuts[num_cuts++] = x1;
  for (int i = 0; i + 1 < num_cuts; ++i) {
    const std::int64_t a = cuts[i], b = cuts[i + 1];
    if (a >= b) continue;
    std::int64_t cb = bmin, db = 0, ce = emax, de = 0;
    if (band.begin_slope && band.begin_off + a >= bmin) cb = band.begin_off, db = 1;
    if (band.begin_slope == 0) cb = std::max(bmin, band.begin_off);
    if (band.end_slope && band.end_off + a < emax) ce = band.end_off, de = 1;
    if (band.end_slope == 0) ce = std::min(emax, band.end_off);
    f(a, b, ce - cb, de - db);
  }
}

// sum over x in [a, b) of max(0, c + d * x).
std::int64_t sum_positive(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  if (d == 0) return c > 0 ? c * (b - a) : 0;
  if (d > 0)
    a = std::max(a, 1 - c);  // c + x > 0
  else
    b = std::min(b, c);  // c - x > 0
  if (a >= b) return 0;
  const std::int64_t n = b - a;
  const std::int64_t first = c + d * a, last = c + d * (b - 1);
  return n * (first + last) / 2;
}

}  // namespace

Band slice_band(const Slice& s) {
  Band b;
  b.row_begin = s.q.begin;
  b.row_end = s.q.end;
  b.begin_min = b.begin_off = s.k.begin;
  b.end_max = b.end_off = s.k.end;
  const std::int64_t below_diag = s.k.end - s.q.end + 1;  // k < q + below_diag
  const std::int64_t above_diag = s.k.begin - s.q.begin;  // k >= q + above_diag
  switch (s.type) {
    case MaskType::kFull:
      break;
    case MaskType::kCausal:
      b.end_off = below_diag, b.end_slope = 1;
      break;
    case MaskType::kInvCausal:
      b.begin_off = above_diag, b.begin_slope = 1;
      break;
    case MaskType::kBiCausal:
      b.end_off = below_diag, b.end_slope = 1;
      b.begin_off = above_diag, b.begin_slope = 1;
      break;
  }
  return normalized(b);
}

std::vector<Band> slice_bands(const std::vector<Slice>& slices, std::vector<std::size_t>* source) {
  std::vector<Band> bands;
  bands.reserve(slices.size());
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const Band b = trim_band(slice_band(slices[i]));
    if (b.row_begin >= b.row_end) continue;
    bands.push_back(b);
    if (source) source->push_back(i);
  }
  return bands;
}

Band trim_band(const Band& band) {
  std::int64_t first = band.row_end, last = band.row_begin - 1;
  for_each_linear_piece(band, band.row_begin, band.row_end, -kFar, kFar,
                        [&](std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
                          // Rows where c + d * x >= 1, inside [a, b).
                          std::int64_t lo = a, hi = b - 1;
                          if (d > 0) lo = std::max(a, 1 - c);
                          if (d < 0) hi = std::min(b - 1, c - 1);
                          if (d == 0 && c < 1) return;
                          if (lo > hi) return;
                          first = std::min(first, lo);
                          last = std::max(last, hi);
                        });
  Band out = band;
  if (first > last) {
    out.row_end = out.row_begin;
  } else {
    out.row_begin = first;
    out.row_end = last + 1;
  }
  return out;
}

Band transpose_band(const Band& band) {
  const Band b = normalized(band);
  Band t;
  t.row_begin = b.begin_min;
  t.row_end = b.end_max;
  // y < end(x) with end(x) = end_off + x gives x >= y - end_off + 1.
  t.begin_slope = b.end_slope;
  t.begin_min = b.row_begin;
  t.begin_off = b.end_slope ? 1 - b.end_off : b.row_begin;
  // begin(x) <= y with begin(x) = begin_off + x gives x <= y - begin_off.
  t.end_slope = b.begin_slope;
  t.end_max = b.row_end;
  t.end_off = b.begin_slope ? 1 - b.begin_off : b.row_end;
  if (b.row_begin >= b.row_end) t.row_end = t.row_begin;
  return trim_band(normalized(t));
}

Band intersect_bands(const Band& a_in, const Band& b_in) {
  const Band a = normalized(a_in), b = normalized(b_in);
  Band r;
  r.row_begin = std::max(a.row_begin, b.row_begin);
  r.row_end = std::max(r.row_begin, std::min(a.row_end, b.row_end));
  r.begin_min = std::max(a.begin_min, b.begin_min);
  r.begin_slope = a.begin_slope | b.begin_slope;
  if (a.begin_slope && b.begin_slope)
    r.begin_off = std::max(a.begin_off, b.begin_off);
  else if (a.begin_slope)
    r.begin_off = a.begin_off;
  else if (b.begin_slope)
    r.begin_off = b.begin_off;
  else
    r.begin_off = r.begin_min;
  r.end_max = std::min(a.end_max, b.end_max);
  r.end_slope = a.end_slope | b.end_slope;
  if (a.end_slope && b.end_slope)
    r.end_off = std::min(a.end_off, b.end_off);
  else if (a.end_slope)
    r.end_off = a.end_off;
  else if (b.end_slope)
    r.end_off = b.end_off;
  else
    r.end_off = r.end_max;
  return normalized(r);
}

std::int64_t band_area(const Band& band, std::int64_t x0, std::int64_t x1, std::int64_t y0,
                       std::int64_t y1) {
  std::int64_t total = 0;
  for_each_linear_piece(band, x0, x1, y0, y1,
                        [&](std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
                          total += sum_positive(a, b, c, d);
                        });
  return total;
}

// Shamos-Hoey sweep over rows. While no two bands overlap, the column intervals of the bands
// active in a row are disjoint, and since interval ends move right by at most one per row their
// order never changes; the first overlap is therefore between neighbours in that order. So it
// suffices to test each pair that becomes adjacent (on insertion and removal) over all its common
// rows: O(n log n) for n bands.
BandOverlap find_overlap(const std::vector<Band>& bands) {
  const std::size_t n = bands.size();
  struct Event {
    std::int64_t row;
    int insert;  // removals (0) sort before insertions (1) at the same row
    std::size_t band;
  };
  std::vector<Event> events;
  events.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    if (bands[i].row_begin >= bands[i].row_end) continue;
    events.push_back({bands[i].row_begin, 1, i});
    events.push_back({bands[i].row_end, 0, i});
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.row != b.row ? a.row < b.row : a.insert < b.insert;
  });

  std::int64_t row = 0;
  auto by_begin = [&](std::size_t a, std::size_t b) {
    const std::int64_t ba = bands[a].begin(row), bb = bands[b].begin(row);
    return ba != bb ? ba < bb : a < b;
  };
  std::set<std::size_t, decltype(by_begin)> active(by_begin);
  std::vector<decltype(active)::iterator> where(n);
  BandOverlap found;
  auto check_pair = [&](std::size_t a, std::size_t b) {
    const Band both = intersect_bands(bands[a], bands[b]);
    if (band_area(both, both.row_begin, both.row_end, both.begin_min, both.end_max) == 0)
      return false;
    found = {true, std::min(a, b), std::max(a, b), trim_band(both)};
    return true;
  };
  for (const Event& e : events) {
    row = e.row;
    if (e.insert) {
      auto it = active.insert(e.band).first;
      where[e.band] = it;
      if (it != active.begin() && check_pair(*std::prev(it), e.band)) return found;
      if (std::next(it) != active.end() && check_pair(e.band, *std::next(it))) return found;
    } else {
      auto next = active.erase(where[e.band]);
      if (next != active.begin() && next != active.end() && check_pair(*std::prev(next), *next))
        return found;
    }
  }
  return found;
}

}  // namespace flexcp
