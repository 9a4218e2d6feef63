// The buffer pool of the recurrent layers (src/cpu/buffer_pool.h): size
// classes, reuse of released blocks across nearby sizes, and storage that is
// large enough and never shared by two live tensors.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "cpu/buffer_pool.h"

namespace seqpack {
namespace {

TEST(BufferPool, SmallRequestsAreNotPooled) {
  EXPECT_EQ(cpu::pool_block_bytes(0), 0u);
  EXPECT_EQ(cpu::pool_block_bytes((64 << 10) - 1), 0u);
  EXPECT_GT(cpu::pool_block_bytes(64 << 10), 0u);
}

TEST(BufferPool, SizeClassesCoverTheRequestWithinAQuarter) {
  // Hand-worked classes: 4..7 times a power of two, rounded to whole pages.
  EXPECT_EQ(cpu::pool_block_bytes(64 << 10), std::size_t{64} << 10);           // 4 * 16K
  EXPECT_EQ(cpu::pool_block_bytes((64 << 10) + 1), std::size_t{80} << 10);     // 5 * 16K
  EXPECT_EQ(cpu::pool_block_bytes(100'000), std::size_t{112} << 10);           // 7 * 16K
  EXPECT_EQ(cpu::pool_block_bytes(std::size_t{1} << 20), std::size_t{1} << 20);
  EXPECT_EQ(cpu::pool_block_bytes((std::size_t{1} << 20) + 1), std::size_t{1280} << 10);
  for (std::size_t bytes = 64 << 10; bytes < (std::size_t{64} << 20); bytes = bytes * 9 / 8 + 4097) {
    SCOPED_TRACE(bytes);
    const std::size_t block = cpu::pool_block_bytes(bytes);
    EXPECT_GE(block, bytes);
    EXPECT_EQ(block % 4096, 0u);
    EXPECT_LE(static_cast<double>(block), 1.25 * static_cast<double>(bytes) + 4096);
  }
}

TEST(BufferPool, ReleasedBlockServesTheNextRequestOfItsClass) {
  // Two token counts of one size class, as consecutive training batches have.
  const int64_t cols = 1024;  // float32: 4 KiB per row
  ASSERT_EQ(cpu::pool_block_bytes(1300 * cols * 4), cpu::pool_block_bytes(1350 * cols * 4));
  const void* first = nullptr;
  {
    Tensor a = cpu::pooled_empty({1300, cols}, DType::f32);
    first = a.raw_data();
    std::memset(a.raw_data(), 1, a.nbytes());
  }
  const std::size_t cached = cpu::pool_cached_bytes();
  EXPECT_GE(cached, cpu::pool_block_bytes(1300 * cols * 4));
  Tensor b = cpu::pooled_empty({1350, cols}, DType::f32);
  EXPECT_EQ(b.raw_data(), first);
  EXPECT_EQ(b.shape(), (Shape{1350, cols}));
  std::memset(b.raw_data(), 2, b.nbytes());  // the whole request is usable (ASan checks this too)
  EXPECT_EQ(cpu::pool_cached_bytes(), cached - cpu::pool_block_bytes(1350 * cols * 4));
}

TEST(BufferPool, PastTheCapTheOldestBlocksGoAndTheNewestStay) {
  // A process that ran other shapes first (a sweep, a server): the cache
  // full of one class's blocks, then a block of another class is released.
  // It is kept, the oldest blocks make room, and the next request of its
  // class takes it from the cache rather than from the allocator.
  const int64_t cols = 1024;
  const std::size_t big = cpu::pool_block_bytes(std::size_t{8192} * cols * 4);  // 32 MiB
  const std::size_t cap = cpu::pool_max_cached_bytes();
  {
    std::vector<Tensor> held;
    for (std::size_t i = 0; i <= cap / big; ++i)
      held.push_back(cpu::pooled_empty({8192, cols}, DType::f32));
  }  // released: more than the cap
  EXPECT_LE(cpu::pool_cached_bytes(), cap);
  EXPECT_GT(cpu::pool_cached_bytes(), cap - big);
  const std::size_t small = cpu::pool_block_bytes(1300 * cols * 4);
  { Tensor t = cpu::pooled_empty({1300, cols}, DType::f32); }
  EXPECT_LE(cpu::pool_cached_bytes(), cap);
  const std::size_t cached = cpu::pool_cached_bytes();
  Tensor again = cpu::pooled_empty({1300, cols}, DType::f32);
  EXPECT_EQ(cpu::pool_cached_bytes(), cached - small) << "the released block was not kept";
}

TEST(BufferPool, LiveTensorsNeverShareABlock) {
  std::vector<Tensor> live;
  std::set<const void*> seen;
  for (int i = 0; i < 8; ++i) {
    live.push_back(cpu::pooled_empty({300 + i, 256}, DType::f32));
    EXPECT_TRUE(seen.insert(live.back().raw_data()).second) << "block reused while alive, i = " << i;
  }
  live.clear();  // all return to the pool
  for (int i = 0; i < 8; ++i) {
    live.push_back(cpu::pooled_empty({300 + i, 256}, DType::f32));
  }
  std::set<const void*> again;
  for (const Tensor& t : live) EXPECT_TRUE(again.insert(t.raw_data()).second);
}

}  // namespace
}  // namespace seqpack
