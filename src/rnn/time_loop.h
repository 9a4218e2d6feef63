// The time loop of the recurrent core: one layer and direction's steps,
// written once for every cell. ForwardDirection runs the input projection,
// lays out the step operands and walks the steps; BackwardDirection walks
// them back for the dh/dc recurrence (one product of live rows per step),
// then computes dW_ih, dW_hh and dW_hr each with one product over all packed
// rows. Each step runs its phases (before the product, the product, after
// it) with the barriers between them (rnn/grid.h's Split says which rows
// and columns are this thread's) and hands its rows to the cell's step
// (rnn/cell.h). Every matrix product goes through the call's GEMM engine
// (cpu/gemm_engine.h): nothing here knows which precision runs.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstring>
#include <memory>
#include <variant>
#include <vector>

#include "cpu/buffer_pool.h"
#include "cpu/finite.h"
#include "cpu/gemm_engine.h"
#include "cpu/scratch.h"
#include "rnn/cell.h"
#include "rnn/grid.h"
#include "rnn/plan.h"
#include "rnn/saved.h"
#include "rnn/state_rows.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"

namespace seqpack::rnn {

// ---------------------------------------------------------------------------
// The forward.
// ---------------------------------------------------------------------------

// The whole forward workspace of one direction, allocated once per call:
// nothing is allocated inside the time loop. Every buffer is written before
// it is read (load_state, the products with beta 0, the kernels): none is
// zero-filled.
template <typename T, typename Cell>
struct ForwardWorkspace {
  cpu::Scratch<T> hstate, hprev, gh, m, bias, proj;
  std::vector<const T*> proj_rows;  // lookup layer: the projection row of each packed row
  typename Cell::template Workspace<T> cell;

  // `table_rows`: a lookup's table rows (its projection's), else 0.
  void resize(const RNNOptions& o, int64_t B, bool save, int64_t table_rows) {
    const int64_t H = o.hidden_size, R = o.real_hidden_size(), G = o.gate_count() * H;
    hstate.resize_for_overwrite(static_cast<std::size_t>(B * R));
    // Without save, h_prev of a step goes to one of two alternating buffers
    // (a thread may start the next step while another still reads this one).
    hprev.resize_for_overwrite(save ? 0 : static_cast<std::size_t>(2 * B * R));
    gh.resize_for_overwrite(Cell::hidden_apart ? static_cast<std::size_t>(B * G) : 0);
    m.resize_for_overwrite(o.proj_size > 0 && !save ? static_cast<std::size_t>(B * H) : 0);
    bias.resize_for_overwrite(static_cast<std::size_t>(G));
    proj.resize_for_overwrite(static_cast<std::size_t>(table_rows * G));
    cell.resize(CellShape::of(o, B, 0));
  }
};

template <typename T, typename Cell>
struct ForwardDirection {
  const RNNOptions& o;
  const cpu::GemmEngine<T>& eng;
  const PackingPlan& plan;
  const std::vector<int64_t>* lookup;  // layer 0 of rnn_forward_lookup, else null
  ForwardWorkspace<T, Cell>& ws;
  RNNSaved::Direction& sd;
  const int64_t l, d, H, R, G, B, N, TT, ldo;
  const bool save, h0_zero, proj;
  const bool groups;  // a thread's gate blocks as one product (RNNConfig::step_groups)
  const cpu::IsaLevel cap;  // the gate kernels' ISA cap (RNNConfig::kernels)
  DirWeights<T> w;
  typename Cell::template Forward<T> cell;
  const typename RNNPlan<T>::Direction& laid_out;  // the model plan's step operands
  T* gates = nullptr;                              // [N, G]
  T* outp = nullptr;                               // this direction's columns of the layer output
  T *hprev = nullptr, *ms = nullptr;               // saved
  const cpu::StepOperand *whh = nullptr, *whr = nullptr;
  // h_prev in the form the steps' products read (step_form; null where they
  // read the fp32 rows): two halves of [B, R], the steps alternating between
  // them (a thread may write a step's h while another still multiplies the
  // previous one's), filled by the gate kernels through hsink.
  std::unique_ptr<cpu::OperandRows> hkept;
  cpu::RowSink hsink;
  // Saving for a backward whose dW_hh reads H_prev in another form
  // (product_form): h_prev's rows in it in packed row order instead (row r:
  // h entering row r's step), kept for dW_hh and read by the steps where
  // they take that form; the kernels write each step's rows that continue
  // into the next step's rows, h0 is put for the rows that begin.
  std::shared_ptr<cpu::OperandRows> hp_kept;
  bool fp32_hprev = true;  // whether h_prev's fp32 rows are written (GRU reads them, or a step)
  // A lookup layer's projected rows: fed into the product where the engine
  // takes init rows (and the cell lets it), else added by the gate kernel
  // (lookup_in_kernel), else copied into G.
  bool fuse_lookup = false, lookup_in_gates = false;

  ForwardDirection(const RNNOptions& o_, const cpu::GemmEngine<T>& eng_, const PackingPlan& plan_,
                   const std::vector<Tensor>& weights, const std::vector<int64_t>* lookup_,
                   ForwardWorkspace<T, Cell>& ws_, RNNSaved::Direction& sd_,
                   const typename RNNPlan<T>::Direction& laid_out_, int64_t l_, int64_t d_,
                   bool save_, bool h0_zero_, const RNNConfig& config)
      : o(o_),
        eng(eng_),
        plan(plan_),
        lookup(l_ == 0 ? lookup_ : nullptr),
        ws(ws_),
        sd(sd_),
        l(l_),
        d(d_),
        H(o.hidden_size),
        R(o.real_hidden_size()),
        G(o.gate_count() * H),
        B(plan.batch()),
        N(plan.total_rows()),
        TT(plan.max_len()),
        ldo(o.output_size()),
        save(save_),
        h0_zero(h0_zero_),
        proj(o.proj_size > 0),
        groups(config.step_groups),
        cap(config.kernels.isa_cap),
        w(dir_weights<T>(o, weights, l_, d_)),
        cell(CellShape::of(o, B, N), w.b_hh, ws.cell, saved_cell(sd_, save_)),
        laid_out(laid_out_) {}

