// Where a call's buffers lie: the weights' pointers of each layer and
// direction in PyTorch's _flat_weights order, the reserve's buffers (written
// by the forward, read by the backward) and the workspace's.
#pragma once

#include <cstdint>
#include <vector>

#include "checks.cuh"

namespace seqpack::cuda {

// The pointers of one (layer, direction) in the _flat_weights order.
template <typename P>
struct LayerWeights {
  P w_ih = nullptr, w_hh = nullptr, b_ih = nullptr, b_hh = nullptr, w_hr = nullptr;
};

template <typename P>
LayerWeights<P> weights_of(const Shape& s, bool has_biases, P const* weights, int64_t layer,
                           int64_t dir) {
  const int64_t per = s.weights_per_layer_dir(has_biases);
  P const* w = weights + (layer * s.dirs + dir) * per;
  LayerWeights<P> out;
  out.w_ih = w[0];
  out.w_hh = w[1];
  int64_t k = 2;
  if (has_biases) {
    out.b_ih = w[2];
    out.b_hh = w[3];
    k = 4;
  }
  if (s.proj > 0) out.w_hr = w[k];
  return out;
}

// Carves consecutive buffers out of one allocation; float32 ones first, so
// every buffer is aligned for its type.
class Arena {
 public:
  explicit Arena(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* take(int64_t count) {
    T* p = reinterpret_cast<T*>(base_ + offset_);
    offset_ += count * static_cast<int64_t>(sizeof(T));
    return p;
  }

 private:
  char* base_;
  int64_t offset_ = 0;
};

// The reserve's buffers of one (layer, direction), rows x width each.
struct Saved {
  float* gates;  // activations (LSTM i,f,g,o; GRU r,z,n; RNN h)
  float* hprev;  // h_{t-1} of each row
  float* c;      // LSTM c_t
  float* cprev;  // LSTM c_{t-1}
  float* m;      // LSTM with projection: o * tanh(c)
  float* ghn;    // GRU: W_hn h_{t-1} + b_hn
};

template <typename T>
struct ReserveLayout {
  std::vector<Saved> saved;       // [layer * dirs + dir]
  std::vector<T*> layer_output;   // [layer], layers below the last
  std::vector<T*> dropped_input;  // [layer], layers above the first
};

template <typename T>
ReserveLayout<T> layout_reserve(const Shape& s, void* reserve) {
  Arena arena(reserve);
  ReserveLayout<T> r;
  const int64_t n = s.rows;
  for (int64_t i = 0; i < s.layers * s.dirs; ++i) {
    Saved v{};
    v.gates = arena.take<float>(n * s.gates());
    v.hprev = arena.take<float>(n * s.hout());
    if (s.lstm()) {
      v.c = arena.take<float>(n * s.hidden);
      v.cprev = arena.take<float>(n * s.hidden);
    }
    if (s.proj > 0) v.m = arena.take<float>(n * s.hidden);
    if (s.gru()) v.ghn = arena.take<float>(n * s.hidden);
    r.saved.push_back(v);
  }
  r.layer_output.assign(static_cast<size_t>(s.layers), nullptr);
  r.dropped_input.assign(static_cast<size_t>(s.layers), nullptr);
  for (int64_t l = 0; l + 1 < s.layers; ++l) r.layer_output[l] = arena.take<T>(n * s.width());
  for (int64_t l = 1; l < s.layers; ++l) r.dropped_input[l] = arena.take<T>(n * s.width());
  return r;
}

struct Workspace {
  int64_t* batch_sizes;  // rows entries: a device copy of batch_sizes
  float* gh;             // batch x gates: h_{t-1} W_hh^T of one step
  float* dgx;            // rows x gates
  float* dgh;            // rows x gates (GRU; else dgx)
  float* dh;             // rows x hout: gradient of each row's h
  float* dm;             // batch x hidden (projection)
  float* dh_carry;       // batch x hout
  float* dc_carry;       // batch x hidden
  float* dy[2];          // rows x dy_width, ping-pong between layers
};

// The workspace as direction d sees it: dgx, dgh and dy are shared (the
// backward on the library's own products, which uses them, runs a layer's
// directions one after the other), the rest is direction d's own (a layer's
// directions run at once otherwise: SideStream).
inline Workspace layout_workspace(const Shape& s, void* workspace, int64_t d = 0) {
  Arena arena(workspace);
  Workspace w{};
  const int64_t n = s.rows;
  w.batch_sizes = arena.take<int64_t>(n * s.dirs) + d * n;
  w.dgx = arena.take<float>(n * s.gates());
  w.dgh = s.gru() ? arena.take<float>(n * s.gates()) : w.dgx;
  w.dy[0] = arena.take<float>(n * s.dy_width());
  w.dy[1] = arena.take<float>(n * s.dy_width());
  for (int64_t k = 0; k < s.dirs; ++k) {  // each direction's part, d's kept
    Workspace own = w;
    own.dh = arena.take<float>(n * s.hout());
    own.gh = arena.take<float>(s.batch * s.gates());
    own.dm = s.proj > 0 ? arena.take<float>(s.batch * s.hidden) : nullptr;
    own.dh_carry = arena.take<float>(s.batch * s.hout());
    own.dc_carry = arena.take<float>(s.batch * s.hidden);
    if (k == d) w = own;
  }
  return w;
}

}  // namespace seqpack::cuda
