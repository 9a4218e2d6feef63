// The bf16 engine: oneDNN matmul with bf16 operands and fp32 accumulation and
// results. The operands are converted to bf16 (rounded to nearest even) right
// before each product: whole-batch operands per call, a step's rows per step
// (or none: the time loop keeps the rows it gives in bf16 already,
// cpu/operand_rows.h); the weights of a model's plan once per plan, in the
// blocked layout the primitive asks for, written by blocked_weights (W_ih
// per orientation by its first product, Bf16Weights; the step weights per
// column range). Primitives are
// created once per shape and thread and kept (creating one costs ~0.2 ms,
// fetching a cached one ~1 us); the scratchpad is the caller's (user mode),
// so two threads never share one.
// Emulated (a plan's kernels.bf16_emulated: the policy's bf16 = "emulated"), the same
// rounded operands are multiplied in fp32 instead (run_emulated), on any CPU.
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cpu/bf16.h"
#include "cpu/bf16_blocked.h"
#include "cpu/buffer_pool.h"
#include "cpu/cpu_info.h"
#include "cpu/gemm.h"
#include "cpu/gemm_bf16_rows.h"
#include "cpu/gemm_engine.h"
#include "cpu/grow_buffer.h"
#include "cpu/isa_cap.h"
#include "cpu/lru_map.h"
#include "cpu/onednn_compat.h"
#include "seqpack/tensor.h"

namespace seqpack::cpu {

// The bounds of this file's caches (docs/performance.md, "Caches and their
// bounds"): each is per thread but few_rows_k_block's (process-wide), the
// least recently used dropped first. A thread's matmul primitives: a
// training job of random batch sizes and lengths meets a new shape (a step's
// live rows) at nearly every call, and each primitive holds its JIT code
// (tens of KB, and more address space): unbounded, LSTM(8, 16) over 20,000
// random batches reached 11.8 GB of virtual memory. The steps of one batch
// of 64 sequences ask for at most a few hundred, so the bound keeps an
// epoch's repeated shapes made. The other caches hold a few hundred bytes
// an entry (a memory descriptor, a reorder of one weight shape, an int).
constexpr std::size_t kPrimitiveCacheEntries = 1024;
constexpr std::size_t kShapeCacheEntries = 256;

namespace {

// 16 values per instruction where the CPU converts natively (AVX512-BF16:
// every CPU the bf16 engine runs on natively; emulated, it runs on others).
// Highway 1.0 has no bf16 conversion with rounding, hence the intrinsic,
// compiled for that target only and called after a run-time check
// (cpu_converts_bf16).
__attribute__((target("avx512f,avx512bf16,avx512vl"))) void f32_to_bf16_native(
    const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<const __m256i&>(h));
  }
  for (; i < n; ++i) dst[i] = bf16_of(src[i]);
}

