#include "cpu/buffer_pool.h"

#include <cstdlib>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

namespace seqpack::cpu {

namespace {

// Past this many cached bytes, the blocks released longest ago are freed.
constexpr std::size_t kMaxCachedBytes = std::size_t{512} << 20;
// And past this many cached blocks (each at least kMinPooledBytes).
constexpr std::size_t kMaxCachedBlocks = 1024;
constexpr std::size_t kMinPooledBytes = std::size_t{64} << 10;

// Released blocks by size, and all of them in the order they were released:
// past the cap the oldest go, whatever their size. (Keeping the first blocks
// and freeing every later one instead filled the cache with the sizes of
// shapes a process no longer runs: after a sweep over 200 shapes, RNN(512)
// training at batch 256 over 64 steps faulted its buffers in at every call,
// 174 against 139 ms.)
struct Pool {
  struct Block {
    std::size_t bytes;
    void* p;
  };
  std::mutex mu;
  std::list<Block> released;                                                   // oldest first
  std::map<std::size_t, std::vector<std::list<Block>::iterator>> free_blocks;  // by exact size
  std::size_t cached = 0;

  void* take(std::size_t bytes, const Shape& shape, DType dtype) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = free_blocks.find(bytes);
      if (it != free_blocks.end() && !it->second.empty()) {
        const auto block = it->second.back();
        it->second.pop_back();
        void* p = block->p;
        released.erase(block);
        cached -= bytes;
        return p;
      }
    }
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw AllocationError(bytes, shape, dtype);
    return p;
  }

  void give(void* p, std::size_t bytes) {
    std::vector<void*> freed;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (bytes <= kMaxCachedBytes) {
        free_blocks[bytes].push_back(released.insert(released.end(), Block{bytes, p}));
        cached += bytes;
        p = nullptr;
      }
      while (cached > kMaxCachedBytes || released.size() > kMaxCachedBlocks) {
        const auto oldest = released.begin();
        const std::size_t size = oldest->bytes;
        auto same = free_blocks.find(size);
        // (the oldest of its size: the front of its vector)
        same->second.erase(same->second.begin());
        if (same->second.empty()) free_blocks.erase(same);
        cached -= size;
        freed.push_back(oldest->p);
        released.erase(oldest);
      }
    }
    std::free(p);
    for (void* q : freed) std::free(q);
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

std::size_t pool_max_cached_bytes() { return kMaxCachedBytes; }

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
