// CellTester: one cell of the recurrent core (src/rnn/cell_lstm.h,
// cell_gru.h, cell_rnn.h) run alone, its fast step against the float64
// reference's row math (src/reference/rnn_reference.h: cell_row_forward,
// cell_row_backward), in XNNPACK's style:
//
//   CellTester(RNNMode::lstm).batch(13).hidden(33).rows(2, 9).columns(16, 32)
//       .continuing(5).save(true).iterations(3).Test();
//
// A step of `batch` live rows, of which this thread owns rows [a, b) (a row
// split; all of them by default) and hidden units [k0, k1) of every gate (a
// column split; all by default); the first `continuing` rows continue from
// the previous step (LSTM: c_prev is that step's saved c when saving, else
// the state's), the others begin here. The tester draws the step's inputs
// (pre-activations, the hidden product, h_prev, c, the incoming gradients)
// at random, builds the cell on its own workspace and saved state, runs
// Forward::step and Backward::step, and checks
//   - the thread's rows and columns against the reference within fp_close's
//     bound (tests/test_util.h) for one step's gate math, kGateMathRoundings
//     roundings (the bias sums: plus one rounding per row summed);
//   - everything else (other rows, other columns, the state rows of other
//     threads, the padding of h's rows) unchanged, bit for bit.
// Test() runs float32 (the Highway kernels) and float64 (the scalar ones).
// A failure names the seed.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reference/rnn_reference.h"
#include "rnn/cells.h"
#include "seqpack/rnn.h"
#include "test_util.h"

namespace seqpack::testing {

class CellTester {
 public:
  explicit CellTester(RNNMode mode) : mode_(mode) {}

  CellTester& batch(int64_t v) {
    batch_ = v;
    return *this;
  }
  CellTester& hidden(int64_t v) {
    hidden_ = v;
    return *this;
  }
  CellTester& rows(int64_t a, int64_t b) {
    row0_ = a;
    row1_ = b;
    return *this;
  }
  CellTester& columns(int64_t k0, int64_t k1) {
    k0_ = k0;
    k1_ = k1;
    return *this;
  }
  CellTester& continuing(int64_t v) {
    cont_ = v;
    return *this;
  }
  CellTester& save(bool v) {
    save_ = v;
    return *this;
  }
  CellTester& bias(bool v) {
    bias_ = v;
    return *this;
  }
  CellTester& iterations(int v) {
    iterations_ = v;
    return *this;
  }
  CellTester& seed(uint64_t v) {
    seed_ = v;
    return *this;
  }

  void Test() const {
    rnn::with_cell(mode_, [&]<typename Cell>(Cell) {
      for (int it = 0; it < iterations_ && !::testing::Test::HasFatalFailure(); ++it) {
        const uint64_t seed = seed_ + static_cast<uint64_t>(it);
        TestForward<float, Cell>(seed);
        TestForward<double, Cell>(seed);
        TestBackward<float, Cell>(seed);
        TestBackward<double, Cell>(seed);
      }
    });
  }

 private:
  // The step's layout: the previous step's rows are packed rows [0, batch),
  // this step's [batch, 2 batch); state rows [0, batch).
  struct Layout {
    int64_t H, G, B, N, j0, n, k0, k1, cont, r0, r_prev;
  };

  Layout layout() const {
    Layout l;
    l.H = hidden_;
    l.G = rnn_gate_count() * hidden_;
    l.B = batch_;
    l.N = 2 * batch_;
    l.j0 = row0_ < 0 ? 0 : row0_;
    l.n = (row1_ < 0 ? batch_ : row1_) - l.j0;
    l.k0 = k0_ < 0 ? 0 : k0_;
    l.k1 = k1_ < 0 ? hidden_ : k1_;
    l.cont = std::clamp<int64_t>(cont_ - l.j0, 0, l.n);
    l.r0 = batch_ + l.j0;
    l.r_prev = l.j0;
    return l;
  }

  int64_t rnn_gate_count() const {
    return mode_ == RNNMode::lstm ? 4 : mode_ == RNNMode::gru ? 3 : 1;
  }

  rnn::CellShape shape(DType dtype) const {
    return {hidden_,    hidden_, rnn_gate_count() * hidden_, batch_,
            2 * batch_, dtype,   mode_ == RNNMode::rnn_relu};
  }