void convert_serial(const float* src, uint16_t* dst, int64_t n) {
  if (cpu_converts_bf16()) {
    f32_to_bf16_native(src, dst, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_of(src[i]);
}

// From this many values a conversion outside a parallel region uses every
// thread: a whole-batch operand (lstm-sentences' gate gradients: 1.3M
// values, converted for three products) would otherwise leave the other
// threads waiting, ~9% of a 2-thread training step.
constexpr int64_t kParallelConversion = 1 << 16;

// From this many weights a few-row product outside a parallel region splits
// its columns over every thread.
constexpr int64_t kParallelFewRows = 1 << 16;

// The rows up to which a product of laid-out weights runs on the few-row
// kernels (they read weights in place for up to kFewRows). From 2 rows
// oneDNN's kernel is faster on the same layout: the few-row kernels' 4-row
// block took 115 us for 4 x 1024 x 4096 against oneDNN's 85, 26 against 20
// for 4 x 500 x 2000 (weights in cache, Zen 5); at one row they took 76 and
// 18.5 against 81 and 20, and LSTM(1024)'s one-step calls at batch 1 ran as
// fast as on oneDNN (training 1.53-1.56x torch against 1.49-1.64x,
// inference 2.75-2.84x against 2.51-2.84x, alternating runs).
constexpr int64_t kLaidOutFewRows = 1;

// The rows up to which a product of weights read in place (a call that
// meets them first) runs on seqpack's kernels rather than laying them out
// for oneDNN's.
constexpr int64_t kInPlaceRows = 64;

}  // namespace

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  const int nt = n < kParallelConversion || omp_in_parallel() ? 1 : omp_get_max_threads();
  if (nt <= 1) {
    convert_serial(src, dst, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    // Blocks of 16 values, each thread's contiguous.
    const int64_t blocks = n / 16, tid = omp_get_thread_num(), nth = omp_get_num_threads();
    const int64_t a = blocks * tid / nth * 16;
    const int64_t b = tid + 1 == nth ? n : blocks * (tid + 1) / nth * 16;
    convert_serial(src + a, dst + a, b - a);
  }
}

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using dims = dnnl::memory::dims;

const dnnl::engine& cpu_engine() {
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// Per-thread state: a stream, bf16 staging buffers and the scratchpad.
struct ThreadState {
  dnnl::stream stream{cpu_engine()};
  GrowBuffer<uint16_t> a, b;
  GrowBuffer<uint8_t> scratch;
  GrowBuffer<float> c;    // a step's result when its columns are not all of C's
  GrowBuffer<float> a32;  // an f32 step's rows, when strided
  GrowBuffer<float> col;  // a one-column C with row stride > 1, dense (run_product)
  GrowBuffer<float> wide_a, wide_b, wide_c;  // emulated bf16 (run_emulated)
};
ThreadState& thread_state() {
  thread_local ThreadState s;
  return s;
}

// X [rows, cols] with row stride ldx to a contiguous bf16 [rows, cols]. A
// transposed operand is staged as it is stored: the primitive reads it
// through strides.
void stage(int64_t rows, int64_t cols, const float* x, int64_t ldx, GrowBuffer<uint16_t>& out) {
  uint16_t* o = out.resize(static_cast<std::size_t>(rows * cols));
  if (ldx == cols) {
    f32_to_bf16(x, o, rows * cols);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) f32_to_bf16(x + r * ldx, o + r * cols, cols);
}

// A logical [rows, cols] matrix stored with row stride ld, or (trans) stored
// as its transpose [cols, rows] with row stride ld.
dnnl::memory::desc operand_desc(int64_t rows, int64_t cols, bool trans, int64_t ld, dt type) {
  return trans ? onednn::matrix_desc(rows, cols, type, 1, ld)
               : onednn::matrix_desc(rows, cols, type, ld, 1);
}
dnnl::memory::desc bf16_desc(int64_t rows, int64_t cols, bool trans) {
  return operand_desc(rows, cols, trans, trans ? rows : cols, dt::bf16);
}

// One cached primitive: src [m, k] and weights [k, n] (stored as given, or
// transposed, with row strides lda and ldb; bf16 operands are staged
// contiguously, so their strides follow from the shape; prepared weights are
// in the blocked layout `layout` of blocked_layouts()), dst [m, n] f32 with
// row stride ldc, optional f32 bias row, beta 0 or 1 (sum post-op).
struct Key {
  int64_t m, n, k, lda, ldb, ldc;
  bool trans_a, trans_b, sum, bias, blocked, f32;
  int layout = -1;  // blocked: the weights' layout, as laid out (BlockedOperand)
  // The threads the primitive splits its work over, fixed when oneDNN makes
  // it (set by primitive(): 1 inside a parallel region, else OpenMP's
  // count), so that a product after set_num_threads gets a primitive made
  // for the new count: one made at 1 thread and run at 2 left the second
  // idle (a process that measured 1 thread first, then 2: LSTM(1024), one
  // step at batch 64, training in bf16, 6.0 ms at both counts on Zen 5).
  int threads = 0;
  bool operator==(const Key& o) const {
    return std::tie(m, n, k, lda, ldb, ldc, trans_a, trans_b, sum, bias, blocked, f32, layout,
                    threads) == std::tie(o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.trans_a, o.trans_b,
                                         o.sum, o.bias, o.blocked, o.f32, o.layout, o.threads);
  }
};

// A hash for the primitive cache: looked up on every product (each step's),
// a std::map's dozen-field comparisons down its tree cost ~0.5% of the main
// job (perf).
struct KeyHash {
  std::size_t operator()(const Key& key) const {
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    for (const int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) {
      h = (h ^ static_cast<uint64_t>(v)) * 0x100000001B3ULL;
    }
    const uint64_t flags = key.trans_a | key.trans_b << 1 | key.sum << 2 | key.bias << 3 |
                           key.blocked << 4 | key.f32 << 5 |
                           static_cast<uint64_t>(static_cast<uint32_t>(key.layout)) << 6 |
                           static_cast<uint64_t>(static_cast<uint32_t>(key.threads)) << 38;
    return static_cast<std::size_t>((h ^ flags) * 0x100000001B3ULL);
  }
};

// Primitives for which oneDNN found no optimised kernel (its reference one is
// ~1000x slower): the engines are built so that this stays 0.
std::atomic<int64_t> reference_primitives{0};
std::atomic<int64_t> primitives_made{0};

struct Primitive {
  dnnl::matmul prim;
  dnnl::memory src, wei, dst, bias, scratch;
  std::size_t scratch_bytes = 0;
  int threads = 0;  // its key's: run on them (product_threads)
};

// The blocked weights layout oneDNN's matmul picks for [k, n] of this type
// (asked once per shape and thread).
dnnl::memory::desc blocked_weights_desc(int64_t k, int64_t n, bool f32) {
  thread_local LruMap<std::tuple<int64_t, int64_t, bool>, dnnl::memory::desc, TupleHash> known(
      kShapeCacheEntries);
  if (const dnnl::memory::desc* d = known.find({k, n, f32})) return *d;
  const dt type = f32 ? dt::f32 : dt::bf16;
  const dnnl::memory::desc src({32, k}, type, tag::ab);
  const dnnl::memory::desc wei({k, n}, type, tag::any);
  const dnnl::memory::desc dst({32, n}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto pd = onednn::matmul_pd(cpu_engine(), src, wei, nullptr, dst, attr);
  return known.insert(std::make_tuple(k, n, f32), pd.weights_desc());
}

// The blocked weights layouts laid out in this process, numbered for the
// primitive cache's keys. A layout is the operand's, fixed by the thread that
// laid it out: oneDNN's choice for a shape (blocked_weights_desc) depends on
// the thread asking (its thread count, inside a parallel region or not), and
// the threads of a row split all read one operand. Each primitive is made for
// the layout its weights are in, never for the one its own thread would pick
// (bf16 rows split over 3 or more threads read garbage that way, on AVX512-BF16
// and AMX alike: device check of 2026-11-27).
class BlockedLayouts {
 public:
  int id(const dnnl::memory::desc& desc) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = 0; i < known_.size(); ++i)
      if (known_[i] == desc) return static_cast<int>(i);
    known_.push_back(desc);
    return static_cast<int>(known_.size() - 1);
  }
  dnnl::memory::desc desc(int id) {
    const std::lock_guard<std::mutex> lock(mutex_);
    return known_.at(static_cast<std::size_t>(id));
  }

 private:
  std::mutex mutex_;
  std::vector<dnnl::memory::desc> known_;
};
BlockedLayouts& blocked_layouts() {
  static BlockedLayouts layouts;
  return layouts;
}

// `layout` (of [k, n] bf16 weights) as write_pair_blocked_bf16 writes it,
// where it is one of those layouts (oneDNN's 16a<N>b2a: every layout its
// bf16 matmul has asked for on AVX512-BF16 and AMX); else the weights go
// through oneDNN's reorder.
std::optional<PairBlocking> pair_blocking(const dnnl::memory::desc& layout, int64_t k, int64_t n) {
  const onednn::Blocking b = onednn::blocking_of(layout);
  if (!b.blocked || b.padded_dims.size() != 2 || b.inner_blks.size() != 3 ||
      b.inner_idxs != dims{0, 1, 0} || b.inner_blks[0] != 16 || b.inner_blks[2] != 2) {
    return std::nullopt;
  }
  const int64_t nb = b.inner_blks[1];
  if (nb <= 0 || nb % 16 != 0) return std::nullopt;
  const int64_t tiles_k = (k + 31) / 32, tiles_n = (n + nb - 1) / nb;
  if (b.padded_dims[0] != tiles_k * 32 || b.padded_dims[1] != tiles_n * nb) return std::nullopt;
  const PairBlocking p{.n_block = nb, .tile_k_stride = b.strides[0], .tile_n_stride = b.strides[1]};
  const int64_t end = (tiles_k - 1) * p.tile_k_stride + (tiles_n - 1) * p.tile_n_stride + 32 * nb;
  if (p.tile_k_stride < 0 || p.tile_n_stride < 0 ||
      static_cast<std::size_t>(end) * sizeof(uint16_t) > layout.get_size()) {
    return std::nullopt;
  }
  return p;
}

// A product of fewer multiply-adds and fewer bytes of B than these runs on
// one thread (the rule grid.cpp's direction_threads applies to a step's
// products): oneDNN's fork and join of its threads costs more than it saves.
// A one-step training call of RNN(64) at batch 8 forked it for each of its
// 8 x 64 x 64 backward products: 66 us a call on two threads, 57 with them
// on one (alternating runs, Zen 5). Larger weights split: each thread reads its
// own share (GRU(500) at batch 1: 1.5 MB of bf16 weights for 0.75 M
// multiply-adds).
constexpr double kParallelProductMacs = 1 << 20;
constexpr int64_t kParallelProductBytes = 256 << 10;

// The threads a product of this key runs on: 1 inside a parallel region
// (the caller splits the work) or for a small product, else OpenMP's count.
int product_threads(const Key& key) {
  if (omp_in_parallel()) return 1;
  const double macs =
      static_cast<double>(key.m) * static_cast<double>(key.n) * static_cast<double>(key.k);
  if (macs < kParallelProductMacs && key.k * key.n * (key.f32 ? 4 : 2) < kParallelProductBytes)
    return 1;
  return omp_get_max_threads();
}

// OpenMP's thread count for this thread set to 1 while alive where `on` (a
// small product outside a parallel region: oneDNN takes its threads from
// it when it makes and runs a primitive), restored after.
class OneThread {
 public:
  explicit OneThread(bool on) : saved_(on && !omp_in_parallel() ? omp_get_max_threads() : 0) {
    if (saved_ > 1) omp_set_num_threads(1);
  }
  ~OneThread() {
    if (saved_ > 1) omp_set_num_threads(saved_);
  }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_;
};

Primitive make_primitive(const Key& key);

// What a primitive's making may map (its JIT code, oneDNN's own buffers),
// with room to spare: a primitive of the recurrent products took 1.4 MB of
// address space on average (1024 of them, LSTM(8, 16)).
constexpr std::size_t kPrimitiveAddressSpace = std::size_t{64} << 20;

// Whether `bytes` of address space can be mapped now (mapped, then
// unmapped: RLIMIT_AS counts even a mapping nothing may touch).
bool address_space_for(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  munmap(p, bytes);
  return true;
}

// The primitive of `asked` on this thread's threads (product_threads), made
// on first use and kept: up to kPrimitiveCacheEntries a thread, the least
// recently used dropped first.
Primitive& primitive(const Key& asked) {
  thread_local LruMap<Key, Primitive, KeyHash> cache(kPrimitiveCacheEntries);
  Key key = asked;
  key.threads = product_threads(key);
  if (Primitive* p = cache.find(key)) return *p;
  // Made (and its JIT code allocated) by oneDNN: memory that runs out there
  // is the library's out-of-memory error, as a tensor's is. oneDNN does not
  // check every mapping of its JIT code (under `ulimit -v` it wrote through
  // a failed one: SIGSEGV inside dnnl_primitive_create), so the address
  // space it needs is asked for first; where there is none, this thread's
  // primitives and oneDNN's cache of them are dropped (their code unmapped)
  // and it is asked again.
  if (!address_space_for(kPrimitiveAddressSpace)) {
    cache.clear();
    // oneDNN's own primitive cache holds them too: emptied.
    const int capacity = dnnl::get_primitive_cache_capacity();
    dnnl::set_primitive_cache_capacity(0);
    dnnl::set_primitive_cache_capacity(capacity);
    if (!address_space_for(kPrimitiveAddressSpace)) {
      throw AllocationError("cannot make oneDNN's matmul primitive for [" +
                            std::to_string(key.m) + ", " + std::to_string(key.k) + "] x [" +
                            std::to_string(key.k) + ", " + std::to_string(key.n) +
                            "]: out of memory (no " +
                            std::to_string(kPrimitiveAddressSpace >> 20) +
                            " MB of address space left for its code)");
    }
  }
  try {
    return cache.insert(key, make_primitive(key));
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_out_of_memory) throw;
    throw AllocationError("cannot make oneDNN's matmul primitive for [" + std::to_string(key.m) +
                          ", " + std::to_string(key.k) + "] x [" + std::to_string(key.k) + ", " +
                          std::to_string(key.n) + "]: out of memory");
  }
}

