// A thread that calls a function every `interval` until destroyed. The destructor wakes it at
// once and joins, so the owner can rely on no call running after it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace sbx {

class Ticker {
 public:
  Ticker(std::chrono::milliseconds interval, std::function<void()> fn)
      : interval_(interval), fn_(std::move(fn)), thread_([this] { Loop(); }) {}
  ~Ticker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

 private:
  void Loop() {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, interval_, [this] { return stop_; })) {
      lock.unlock();
      fn_();
      lock.lock();
    }
  }

  const std::chrono::milliseconds interval_;
  const std::function<void()> fn_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it reads are built
};

}  // namespace sbx