  // The cell's saved state in sd (made the cell's kind), or null without save.
  static typename Cell::Saved* saved_cell(RNNSaved::Direction& sd, bool save) {
    if (!save) return nullptr;
    sd.cell = typename Cell::Saved{};
    return &std::get<typename Cell::Saved>(sd.cell);
  }

  // G = X·W_ihᵀ + b, with b = b_ih, plus b_hh where the cell has it there
  // (b_hh_in_projection; GRU's b_hn stays inside r * (W_hn h + b_hn)). A
  // lookup layer projects the V table rows once instead; each step takes its
  // rows' projection (fused into the product where the engine takes init
  // rows, into the gate kernel otherwise, else copied into G).
  void project_inputs(const Tensor& x) {
    Tensor gates_t = cpu::pooled_empty({N, G}, o.dtype);
    gates = gates_t.data<T>();
    if (save)
      sd.gates = gates_t;
    else
      ws_gates_ = gates_t;
    T* bias = ws.bias.data();
    for (int64_t k = 0; k < G; ++k) {
      bias[k] = !o.bias ? T(0) : !Cell::b_hh_in_projection ? w.b_ih[k] : w.b_ih[k] + w.b_hh[k];
    }
    const int64_t in = x.size(1);
    if (!lookup) {
      eng.gemm({.m = N,
                .n = G,
                .k = in,
                .a = {.data = x.data<T>(), .ld = in},
                .b = {.data = w.w_ih,
                      .ld = in,
                      .trans = true,
                      .laid_out = laid_out.wih,
                      .in_place = laid_out.in_place},
                .c = gates,
                .ldc = G,
                .c_row = o.bias ? bias : nullptr});
      return;
    }
    const int64_t V = x.size(0);
    T* p = ws.proj.data();
    eng.gemm({.m = V,
              .n = G,
              .k = in,
              .a = {.data = x.data<T>(), .ld = in},
              .b = {.data = w.w_ih,
                    .ld = in,
                    .trans = true,
                    .laid_out = laid_out.wih,
                    .in_place = laid_out.in_place},
              .c = p,
              .ldc = G});
    for (int64_t v = 0; v < V; ++v)
      for (int64_t k = 0; k < G; ++k) p[v * G + k] += bias[k];
    fuse_lookup = eng.takes_init() && Cell::lookup_in_product;
    lookup_in_gates = !fuse_lookup && Cell::lookup_in_kernel;
    if (fuse_lookup || lookup_in_gates) {
      ws.proj_rows.resize(static_cast<std::size_t>(N));
      for (int64_t r = 0; r < N; ++r)
        ws.proj_rows[static_cast<std::size_t>(r)] = p + (*lookup)[static_cast<std::size_t>(r)] * G;
    }
  }

  // The saved activations, the steps' operands (W_hhᵀ [R, G], W_hrᵀ [H, R],
  // laid out once by the model plan for this direction's threads) and the
  // initial state.
  void prepare(const Tensor& h0, const Tensor& c0, Tensor& out) {
    whh = laid_out.whh.get();
    whr = laid_out.whr.get();
    // Under a projection h_prev is W_hr's product, not a kernel's output.
    // dW_hh = dGᵀ·H_prev takes every row, h0's too: dG·0 is NaN where dG is
    // not finite, as in torch.
    if (save && !proj) hp_kept = cpu::OperandRows::make(eng.product_form(G, R, N), N, R);
    if (hp_kept) {
      hsink = hp_kept->sink();
      sd.h_prev_kept = hp_kept;
    }
    fp32_hprev = !hp_kept || Cell::reads_h_prev || eng.step_form(*whh) != hp_kept->form();
    if (save) {
      if (fp32_hprev) {
        sd.h_prev = cpu::pooled_empty({N, R}, o.dtype);
        hprev = sd.h_prev.data<T>();
      }
      if (proj) {
        sd.m = cpu::pooled_empty({N, H}, o.dtype);
        ms = sd.m.data<T>();
      }
    }
    const int64_t ld = l * o.num_directions() + d;
    load_state(ws.hstate.data(), h0, ld, plan.sorted_indices(), R);
    cell.start(c0, ld, plan.sorted_indices());
    outp = out.data<T>() + d * R;
    if (!proj && !hp_kept) hkept = cpu::OperandRows::make(eng.step_form(*whh), 2 * B, R);
    if (hkept) {
      hsink = hkept->sink();
      if (!h0_zero) {  // rows that begin later read h0 from either half
        hkept->put(0, ws.hstate.data(), R, B);
        hkept->put(B, ws.hstate.data(), R, B);
      }
    }
  }

  // One step, walked by every thread on its share, in phases: before the
  // product (the step's rows, h_prev), the product, after it (the cell's
  // math, then a projection). By columns, one barrier per step (two with a
  // projection), since each thread multiplies all of h_prev by its rows of
  // W_hh and runs the gate math on its columns; by rows, none: each thread's
  // rows go through the product and the gate math on that thread alone.
  void step(int64_t s, const Split& sp) {
    ForwardStep<T> st = before_product(s, sp);
    columns_barrier(sp);  // the product reads every column of h_prev
    product(st, sp);
    after_product(st, sp);
  }