Primitive make_primitive(const Key& key) {
  const OneThread one(key.threads == 1);
  const dt type = key.f32 ? dt::f32 : dt::bf16;
  const dnnl::memory::desc src = operand_desc(key.m, key.k, key.trans_a, key.lda, type);
  if (key.blocked && key.layout < 0) throw std::logic_error("a blocked operand without its layout");
  const dnnl::memory::desc wei = key.blocked
                                     ? blocked_layouts().desc(key.layout)
                                     : operand_desc(key.k, key.n, key.trans_b, key.ldb, type);
  const dnnl::memory::desc dst({key.m, key.n}, dt::f32, dims{key.ldc, 1});
  const dnnl::memory::desc bias({1, key.n}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.sum) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const auto pd = onednn::matmul_pd(cpu_engine(), src, wei, key.bias ? &bias : nullptr, dst, attr);
  if (pd.weights_desc() != wei) {
    throw std::runtime_error("oneDNN matmul changed the weights layout for m = " +
                             std::to_string(key.m));
  }
  if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) {
    reference_primitives.fetch_add(1, std::memory_order_relaxed);
  }
  primitives_made.fetch_add(1, std::memory_order_relaxed);
  Primitive p;
  p.prim = dnnl::matmul(pd);
  const auto& eng = cpu_engine();
  p.src = dnnl::memory(src, eng, nullptr);
  p.wei = dnnl::memory(wei, eng, nullptr);
  p.dst = dnnl::memory(dst, eng, nullptr);
  if (key.bias) p.bias = dnnl::memory(bias, eng, nullptr);
  p.scratch_bytes = pd.scratchpad_desc().get_size();
  p.scratch = dnnl::memory(pd.scratchpad_desc(), eng, nullptr);
  p.threads = key.threads;
  return p;
}

// run() of a bf16 key on the fp32 units (emulated bf16): the operands
// widened to f32 (exact), then one plain loop whose sums run over k in
// order for every row, whatever the rows around it: the same bits for a row
// on any split of the rows, as the native engine gives (each bf16 product is
// exact in f32; only the order of the sums differs from the bf16 units').
// Blocked weights are f32 [k, n] rows already (BlockedOperand::lay_out).
void run_emulated(const Key& key, const void* src, const void* wei, float* dst, const float* bias) {
  ThreadState& ts = thread_state();
  const int64_t m = key.m, n = key.n, k = key.k;
  const auto* s16 = static_cast<const uint16_t*>(src);
  float* a = ts.wide_a.resize(static_cast<std::size_t>(m * k));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t q = 0; q < k; ++q)
      a[i * k + q] = float_of_bf16(key.trans_a ? s16[q * key.lda + i] : s16[i * key.lda + q]);
  }
  const float* b = static_cast<const float*>(wei);
  if (!key.blocked) {
    const auto* w16 = static_cast<const uint16_t*>(wei);
    float* w = ts.wide_b.resize(static_cast<std::size_t>(k * n));
    for (int64_t q = 0; q < k; ++q) {
      for (int64_t j = 0; j < n; ++j)
        w[q * n + j] = float_of_bf16(key.trans_b ? w16[j * key.ldb + q] : w16[q * key.ldb + j]);
    }
    b = w;
  }
  float* acc = ts.wide_c.resize(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(acc, acc + n, 0.0f);
    for (int64_t q = 0; q < k; ++q) {
      const float x = a[i * k + q];
      const float* row = b + q * n;
      for (int64_t j = 0; j < n; ++j) acc[j] += x * row[j];
    }
    float* d = dst + i * key.ldc;
    for (int64_t j = 0; j < n; ++j) {
      const float r = bias ? acc[j] + bias[j] : acc[j];
      d[j] = key.sum ? d[j] + r : r;
    }
  }
}

// dst[:m, :n] (+)= src·wei (+ bias); a bf16 key's products emulated in fp32
// where `emulated` (run_emulated).
void run(const Key& key, const void* src, const void* wei, float* dst, const float* bias,
         bool emulated) {
  if (!key.f32 && emulated) {
    run_emulated(key, src, wei, dst, bias);
    return;
  }
  ThreadState& ts = thread_state();
  Primitive& p = primitive(key);
  ts.scratch.resize(p.scratch_bytes);
  p.src.set_data_handle(const_cast<void*>(src));
  p.wei.set_data_handle(const_cast<void*>(wei));
  p.dst.set_data_handle(dst);
  p.scratch.set_data_handle(ts.scratch.data());
  // The C API takes the arguments as an array: no map allocated per step.
  dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, p.src.get()},
                             {DNNL_ARG_WEIGHTS, p.wei.get()},
                             {DNNL_ARG_DST, p.dst.get()},
                             {DNNL_ARG_SCRATCHPAD, p.scratch.get()},
                             {DNNL_ARG_BIAS, nullptr}};
  int nargs = 4;
  if (bias) {
    p.bias.set_data_handle(const_cast<float*>(bias));
    args[nargs++].memory = p.bias.get();
  }
  dnnl_status_t st;
  {
    const OneThread one(p.threads == 1);
    st = dnnl_primitive_execute(p.prim.get(), ts.stream.get(), nargs, args);
  }
  if (st != dnnl_success) {
    throw std::runtime_error("oneDNN matmul failed (status " + std::to_string(st) + ")");
  }
}

// run() for a whole product. A C of one column with row stride ldc > 1 is
// computed dense and copied back: oneDNN 3.7's brg_matmul (avx512_core)
// writes past that column (C[0][1] of a 3x1 product with ldc 3, found by
// tests/test_gemm_engine_sweep on Debian 13; oneDNN 2.6 does not), which would
// overwrite a neighbour's column, e.g. the other direction's in a [rows, 2H]
// buffer with H = 1.
void run_product(Key key, const void* src, const void* wei, float* c, const float* bias,
                 bool emulated) {
  if (key.n != 1 || key.ldc == 1) {
    run(key, src, wei, c, bias, emulated);
    return;
  }
  const int64_t m = key.m, ldc = key.ldc;
  float* dense = thread_state().col.resize(static_cast<std::size_t>(m));
  if (key.sum) {
    for (int64_t i = 0; i < m; ++i) dense[i] = c[i * ldc];
  }
  key.ldc = 1;
  run(key, src, wei, dense, bias, emulated);
  for (int64_t i = 0; i < m; ++i) c[i * ldc] = dense[i];
}

