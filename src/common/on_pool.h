#pragma once
// OnPool: from an Asio coroutine, run a blocking function on a thread pool and resume on the
// coroutine's own executor with its result (the HTTP server's blocking API calls, the egress
// proxy's name resolution). Header-only; whoever includes it uses Boost.Asio.

#include <boost/asio/async_result.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <type_traits>
#include <utility>

namespace airlock {

// `fn` is taken by reference and must live until the await completes (a local of the awaiting
// coroutine does). Not a coroutine itself, and only pointers are captured: g++ 12 destroys
// non-trivial temporaries inside co_await expressions twice.
template <typename Fn>
boost::asio::awaitable<std::invoke_result_t<Fn&>> OnPool(boost::asio::thread_pool& pool, Fn& fn) {
  namespace asio = boost::asio;
  using R = std::invoke_result_t<Fn&>;
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(R)>(
      [pool_ptr = &pool, fn_ptr = &fn](auto handler) {
        auto work = asio::make_work_guard(asio::get_associated_executor(handler));
        asio::post(*pool_ptr, [fn_ptr, handler = std::move(handler),
                               work = std::move(work)]() mutable {
          R result = (*fn_ptr)();
          auto home = work.get_executor();
          asio::post(home, [handler = std::move(handler), result = std::move(result)]() mutable {
            handler(std::move(result));
          });
        });
      },
      asio::use_awaitable);
}

}  // namespace airlock