  // This thread's rows of step s, where their h goes in the engine's form,
  // and their h_prev.
  ForwardStep<T> before_product(int64_t s, const Split& sp) {
    // The reverse direction walks t down; rows bs[t+1]..bs[t]-1 begin there
    // and take h0 (and c0) from the state buffers, which hold nothing else.
    const auto& bs = plan.batch_sizes();
    const int64_t t = d == 0 ? s : TT - 1 - s;
    const auto [j0, j1] = sp.rows(bs[static_cast<std::size_t>(t)]);
    ForwardStep<T> st;
    st.cap = cap;
    st.n = j1 - j0;
    st.j0 = j0;
    st.k0 = sp.a;
    st.k1 = sp.b;
    st.r0 = plan.offsets()[static_cast<std::size_t>(t)] + j0;
    st.g = gates + st.r0 * G;
    if (s + 1 < TT) {  // this thread's rows of the next step
      const auto tn = static_cast<std::size_t>(d == 0 ? t + 1 : t - 1);
      const auto [n0, n1] = sp.rows(bs[tn]);
      st.next_g = gates + (plan.offsets()[tn] + n0) * G;
      st.next_len = (n1 - n0) * G;
    }
    st.out = outp + st.r0 * ldo;
    st.cont = std::clamp<int64_t>(rows_after_h0(bs, t, d) - j0, 0, st.n);
    if (st.cont > 0)
      st.r_prev = plan.offsets()[static_cast<std::size_t>(d == 0 ? t - 1 : t + 1)] + j0;
    if (hp_kept) {  // packed rows: the next step's are where this step's h goes
      st.h_row = st.r0;
      if (s + 1 < TT) {
        const auto tn = static_cast<std::size_t>(d == 0 ? t + 1 : t - 1);
        st.n_next = std::clamp<int64_t>(bs[tn] - j0, 0, st.n);
        // (a row split's j0 may lie past the next step's rows: no sink row then)
        if (st.n_next > 0) st.h_next = hsink.from_row(plan.offsets()[tn] + j0);
      }
      // The rows that begin here take h0 (before the barrier: every thread's
      // product reads them).
      if (sp.owns_row_work() && st.cont < st.n)
        hp_kept->put(st.r0 + st.cont, ws.hstate.data() + (j0 + st.cont) * R, R, st.n - st.cont);
    } else {
      st.h_row = (s % 2) * B + j0;
      st.h_next = hsink.from_row(((s + 1) % 2) * B + j0);
      st.n_next = st.n;
    }
    // h_prev: the previous step's output rows for the rows that continue
    // from it (read where the kernel wrote them: no copy into a state
    // buffer), h0 for the others.
    if (fp32_hprev) {
      T* hsrc = save ? hprev + st.r0 * R : ws.hprev.data() + ((s % 2) * B + j0) * R;
      if (st.cont > 0)
        copy_rows(hsrc + sp.ra, R, outp + st.r_prev * ldo + sp.ra, ldo, st.cont, sp.rb - sp.ra);
      copy_rows(hsrc + st.cont * R + sp.ra, R, ws.hstate.data() + (j0 + st.cont) * R + sp.ra, R,
                st.n - st.cont, sp.rb - sp.ra);
      st.h_prev = hsrc;
    }
    // Rows past ng hold the zero h0: their product is zero.
    const int64_t ng = h0_zero ? rows_after_h0(bs, t, d) : bs[static_cast<std::size_t>(t)];
    st.ng = std::clamp<int64_t>(ng - j0, 0, st.n);
    return st;
  }

  // The product: h_prev · W_hhᵀ into the gate rows, or into the cell's own
  // buffer (hidden_apart), whose rows without a product read zeros; a lookup
  // layer's rows go in with it, or into G, or to the kernel.
  void product(ForwardStep<T>& st, const Split& sp) {
    if (lookup) take_lookup_rows(st, sp);
    if constexpr (Cell::hidden_apart) {
      st.gh = ws.gh.data() + st.j0 * G;
      hidden_product(st, sp, T(0), st.gh);
      for (int64_t r = st.ng; r < st.n; ++r)
        for (int64_t q = 0; q < G / H; ++q)
          std::fill(st.gh + r * G + q * H + sp.a, st.gh + r * G + q * H + sp.b, T(0));
    } else {
      st.gh = st.g;
      hidden_product(st, sp, st.x_rows ? T(0) : T(1), st.g);
    }
  }

  // After the product: the cell's math on this thread's columns and rows,
  // writing h (before a projection: m), then h = W_hr m.
  void after_product(ForwardStep<T>& st, const Split& sp) {
    st.h = st.out;
    st.ldh = ldo;
    if (proj) {
      st.h = save ? ms + st.r0 * H : ws.m.data() + st.j0 * H;
      st.ldh = H;
    }
    cell.step(st);
    if (proj) {
      columns_barrier(sp);  // the projection reads every column of m
      eng.step(st.n, st.h, H, *whr, sp.range(1, 0), T(0), st.out, ldo);
    }
  }