// The reorder of a plain [k, w] weight operand (transposed or not; f32 with
// row stride ld, or contiguous bf16 with ld 0) into the blocked layout,
// created once per shape and thread: created per call (each W_hh and W_hr,
// per layer, direction and call), its creation cost more than the reorder
// (perf: 1.1% of the main job in dnnl_primitive_create).
const dnnl::reorder& weights_reorder(int64_t k, int64_t w, bool trans, int64_t ld, int layout,
                                     const dnnl::memory& plain, const dnnl::memory& blocked) {
  thread_local LruMap<std::tuple<int64_t, int64_t, bool, int64_t, int>, dnnl::reorder, TupleHash>
      known(kShapeCacheEntries);
  const auto key = std::make_tuple(k, w, trans, ld, layout);
  if (const dnnl::reorder* r = known.find(key)) return *r;
  try {
    return known.insert(key, dnnl::reorder(plain, blocked));
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_out_of_memory) throw;
    throw AllocationError("cannot make oneDNN's reorder of [" + std::to_string(k) + ", " +
                          std::to_string(w) + "] weights: out of memory");
  }
}

// A oneDNN memory on storage from the buffer pool (cpu/buffer_pool.h), which
// it keeps: weights laid out again after every optimiser step would
// otherwise take fresh blocks from mmap each time, faulted in page by page
// (LSTM(500), one step at batch 1, training with an SGD step per call: 2.7
// ms a call against 0.9 with glibc's mmap threshold raised, Zen 5). The
// memory is a view: whatever keeps it keeps the PooledMemory.
struct PooledMemory {
  Tensor storage;
  dnnl::memory memory;
};
PooledMemory pooled_memory(const dnnl::memory::desc& desc) {
  PooledMemory m;
  m.storage = pooled_empty({static_cast<int64_t>((desc.get_size() + 7) / 8)}, DType::f64);
  m.memory = dnnl::memory(desc, cpu_engine(), m.storage.raw_data());
  return m;
}

// op(x) [k, w] (x's first column at `first`, row stride ld; transposed
// where trans) through oneDNN's reorder into `layout`: bf16 staged first.
PooledMemory reordered_weights(const float* first, bool trans, int64_t ld, int64_t k, int64_t w,
                               bool f32, const dnnl::memory::desc& layout) {
  ThreadState& ts = thread_state();
  dnnl::memory plain;
  if (f32) {
    plain = dnnl::memory(operand_desc(k, w, trans, ld, dt::f32), cpu_engine(),
                         const_cast<float*>(first));
  } else {
    stage(trans ? w : k, trans ? k : w, first, ld, ts.b);
    plain = dnnl::memory(bf16_desc(k, w, trans), cpu_engine(), ts.b.data());
  }
  // The reorder's source: key (k, w, trans, ld), ld 0 for contiguous bf16.
  bool src_trans = trans;
  int64_t src_ld = f32 ? ld : 0;
  if (trans && onednn::kReorderTransposedThroughRowMajor) {
    dnnl::memory rows(dnnl::memory::desc({k, w}, f32 ? dt::f32 : dt::bf16, tag::ab), cpu_engine());
    dnnl::reorder(plain, rows).execute(ts.stream, plain, rows);
    plain = rows;
    src_trans = false;
    src_ld = f32 ? w : 0;  // as a row-major operand of this shape
  }
  PooledMemory blocked = pooled_memory(layout);
  weights_reorder(k, w, src_trans, src_ld, blocked_layouts().id(layout), plain, blocked.memory)
      .execute(ts.stream, plain, blocked.memory);
  return blocked;
}

// op(x) [k, w] (as above) in the blocked layout oneDNN's matmul picks for
// it: bf16 written in one pass where the layout is a pair blocking
// (bf16_blocked.h), else through oneDNN's reorder; for emulated bf16, its
// values rounded to bf16 in f32 [k, w] rows (run_emulated's weights).
PooledMemory blocked_weights(const float* first, bool trans, int64_t ld, int64_t k, int64_t w,
                             bool f32, bool emulated) {
  if (!f32 && emulated) {
    // run_emulated's weights: the values rounded to bf16, in f32 [k, w] rows.
    PooledMemory rows = pooled_memory(dnnl::memory::desc({k, w}, dt::f32, tag::ab));
    auto* r = static_cast<float*>(rows.memory.get_data_handle());
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t c = 0; c < w; ++c)
        r[i * w + c] = float_of_bf16(bf16_of(trans ? first[c * ld + i] : first[i * ld + c]));
    }
    return rows;
  }
  const dnnl::memory::desc layout = blocked_weights_desc(k, w, f32);
  if (!f32) {
    if (const auto pairs = pair_blocking(layout, k, w)) {
      PooledMemory blocked = pooled_memory(layout);
      write_pair_blocked_bf16(first, trans, ld, k, w, *pairs,
                              static_cast<uint16_t*>(blocked.memory.get_data_handle()));
      return blocked;
    }
  }
  return reordered_weights(first, trans, ld, k, w, f32, layout);
}

// Columns [c0, c1) of op(b) [k, n] per range, in the primitive's blocked
// layout, each laid out on its first use (a call uses either the one-thread
// range or the per-thread ones, never both); and, for step_blocks(), a
// thread's consecutive ranges laid out together as one [k, sum of widths]
// operand (group(first, count), on its first use).
struct BlockedOperand : StepOperand {
  std::unique_ptr<StepOperand> fallback;  // the fp32 engine's operand, where bf16 does not pay
  const float* b = nullptr;
  bool trans = false, f32 = false;
  bool emulated = false;  // bf16's products emulated in fp32 (run_emulated)
  // Steps of a few rows read b where it is (prepare_in_place), else their
  // range's blocked layout (block()).
  bool in_place = false;
  int64_t ldb = 0;
  std::vector<ColumnRange> ranges;
  mutable std::vector<PooledMemory> blocks;  // one per range
  mutable std::vector<int> block_layouts;    // their layouts (blocked_layouts())
  std::unique_ptr<std::once_flag[]> ready;  // one per range
  mutable std::vector<PooledMemory> groups;  // per first range of a group
  mutable std::vector<int> group_layouts;
  std::unique_ptr<std::once_flag[]> group_ready;

  // Range r laid out, and its layout's number (for the primitive's Key).
  const dnnl::memory& block(std::size_t r) const {
    std::call_once(ready[r], [&] {
      const auto [c0, c1] = ranges[r];
      blocks[r] = lay_out(trans ? b + c0 * ldb : b + c0, c1 - c0, ldb);
      block_layouts[r] = blocked_layouts().id(blocks[r].memory.get_desc());
    });
    return blocks[r].memory;
  }
  int block_layout(std::size_t r) const {
    block(r);
    return block_layouts[r];
  }

  // Range r's columns as the few-row kernels read them for a product of
  // m rows: in place, or in the range's blocked layout where that is a pair
  // blocking and m is 1 (else none: oneDNN's kernel runs it).
  std::optional<Bf16RowsB> few_rows_b(std::size_t r, int64_t m) const {
    const auto [c0, c1] = ranges[r];
    Bf16RowsB out{.k = k, .n = c1 - c0};
    if (in_place) {
      out.w = trans ? b + c0 * ldb : b + c0;
      out.ld = ldb;
      out.trans = trans;
      return out;
    }
    if (m > kLaidOutFewRows) return std::nullopt;
    const dnnl::memory& laid = block(r);
    const auto pairs = pair_blocking(laid.get_desc(), k, c1 - c0);
    if (!pairs) return std::nullopt;
    out.laid = static_cast<const uint16_t*>(laid.get_data_handle());
    out.blocking = *pairs;
    return out;
  }

