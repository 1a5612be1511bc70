// A small pool for the kernel's parallel loops. A one-row matmul of the default model takes tens of
// microseconds, so waking threads through the OS on every call would cost as much as the work:
// workers wait for the next job awake for a while (VSURGE_KERNEL_SPIN_US, default 200: a quarter
// of it spinning, the rest yielding the core to ready threads) before they sleep, and the calling
// thread works too. One job runs at a time; a caller that finds the pool busy (XLA
// running two custom calls at once) runs its loop alone instead of waiting.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace vsurge {

class ThreadPool {
 public:
  using Fn = void (*)(void* ctx, int64_t begin, int64_t end);

  // threads: workers + the caller (1 = no workers).
  ThreadPool(int threads, int64_t spin_ns);
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(ctx, i, j) over disjoint [i, j) covering [0, n), `chunk` items at a time, and returns
  // when all are done.
  void parallel_for(int64_t n, int64_t chunk, Fn fn, void* ctx);

 private:
  void worker();
  void run_items();

  // state_: generation << 32 | closed << 16 | number of workers inside the current job.
  static constexpr uint64_t kClosed = 1ull << 16;
  static constexpr uint64_t kActive = 0xFFFF;
  std::atomic<uint64_t> state_{kClosed};
  std::atomic<int64_t> next_{0};
  int64_t n_ = 0, chunk_ = 1;
  Fn fn_ = nullptr;
  void* ctx_ = nullptr;

  std::mutex run_mu_;  // one job at a time
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
  std::atomic<int> sleepers_{0};
  int64_t spin_ns_;
  std::vector<std::thread> workers_;
};

// The process-wide pool, made on first use (VSURGE_KERNEL_THREADS, default: the CPUs this process
// may run on) and made again in a child after fork().
ThreadPool& kernel_pool();

}  // namespace vsurge
