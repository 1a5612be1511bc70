#include "thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace vsurge {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long long parsed = std::strtoll(v, &end, 10);
  return (end != v && parsed >= 0) ? parsed : fallback;
}

int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

std::atomic<ThreadPool*> g_pool{nullptr};
std::mutex g_pool_mu;

// The pool's threads do not exist in a forked child: make a new pool there on first use (the old
// one is leaked, its memory belongs to the parent's image).
void forget_pool_in_child() { g_pool.store(nullptr); }

}  // namespace

ThreadPool::ThreadPool(int threads, int64_t spin_ns) : spin_ns_(spin_ns) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker(); });
  for (auto& t : workers_) t.detach();  // the pool lives as long as the process
}

void ThreadPool::run_items() {
  for (;;) {
    const int64_t i = next_.fetch_add(chunk_, std::memory_order_relaxed);
    if (i >= n_) return;
    fn_(ctx_, i, std::min(i + chunk_, n_));
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t chunk, Fn fn, void* ctx) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(1, chunk);
  std::unique_lock<std::mutex> lock(run_mu_, std::try_to_lock);
  if (workers_.empty() || !lock.owns_lock() || n <= chunk) {
    fn(ctx, 0, n);
    return;
  }
  n_ = n;
  chunk_ = chunk;
  fn_ = fn;
  ctx_ = ctx;
  next_.store(0, std::memory_order_relaxed);
  const uint64_t generation = (state_.load(std::memory_order_relaxed) >> 32) + 1;
  state_.store(generation << 32);  // open, nobody inside yet (seq_cst: pairs with sleepers_)
  if (sleepers_.load() > 0) {
    { std::lock_guard<std::mutex> g(sleep_mu_); }
    sleep_cv_.notify_all();
  }
  run_items();
  state_.fetch_or(kClosed, std::memory_order_acq_rel);  // late workers stay out
  for (int spins = 0; state_.load(std::memory_order_acquire) & kActive; ++spins) {
    if (spins < 4096) cpu_relax();
    else std::this_thread::yield();  // a worker was descheduled inside its last chunk
  }
}

void ThreadPool::worker() {
  using Clock = std::chrono::steady_clock;
  uint64_t seen = state_.load(std::memory_order_acquire) >> 32;
  for (;;) {
    uint64_t s = state_.load(std::memory_order_acquire);
    auto start = Clock::now();
    for (int spins = 1; (s >> 32) == seen; ++spins) {
      // the first quarter of the wait on the core alone, the rest yielding it to any thread that
      // is ready (XLA's, between two kernel calls), then asleep
      const auto waited = Clock::now() - start;
      if (waited < std::chrono::nanoseconds(spin_ns_ / 4)) cpu_relax();
      else std::this_thread::yield();
      if (spins % 64 == 0 && waited > std::chrono::nanoseconds(spin_ns_)) {
        std::unique_lock<std::mutex> lk(sleep_mu_);
        sleepers_.fetch_add(1);
        sleep_cv_.wait(lk, [&] { return (state_.load() >> 32) != seen; });
        sleepers_.fetch_sub(1);
        start = Clock::now();
      }
      s = state_.load(std::memory_order_acquire);
    }
    seen = s >> 32;
    while (!(s & kClosed) && (s >> 32) == seen) {
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        run_items();
        state_.fetch_sub(1, std::memory_order_release);
        break;
      }
    }
  }
}

ThreadPool& kernel_pool() {
  ThreadPool* pool = g_pool.load(std::memory_order_acquire);
  if (pool != nullptr) return *pool;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  pool = g_pool.load();
  if (pool == nullptr) {
    static bool registered = [] { return pthread_atfork(nullptr, nullptr, forget_pool_in_child) == 0; }();
    (void)registered;
    const int threads = static_cast<int>(std::max<int64_t>(1, env_int("VSURGE_KERNEL_THREADS", usable_cpus())));
    pool = new ThreadPool(threads, env_int("VSURGE_KERNEL_SPIN_US", 200) * 1000);
    g_pool.store(pool, std::memory_order_release);
  }
  return *pool;
}

}  // namespace vsurge
