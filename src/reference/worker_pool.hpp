// Internal: the reference engine's worker pool (forward and backward): how many threads a call
// gets, and running a list of independent work items on them with the first error rethrown.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace blasst::detail {

// Threads for n_items work items: num_threads (RunOptions; 0 = one per hardware thread), clamped
// to 4 per hardware thread and 1024 (more only cost memory and thread creation:
// docs/reference.md) and to the number of items.
inline unsigned worker_count(long long num_threads, std::size_t n_items) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const unsigned max_threads = std::min(1024u, 4 * hw);
  unsigned n = num_threads > 0 ? static_cast<unsigned>(std::min<long long>(num_threads, max_threads)) : hw;
  return static_cast<unsigned>(std::min<std::size_t>(n, std::max<std::size_t>(n_items, 1)));
}

// The shared item counter: take(i) hands out the next item index, false when none is left.
class WorkQueue {
 public:
  explicit WorkQueue(std::size_t n) : n_(n) {}
  bool take(std::size_t& i) { return (i = next_.fetch_add(1)) < n_; }
  void drain() { next_.store(n_); }

 private:
  std::atomic<std::size_t> next_{0};
  std::size_t n_;
};

// Runs worker(w, queue) on nthreads workers (w = 0 is the calling thread); each takes items from
// the queue until it is empty. The first exception stops the others (the queue is drained) and is
// rethrown after every helper joined. A helper that cannot be created (out of threads or memory:
// std::system_error) ends the spawning: the items are shared through the queue, so the workers
// already running (at least the caller) do them all and the result is the same.
template <class Worker>
void run_workers(unsigned nthreads, std::size_t n_items, Worker&& worker) {
  WorkQueue queue(n_items);
  std::exception_ptr err;
  std::mutex err_mu;
  auto guarded = [&](unsigned w) {
    try {
      worker(w, queue);
    } catch (...) {
      std::lock_guard<std::mutex> lk(err_mu);
      if (!err) err = std::current_exception();
      queue.drain();
    }
  };
  {
    std::vector<std::thread> helpers;
    helpers.reserve(nthreads > 0 ? nthreads - 1 : 0);
    struct JoinAll {
      std::vector<std::thread>& threads;
      ~JoinAll() {
        for (auto& x : threads) x.join();
      }
    } join_all{helpers};
    for (unsigned w = 1; w < nthreads; ++w) {
      try {
        helpers.emplace_back(guarded, w);
      } catch (const std::system_error&) {
        break;
      }
    }
    guarded(0);
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace blasst::detail