  // Ranges [first, first + count) side by side: columns of op(b) gathered
  // into one dense operand (op(b)'s layout, row stride its width), laid out.
  const dnnl::memory& group(std::size_t first, std::size_t count) const {
    std::call_once(group_ready[first], [&] {
      int64_t w = 0;
      for (std::size_t q = first; q < first + count; ++q) w += ranges[q].second - ranges[q].first;
      std::vector<float> cat(static_cast<std::size_t>(k * w));
      int64_t at = 0;
      for (std::size_t q = first; q < first + count; ++q) {
        const auto [c0, c1] = ranges[q];
        for (int64_t c = c0; c < c1; ++c, ++at) {
          for (int64_t i = 0; i < k; ++i) {
            // op(b)[i][c]: b[c][i] when transposed, else b[i][c]
            const float v = trans ? b[c * ldb + i] : b[i * ldb + c];
            if (trans) {
              cat[static_cast<std::size_t>(at * k + i)] = v;
            } else {
              cat[static_cast<std::size_t>(i * w + at)] = v;
            }
          }
        }
      }
      groups[first] = lay_out(cat.data(), w, trans ? k : w);
      group_layouts[first] = blocked_layouts().id(groups[first].memory.get_desc());
    });
    return groups[first].memory;
  }
  int group_layout(std::size_t first, std::size_t count) const {
    group(first, count);
    return group_layouts[first];
  }

 private:
  // op(x) [k, w] (x's first column at `first`, row stride ld) in the blocked
  // layout; for emulated bf16, its values rounded to bf16 in f32 [k, w] rows
  // (run_emulated's weights).
  PooledMemory lay_out(const float* first, int64_t w, int64_t ld) const {
    return blocked_weights(first, trans, ld, k, w, f32, emulated);
  }
};

// A weight matrix of a model's plan (lay_out_weights) laid out for the
// whole-batch products that multiply by it, per orientation (op(B) = Wᵀ, the
// forward's input projection; op(B) = W, the backward's dX), each made by
// the first product that reads it and kept with the plan: in the blocked
// bf16 layout the step products read (blocked_weights), so a model's calls
// neither convert W_ih per call (LSTM(1024), one step at batch 1, inference:
// converting its 4M values per call was half of the call) nor read it
// plain (oneDNN's matmul at batch 1 took 0.24 ms on plain bf16 weights of
// 1024 x 4096 and 0.09 ms on blocked ones, Zen 5, DNNL_VERBOSE).
struct Bf16Weights : WeightLayout {
  const float* source = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;  // the matrix as stored
  bool emulated = false;               // laid out for emulated bf16 (blocked_weights)
  struct Blocked {
    PooledMemory weights;
    int layout = -1;  // blocked_layouts()' number
  };
  mutable std::once_flag made[2];  // per orientation: [trans]
  mutable Blocked blocked[2];
  // Whether op(B) [k, n] is this matrix (stored at data, row stride l, read
  // transposed where trans).
  bool describes(const float* data, bool trans, int64_t k, int64_t n, int64_t l) const {
    return data == source && (trans ? n : k) == rows && (trans ? k : n) == cols && l == ld;
  }

  // op(B) [k, n] laid out, where describes(); else null.
  const Blocked* of(const float* data, bool trans, int64_t k, int64_t n, int64_t l) const {
    if (!describes(data, trans, k, n, l)) return nullptr;
    std::call_once(made[trans], [&] {
      blocked[trans].weights = blocked_weights(source, trans, ld, k, n, /*f32=*/false, emulated);
      blocked[trans].layout = blocked_layouts().id(blocked[trans].weights.memory.get_desc());
    });
    return &blocked[trans];
  }
};

}  // namespace

namespace {
// The blocks of k (values) of oneDNN's bf16 products of this shape and
// thread context whose bits the few-row kernels give: found once per shape
// by running oneDNN and the kernels on the same values, for one block and
// blocks of 512, 1024 and 2048 (oneDNN 2.6 on AVX512-BF16 sums k in blocks
// of 512, or 1024 where k > 1024; 3.7 in blocks of 512 at most shapes);
// 0 where none gives them (oneDNN then runs the products), so that a row's
// bits never depend on how many rows share its product.
int64_t few_rows_k_block(int64_t m, int64_t k, int64_t n) {
  static std::mutex mutex;
  static LruMap<std::tuple<int64_t, int64_t, int64_t, int>, int64_t, TupleHash> known(
      kShapeCacheEntries);
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const auto key = std::make_tuple(m, k, n, threads);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const int64_t* found = known.find(key)) return *found;
  }
  const int64_t found = [&]() -> int64_t {
    // Positive values, so that the sums grow with k, the weights' scaled by
    // 2^0 .. 2^-15: a pair's two products (16 significant bits each) then
    // rarely sum exactly, nor does a sum with a pair, and every order of the
    // sums gives its own bits (random values of one scale let one order
    // pass for another at some k: both exact at the block's edge).
    uint32_t state = static_cast<uint32_t>(k * 7919 + n * 104729 + m);
    const auto next = [&] {
      state = state * 1664525u + 1013904223u;
      return state >> 8;
    };
    std::vector<float> a(static_cast<std::size_t>(m * k)), w(static_cast<std::size_t>(k * n));
    for (float& x : a) x = 0.5f + static_cast<float>(next()) / static_cast<float>(1 << 25);
    for (float& x : w) {
      const uint32_t r = next();
      x = std::ldexp(0.5f + static_cast<float>(r & 0xFFFF) / static_cast<float>(1 << 17),
                     -static_cast<int>(r >> 16) % 16);
    }
    const PooledMemory laid =
        blocked_weights(w.data(), /*trans=*/false, n, k, n, /*f32=*/false, /*emulated=*/false);
    if (!pair_blocking(laid.memory.get_desc(), k, n)) return 0;
    GrowBuffer<uint16_t> a16, rows16;
    stage(m, k, a.data(), k, a16);
    std::vector<float> want(static_cast<std::size_t>(m * n)), got(want.size());
    const Key probe{m,
                    n,
                    k,
                    k,
                    0,
                    n,
                    false,
                    false,
                    false,
                    false,
                    true,
                    false,
                    blocked_layouts().id(laid.memory.get_desc())};
    run(probe, a16.data(), laid.memory.get_data_handle(), want.data(), nullptr,
        /*emulated=*/false);
    const uint16_t* rows = bf16_rows_operand(m, k, a.data(), k, nullptr, rows16);
    for (const int64_t block : {(k + 31) / 32 * 32, int64_t{512}, int64_t{1024}, int64_t{2048}}) {
      const Bf16RowsB in_place{.k = k, .n = n, .k_block = block, .w = w.data(), .ld = n};
      bf16_rows_product(m, rows, in_place, 0, n, 0.0f, got.data(), n);
      if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0) return block;
    }
    return 0;
  }();
  const std::lock_guard<std::mutex> lock(mutex);
  known.insert(key, found);
  return found;
}
}  // namespace