  // A lookup layer's step: rows < ng take their projection inside the product
  // (fused), the others (all of them, unfused) are copied into G; or the gate
  // kernel adds every row's, and rows past ng, which get no product, start
  // from zero.
  void take_lookup_rows(ForwardStep<T>& st, const Split& sp) {
    if (lookup_in_gates) {
      st.x_rows = ws.proj_rows.data() + st.r0;
      for (int64_t j = st.ng; j < st.n; ++j)
        for (int64_t q = 0; q < G / H; ++q)
          std::fill(st.g + j * G + q * H + sp.a, st.g + j * G + q * H + sp.b, T(0));
      return;
    }
    const int64_t copied = fuse_lookup ? st.ng : 0;
    if (fuse_lookup) st.init = ws.proj_rows.data() + st.r0;
    const T* p = ws.proj.data();
    for (int64_t j = copied; j < st.n; ++j) {
      const T* src = p + (*lookup)[static_cast<std::size_t>(st.r0 + j)] * G;
      for (int64_t q = 0; q < G / H; ++q) {
        std::memcpy(st.g + j * G + q * H + sp.a, src + q * H + sp.a,
                    static_cast<std::size_t>(sp.b - sp.a) * sizeof(T));
      }
    }
  }

  // dst[:ng, q*H + a .. q*H + b) (+)= h_prev · W_hh[q*H + a .. q*H + b)ᵀ for each gate q.
  void hidden_product(const ForwardStep<T>& st, const Split& sp, T beta, T* dst) {
    if (st.ng == 0) return;
    const int64_t blocks = sp.nth == 1 || sp.by_rows ? 1 : G / H;
    const cpu::OperandRows* rows = hp_kept ? hp_kept.get() : hkept.get();
    if (groups) {
      eng.step_blocks(st.ng, st.h_prev, R, *whh, sp.range(G / H, 0),
                      static_cast<std::size_t>(blocks), beta, dst, G, st.init, rows, st.h_row);
    } else {  // one product per block (GemmEngine::step_blocks' own rule)
      for (int64_t q = 0; q < blocks; ++q)
        eng.step(st.ng, st.h_prev, R, *whh, sp.range(G / H, q), beta, dst, G, st.init, rows,
                 st.h_row);
    }
  }

  // A direction runs in three parts: begin() on the calling thread (the
  // input projection there may use every thread), steps() on each thread of
  // its team (run_teams: the two directions' teams side by side), finish()
  // on the calling thread again.
  // `by_rows`: the call's split (rows_split).
  void begin(int nt, bool by_rows, const Tensor& x, const Tensor& h0, const Tensor& c0,
             Tensor& out) {
    project_inputs(x);
    prepare(h0, c0, out);
    bounds_ = by_rows && nt > 1 ? row_bounds(plan.batch_sizes(), B, nt) : std::vector<int64_t>{};
  }

  void steps(const Team& team) {
    const Split sp(team, H, R, bounds_);
    for (int64_t s = 0; s < TT; ++s) step(s, sp);
  }

  void finish(RNNForwardResult& res) {
    const int64_t ld = l * o.num_directions() + d;
    final_rows(ws.hstate.data(), outp, ldo, R);
    store_state(res.h_n, ws.hstate.data(), ld, plan.sorted_indices(), R);
    cell.finish([&](T* state, const T* src, int64_t lds,
                    int64_t width) { final_rows(state, src, lds, width); },
                res.c_n, ld, plan.sorted_indices());
  }

  // state[j] = row j's values (packed rows src, stride ld) at its last step:
  // the forward direction's rows [bs[t+1], bs[t]) end at step t, the reverse
  // direction's all at step 0. A row never live keeps the state's h0 or c0.
  void final_rows(T* state, const T* src, int64_t ld, int64_t width) {
    const auto& bs = plan.batch_sizes();
    const auto& off = plan.offsets();
    for (int64_t t = 0; t < TT; ++t) {
      const int64_t hi = bs[static_cast<std::size_t>(t)];
      int64_t lo = t + 1 < TT ? bs[static_cast<std::size_t>(t + 1)] : 0;
      if (d != 0) lo = t == 0 ? 0 : hi;
      copy_rows(state + lo * width, width, src + (off[static_cast<std::size_t>(t)] + lo) * ld, ld,
                hi - lo, width);
    }
  }

 private:
  Tensor ws_gates_;               // G when nothing is saved
  std::vector<int64_t> bounds_;  // a row split's rows per thread (row_bounds)
};

// ---------------------------------------------------------------------------
// The backward.
// ---------------------------------------------------------------------------

template <typename T, typename Cell>
struct BackwardWorkspace {
  cpu::Scratch<T> dhstate, dm, dhtot, dproj;
  std::vector<T*> dproj_rows;  // LSTM lookup layer: the dP row of each packed row
  cpu::Scratch<T> dproj_parts;  // a lookup layer's row split: threads 1.. sum their dP apart
  cpu::Scratch<T> dg_step;     // two steps' dG rows, where nothing reads them past the step
  std::vector<T> db_parts;     // a row split: threads 1.. sum their bias gradients here
  Tensor dg_t, dgh_t;
  T* dg = nullptr;   // [N, G] gradient of the gate pre-activations (GRU: input side)
  T* dgh = nullptr;  // GRU: [N, G] gradient of W_h h_prev + b_h; else = dg
  // dG's rows in the form the whole-batch products read them (product_form;
  // null where they read the fp32 rows), written by the gate kernels step by
  // step while the rows are in cache: dgh_kept for the steps' products and
  // dW_hh (and, where dG is dG_h, for dW_ih and dX); GRU's dgx_kept for dW_ih
  // and dX. Without them, each of those products would convert all of dG
  // again, streaming it from memory.
  std::unique_ptr<cpu::OperandRows> dgh_kept, dgx_kept;
  typename Cell::template Workspace<T> cell;
  const cpu::OperandRows* dg_kept() const { return dgh == dg ? dgh_kept.get() : dgx_kept.get(); }

