#include "cpu/buffer_pool.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

namespace seqpack::cpu {

namespace {

// Past this many cached bytes, released blocks are freed instead of kept.
constexpr std::size_t kMaxCachedBytes = std::size_t{512} << 20;
constexpr std::size_t kMinPooledBytes = std::size_t{64} << 10;

struct Pool {
  std::mutex mu;
  std::map<std::size_t, std::vector<void*>> free_blocks;  // by exact block size
  std::size_t cached = 0;

  void* take(std::size_t bytes, const Shape& shape, DType dtype) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = free_blocks.find(bytes);
      if (it != free_blocks.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached -= bytes;
        return p;
      }
    }
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw AllocationError(bytes, shape, dtype);
    return p;
  }

  void give(void* p, std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (cached + bytes <= kMaxCachedBytes) {
        free_blocks[bytes].push_back(p);
        cached += bytes;
        return;
      }
    }
    std::free(p);
  }
};

// Leaked on purpose: tensors holding pool storage may outlive static destruction.
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

}  // namespace

std::size_t pool_block_bytes(std::size_t bytes) {
  if (bytes < kMinPooledBytes) return 0;
  // Size classes 4, 5, 6, 7 times a power of two (at most 25% unused): a
  // training loop's batches differ in token count, so their buffers differ in
  // size from call to call, and blocks kept for an exact size were almost never
  // asked for again (each batch faulted in fresh pages while the cache filled).
  std::size_t pow2 = 1;
  while (pow2 * 8 <= bytes) pow2 *= 2;  // now 4 * pow2 <= bytes < 8 * pow2 when pow2 >= 1
  std::size_t block = 4 * pow2;
  while (block < bytes) block += pow2;
  return (block + 4095) / 4096 * 4096;
}

std::size_t pool_cached_bytes() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  return p.cached;
}

Tensor pooled_empty(Shape shape, DType dtype) {
  const std::size_t bytes = shape_nbytes(shape, dtype);
  const std::size_t rounded = pool_block_bytes(bytes);
  // Small buffers gain nothing from pooling.
  if (rounded == 0) return Tensor::empty(std::move(shape), dtype);
  void* p = pool().take(rounded, shape, dtype);
  std::shared_ptr<void> owner(p, [rounded](void* q) { pool().give(q, rounded); });
  return Tensor::wrap(p, std::move(shape), dtype, std::move(owner));
}

}  // namespace seqpack::cpu