namespace {

// A whole-batch product's bf16 operand [rows, cols]: rows [row, row + rows)
// of the kept rows where they are bf16 rows of this width, else x (row
// stride ld) converted into buf.
const uint16_t* bf16_operand(const OperandRows* kept, int64_t row, int64_t rows, int64_t cols,
                             const float* x, int64_t ld, GrowBuffer<uint16_t>& buf) {
  if (kept && kept->form() == SinkElement::bf16 && kept->cols() == cols)
    return kept->bf16_rows(row, rows);
  stage(rows, cols, x, ld, buf);
  return buf.data();
}

// Every product through oneDNN's matmul, in f32 (operands read in place
// through their strides) or bf16 (operands converted per call; fp32
// accumulation). With `small_in_fp32`, the products too small for bf16 to pay
// (bf16_product, bf16_step) run in the fp32 engine instead: the core's bf16
// engine. Without it: oneDNN's own rate, for bench_gemm. On `kernels`: bf16
// emulated in fp32 where they say so, the few-row kernels and the fp32
// engine under their cap.
class OnednnEngine : public GemmEngine<float> {
 public:
  OnednnEngine(bool f32, bool small_in_fp32, const Kernels& kernels)
      : f32_(f32), small_in_fp32_(small_in_fp32), kernels_(kernels) {}

  void gemm(const GemmProduct<float>& p) const override {
    const GemmOperand<float>& a = p.a;
    const GemmOperand<float>& b = p.b;
    const int64_t m = p.m, n = p.n, k = p.k;
    // Weights a model's plan laid out: bf16 at any m where the weights are
    // large enough for bf16 to pay (bf16_step's rule: their layout is made
    // once, not per product).
    const auto* laid_out = f32_ ? nullptr : static_cast<const Bf16Weights*>(b.laid_out);
    // Of a few rows (a decoder step's projection and dX): the few-row
    // kernels, reading the weights where they are for a call that meets
    // them first (b.in_place: a kept plan's first call, or a call of up to
    // kFewRows rows of an in-place plan, which has no layout), else in their
    // blocked layout, made once. Read in place, the weights are not
    // converted to bf16 for the one product: a one-step call of GRU(500) or
    // LSTM(500) at batch 1 went from 0.96 and 0.85x torch's bf16 module to
    // 1.19 and 1.06x in inference (bench/step_vs_torch.py --precision bf16,
    // Zen 4); at batch 8 and 64 the panel kernel in place was slower than
    // converting W_ih for oneDNN's (LSTM(500)'s training call at batch 8:
    // 2.6 against 1.6 ms), which those keep.
    const bool in_place_only = !f32_ && !laid_out && b.in_place && m <= kFewRows;
    if ((laid_out || in_place_only) && few_rows(m) && !a.trans && n > 0 && k > 0 &&
        (bf16_step(k, n) || bf16_product(m, n, k)) &&
        (in_place_only || laid_out->describes(b.data, b.trans, k, n, b.ld))) {
      Bf16RowsB rows{.k = k, .n = n, .k_block = few_rows_k_block(m, k, n)};
      std::optional<PairBlocking> pairs;
      if (rows.k_block == 0) {
        // oneDNN's own order here: its blocked product below.
      } else if (b.in_place) {
        rows.w = b.data;
        rows.ld = b.ld;
        rows.trans = b.trans;
      } else if (m > kLaidOutFewRows) {
        // oneDNN's kernel: its blocked product below.
      } else if (const auto* laid = laid_out->of(b.data, b.trans, k, n, b.ld);
                 (pairs = pair_blocking(laid->weights.memory.get_desc(), k, n))) {
        rows.laid = static_cast<const uint16_t*>(laid->weights.memory.get_data_handle());
        rows.blocking = *pairs;
      }
      if (rows.w || rows.laid) {
        few_rows_gemm(p, rows);
        return;
      }
    }
    const Bf16Weights::Blocked* blocked =
        laid_out && !a.trans && m > 0 && n > 0 && k > 0 &&
                (bf16_step(k, n) || bf16_product(m, n, k) || !small_in_fp32_)
            ? laid_out->of(b.data, b.trans, k, n, b.ld)
            : nullptr;
    if (blocked) {
      ThreadState& ts = thread_state();
      const uint16_t* a16 = bf16_operand(a.kept, a.kept_row, m, k, a.data, a.ld, ts.a);
      // A strided C goes through a dense one, as step() does: with blocked
      // weights oneDNN has only its reference kernel for a strided
      // destination (GemmEngine.LaidOutWeightsGiveTheSameProducts counts).
      const bool strided = p.ldc != n;
      float* out = strided ? ts.c.resize(static_cast<std::size_t>(m * n)) : p.c;
      const bool sum = !strided && !p.c_row && p.beta != 0.0f, bias = p.c_row != nullptr;
      const Key key{m, n, k, k, 0, n, false, false, sum, bias, true, false, blocked->layout};
      run_product(key, a16, blocked->weights.memory.get_data_handle(), out, p.c_row, emulated());
      if (strided) put_columns(m, out, n, n, p.c_row ? 0.0f : p.beta, p.c, p.ldc);
      return;
    }
    // A weight gradient of a few rows (dGᵀ·X, k the batch of a decoder
    // step) writes C more than it multiplies: the fp32 engine writes it
    // once from registers (gemm_few_terms) at 2-5x oneDNN's bf16 rate for
    // k <= 4 (bench_gemm BM_batch m 1024, n 1024, Zen 5).
    const bool few_terms = a.trans && !b.trans && k <= kFewTerms;
    if (small_in_fp32_ && (few_terms || !bf16_product(m, n, k))) {
      // The fp32 engine's product, its routes included (a decoder step's
      // weight gradients, k = batch <= 4, as passes over dW: two of oneDNN's
      // 1024 x 1 x 1024 products took 0.36 of a 0.61 ms one-step training
      // call of an RNN(1024) at batch 1 on Zen 5, DNNL_VERBOSE). Its rows
      // are read as they are (product_form: none), its weights too.
      gemm_engine_f32(Precision::fp32, kernels_).gemm(p);
      return;
    }
    if (f32_) {
      onednn_gemm_f32(a.trans, b.trans, m, n, k, a.data, a.ld, b.data, b.ld, p.beta, p.c, p.ldc,
                      p.c_row);
      return;
    }
    if (m == 0 || n == 0) return;
    if (k == 0) {  // nothing to multiply: cpu::gemm's handling of C
      cpu::gemm<float>(a.trans, b.trans, m, n, k, 1.0f, a.data, a.ld, b.data, b.ld, p.beta, p.c,
                       p.ldc, kernels_.isa_cap, p.c_row);
      return;
    }
    ThreadState& ts = thread_state();
    const uint16_t* a16 =
        bf16_operand(a.kept, a.kept_row, a.trans ? k : m, a.trans ? m : k, a.data, a.ld, ts.a);
    const uint16_t* b16 =
        bf16_operand(b.kept, b.kept_row, b.trans ? n : k, b.trans ? k : n, b.data, b.ld, ts.b);
    const Key key{m,       n,       k, a.trans ? m : k, b.trans ? k : n, p.ldc, a.trans,
                  b.trans, !p.c_row && p.beta != 0.0f, p.c_row != nullptr, false, false};
    run_product(key, a16, b16, p.c, p.c_row, emulated());
  }

  // bf16: B in the blocked bf16 layout per orientation, each made by the
  // first product that reads it (Bf16Weights); the step products lay their
  // weights out in prepare().
  std::unique_ptr<WeightLayout> lay_out_weights(const float* b, bool trans_b, int64_t k, int64_t n,
                                                int64_t ldb) const override {
    if (f32_) return nullptr;
    auto w = std::make_unique<Bf16Weights>();
    w->source = b;
    w->rows = trans_b ? n : k;
    w->cols = trans_b ? k : n;
    w->ld = ldb;
    w->emulated = emulated();
    return w;
  }

  // (Asked for the weight gradients' shapes, dGᵀ·X with k the rows: where
  // those run in the fp32 engine, few terms or small, their rows stay fp32.)
  SinkElement product_form(int64_t m, int64_t n, int64_t k) const override {
    if (f32_ || (small_in_fp32_ && (k <= kFewTerms || !bf16_product(m, n, k))))
      return SinkElement::none;
    return SinkElement::bf16;
  }