  // Written before read, as the forward's (dP is zeroed where its sums begin).
  void resize(const RNNSaved& sv) {
    const RNNOptions& o = sv.options;
    const int64_t B = sv.batch, N = sv.total_rows, H = o.hidden_size;
    const int64_t R = o.real_hidden_size(), G = o.gate_count() * H;
    const bool proj = o.proj_size > 0;
    dhstate.resize_for_overwrite(static_cast<std::size_t>(B * R));
    cell.resize(CellShape::of(o, B, N));
    dm.resize_for_overwrite(proj ? static_cast<std::size_t>(B * H) : 0);
    // Under a projection dW_hr = dHᵀ·M needs dh of every row; otherwise one step's worth.
    dhtot.resize_for_overwrite(static_cast<std::size_t>((proj ? N : B) * R));
    dg_t = cpu::pooled_empty({N, G}, o.dtype);
    dg = dg_t.template data<T>();
    if (Cell::hidden_apart) dgh_t = cpu::pooled_empty({N, G}, o.dtype);
    dgh = Cell::hidden_apart ? dgh_t.template data<T>() : dg;
    if (!sv.lookup.empty()) {
      dproj.resize_for_overwrite(static_cast<std::size_t>(sv.layers[0].input.size(0) * G));
    }
  }
};

template <typename T, typename Cell>
struct BackwardDirection {
  const RNNSaved& sv;
  const RNNOptions& o;
  const cpu::GemmEngine<T>& eng;
  BackwardWorkspace<T, Cell>& ws;
  const RNNSaved::Direction& sd;
  RNNGradients& g;
  const int64_t l, d, H, R, G, N, TT, ldo;
  const bool proj, lookup_layer, initial_state_grad;
  DirWeights<T> w;
  typename Cell::template Backward<T> cell;
  const T* dout = nullptr;  // this direction's columns of the output gradient, or null
  T *db_ih = nullptr, *db_hh = nullptr;
  // The steps' operands: the model plan's (laid_out) or this call's (own).
  const cpu::StepOperand *whh = nullptr, *whr = nullptr;
  typename BackwardPlan<T>::Direction own;
  // Whether dG lives one step at a time (ws.dg_step): a lookup layer's dW_ih
  // and dX read dP instead, and dW_hh the kept rows. Its rows stay in cache
  // instead of streaming [N, G] through memory.
  bool dg_per_step = false;
  bool row_split = false;  // the steps split by rows (else by columns)
  // Where the gate kernels write dG_h's and GRU's dG_x's rows in the engine's
  // form (its sinks into ws.dgh_kept and ws.dgx_kept, or empty).
  cpu::RowSink dgh_sink, dgx_sink;

  BackwardDirection(const RNNSaved& sv_, const cpu::GemmEngine<T>& eng_,
                    BackwardWorkspace<T, Cell>& ws_, RNNGradients& g_, int64_t l_, int64_t d_,
                    bool initial_state_grad_)
      : sv(sv_),
        o(sv_.options),
        eng(eng_),
        ws(ws_),
        sd(sv_.layers[static_cast<std::size_t>(l_)].dirs[static_cast<std::size_t>(d_)]),
        g(g_),
        l(l_),
        d(d_),
        H(o.hidden_size),
        R(o.real_hidden_size()),
        G(o.gate_count() * H),
        N(sv_.total_rows),
        TT(static_cast<int64_t>(sv_.batch_sizes.size())),
        ldo(o.output_size()),
        proj(o.proj_size > 0),
        lookup_layer(l_ == 0 && !sv_.lookup.empty()),
        initial_state_grad(initial_state_grad_),
        w(dir_weights<T>(o, sv_.weights, l_, d_)),
        cell(CellShape::of(o, sv_.batch, N), std::get<typename Cell::Saved>(sd.cell), ws.cell) {}

  // Bias gradients are summed by the gate kernels step by step (LSTM and RNN:
  // db_hh == db_ih, copied after); W_hh [G, R] and W_hr [R, H] are laid out
  // for the steps' products (by the model plan, laid_out, or here once a
  // call); dh and dc start from grad_h_n and grad_c_n.
  void prepare(int nt, const Tensor& dout_t, const Tensor& grad_h_n, const Tensor& grad_c_n,
               int64_t in, const typename BackwardPlan<T>::Direction* laid_out) {
    if (o.bias) {
      db_ih = g.weights[static_cast<std::size_t>(w.first) + 2].data<T>();
      db_hh = g.weights[static_cast<std::size_t>(w.first) + 3].data<T>();
      std::fill(db_ih, db_ih + G, T(0));
      std::fill(db_hh, db_hh + G, T(0));
    }
    if (!laid_out) {
      own = backward_step_operands<T>(o, w, eng, columns(nt), in_place_steps(TT));
      laid_out = &own;
    }
    whh = laid_out->whh.get();
    whr = laid_out->whr.get();
    ws.dgh_kept = cpu::OperandRows::make(eng.product_form(G, R, N), N, G);
    // A lookup layer's dW_ih and dX read dP, not dG.
    ws.dgx_kept = Cell::hidden_apart && !lookup_layer
                      ? cpu::OperandRows::make(eng.product_form(G, in, N), N, G)
                      : nullptr;
    dg_per_step = ws.dgh_kept && lookup_layer && !Cell::hidden_apart;
    dgh_sink = ws.dgh_kept ? ws.dgh_kept->sink() : cpu::RowSink{};
    dgx_sink = ws.dgx_kept ? ws.dgx_kept->sink() : cpu::RowSink{};
    assert(!dgh_sink.data || dgh_sink.ld == G);  // the kernels write dG's layout
    assert(!dgx_sink.data || dgx_sink.ld == G);
    if (dg_per_step) ws.dg_step.resize_for_overwrite(static_cast<std::size_t>(2 * sv.batch * G));
    const int64_t ld = l * o.num_directions() + d;
    load_state(ws.dhstate.data(), grad_h_n, ld, sv.sorted_indices, R);
    cell.start(grad_c_n, ld, sv.sorted_indices);
    dout = dout_t.defined() ? dout_t.data<T>() + d * R : nullptr;
    // Layer 0 of a lookup: dP[v] sums dg over the rows that read table row v
    // (where the gate kernel adds each row into its dP row: lookup_in_kernel;
    // else scatter_rows).
    // Under a row split each thread sums into its own dP (thread 0 into
    // ws.dproj, the others into ws.dproj_parts; two threads' rows may read
    // the same table row), zeroed and added by the team (steps()).
    if (lookup_layer) {
      if (row_split) {
        ws.dproj_parts.resize_for_overwrite(static_cast<std::size_t>((nt - 1) * table_rows() * G));
      } else {
        std::fill(ws.dproj.begin(), ws.dproj.end(), T(0));
      }
      ws.dproj_rows.resize(Cell::lookup_in_kernel ? static_cast<std::size_t>(N) : 0);
      if (ws.dproj_rows.empty()) return;
      for (int64_t t = 0; t < TT; ++t) {
        const int64_t n = sv.batch_sizes[static_cast<std::size_t>(t)];
        int tid = 0;
        for (int64_t j = 0; j < n; ++j) {
          while (row_split && j >= bounds_[static_cast<std::size_t>(tid + 1)]) ++tid;
          const auto r = static_cast<std::size_t>(sv.offsets[static_cast<std::size_t>(t)] + j);
          ws.dproj_rows[r] = dproj_of(tid) + sv.lookup[r] * G;
        }
      }
    }
  }

