// A map of at most `capacity` entries that drops the least recently used
// first: what every cache keyed by shapes uses, so that a process meeting
// ever new shapes (random batch sizes and lengths, a stream of new word
// lengths) keeps a bounded number of them (docs/performance.md, "Caches and
// their bounds"). A reference find() or insert() returns stays valid until
// `capacity` other keys have been inserted since its last use.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace seqpack::cpu {

// A hash of a std::tuple of integers and flags.
struct TupleHash {
  template <typename... Ts>
  std::size_t operator()(const std::tuple<Ts...>& t) const {
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    std::apply(
        [&](const auto&... v) {
          ((h = (h ^ static_cast<uint64_t>(v)) * 0x100000001B3ULL), ...);
        },
        t);
    return static_cast<std::size_t>(h);
  }
};

template <typename K, typename V, typename Hash = std::hash<K>>
class LruMap {
 public:
  explicit LruMap(std::size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The value of `key`, made the most recently used; null where absent.
  V* find(const K& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  // Inserts (or replaces) `key`, the most recently used, dropping the least
  // recently used beyond the capacity.
  V& insert(const K& key, V value) {
    if (const auto it = index_.find(key); it != index_.end()) {
      order_.erase(it->second);
      index_.erase(it);
    }
    order_.emplace_front(key, std::move(value));
    index_.emplace(key, order_.begin());
    while (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    return order_.front().second;
  }
  void clear() {
    index_.clear();
    order_.clear();
  }
  std::size_t size() const { return order_.size(); }
  std::size_t capacity() const { return capacity_; }

 private:
  std::size_t capacity_;
  std::list<std::pair<K, V>> order_;  // most recently used first
  std::unordered_map<K, typename std::list<std::pair<K, V>>::iterator, Hash> index_;
};

}  // namespace seqpack::cpu
