// Stages and the cost model: remote K/V arrives in stages; stage s computes while stage s+1 is in
// flight. The cost model prices compute on attended pairs and transfers per link.
#include <algorithm>
#include <map>
#include <numeric>

#include "plan/plan_internal.h"

namespace flexcp::plan_detail {

int node_of(int rank, const PlanOptions& o) {
  return o.gpus_per_node > 0 ? rank / o.gpus_per_node : 0;
}

double compute_us(std::int64_t area, const PlanOptions& o) {
  const double flops =
      4.0 * static_cast<double>(area) * static_cast<double>(o.head_dim * o.heads_q);
  return flops / (o.cost.kernel_tflops * 1e12) * 1e6;
}

std::int64_t kv_bytes_per_token(const PlanOptions& o) {
  return 2 * o.heads_kv * o.head_dim * o.element_bytes;
}

double transfer_us(std::int64_t tokens, bool same_node, const PlanOptions& o) {
  const double gbps = same_node ? o.cost.intra_node_gbps : o.cost.inter_node_gbps;
  return static_cast<double>(tokens * kv_bytes_per_token(o)) / (gbps * 1e9) * 1e6;
}

Staging price_pieces(std::int64_t local_area, const std::vector<Piece>& pieces, int rank,
                     const PlanOptions& o) {
  Staging st;
  st.local_us = compute_us(local_area, o);
  // Nearest owners first (ring distance), so early stages lean on short, intra-node hops.
  st.order.resize(pieces.size());
  std::iota(st.order.begin(), st.order.end(), 0);
  const int world = o.world_size;
  auto distance = [&](int owner) { return (owner - rank + world) % world; };
  std::stable_sort(st.order.begin(), st.order.end(), [&](auto a, auto b) {
    return distance(pieces[a].owner) < distance(pieces[b].owner);
  });
  for (std::size_t i : st.order) {
    const Piece& p = pieces[i];
    st.comm_us.push_back(transfer_us(p.tokens.size(), node_of(p.owner, o) == node_of(rank, o), o));
    st.compute_us.push_back(compute_us(p.area, o));
    st.tokens.push_back(p.tokens.size());
  }
  return st;
}

namespace {

// Calls fn(position in order, stage) with stages cutting the tokens into equal shares.
template <class Fn>
void for_each_stage(const Staging& st, int num_stages, Fn&& fn) {
  std::int64_t total = 0;
  for (std::int64_t t : st.tokens) total += t;
  std::int64_t sent = 0;
  for (std::size_t i = 0; i < st.order.size(); ++i) {
    const std::int64_t s = total > 0 ? sent * num_stages / total : 0;
    fn(i, static_cast<int>(std::min<std::int64_t>(s, num_stages - 1)) + 1);
    sent += st.tokens[i];
  }
}

}  // namespace

std::vector<int> stage_pieces(const Staging& st, int num_stages) {
  std::vector<int> stage(st.order.size(), 1);
  for_each_stage(st, num_stages, [&](std::size_t i, int s) { stage[st.order[i]] = s; });
  return stage;
}

Timeline simulate(const Staging& st, int num_stages, const PlanOptions& o) {
  std::vector<double> comm(num_stages + 1, 0.0), compute(num_stages + 1, 0.0);
  compute[0] = st.local_us;
  for_each_stage(st, num_stages, [&](std::size_t i, int s) {
    comm[s] += st.comm_us[i];
    compute[s] += st.compute_us[i];
  });
  // Transfers run back to back from t = 0; a stage computes once its data is in and the previous
  // stage is done.
  double arrived = 0, done = compute[0], busy = compute[0];
  for (int s = 1; s <= num_stages; ++s) {
    arrived += comm[s];
    done = std::max(done, arrived) + compute[s];
    busy += compute[s];
  }
  const double overhead = num_stages * o.cost.stage_overhead_us;
  return {done + overhead, done - busy};
}

std::vector<CastItem> group_casts(const std::vector<std::vector<Piece>>& needs, int world) {
  // Per owner, sweep the needed ranges; between consecutive boundaries the set of destinations is
  // constant, and neighbouring intervals with the same set merge into one item.
  std::vector<std::vector<std::pair<std::int64_t, int>>> events(world);  // (pos, +/-(dest+1))
  for (int r = 0; r < static_cast<int>(needs.size()); ++r)
    for (const Piece& p : needs[r]) {
      events[p.owner].push_back({p.tokens.begin, r + 1});
      events[p.owner].push_back({p.tokens.end, -(r + 1)});
    }
  std::vector<CastItem> items;
  for (int owner = 0; owner < world; ++owner) {
    auto& ev = events[owner];
    std::sort(ev.begin(), ev.end());
    std::map<int, int> active;  // dest -> count (a rank's pieces never overlap, so 0 or 1)
    for (std::size_t i = 0; i < ev.size();) {
      const std::int64_t pos = ev[i].first;
      for (; i < ev.size() && ev[i].first == pos; ++i) {
        const int dest = std::abs(ev[i].second) - 1;
        if (ev[i].second > 0)
          ++active[dest];
        else if (--active[dest] == 0)
          active.erase(dest);
      }
      if (active.empty() || i == ev.size()) continue;
      std::vector<int> dests;
      for (auto& [d, n] : active) dests.push_back(d);
      const Range span{pos, ev[i].first};
      if (!items.empty() && items.back().owner == owner && items.back().tokens.end == span.begin &&
          items.back().dests == dests)
        items.back().tokens.end = span.end;
      else
        items.push_back({owner, span, std::move(dests)});
    }
  }
  return items;
}

}  // namespace flexcp::plan_detail