  SinkElement step_form(const StepOperand& b) const override {
    if (f32_ || static_cast<const BlockedOperand&>(b).fallback) return SinkElement::none;
    return SinkElement::bf16;
  }

  std::unique_ptr<StepOperand> prepare(const float* b, bool trans_b, int64_t k, int64_t n,
                                       int64_t ldb,
                                       const std::vector<ColumnRange>& ranges,
                                       const WeightLayout*) const override {
    return operand(b, trans_b, k, n, ldb, ranges, /*in_place=*/false);
  }

  // Steps of a few rows read b where it is (the few-row kernels, or the
  // fp32 engine's in-place products where bf16 does not pay); steps of more
  // lay their ranges out as prepare()'s do.
  std::unique_ptr<StepOperand> prepare_in_place(const float* b, bool trans_b, int64_t k, int64_t n,
                                                int64_t ldb, const std::vector<ColumnRange>& ranges,
                                                const WeightLayout*) const override {
    return operand(b, trans_b, k, n, ldb, ranges, /*in_place=*/true);
  }

  std::unique_ptr<StepOperand> operand(const float* b, bool trans_b, int64_t k, int64_t n,
                                       int64_t ldb, const std::vector<ColumnRange>& ranges,
                                       bool in_place) const {
    auto op = std::make_unique<BlockedOperand>();
    op->k = k;
    op->n = n;
    op->ranges = ranges;
    if (!f32_ && small_in_fp32_ && !bf16_step(k, n)) {
      const GemmEngine<float>& fp32 = gemm_engine_f32(Precision::fp32, kernels_);
      op->fallback = in_place ? fp32.prepare_in_place(b, trans_b, k, n, ldb, ranges)
                              : fp32.prepare(b, trans_b, k, n, ldb, ranges);
      return op;
    }
    op->b = b;
    op->trans = trans_b;
    op->f32 = f32_;
    op->emulated = emulated();
    op->ldb = ldb;
    op->in_place = in_place;
    op->blocks.resize(ranges.size());
    op->block_layouts.assign(ranges.size(), -1);
    op->group_layouts.assign(ranges.size(), -1);
    op->ready = std::make_unique<std::once_flag[]>(ranges.size());
    op->groups.resize(ranges.size());
    op->group_ready = std::make_unique<std::once_flag[]>(ranges.size());
    return op;
  }

  void step(int64_t m, const float* a, int64_t lda, const StepOperand& sb, std::size_t range,
            float beta, float* c, int64_t ldc, const float* const* init, const OperandRows* rows,
            int64_t row) const override {
    const auto& op = static_cast<const BlockedOperand&>(sb);
    if (op.fallback) {
      gemm_engine_f32(Precision::fp32, kernels_)
          .step(m, a, lda, *op.fallback, range, beta, c, ldc, nullptr);
      return;
    }
    const auto [c0, c1] = op.ranges[range];
    if (m == 0 || c1 <= c0) return;
    ThreadState& ts = thread_state();
    if (few_rows(m)) {
      auto b16 = op.few_rows_b(range, m);
      if (b16 && (b16->k_block = few_rows_k_block(m, op.k, c1 - c0)) > 0) {
        const uint16_t* a16 =
            bf16_rows_operand(m, op.k, a, lda, kept_bf16(rows, row, m, op.k), ts.a);
        bf16_rows_product(m, a16, *b16, 0, c1 - c0, beta, c + c0, ldc);
        return;
      }
    }
    const void* src = step_source(op, m, a, lda, rows, row);
    lda = op.k;
    const int64_t w = c1 - c0;
    if (w == ldc) {
      const Key key{m,     w,     op.k,           lda,   0,    ldc,  false,
                    false, beta != 0.0f, false, true, f32_, op.block_layout(range)};
      run(key, src, op.block(range).get_data_handle(), c + c0, nullptr, op.emulated);
      return;
    }
    // A thread's share of C's columns: oneDNN's brgemm matmul takes only a
    // dense destination (a strided one falls back to its reference kernel,
    // ~1000x slower), so the product goes to a dense buffer first.
    ts.c.resize(static_cast<std::size_t>(m * w));
    const Key key{m,     w,     op.k,  lda,  0,    w,  false,
                  false, false, false, true, f32_, op.block_layout(range)};
    run(key, src, op.block(range).get_data_handle(), ts.c.data(), nullptr, op.emulated);
    put_columns(m, ts.c.data(), w, w, beta, c + c0, ldc);
  }

  void step_blocks(int64_t m, const float* a, int64_t lda, const StepOperand& sb,
                   std::size_t first, std::size_t count, float beta, float* c, int64_t ldc,
                   const float* const* init, const OperandRows* rows,
                   int64_t row) const override {
    const auto& op = static_cast<const BlockedOperand&>(sb);
    // Steps seqpack's kernels may run (step()) go range by range, as do
    // laid-out steps of up to kFewRows rows.
    if (count <= 1 || op.fallback ||
        (few_rows(m) && (op.in_place || m <= kFewRows))) {
      GemmEngine<float>::step_blocks(m, a, lda, sb, first, count, beta, c, ldc, init, rows, row);
      return;
    }
    int64_t w = 0;
    for (std::size_t q = first; q < first + count; ++q)
      w += op.ranges[q].second - op.ranges[q].first;
    if (m == 0 || w == 0) return;
    ThreadState& ts = thread_state();
    const void* src = step_source(op, m, a, lda, rows, row);
    ts.c.resize(static_cast<std::size_t>(m * w));
    const Key key{m,     w,     op.k,  op.k, 0,    w,  false,
                  false, false, false, true, f32_, op.group_layout(first, count)};
    run(key, src, op.group(first, count).get_data_handle(), ts.c.data(), nullptr, op.emulated);
    // Each range's columns to their place in C.
    int64_t at = 0;
    for (std::size_t q = first; q < first + count; ++q) {
      const auto [c0, c1] = op.ranges[q];
      put_columns(m, ts.c.data() + at, w, c1 - c0, beta, c + c0, ldc);
      at += c1 - c0;
    }
  }

  // A column share costs one call per gate block, each staging the rows
  // again and going through a dense buffer (above); a row share is one call
  // per thread straight into C's rows, but each thread then reads all of B
  // every step: rows while B takes at most half of a core's L2 (Zen 4: 1 MB).
  // lstm-sentences' W_hh (256 x 1024 bf16, 512 KB) runs 2 threads at 1.9x
  // one by rows, 1.6x by columns; lstm-long-tail's (512 x 2048, 2 MB) at
  // 1.5x by rows, 1.75x by columns (each thread's half stays in its L2).
  bool steps_by_rows(int64_t k, int64_t n, bool) const override {
    return fits_row_split(k, n, f32_ ? 4 : 2);
  }

 private:
  // dst[:m, :width) = p[:m, :width) (row strides ldp, ldc), or += where beta != 0:
  // a dense product's columns to their place in C.
  static void put_columns(int64_t m, const float* p, int64_t ldp, int64_t width, float beta,
                          float* dst, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i, p += ldp, dst += ldc) {
      if (beta != 0.0f) {
        for (int64_t j = 0; j < width; ++j) dst[j] += p[j];
      } else {
        std::memcpy(dst, p, static_cast<std::size_t>(width) * sizeof(float));
      }
    }
  }