  template <typename T>
  static std::vector<T> draw(int64_t size, double bound, std::mt19937_64& gen) {
    std::uniform_real_distribution<double> u(-bound, bound);
    std::vector<T> v(static_cast<std::size_t>(size));
    for (T& x : v) x = static_cast<T>(u(gen));
    return v;
  }

  static std::string what(const char* name, uint64_t seed) {
    return std::string(name) + " (seed " + std::to_string(seed) + ")";
  }

  // Column j of gate q is this thread's.
  bool mine(const Layout& l, int64_t col) const {
    const int64_t k = col % l.H;
    return k >= l.k0 && k < l.k1;
  }

  // Compares buffer `got` with `want` (the reference where `want_ref`,
  // elsewhere the values before the step, bit for bit). Elements where
  // `checked(i)` is false must be equal to `before` bit for bit.
  template <typename T, typename F>
  void expect_step(const std::vector<T>& got, const std::vector<T>& before,
                   const std::vector<double>& want, F&& checked, int64_t roundings,
                   const char* name, uint64_t seed) const {
    std::vector<double> a, e;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (checked(static_cast<int64_t>(i))) {
        a.push_back(got[i]);
        e.push_back(want[i]);
      } else {
        ASSERT_EQ(std::memcmp(&got[i], &before[i], sizeof(T)), 0)
            << what(name, seed) << ": element " << i << " outside the thread's rows and columns "
            << "changed from " << before[i] << " to " << got[i];
      }
    }
    const int64_t m = static_cast<int64_t>(a.size());
    EXPECT_TRUE(fp_close(Tensor::from_vector(a, {m}), Tensor::from_vector(e, {m}), roundings,
                         dtype_of<T>(), what(name, seed)));
  }

