// The bounded map every shape-keyed cache uses (src/cpu/lru_map.h): at most
// its capacity, the least recently used dropped first, a hit making an entry
// the most recent.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "cpu/lru_map.h"

namespace seqpack {
namespace {

TEST(LruMap, HoldsAtMostItsCapacityDroppingTheLeastRecentlyUsed) {
  cpu::LruMap<int, std::string> m(3);
  m.insert(1, "a");
  m.insert(2, "b");
  m.insert(3, "c");
  ASSERT_NE(m.find(1), nullptr);  // 1 now the most recent: 2 goes next
  m.insert(4, "d");
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(m.find(2), nullptr);
  ASSERT_NE(m.find(1), nullptr);
  EXPECT_EQ(*m.find(1), "a");
  EXPECT_EQ(*m.find(3), "c");
  EXPECT_EQ(*m.find(4), "d");
}

TEST(LruMap, ManyNewKeysKeepItBounded) {
  cpu::LruMap<std::tuple<int64_t, int64_t, bool>, int64_t, cpu::TupleHash> m(256);
  for (int64_t i = 0; i < 100000; ++i) {
    m.insert({i, i % 7, i % 2 == 0}, i);
    ASSERT_LE(m.size(), 256u) << "after " << i;
  }
  EXPECT_EQ(m.size(), 256u);
  // The last 256 are the ones kept, with their values.
  for (int64_t i = 100000 - 256; i < 100000; ++i) {
    const int64_t* v = m.find({i, i % 7, i % 2 == 0});
    ASSERT_NE(v, nullptr) << i;
    EXPECT_EQ(*v, i);
  }
  EXPECT_EQ(m.find({0, 0, true}), nullptr);
}

TEST(LruMap, InsertingAKeptKeyReplacesItsValue) {
  cpu::LruMap<int, int> m(2);
  m.insert(1, 10);
  m.insert(1, 11);
  EXPECT_EQ(m.size(), 1u);
  EXPECT_EQ(*m.find(1), 11);
}

}  // namespace
}  // namespace seqpack
