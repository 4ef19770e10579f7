// spdlog's implementation, compiled once for the whole project. Debian ships spdlog as headers
// and a shared library only; the static agent and launcher cannot link the shared one, and
// spdlog's header-only mode compiles all of this into every file that logs (some 10 s of CPU per
// file at -O2). With SPDLOG_COMPILED_LIB (set on airlock_common for every user) the headers
// declare and this file defines: what spdlog's own library build would compile, for the pieces
// Airlock uses (the registry, the pattern formatter, the stderr sink of InitLogging and the
// colour sink of spdlog's default logger). A link error naming an spdlog symbol means a new
// piece is used: include its -inl.h here and instantiate it for the mutex it takes.
#ifndef SPDLOG_COMPILED_LIB
#error "spdlog_lib.cc is built with SPDLOG_COMPILED_LIB (airlock_common's definitions)"
#endif

#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/sinks/stdout_sinks-inl.h>
#include <spdlog/spdlog-inl.h>

#include <memory>
#include <mutex>
#include <string>

template class spdlog::sinks::base_sink<std::mutex>;
template class spdlog::sinks::base_sink<spdlog::details::null_mutex>;
template class spdlog::sinks::stdout_sink_base<spdlog::details::console_mutex>;
template class spdlog::sinks::stderr_sink<spdlog::details::console_mutex>;
template class spdlog::sinks::ansicolor_sink<spdlog::details::console_mutex>;
template class spdlog::sinks::ansicolor_stdout_sink<spdlog::details::console_mutex>;
template std::shared_ptr<spdlog::logger> spdlog::stderr_logger_mt<spdlog::synchronous_factory>(
    const std::string& logger_name);