  template <typename T, typename Cell>
  void TestForward(uint64_t seed) const {
    const Layout l = layout();
    const int64_t H = l.H, G = l.G, ldh = H + 3;
    std::mt19937_64 gen(seed);
    // Inputs: this thread's gate rows (pre-activations; GRU: W_i x + b_i),
    // GRU's hidden product W_h h_prev and b_hh, h_prev, c (state rows and the
    // previous step's saved rows).
    const std::vector<T> g0 = draw<T>(l.n * G, 3.0, gen);
    std::vector<T> gh = draw<T>(l.n * G, 2.0, gen);
    const std::vector<T> b_hh = draw<T>(G, 1.0, gen);
    const std::vector<T> h_prev = draw<T>(l.n * H, 1.0, gen);
    const std::vector<T> h0 = draw<T>(l.n * ldh, 1.0, gen);
    const std::vector<T> cstate0 = draw<T>(l.B * H, 2.0, gen);
    const std::vector<T> csaved0 = draw<T>(l.N * H, 2.0, gen);

    typename Cell::template Workspace<T> ws;
    const rnn::CellShape s = shape(dtype_of<T>());
    ws.resize(s);
    typename Cell::Saved saved;
    typename Cell::template Forward<T> cell(s, bias_ ? b_hh.data() : nullptr, ws,
                                            save_ ? &saved : nullptr);
    // The state rows (c0, or the rows' c) and, saving, the previous step's c.
    T* cstate = nullptr;
    T* csaved = nullptr;
    if constexpr (Cell::cell_state) {
      cstate = cell.state();
      std::copy(cstate0.begin(), cstate0.end(), cstate);
      if (save_) {
        csaved = saved.c.template data<T>();
        std::copy(csaved0.begin(), csaved0.end(), csaved);
      }
    }
    std::vector<T> g = g0, h = h0;
    std::vector<T> ghn;
    rnn::ForwardStep<T> st;
    st.cap = testing::kernels().isa_cap;  // the program's (CTest runs it under caps)
    st.n = l.n;
    st.ng = l.n;
    st.cont = l.cont;
    st.r_prev = l.r_prev;
    st.r0 = l.r0;
    st.j0 = l.j0;
    st.k0 = l.k0;
    st.k1 = l.k1;
    st.g = g.data();
    st.gh = Cell::hidden_apart ? gh.data() : g.data();
    st.h = h.data();
    st.ldh = ldh;
    st.h_prev = h_prev.data();
    cell.step(st);

    // The reference, row by row.
    std::vector<double> act(static_cast<std::size_t>(l.n * G)),
        hr(static_cast<std::size_t>(l.n * ldh));
    std::vector<double> cr(static_cast<std::size_t>(l.n * H)),
        hn(static_cast<std::size_t>(l.n * H));
    for (int64_t r = 0; r < l.n; ++r) {
      std::vector<double> gi(static_cast<std::size_t>(G)), ghr(static_cast<std::size_t>(G), 0.0);
      std::vector<double> hp(static_cast<std::size_t>(H)), cp(static_cast<std::size_t>(H));
      for (int64_t j = 0; j < G; ++j) {
        gi[j] = g0[static_cast<std::size_t>(r * G + j)];
        if (Cell::hidden_apart) {
          ghr[j] = static_cast<double>(gh[static_cast<std::size_t>(r * G + j)]) +
                   (bias_ ? static_cast<double>(b_hh[static_cast<std::size_t>(j)]) : 0.0);
        }
      }
      for (int64_t k = 0; k < H; ++k) {
        hp[k] = h_prev[static_cast<std::size_t>(r * H + k)];
        const bool from_saved = save_ && r < l.cont;
        cp[k] = from_saved ? csaved0[static_cast<std::size_t>((l.r_prev + r) * H + k)]
                           : cstate0[static_cast<std::size_t>((l.j0 + r) * H + k)];
      }
      reference::cell_row_forward(mode_, H, gi.data(), ghr.data(), hp.data(), cp.data(),
                                  act.data() + r * G, cr.data() + r * H, hr.data() + r * ldh,
                                  hn.data() + r * H);
    }
    // RNN: the gate rows hold h (the activation), not the pre-activation.
    if constexpr (!Cell::cell_state && !Cell::hidden_apart) {
      for (int64_t r = 0; r < l.n; ++r)
        for (int64_t k = 0; k < H; ++k) act[r * G + k] = hr[r * ldh + k];
    }
    const int64_t n_gm = kGateMathRoundings;
    expect_step(
        g, g0, act, [&](int64_t i) { return mine(l, i % G); }, n_gm, "gates", seed);
    expect_step(
        h, h0, hr, [&](int64_t i) { return i % ldh < H && mine(l, i % ldh); }, n_gm, "h", seed);
    if constexpr (Cell::cell_state) {
      // c: in the state rows (in place), or the step's saved rows.
      std::vector<T> got(cstate, cstate + l.B * H);
      std::vector<T> before = cstate0;
      std::vector<double> want(before.begin(), before.end());
      int64_t base = l.j0;
      if (save_) {
        got.assign(csaved, csaved + l.N * H);
        before = csaved0;
        want.assign(before.begin(), before.end());
        base = l.r0;
        // The state rows are not written when saving.
        ASSERT_TRUE(std::equal(cstate0.begin(), cstate0.end(), cstate)) << what("c state", seed);
      }
      for (int64_t r = 0; r < l.n; ++r)
        for (int64_t k = 0; k < H; ++k) want[(base + r) * H + k] = cr[r * H + k];
      expect_step(
          got, before, want,
          [&](int64_t i) { return i / H >= base && i / H < base + l.n && mine(l, i % H); }, n_gm,
          "c", seed);
    }
    if constexpr (Cell::hidden_apart) {
      if (save_) {
        const T* ghn_saved = saved.ghn.template data<T>();
        for (int64_t r = 0; r < l.n; ++r) {
          for (int64_t k = l.k0; k < l.k1; ++k) {
            const double got = ghn_saved[(l.r0 + r) * H + k], want = hn[r * H + k];
            ASSERT_LE(std::fabs(got - want),
                      2 * unit_roundoff(dtype_of<T>()) * 4 * (1 + std::fabs(want)))
                << what("ghn", seed) << " row " << r << " unit " << k;
          }
        }
      }
    }
  }

