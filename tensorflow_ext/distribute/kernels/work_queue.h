// tensorflow_ext distribute: the state of a work queue, TF-free (the TfExtWorkQueue* kernels wrap it in a resource
// on a parameter server; tensorflow_ext/distribute/work_queue.py is the Python side).
//
// Contract
//  * Items: a queue hands out `num_epochs` passes over `slices` (non-empty strings: file names, record ranges,
//    whatever the workers' readers understand). Item i is pass i / S of slice order[i] (S slices); with `shuffle`,
//    each pass is a permutation drawn from (seed, pass) alone, so every process that builds the same queue gets the
//    same order.
//  * Every item is pending, held by one worker, or done. Take(worker, finished, now):
//     1. settles what `worker` held: done if `finished`, else pending again (the worker restarted and lost it);
//     2. puts every held item whose lease ran out (deadline < now) back to pending;
//     3. hands `worker` the first pending item (lowest index: an item put back goes out before later ones) with a
//        lease until now + lease_secs, and answers kTaken; with nothing pending it answers kWait while other workers
//        hold items (one may still be put back) and kFinished once every item is done.
//    A worker holds one item at a time: asking for the next one is what says the previous one is done.
//  * Renew(worker, now) extends the lease of what `worker` holds; false when it holds nothing (its lease ran out
//    and the item went to another worker, or it never took one).
//  * Progress: DoneMask() (one byte per item, 1 = done) and digest() are what a checkpoint keeps; a queue built
//    with the same slices, passes, shuffle and seed has the same digest and takes the mask back (MarkDone). Held
//    items are saved as not done: after a restore they are handed out again.
//  * Time is the caller's (seconds on one monotonic clock): the kernels pass the parameter server's steady clock,
//    so the workers' clocks never matter.
//  * Not thread-safe: the resource serializes every call under its mutex.

#ifndef TENSORFLOW_EXT_DISTRIBUTE_KERNELS_WORK_QUEUE_H_
#define TENSORFLOW_EXT_DISTRIBUTE_KERNELS_WORK_QUEUE_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace tfext {
namespace distribute {

enum class TakeStatus : int32_t { kTaken = 0, kWait = 1, kFinished = 2 };

struct TakeResult {
  TakeStatus status = TakeStatus::kFinished;
  int64_t item = -1;   // the item handed out (kTaken), else -1
  int64_t epoch = -1;  // its pass
  int64_t slice = -1;  // its index in `slices`
  // kWait: seconds until the earliest lease of another worker runs out (when waiting can end at the latest).
  double wait_secs = 0;
  // Workers whose leases ran out in this call (step 2), for the caller's log.
  std::vector<std::string> expired;
  // True when step 1 put back an item `worker` held without finishing it.
  bool released = false;
};

struct WorkQueueCounts {
  int64_t items = 0;
  int64_t done = 0;
  int64_t held = 0;
  int64_t pending = 0;
};

class WorkQueueState {
 public:
  // Throws std::invalid_argument naming the bad value: no slices, an empty slice, num_epochs < 1, lease_secs <= 0,
  // or more than 2^40 items.
  WorkQueueState(std::vector<std::string> slices, int64_t num_epochs, bool shuffle, uint64_t seed, double lease_secs);

  TakeResult Take(const std::string& worker, bool finished, double now);
  bool Renew(const std::string& worker, double now);

  // Marks the items whose byte is non-zero done (a restore; call on a fresh queue). Throws std::invalid_argument
  // unless mask has one byte per item.
  void MarkDone(const std::vector<uint8_t>& mask);
  std::vector<uint8_t> DoneMask() const;

  // "wq1:<16 hex digits>:<slices>x<passes>": a hash of the slices, passes, shuffle and seed (not of the lease).
  const std::string& digest() const { return digest_; }
  const std::string& slice(int64_t index) const { return slices_[index]; }
  int64_t num_slices() const { return static_cast<int64_t>(slices_.size()); }
  WorkQueueCounts counts() const;

 private:
  enum : uint8_t { kPending = 0, kHeld = 1, kDone = 2 };
  struct Lease {
    int64_t item;
    double deadline;
  };

  void PutBack(int64_t item);

  std::vector<std::string> slices_;
  int64_t num_epochs_;
  double lease_secs_;
  std::string digest_;
  std::vector<int64_t> order_;  // item -> slice index
  std::vector<uint8_t> state_;  // item -> kPending / kHeld / kDone
  // Pending items: every item >= next_ not done, and the items put back (all below next_). Kept apart so that a
  // queue of millions of items costs a byte and an index per item, not a set node.
  int64_t next_ = 0;
  std::set<int64_t> put_back_;
  std::map<std::string, Lease> held_;
  int64_t done_ = 0;
};

}  // namespace distribute
}  // namespace tfext

#endif  // TENSORFLOW_EXT_DISTRIBUTE_KERNELS_WORK_QUEUE_H_
