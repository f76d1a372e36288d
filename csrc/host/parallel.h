// The CPU implementations' one way to use several cores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace kbit {

// The most threads parallel_for uses: the machine's cores, at most 32.
inline int64_t max_threads() {
    return std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), 32);
}

// Runs body(first, last) over [0, count) split across the machine's cores (at most 32
// threads, each with at least min_per_thread items; the split never changes a result
// because the items are independent). If a thread cannot be started, the calling thread
// does its share. body must not throw.
template <class Body>
void parallel_for(int64_t count, int64_t min_per_thread, Body &&body) {
    const int64_t threads = std::min<int64_t>(max_threads(), count / min_per_thread);
    if (threads <= 1) {
        body(int64_t{0}, count);
        return;
    }
    const int64_t chunk = (count + threads - 1) / threads;
    std::vector<std::thread> pool;
    int64_t started = chunk;  // [chunk, started) runs on the pool
    try {
        pool.reserve(static_cast<size_t>(threads - 1));
        for (; started < count; started += chunk) {
            const int64_t first = started, last = std::min(count, first + chunk);
            pool.emplace_back([&body, first, last] { body(first, last); });
        }
    } catch (...) {
        // No more threads: the calling thread does what was not handed out.
    }
    body(int64_t{0}, std::min(count, chunk));
    if (started < count) body(started, count);
    for (auto &th : pool) th.join();
}

}  // namespace kbit
