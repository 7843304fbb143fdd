// Stages and the cost model: remote K/V arrives in stages; stage s computes while stage s+1 is in
// flight. The cost model prices compute on attended pairs and transfers per link.
#include <algorithm>
#include <map>
#include <numeric>

#include "plan/plan_internal.h"

namespace flexcp::plan_detail {
namespace {

// Stage counts the cost model chooses among.
constexpr int kMaxAutoStages = 8;

}  // namespace

int node_of(int rank, const PlanOptions& o) {
  return o.gpus_per_node > 0 ? rank / o.gpus_per_node : 0;
}

double compute_us(std::int64_t area, const PlanOptions& o) {
  const double flops =
      4.0 * static_cast<double>(area) * static_cast<double>(o.head_dim * o.heads_q);
  return flops / (o.cost.kernel_tflops * 1e12) * 1e6;
}

std::int64_t kv_bytes_per_token(const PlanOptions& o) {
  return 2 * o.heads_kv * o.head_dim * static_cast<std::int64_t>(dtype_size(o.dtype));
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

int choose_stages(const Staging& st, const PlanOptions& o) {
  if (st.order.empty()) return 0;
  if (o.num_stages > 0) return o.num_stages;
  int best_stages = 1;
  double best = simulate(st, 1, o).total_us;
  for (int s = 2; s <= kMaxAutoStages; ++s) {
    const double t = simulate(st, s, o).total_us;
    if (t < best) best = t, best_stages = s;
  }
  return best_stages;
}

LinkBytes hierarchical_bytes(const std::vector<SendRange>& sends, int owner, const PlanOptions& o) {
  // Between consecutive range boundaries the set of destinations is constant: each of their
  // remote nodes costs one crossing, each destination one intra-node delivery beyond it.
  std::vector<std::pair<std::int64_t, int>> events;  // (token, +/-(dest + 1))
  for (const SendRange& s : sends) {
    events.push_back({s.tokens.begin, s.dest + 1});
    events.push_back({s.tokens.end, -(s.dest + 1)});
  }
  std::sort(events.begin(), events.end());
  const std::int64_t bpt = kv_bytes_per_token(o);
  const int home = node_of(owner, o);
  std::map<int, int> dests_per_node;  // node -> active destinations on it
  int active = 0;
  LinkBytes bytes;
  for (std::size_t i = 0; i < events.size();) {
    const std::int64_t pos = events[i].first;
    for (; i < events.size() && events[i].first == pos; ++i) {
      const int node = node_of(std::abs(events[i].second) - 1, o);
      if (events[i].second > 0) {
        ++dests_per_node[node], ++active;
      } else if (--dests_per_node[node] == 0) {
        dests_per_node.erase(node), --active;
      } else {
        --active;
      }
    }
    if (i == events.size() || active == 0) continue;
    const std::int64_t tokens = events[i].first - pos;
    const std::int64_t remote_nodes =
        static_cast<std::int64_t>(dests_per_node.size()) - (dests_per_node.count(home) ? 1 : 0);
    bytes.inter += remote_nodes * tokens * bpt;
    bytes.intra += (active - remote_nodes) * tokens * bpt;
  }
  return bytes;
}

}  // namespace flexcp::plan_detail