  int64_t table_rows() const { return sv.layers[0].input.size(0); }

  // Where thread tid of a row split sums a lookup layer's dP (thread 0, and
  // every thread of a column split: ws.dproj).
  T* dproj_of(int tid) {
    if (!row_split || tid == 0) return ws.dproj.data();
    return ws.dproj_parts.data() + (tid - 1) * table_rows() * G;
  }

  // Whether a lookup layer's steps may split by rows over nt threads: the
  // threads' own dP sums (nt - 1 tables of G columns) take no more room
  // than dG.
  static bool lookup_rows_fit(const RNNSaved& sv, int nt) {
    return (nt - 1) * sv.layers[0].input.size(0) <= sv.total_rows;
  }

  // dh of this step = upstream gradient of the output rows + what the
  // following step sent back through W_hh (or grad_h_n at the last step).
  // With no output gradient and no projection, the kernels read it where it
  // is (they only read dh; the product that overwrites it comes after them,
  // past the barrier), except a kernel that writes its direct dh_prev part
  // into the state while it reads dh (dh_prev_in_kernel): it reads a copy.
  const T* gather_dh(const BackwardStep<T>& st, const Split& sp) {
    const int64_t n = st.n, r0 = st.r0;
    const T* dhstate = ws.dhstate.data() + st.j0 * R;
    T* dht = proj ? ws.dhtot.data() + r0 * R : ws.dhtot.data() + st.j0 * R;
    if (!dout && !proj && !Cell::dh_prev_in_kernel) return dhstate;
    if (dout) {
      for (int64_t j = 0; j < n; ++j) {
        const T* x = dout + (r0 + j) * ldo;
        const T* y = dhstate + j * R;
        T* z = dht + j * R;
        for (int64_t k = sp.ra; k < sp.rb; ++k) z[k] = x[k] + y[k];
      }
    } else {
      copy_rows(dht + sp.ra, R, dhstate + sp.ra, R, n, sp.rb - sp.ra);
    }
    return dht;
  }

  // Undoes the forward's order: the forward direction walks t down here.
  void step(int64_t s, const Split& sp) {
    const int64_t t = d == 0 ? TT - 1 - s : s;
    const int64_t n = sv.batch_sizes[static_cast<std::size_t>(t)];
    const auto [j0, j1] = sp.rows(n);
    BackwardStep<T> st;
    st.cap = sv.config.kernels.isa_cap;
    st.n = j1 - j0;
    st.j0 = j0;
    st.k0 = sp.a;
    st.k1 = sp.b;
    st.r0 = sv.offsets[static_cast<std::size_t>(t)] + j0;
    // The rows that continued from the forward's previous step (the others began at t).
    st.cont = std::clamp<int64_t>(rows_after_h0(sv.batch_sizes, t, d) - j0, 0, st.n);
    if (st.cont > 0) st.r_prev = sv.offsets[static_cast<std::size_t>(d == 0 ? t - 1 : t + 1)] + j0;
    st.gates = sd.gates.template data<T>() + st.r0 * G;
    if (sd.h_prev.defined()) st.h_prev = sd.h_prev.template data<T>() + st.r0 * R;
    st.dh = gather_dh(st, sp);
    // One step's dG alternates between two buffers: a thread may start the
    // next step's kernel while another still multiplies this step's rows.
    st.dg = dg_per_step ? ws.dg_step.data() + ((s % 2) * sv.batch + j0) * G : ws.dg + st.r0 * G;
    st.dgh = Cell::hidden_apart ? ws.dgh + st.r0 * G : st.dg;
    st.dh_prev = ws.dhstate.data() + st.j0 * R;
    st.db_ih = bias_sums(sp, db_ih);
    st.db_hh = bias_sums(sp, db_hh);
    if (lookup_layer && Cell::lookup_in_kernel) st.dx_rows = ws.dproj_rows.data() + st.r0;
    st.dg_sink = dgh_sink.from_row(st.r0);
    st.dgx_sink = dgx_sink.from_row(st.r0);
    // Without grad h0, rows past ng send dh_prev nowhere.
    const int64_t ng = initial_state_grad ? n : rows_after_h0(sv.batch_sizes, t, d);
    st.ng = std::clamp<int64_t>(ng - j0, 0, st.n);
    st.ld_dh = R;
    before_product(st, sp);
    columns_barrier(sp);  // the product reads every column of dG
    product(st, sp);
  }