  // A step's A rows, dense (brgemm has no kernel for some strided sources,
  // e.g. f32 with k = 64): the caller's bf16 rows where given, else bf16
  // staging makes them so; f32 copies them if needed.
  const void* step_source(const BlockedOperand& op, int64_t m, const float* a, int64_t lda,
                          const OperandRows* rows, int64_t row) const {
    ThreadState& ts = thread_state();
    if (!f32_ && rows && rows->form() == SinkElement::bf16 && rows->cols() == op.k)
      return rows->bf16_rows(row, m);
    if (!f32_) {
      stage(m, op.k, a, lda, ts.a);
      return ts.a.data();
    }
    if (lda == op.k) return a;
    float* dense = ts.a32.resize(static_cast<std::size_t>(m * op.k));
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(dense + i * op.k, a + i * lda, static_cast<std::size_t>(op.k) * sizeof(float));
    return dense;
  }

  // Whether a product of m rows may run on the few-row kernels
  // (cpu/gemm_bf16_rows.h): the core's bf16 engine, natively; each shape
  // where they give oneDNN's bits (few_rows_k_block).
  bool few_rows(int64_t m) const {
    return !f32_ && small_in_fp32_ && m >= 1 && m <= kInPlaceRows && bf16_rows_available(kernels_);
  }

  // Whether its bf16 products run emulated in fp32 (run_emulated).
  bool emulated() const { return !f32_ && kernels_.bf16_emulated; }

  // The caller's bf16 rows [row, row + m) of width k where it gives them.
  static const uint16_t* kept_bf16(const OperandRows* rows, int64_t row, int64_t m, int64_t k) {
    return rows && rows->form() == SinkElement::bf16 && rows->cols() == k ? rows->bf16_rows(row, m)
                                                                          : nullptr;
  }

  // p (A not transposed, few_rows(p.m)) on the few-row kernels with B as
  // `b` gives it; the columns split over the threads outside a parallel
  // region where B is large (each column's bits are the same on any split).
  static void few_rows_gemm(const GemmProduct<float>& p, const Bf16RowsB& b) {
    const uint16_t* a16 = bf16_rows_operand(
        p.m, p.k, p.a.data, p.a.ld, kept_bf16(p.a.kept, p.a.kept_row, p.m, p.k), thread_state().a);
    const int nt = omp_in_parallel() || p.k * p.n < kParallelFewRows ? 1 : omp_get_max_threads();
    if (nt <= 1) {
      bf16_rows_product(p.m, a16, b, 0, p.n, p.beta, p.c, p.ldc, p.c_row);
      return;
    }
    const int64_t blocks = (p.n + 63) / 64;
#pragma omp parallel num_threads(nt)
    {
      const int64_t tid = omp_get_thread_num(), nth = omp_get_num_threads();
      const int64_t j0 = blocks * tid / nth * 64;
      const int64_t j1 = std::min(p.n, blocks * (tid + 1) / nth * 64);
      if (j0 < j1) bf16_rows_product(p.m, a16, b, j0, j1, p.beta, p.c, p.ldc, p.c_row);
    }
  }

  bool f32_, small_in_fp32_;
  Kernels kernels_;
};

// The engine of these flags on `kernels`, made on first use and kept (one
// per setting that changes its products: the cap, bf16's emulation).
const OnednnEngine& onednn_engine_of(bool f32, bool small_in_fp32, const Kernels& kernels) {
  static std::mutex mutex;
  static std::map<std::tuple<bool, bool, int, bool>, std::unique_ptr<OnednnEngine>> made;
  Kernels k = kernels;
  k.int8 = Kernels::Int8::automatic;  // not read here
  if (f32) k.bf16_emulated = false;
  const auto key =
      std::make_tuple(f32, small_in_fp32, static_cast<int>(k.isa_cap), k.bf16_emulated);
  const std::lock_guard<std::mutex> lock(mutex);
  auto& engine = made[key];
  if (!engine) engine = std::make_unique<OnednnEngine>(f32, small_in_fp32, k);
  return *engine;
}

}  // namespace

int64_t bf16_few_rows_k_block(int64_t m, int64_t k, int64_t n, const Kernels& kernels) {
  return bf16_rows_available(kernels) && m >= 1 && m <= kInPlaceRows && k > 0 && n > 0
             ? few_rows_k_block(m, k, n)
             : 0;
}

int64_t onednn_reference_primitives() { return reference_primitives.load(); }
int64_t onednn_primitives_made() { return primitives_made.load(); }

bool bf16_product(int64_t m, int64_t n, int64_t k) {
  return static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) >= 2097152.0;
}
bool bf16_step(int64_t k, int64_t n) { return k * n > 8192; }

void onednn_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                     const float* c_row) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // (k = 0: C's rows only, no kernel)
    cpu::gemm<float>(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc,
                     IsaLevel::avx512, c_row);
    return;
  }
  // A one-row operand with strided elements (A transposed with m = 1, B
  // transposed with k = 1): where oneDNN describes it
  // row-major (onednn_compat.h) it has no optimised kernel, so it is copied dense.
  if (onednn::kOneRowOperandsRowMajor) {
    ThreadState& ts = thread_state();
    if (trans_a && m == 1 && lda != 1) {
      float* dense = ts.a32.resize(static_cast<std::size_t>(k));
      for (int64_t i = 0; i < k; ++i) dense[i] = a[i * lda];
      a = dense;
      lda = 1;
    }
    if (trans_b && k == 1 && ldb != 1) {
      float* dense = ts.c.resize(static_cast<std::size_t>(n));
      for (int64_t j = 0; j < n; ++j) dense[j] = b[j * ldb];
      b = dense;
      ldb = 1;
    }
  }
  const Key key{m,       n,       k, lda, ldb, ldc, trans_a,
                trans_b, !c_row && beta != 0.0f, c_row != nullptr, false, true};
  run_product(key, a, b, c, c_row, /*emulated=*/false);
}

Bf16LayoutsForTest bf16_layouts_for_test(const float* b, bool trans, int64_t k, int64_t n,
                                         int64_t ld, int64_t n_block) {
  Bf16LayoutsForTest out;
  dnnl::memory::desc layout;
  if (n_block == 0) {
    layout = blocked_weights_desc(k, n, /*f32=*/false);
  } else {
    const std::map<int64_t, tag> pairs{
        {16, tag::BA16a16b2a}, {32, tag::BA16a32b2a}, {48, tag::BA16a48b2a}, {64, tag::BA16a64b2a}};
    const auto it = pairs.find(n_block);
    if (it == pairs.end()) {
      throw std::invalid_argument("n_block " + std::to_string(n_block) + ": 0, 16, 32, 48 or 64");
    }
    layout = dnnl::memory::desc({k, n}, dt::bf16, it->second);
  }
  const std::size_t size = layout.get_size() / sizeof(uint16_t);
  const PooledMemory reordered = reordered_weights(b, trans, ld, k, n, /*f32=*/false, layout);
  const auto* r = static_cast<const uint16_t*>(reordered.memory.get_data_handle());
  out.onednn.assign(r, r + size);
  const auto pairs = pair_blocking(layout, k, n);
  out.pair_blocked = pairs.has_value();
  if (pairs) {
    // Filled with NaN's bits first: an element the writers skip shows.
    out.written.assign(size, 0xFFFF);
    out.reference.assign(size, 0xFFFF);
    write_pair_blocked_bf16(b, trans, ld, k, n, *pairs, out.written.data());
    write_pair_blocked_bf16_reference(b, trans, ld, k, n, *pairs, out.reference.data());
  }
  return out;
}

const GemmEngine<float>& onednn_bf16_engine(const Kernels& kernels) {
  return onednn_engine_of(/*f32=*/false, /*small_in_fp32=*/true, kernels);
}

const GemmEngine<float>& onednn_engine(Precision precision, const Kernels& kernels) {
  if (precision == Precision::bf16) {
    require_bf16_dot_products(kernels);
    return onednn_engine_of(/*f32=*/false, /*small_in_fp32=*/false, kernels);
  }
  return onednn_engine_of(/*f32=*/true, /*small_in_fp32=*/false, kernels);
}

}  // namespace seqpack::cpu
