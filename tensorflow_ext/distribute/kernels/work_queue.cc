// tensorflow_ext distribute: WorkQueueState (contract in work_queue.h).

#include "tensorflow_ext/distribute/kernels/work_queue.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <utility>

namespace tfext {
namespace distribute {
namespace {

constexpr int64_t kMaxItems = int64_t{1} << 40;

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// FNV-1a over bytes, then mixed: the digest only tells configurations apart, it is no security measure.
void HashBytes(uint64_t* h, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    *h ^= p[i];
    *h *= 0x100000001B3ull;
  }
}

template <class T>
void HashValue(uint64_t* h, T v) {
  HashBytes(h, &v, sizeof(v));
}

std::string Digest(const std::vector<std::string>& slices, int64_t num_epochs, bool shuffle, uint64_t seed) {
  uint64_t h = 0xCBF29CE484222325ull;
  HashValue(&h, static_cast<uint64_t>(slices.size()));
  for (const std::string& s : slices) {
    HashValue(&h, static_cast<uint64_t>(s.size()));  // length-prefixed: ("ab", "c") differs from ("a", "bc")
    HashBytes(&h, s.data(), s.size());
  }
  HashValue(&h, num_epochs);
  HashValue(&h, static_cast<uint8_t>(shuffle));
  HashValue(&h, seed);
  uint64_t mix = h;
  h = SplitMix64(&mix);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "wq1:%016llx:%lldx%lld", static_cast<unsigned long long>(h),
                static_cast<long long>(slices.size()), static_cast<long long>(num_epochs));
  return buf;
}

}  // namespace

WorkQueueState::WorkQueueState(std::vector<std::string> slices, int64_t num_epochs, bool shuffle, uint64_t seed,
                               double lease_secs)
    : slices_(std::move(slices)), num_epochs_(num_epochs), lease_secs_(lease_secs) {
  if (slices_.empty()) throw std::invalid_argument("a work queue needs at least one slice, got none");
  for (size_t i = 0; i < slices_.size(); ++i) {
    // An empty string is what a worker's dataset reads as "no more work".
    if (slices_[i].empty()) throw std::invalid_argument("slice " + std::to_string(i) + " is an empty string");
  }
  if (num_epochs_ < 1) throw std::invalid_argument("num_epochs must be >= 1, got " + std::to_string(num_epochs_));
  if (!(lease_secs_ > 0) || lease_secs_ == std::numeric_limits<double>::infinity()) {
    throw std::invalid_argument("lease_secs must be a positive number of seconds, got " + std::to_string(lease_secs_));
  }
  const int64_t s = num_slices();
  if (num_epochs_ > kMaxItems / s) {
    throw std::invalid_argument(std::to_string(s) + " slices x " + std::to_string(num_epochs_) +
                                " epochs is more than 2^40 items");
  }
  digest_ = Digest(slices_, num_epochs_, shuffle, seed);
  const int64_t n = s * num_epochs_;
  order_.resize(n);
  state_.assign(n, kPending);
  for (int64_t e = 0; e < num_epochs_; ++e) {
    int64_t* pass = order_.data() + e * s;
    for (int64_t i = 0; i < s; ++i) pass[i] = i;
    if (!shuffle) continue;
    // Fisher-Yates from (seed, pass) alone: the order does not depend on what came before.
    uint64_t rng = seed ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(e + 1));
    for (int64_t i = s - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(SplitMix64(&rng) % static_cast<uint64_t>(i + 1));
      std::swap(pass[i], pass[j]);
    }
  }
}

void WorkQueueState::PutBack(int64_t item) {
  state_[item] = kPending;
  put_back_.insert(item);
}

TakeResult WorkQueueState::Take(const std::string& worker, bool finished, double now) {
  TakeResult r;
  auto mine = held_.find(worker);
  if (mine != held_.end()) {
    if (finished) {
      state_[mine->second.item] = kDone;
      ++done_;
    } else {
      PutBack(mine->second.item);
      r.released = true;
    }
    held_.erase(mine);
  }
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.deadline < now) {
      PutBack(it->second.item);
      r.expired.push_back(it->first);
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  int64_t item = -1;
  if (!put_back_.empty()) {
    item = *put_back_.begin();
    put_back_.erase(put_back_.begin());
  } else {
    const int64_t n = static_cast<int64_t>(state_.size());
    while (next_ < n && state_[next_] != kPending) ++next_;  // skips the items a restore marked done
    if (next_ < n) item = next_++;
  }
  if (item >= 0) {
    state_[item] = kHeld;
    held_[worker] = Lease{item, now + lease_secs_};
    r.status = TakeStatus::kTaken;
    r.item = item;
    r.epoch = item / num_slices();
    r.slice = order_[item];
    return r;
  }
  if (!held_.empty()) {
    double earliest = std::numeric_limits<double>::infinity();
    for (const auto& kv : held_) earliest = std::min(earliest, kv.second.deadline);
    r.status = TakeStatus::kWait;
    r.wait_secs = std::max(0.0, earliest - now);
    return r;
  }
  r.status = TakeStatus::kFinished;
  return r;
}

bool WorkQueueState::Renew(const std::string& worker, double now) {
  auto mine = held_.find(worker);
  if (mine == held_.end()) return false;
  mine->second.deadline = now + lease_secs_;
  return true;
}

void WorkQueueState::MarkDone(const std::vector<uint8_t>& mask) {
  if (mask.size() != state_.size()) {
    throw std::invalid_argument("the done mask has " + std::to_string(mask.size()) + " entries, the queue " +
                                std::to_string(state_.size()) + " items");
  }
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] == 0 || state_[i] == kDone) continue;
    if (state_[i] == kHeld) {
      for (auto it = held_.begin(); it != held_.end(); ++it) {
        if (it->second.item == static_cast<int64_t>(i)) {
          held_.erase(it);
          break;
        }
      }
    }
    put_back_.erase(static_cast<int64_t>(i));
    state_[i] = kDone;
    ++done_;
  }
}

std::vector<uint8_t> WorkQueueState::DoneMask() const {
  std::vector<uint8_t> mask(state_.size());
  for (size_t i = 0; i < state_.size(); ++i) mask[i] = state_[i] == kDone ? 1 : 0;
  return mask;
}

WorkQueueCounts WorkQueueState::counts() const {
  WorkQueueCounts c;
  c.items = static_cast<int64_t>(state_.size());
  c.done = done_;
  c.held = static_cast<int64_t>(held_.size());
  c.pending = c.items - c.done - c.held;
  return c;
}

}  // namespace distribute
}  // namespace tfext
