// The persistent scheduler both sm90 kernels use: one CTA per SM, each taking its first item at
// blockIdx.x and every further one from a global counter when it is ready for it (which keeps the
// CTAs balanced whatever the items' sizes). The counters live in the plan's workspace,
// {next item - gridDim.x, CTAs done}, zero at launch; the last CTA to finish resets them, so
// launches on one stream run in turn. The producer thread takes items and hands them to the
// consumer warp groups through a small pipeline of item slots in shared memory.
#pragma once

#include <cutlass/pipeline/pipeline.hpp>

namespace flexcp::sm90 {

template <int kSlots>
struct ItemQueue {
  using Pipeline = cutlass::PipelineAsync<kSlots>;
  struct SharedStorage {
    typename Pipeline::SharedStorage pipe;
    int item[kSlots];
  };

  // The item after the CTA's current one.
  static __device__ __forceinline__ int next(int* counters) {
    return gridDim.x + atomicAdd(counters, 1);
  }
  // Called once by each CTA's producer after its last item: every CTA has taken its last item
  // once all have counted themselves out, and the last one resets the counters.
  static __device__ __forceinline__ void retire(int* counters) {
    __threadfence();
    if (atomicAdd(counters + 1, 1) == int(gridDim.x) - 1) {
      atomicExch(counters, 0);
      atomicExch(counters + 1, 0);
    }
  }
  // Producer: hands item i (>= the item count: no more) to the consumers.
  template <class State>
  static __device__ __forceinline__ void publish(Pipeline& pipe, State& state, SharedStorage& ss,
                                                 int i) {
    pipe.producer_acquire(state);
    ss.item[state.index()] = i;
    pipe.producer_commit(state);
    ++state;
  }
  // Producer: takes items from the scheduler (this CTA's first is its index), hands each to the
  // consumers and calls load(i) for it; after the last, hands over the end and counts this CTA
  // out.
  template <class Load>
  static __device__ __forceinline__ void produce(Pipeline& pipe, SharedStorage& ss, int* counters,
                                                 int items, Load&& load) {
    auto state = cutlass::make_producer_start_state<Pipeline>();
    for (int i = blockIdx.x;; i = next(counters)) {
      publish(pipe, state, ss, i);
      if (i >= items) {
        retire(counters);
        return;
      }
      load(i);
    }
  }
  // The pipeline's parameters: one producer thread, `consumers` consumer threads.
  static __device__ __forceinline__ typename Pipeline::Params params(bool producer, int consumers) {
    typename Pipeline::Params ip;
    ip.role = producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    ip.producer_arv_count = 1;
    ip.consumer_arv_count = consumers;
    return ip;
  }
  // Consumers: the next item handed over.
  template <class State>
  static __device__ __forceinline__ int take(Pipeline& pipe, State& state,
                                             const SharedStorage& ss) {
    pipe.consumer_wait(state);
    const int i = ss.item[state.index()];
    pipe.consumer_release(state);
    ++state;
    return i;
  }
};

}  // namespace flexcp::sm90