  // Before the product: dh through the projection (dm = dh · W_hr), then the
  // cell's math, which writes dG (and a lookup layer's dP rows).
  void before_product(BackwardStep<T>& st, const Split& sp) {
    if (proj) {
      columns_barrier(sp);  // the product reads every column of dh
      T* dm = ws.dm.data() + st.j0 * H;
      eng.step(st.n, st.dh, R, *whr, sp.range(1, 0), T(0), dm, H);
      st.dh = dm;
      st.ld_dh = H;
    }
    cell.step(st);
    if constexpr (!Cell::lookup_in_kernel) scatter_rows(st, sp);
  }

  // The product: dh_prev = dG_h · W_hh (added to the cell's direct part
  // where its kernel wrote one). (After it, nothing: the next step's dh is
  // this product.)
  void product(const BackwardStep<T>& st, const Split& sp) {
    hidden_product(st, st.dgh, Cell::dh_prev_in_kernel ? T(1) : T(0), sp);
  }

  // dh_prev[:ng, ra..rb) (+)= dgr · W_hh[:, ra..rb), dgr's rows read from
  // dgh_kept where the product takes them in its form (the kernels wrote
  // them there, rows past ng too, for dW_hh).
  void hidden_product(const BackwardStep<T>& st, const T* dgr, T beta, const Split& sp) {
    if (st.ng == 0) return;
    eng.step(st.ng, dgr, G, *whh, sp.range(1, 0), beta, ws.dhstate.data() + st.j0 * R, R, nullptr,
             ws.dgh_kept.get(), st.r0);
  }

  // Layer 0 of a lookup: dP[v] += dg of the rows that read table row v, added
  // step by step while the rows are in cache (under a row split into the
  // thread's own dP: two threads' rows may share a table row).
  void scatter_rows(const BackwardStep<T>& st, const Split& sp) {
    if (!lookup_layer) return;
    T* dp = dproj_of(sp.by_rows ? sp.tid : 0);
    for (int64_t j = 0; j < st.n; ++j) {
      T* dst = dp + sv.lookup[static_cast<std::size_t>(st.r0 + j)] * G;
      const T* src = st.dg + j * G;
      for (int64_t q = 0; q < G / H; ++q)
        for (int64_t c = q * H + sp.a; c < q * H + sp.b; ++c) dst[c] += src[c];
    }
  }

  // Where the gate kernels add the bias gradients (db_ih or db_hh): a column
  // split's threads own their columns of db; a row split's threads past the
  // first sum their rows apart (db_parts), added after the steps.
  T* bias_sums(const Split& sp, T* db) {
    if (!sp.by_rows || sp.tid == 0 || !db) return db;
    const int64_t which = db == db_hh ? 1 : 0;
    return ws.db_parts.data() + ((sp.tid - 1) * 2 + which) * G;
  }
  // After a row split's steps: threads 1.. bias gradient sums into thread 0's.
  void add_bias_parts(int nt) {
    for (int i = 0; i + 1 < nt && o.bias; ++i) {
      const T* part = ws.db_parts.data() + i * 2 * G;
      for (int64_t c = 0; c < G; ++c) db_ih[c] += part[c];
      for (int64_t c = 0; c < G && Cell::separate_db_hh; ++c) db_hh[c] += part[G + c];
    }
  }

  // A lookup layer's row split: dP of thread i (dproj_of) zeroed before its
  // steps, by thread i of a planned team (sp.by_rows), all of them by a team
  // of one (run_teams' fall-back, whose one thread walks every row).
  void zero_dproj(const Split& sp) {
    const int64_t size = table_rows() * G;
    for (int i = sp.by_rows ? sp.tid : 0; i < (sp.by_rows ? sp.tid + 1 : nt_); ++i)
      std::fill(dproj_of(i), dproj_of(i) + size, T(0));
  }

  // After the steps: dP = thread 0's + thread 1's + ... in that order (the
  // same bits whoever adds), each thread of a planned team adding its share
  // of the table's columns after the team's barrier: with V table rows the
  // sum is (nt - 1) * V * G additions, which one thread would take alone
  // while the team waited (at 8 threads a direction and the main job's table
  // of 98 rows, 351k a direction and batch).
  void add_dproj(const Split& sp) {
    const int64_t size = table_rows() * G;
    int64_t a = 0, b = size;
    if (sp.by_rows) {
      sp.barrier->wait();
      split_columns(size, sp.nth, sp.tid, a, b);
    }
    T* dp = ws.dproj.data();
    for (int i = 1; i < nt_; ++i) {
      const T* part = dproj_of(i);
      for (int64_t k = a; k < b; ++k) dp[k] += part[k];
    }
  }

