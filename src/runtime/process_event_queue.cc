#include "runtime/process_event_queue.h"

#include "common/log.h"

namespace airlock::runtime {

ProcessEventQueue::ProcessEventQueue(ProcessEventSink sink)
    : sink_(std::move(sink)), thread_([this] { Deliver(); }) {}

ProcessEventQueue::~ProcessEventQueue() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProcessEventQueue::Push(const std::string& id, ProcessEvent event) {
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= kMaxQueued) {
      dropped_++;
      return;
    }
    queue_.emplace_back(id, std::move(event));
  }
  cv_.notify_one();
}

void ProcessEventQueue::Deliver() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    auto [id, event] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    try {
      sink_(id, event);
      reported_++;
    } catch (const std::exception& e) {  // the sink's failure is not the watch's end
      dropped_++;
      spdlog::error("process events: the sink failed: {}", e.what());
    }
    lock.lock();
  }
}

}  // namespace airlock::runtime