  template <typename T, typename Cell>
  void TestBackward(uint64_t seed) const {
    const Layout l = layout();
    const int64_t H = l.H, G = l.G, ld_dh = H + 2;
    std::mt19937_64 gen(seed ^ 0x5EEDULL);
    // Consistent saved values: the reference forward of random inputs, in T.
    std::vector<T> gates(static_cast<std::size_t>(l.n * G)), h_prev = draw<T>(l.n * H, 1.0, gen);
    std::vector<T> c_rows(static_cast<std::size_t>(l.N * H));  // c after each packed row's step
    std::vector<T> c0 = draw<T>(l.B * H, 2.0, gen);            // c0 of the state rows
    std::vector<T> ghn(static_cast<std::size_t>(l.N * H));
    const std::vector<T> c_prev_step = draw<T>(l.N * H, 2.0, gen);
    for (int64_t i = 0; i < l.N * H; ++i) c_rows[i] = c_prev_step[i];  // the previous step's
    std::vector<double> c_prev_ref(static_cast<std::size_t>(l.n * H));
    for (int64_t r = 0; r < l.n; ++r) {
      std::vector<double> gi(static_cast<std::size_t>(G)), ghr(static_cast<std::size_t>(G));
      std::vector<double> hp(static_cast<std::size_t>(H)), cp(static_cast<std::size_t>(H));
      std::vector<double> act(static_cast<std::size_t>(G)), c(static_cast<std::size_t>(H)),
          h(static_cast<std::size_t>(H)), hn(static_cast<std::size_t>(H));
      std::uniform_real_distribution<double> u(-3, 3);
      for (int64_t j = 0; j < G; ++j) {
        gi[j] = u(gen);
        ghr[j] = Cell::hidden_apart ? u(gen) : 0.0;
      }
      for (int64_t k = 0; k < H; ++k) {
        hp[k] = h_prev[static_cast<std::size_t>(r * H + k)];
        cp[k] = r < l.cont ? c_prev_step[static_cast<std::size_t>((l.r_prev + r) * H + k)]
                           : c0[static_cast<std::size_t>((l.j0 + r) * H + k)];
        c_prev_ref[r * H + k] = cp[k];
      }
      reference::cell_row_forward(mode_, H, gi.data(), ghr.data(), hp.data(), cp.data(), act.data(),
                                  c.data(), h.data(), hn.data());
      for (int64_t j = 0; j < G; ++j) {
        // RNN: the saved gate rows are h.
        const double v = !Cell::cell_state && !Cell::hidden_apart ? h[j] : act[j];
        gates[static_cast<std::size_t>(r * G + j)] = static_cast<T>(v);
      }
      for (int64_t k = 0; k < H; ++k) {
        c_rows[static_cast<std::size_t>((l.r0 + r) * H + k)] = static_cast<T>(c[k]);
        ghn[static_cast<std::size_t>((l.r0 + r) * H + k)] = static_cast<T>(hn[k]);
      }
    }
    const std::vector<T> dh = draw<T>(l.n * ld_dh, 1.0, gen);
    const std::vector<T> dc0 = draw<T>(l.B * H, 1.0, gen);
    const std::vector<T> dg0 = draw<T>(l.n * G, 1.0, gen), dgh0 = draw<T>(l.n * G, 1.0, gen);
    const std::vector<T> dhp0 = draw<T>(l.n * H, 1.0, gen);
    const std::vector<T> db_ih0 = draw<T>(G, 1.0, gen), db_hh0 = draw<T>(G, 1.0, gen);

    typename Cell::Saved saved;
    if constexpr (Cell::cell_state) {
      saved.c = Tensor::from_vector(std::vector<T>(c_rows), {l.N, H});
      saved.c0 = Tensor::from_vector(std::vector<T>(c0), {l.B, H});
    }
    if constexpr (Cell::hidden_apart)
      saved.ghn = Tensor::from_vector(std::vector<T>(ghn), {l.N, H});
    typename Cell::template Workspace<T> ws;
    const rnn::CellShape s = shape(dtype_of<T>());
    ws.resize(s);
    typename Cell::template Backward<T> cell(s, saved, ws);
    T* dc = nullptr;
    if constexpr (Cell::cell_state) {
      dc = cell.state();
      std::copy(dc0.begin(), dc0.end(), dc);
    }
    std::vector<T> dg = dg0, dgh = dgh0, dhp = dhp0, db_ih = db_ih0, db_hh = db_hh0;
    rnn::BackwardStep<T> st;
    st.cap = testing::kernels().isa_cap;
    st.n = l.n;
    st.ng = l.n;
    st.cont = l.cont;
    st.r_prev = l.r_prev;
    st.r0 = l.r0;
    st.j0 = l.j0;
    st.k0 = l.k0;
    st.k1 = l.k1;
    st.gates = gates.data();
    st.h_prev = h_prev.data();
    st.dh = dh.data();
    st.ld_dh = ld_dh;
    st.dg = dg.data();
    st.dgh = Cell::hidden_apart ? dgh.data() : dg.data();
    st.dh_prev = dhp.data();
    st.db_ih = bias_ ? db_ih.data() : nullptr;
    st.db_hh = bias_ ? db_hh.data() : nullptr;
    cell.step(st);

    // The reference, row by row.
    std::vector<double> dgi_r(static_cast<std::size_t>(l.n * G)),
        dgh_r(static_cast<std::size_t>(l.n * G));
    std::vector<double> dhp_r(static_cast<std::size_t>(l.n * H), 0.0);
    std::vector<double> dc_r(dc0.begin(), dc0.end());
    std::vector<double> dbi_r(db_ih0.begin(), db_ih0.end()), dbh_r(db_hh0.begin(), db_hh0.end());
    for (int64_t r = 0; r < l.n; ++r) {
      std::vector<double> act(static_cast<std::size_t>(G)), c(static_cast<std::size_t>(H)),
          hp(static_cast<std::size_t>(H)), hn(static_cast<std::size_t>(H)),
          d(static_cast<std::size_t>(H)), hsaved(static_cast<std::size_t>(H));
      for (int64_t j = 0; j < G; ++j) act[j] = gates[static_cast<std::size_t>(r * G + j)];
      for (int64_t k = 0; k < H; ++k) {
        c[k] = c_rows[static_cast<std::size_t>((l.r0 + r) * H + k)];
        hp[k] = h_prev[static_cast<std::size_t>(r * H + k)];
        hn[k] = ghn[static_cast<std::size_t>((l.r0 + r) * H + k)];
        d[k] = dh[static_cast<std::size_t>(r * ld_dh + k)];
        hsaved[k] = act[k];  // RNN: the gate rows are h
      }
      reference::cell_row_backward(mode_, H, act.data(), c.data(), c_prev_ref.data() + r * H,
                                   hp.data(), hn.data(), hsaved.data(), d.data(),
                                   dc_r.data() + (l.j0 + r) * H, dgi_r.data() + r * G,
                                   dgh_r.data() + r * G, dhp_r.data() + r * H);
      for (int64_t j = 0; j < G; ++j) {
        dbi_r[j] += dgi_r[r * G + j];
        dbh_r[j] += dgh_r[r * G + j];
      }
    }
    const int64_t n_gm = kGateMathRoundings;
    const auto col = [&](int64_t i) { return mine(l, i % G); };
    expect_step(dg, dg0, dgi_r, col, n_gm, "dG", seed);
    if constexpr (Cell::hidden_apart) {
      expect_step(dgh, dgh0, dgh_r, col, n_gm, "dG_h", seed);
      expect_step(
          dhp, dhp0, dhp_r, [&](int64_t i) { return mine(l, i % H); }, n_gm, "dh_prev", seed);
    }
    if constexpr (Cell::cell_state) {
      expect_step(
          std::vector<T>(dc, dc + l.B * H), dc0, dc_r,
          [&](int64_t i) { return i / H >= l.j0 && i / H < l.j0 + l.n && mine(l, i % H); }, n_gm,
          "dc", seed);
    }
    if (bias_) {
      expect_step(db_ih, db_ih0, dbi_r, col, n_gm + l.n, "db_ih", seed);
      if (Cell::separate_db_hh) expect_step(db_hh, db_hh0, dbh_r, col, n_gm + l.n, "db_hh", seed);
    }
  }

  RNNMode mode_;
  int64_t batch_ = 1, hidden_ = 1;
  int64_t row0_ = -1, row1_ = -1, k0_ = -1, k1_ = -1;
  int64_t cont_ = 0;
  bool save_ = false, bias_ = true;
  int iterations_ = 1;
  uint64_t seed_ = 1;
};

}  // namespace seqpack::testing