  // Everything after the steps is one product (or one pass) over all rows.
  void weight_gradients(const Tensor& input) {
    const std::size_t k = static_cast<std::size_t>(w.first);
    T* dwih = g.weights[k].data<T>();
    const T* x = input.data<T>();
    const int64_t in = input.size(1);
    if (lookup_layer) {  // dW_ih = dPᵀ·table, dP summed during the steps
      eng.gemm({.m = G,
                .n = in,
                .k = input.size(0),
                .a = {.data = ws.dproj.data(), .ld = G, .trans = true},
                .b = {.data = x, .ld = in},
                .c = dwih,
                .ldc = in});
    } else {
      eng.gemm({.m = G,
                .n = in,
                .k = N,
                .a = {.data = ws.dg, .ld = G, .trans = true, .kept = ws.dg_kept()},
                .b = {.data = x, .ld = in},
                .c = dwih,
                .ldc = in});
    }
    // The rows that read h0 too (see prepare in the forward), but those
    // whose h_prev is the zero h0 of a forward given none where their dG_h
    // is finite: they add dG_hᵀ·0 = 0 (a NaN or inf in dG_h makes it NaN, as
    // in torch, and the product takes them). They are the first step's rows
    // of the forward direction (every row of a one-step batch in either
    // direction): a one-step training call's dW_hh is then zeros, no
    // product.
    const int64_t z = h0_rows_skipped();
    T* dwhh = g.weights[k + 1].data<T>();
    if (z == N) {
      std::fill(dwhh, dwhh + G * R, T(0));
    } else {
      eng.gemm({.m = G,
                .n = R,
                .k = N - z,
                .a = {.data = ws.dgh + z * G,
                      .ld = G,
                      .trans = true,
                      .kept = ws.dgh_kept.get(),
                      .kept_row = z},
                .b = {.data = sd.h_prev.defined() ? sd.h_prev.data<T>() + z * R : nullptr,
                      .ld = R,
                      .kept = sd.h_prev_kept.get(),
                      .kept_row = z},
                .c = dwhh,
                .ldc = R});
    }
    std::size_t next = k + 2;
    if (o.bias) {
      if (!Cell::separate_db_hh) std::copy(db_ih, db_ih + G, db_hh);
      next += 2;
    }
    if (proj) {
      eng.gemm({.m = R,
                .n = H,
                .k = N,
                .a = {.data = ws.dhtot.data(), .ld = R, .trans = true},
                .b = {.data = sd.m.data<T>(), .ld = H},
                .c = g.weights[next].data<T>(),
                .ldc = H});
    }
  }

  // The leading rows of dW_hh's product whose h_prev is the zero h0 and
  // whose dG_h is finite (weight_gradients): 0 where the forward had an h0,
  // or dG lives one step at a time (its full rows are not kept).
  int64_t h0_rows_skipped() const {
    if (!sv.h0_zero || dg_per_step || N == 0) return 0;
    const int64_t first = TT == 1 ? N : d == 0 ? sv.batch_sizes[0] : 0;
    return first > 0 && cpu::all_finite(ws.dgh, first * G) ? first : 0;
  }

  // The threads of a layer's steps (a direction's team), from the forward's
  // count (direction_threads): a lookup layer whose threads' own dP sums
  // would not fit (lookup_rows_fit) keeps the column split, and the column
  // split's thread count.
  static int layer_threads(int nt, const cpu::GemmEngine<T>& eng, const RNNSaved& sv,
                           bool lookup_layer) {
    const RNNOptions& o = sv.options;
    if (lookup_layer && rows_split(eng, o, sv.config, /*backward=*/true) &&
        !lookup_rows_fit(sv, nt))
      return std::min(nt, step_threads(sv.config, o.hidden_size, false, nt));
    return nt;
  }

  // Whether the steps of a layer on nt threads (layer_threads) split by rows.
  static bool splits_rows(int nt, const cpu::GemmEngine<T>& eng, const RNNSaved& sv,
                          bool lookup_layer) {
    return rows_split(eng, sv.options, sv.config, /*backward=*/true) && nt > 1 &&
           (!lookup_layer || lookup_rows_fit(sv, nt));
  }
  // The threads sharing a step's columns: the operands' split.
  int columns(int nt) const { return row_split ? 1 : nt; }

  // As the forward's: begin() and finish() on the calling thread (the weight
  // gradients' products there may use every thread), steps() on each
  // thread of the direction's team of nt (layer_threads). `laid_out`: the
  // model plan's step operands for columns(nt) threads, or null.
  void begin(int nt, const Tensor& dout_t, const Tensor& grad_h_n, const Tensor& grad_c_n,
             const Tensor& input, const typename BackwardPlan<T>::Direction* laid_out) {
    nt_ = nt;
    row_split = splits_rows(nt, eng, sv, lookup_layer);
    bounds_ = row_split ? row_bounds(sv.batch_sizes, sv.batch, nt) : std::vector<int64_t>{};
    prepare(nt, dout_t, grad_h_n, grad_c_n, input.size(1), laid_out);
    if (row_split) ws.db_parts.assign(static_cast<std::size_t>((nt - 1) * 2 * G), T(0));
  }

  void steps(const Team& team) {
    const Split sp(team, H, o.real_hidden_size(), bounds_);
    const bool dproj_parts = lookup_layer && row_split;
    if (dproj_parts) zero_dproj(sp);
    for (int64_t s = 0; s < TT; ++s) step(s, sp);
    if (dproj_parts) add_dproj(sp);
  }

  void finish(const Tensor& input) {
    if (row_split) add_bias_parts(nt_);
    if (initial_state_grad) {
      const int64_t ld = l * o.num_directions() + d;
      store_state(g.h0, ws.dhstate.data(), ld, sv.sorted_indices, R);
      cell.finish(g.c0, ld, sv.sorted_indices);
    }
    weight_gradients(input);
  }

 private:
  int nt_ = 1;
  std::vector<int64_t> bounds_;  // a row split's rows per thread (row_bounds)
};

}  // namespace seqpack::rnn
