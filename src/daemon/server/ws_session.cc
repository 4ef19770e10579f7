#include "daemon/server/ws_session.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "common/ids.h"
#include "daemon/api/json.h"
#include "daemon/api/query.h"
#include "daemon/api/render.h"
#include "daemon/api/types.h"
#include "daemon/server/controller.h"
#include "daemon/server/router.h"

namespace airlock::daemon {
namespace {

using Refusal = std::unexpected<HttpReply>;

// How long Next() waits for an exec/ws client's first message before returning "", and how
// long the client has to send it at all (an idle connection must not hold a session forever).
constexpr auto kFirstMessagePoll = std::chrono::seconds(1);
constexpr auto kFirstMessageTimeout = std::chrono::seconds(60);

// An event rendered as an NDJSON line; a WebSocket message carries it without the newline.
std::string AsMessage(std::string line) {
  if (line.ends_with('\n')) line.pop_back();
  return line;
}

// A WebSocket message: one event, rendered as an NDJSON line without its newline.
std::string Message(const api::Event& event) { return AsMessage(api::RenderEvent(event)); }

// An EventStream's events one at a time (Next gives what had already arrived in one go); a
// WebSocket message carries one event.
class EventMessages {
 public:
  explicit EventMessages(std::unique_ptr<EventStream> stream) : stream_(std::move(stream)) {}

  int32_t pid() const { return stream_->pid(); }

  // The next event, however long it takes; nullopt at the end. Blocks.
  std::optional<api::Event> NextEvent() {
    while (pending_.empty()) {
      if (!Read()) return std::nullopt;
    }
    return Pop();
  }

  // As WsSession::Next: one event's message, "" when nothing came within about a second,
  // nullopt at the end. Blocks.
  std::optional<std::string> Next() {
    if (pending_.empty()) {
      if (!Read()) return std::nullopt;
      if (pending_.empty()) return std::string();
    }
    return Message(Pop());
  }

 private:
  // False at the end of the stream.
  bool Read() {
    std::optional<std::vector<api::Event>> events = stream_->Next();
    if (!events) return false;
    for (api::Event& event : *events) pending_.push_back(std::move(event));
    return true;
  }
  api::Event Pop() {
    api::Event event = std::move(pending_.front());
    pending_.pop_front();
    return event;
  }

  std::unique_ptr<EventStream> stream_;
  std::deque<api::Event> pending_;
};

// The input side of a session: client messages turned into ProcessControl calls. Not
// thread-safe; the sessions serialize their Inputs.
class ProcessInput {
 public:
  // `control` may be null: the process ended before input could be attached, and input is
  // dropped (its end reaches the client as the exit event).
  explicit ProcessInput(std::unique_ptr<ProcessControl> control) : control_(std::move(control)) {}

  Status Deliver(std::string_view message, bool binary) {
    api::WsClientMessage msg;
    if (binary) {
      msg.data = std::string(message);  // type kStdin
    } else {
      auto parsed = api::WsClientMessage::FromJson(message);
      if (!parsed) return std::unexpected(std::move(parsed.error()));
      msg = std::move(*parsed);
    }
    if (!control_) return {};
    const protocol::Attached& info = control_->info();
    const std::string what = "process " + std::to_string(info.pid);
    Status st;
    switch (msg.type) {
      case api::WsClientMessage::Type::kStdin:
        // The client's own mistakes are refused here; the agent's answer below may also come
        // from the process ending meanwhile, which is not the client's fault.
        if (stdin_closed_) {
          return Fail(ErrorCode::kFailedPrecondition,
                      "stdin of " + what + " was closed by an earlier stdin_close");
        }
        if (!info.stdin_open) {
          return Fail(ErrorCode::kFailedPrecondition,
                      "stdin of " + what + " is not open (start it with a pty or stdin_open)");
        }
        if (msg.data.empty()) return {};
        st = control_->WriteStdin(msg.data);
        break;
      case api::WsClientMessage::Type::kStdinClose:
        if (stdin_closed_) return {};
        stdin_closed_ = true;
        if (!info.stdin_open) return {};
        st = control_->CloseStdin();
        break;
      case api::WsClientMessage::Type::kSignal:
        st = control_->Signal(msg.signal);
        break;
      case api::WsClientMessage::Type::kResize:
        if (!info.pty) {
          return Fail(ErrorCode::kFailedPrecondition, "resize: " + what + " has no terminal");
        }
        st = control_->Resize(msg.cols, msg.rows);
        break;
    }
    // Gone or no longer taking input: the process ended while the message was on its way. Its
    // exit event is coming; closing the session for that would lose it.
    if (!st && (st.error().code() == ErrorCode::kNotFound ||
                st.error().code() == ErrorCode::kFailedPrecondition)) {
      return {};
    }
    return st;
  }

 private:
  std::unique_ptr<ProcessControl> control_;
  bool stdin_closed_ = false;
};

// exec/ws: the first client message is the exec request; the command starts then, with stdin
// open, and everything after is input to it.
class ExecWsSession final : public WsSession {
 public:
  ExecWsSession(Controller& controller, std::string id)
      : controller_(controller), id_(std::move(id)), since_(std::chrono::steady_clock::now()) {}

  std::optional<std::string> Next() override {
    {
      std::unique_lock lock(mu_);
      if (!started_cv_.wait_for(lock, kFirstMessagePoll, [this] { return started_; })) {
        if (std::chrono::steady_clock::now() - since_ < kFirstMessageTimeout) return std::string();
        // Too late: no request is taken any more; the session ends with this.
        started_ = true;
        early_.push_back(ErrorEventMessage(
            Error(ErrorCode::kDeadlineExceeded,
                  "no exec request within " +
                      std::to_string(std::chrono::seconds(kFirstMessageTimeout).count()) +
                      " seconds of the upgrade")));
      }
      if (!early_.empty()) {
        std::string event = std::move(early_.front());
        early_.pop_front();
        return event;
      }
    }
    // events_ was set before started_ (under mu_) and only Next touches it after.
    if (!events_) return std::nullopt;
    return events_->Next();
  }

  Status Input(std::string_view message, bool binary) override {
    std::lock_guard input_lock(input_mu_);
    if (!input_) return Start(message, binary);
    return input_->Deliver(message, binary);
  }

 private:
  // The first message: starts the command, reads its start event (whose pid says where input
  // goes) and attaches the input side, then lets Next go on with the stream.
  Status Start(std::string_view message, bool binary) {
    input_.emplace(nullptr);  // whatever happens below, later messages are input, not requests
    if (binary) {
      return Fail(ErrorCode::kInvalidArgument,
                  "the first message must be the exec request (JSON text), got a binary message");
    }
    auto request = api::ExecRequest::FromJson(message);
    if (!request) return std::unexpected(std::move(request.error()).Wrap("exec request"));
    if (request->stream || request->background) {
      return Fail(ErrorCode::kInvalidArgument,
                  "exec request: exec/ws takes neither stream nor background (its events are "
                  "the session's messages)");
    }
    request->stdin_open = true;
    // A terminal is for as long as its user wants it, and the command ends anyway when the
    // client leaves: without a timeout_seconds of its own it gets the longest there is, not the
    // five minutes of a plain exec.
    if (!request->timeout_given) request->timeout_seconds = api::kMaxTimeoutSeconds;
    std::deque<std::string> events;
    auto started = controller_.exec().StartExec(id_, *request);
    if (!started) {
      // The command could not start (paused sandbox, bad user...): that ends the session as a
      // streamed exec's error event ends its stream.
      events.push_back(ErrorEventMessage(started.error()));
      Publish(nullptr, std::move(events));
      return {};
    }
    auto stream = std::make_unique<EventMessages>(std::move(*started));
    std::optional<api::Event> first = stream->NextEvent();
    if (!first) {
      Publish(std::move(stream), std::move(events));
      return {};
    }
    int32_t pid = stream->pid();
    if (auto* start = std::get_if<api::StartEvent>(&first->what); pid <= 0 && start) {
      pid = start->pid;
    }
    events.push_back(Message(*first));
    if (pid > 0) {
      auto control = controller_.exec().Control(id_, pid);
      if (control) {
        input_.emplace(std::move(*control));
      } else if (control.error().code() != ErrorCode::kNotFound) {
        // Without input the session is not interactive: end it (dropping the stream kills the
        // command) and say why.
        events.push_back(ErrorEventMessage(control.error().Wrap("attaching stdin")));
        Publish(nullptr, std::move(events));
        return {};
      }
      // kNotFound: the command has already ended; its exit event follows the start.
    }
    Publish(std::move(stream), std::move(events));
    return {};
  }

  void Publish(std::unique_ptr<EventMessages> stream, std::deque<std::string> events) {
    {
      std::lock_guard lock(mu_);
      if (started_) return;  // Next gave up waiting; dropping `stream` ends the command
      events_ = std::move(stream);
      early_ = std::move(events);
      started_ = true;
    }
    started_cv_.notify_all();
  }

  Controller& controller_;
  const std::string id_;
  const std::chrono::steady_clock::time_point since_;  // the upgrade

  std::mutex mu_;
  std::condition_variable started_cv_;
  bool started_ = false;             // guarded by mu_
  std::deque<std::string> early_;    // guarded by mu_: events read by Start, sent first
  std::unique_ptr<EventMessages> events_;  // set by Publish, then Next's alone

  std::mutex input_mu_;  // Inputs in order, one at a time (ProcessControl is not thread-safe)
  std::optional<ProcessInput> input_;  // guarded by input_mu_; empty until the first message
};

// processes/{pid}/ws: output from the agent's ring and live, input through a control
// attachment. Destroying it detaches both; the process runs on.
class AttachWsSession final : public WsSession {
 public:
  AttachWsSession(std::unique_ptr<EventStream> output, std::unique_ptr<ProcessControl> control)
      : output_(std::move(output)), input_(std::move(control)) {}

  std::optional<std::string> Next() override { return output_.Next(); }

  Status Input(std::string_view message, bool binary) override {
    std::lock_guard lock(input_mu_);
    return input_.Deliver(message, binary);
  }

 private:
  EventMessages output_;
  std::mutex input_mu_;
  ProcessInput input_;  // guarded by input_mu_
};

}  // namespace

std::string ErrorEventMessage(const Error& error) {
  return Message({api::ErrorEvent{error}});
}

bool IsWebSocketPath(std::string_view path) {
  const auto parts = SplitPath(path);
  if (parts.size() < 5 || parts[0] != "v1" || parts[1] != "sandboxes") return false;
  if (parts.size() == 5) return parts[3] == "exec" && parts[4] == "ws";
  return parts.size() == 6 && parts[3] == "processes" && parts[5] == "ws";
}

std::expected<std::unique_ptr<WsSession>, HttpReply> Router::Upgrade(const HttpRequest& request) {
  auto refuse = [this](HttpReply reply) {
    metrics_.CountReply(reply.status, reply.error_code);
    return Refusal(std::move(reply));
  };
  auto refuse_error = [&](const Error& error) { return refuse(ErrorReply(error)); };
  const std::string_view target = request.target;
  const std::string_view path = target.substr(0, target.find('?'));
  std::string_view raw_query;
  if (size_t q = target.find('?'); q != std::string_view::npos) raw_query = target.substr(q + 1);

  // As for every /v1 route: 401 first, whatever else is wrong.
  const std::optional<Caller> caller = Authenticate(request.authorization);
  if (!caller) {
    api::HttpError e = api::UnauthenticatedBody();
    HttpReply reply{static_cast<unsigned>(e.status), std::move(e.body), ""};
    reply.error_code = "unauthenticated";
    return refuse(std::move(reply));
  }
  if (request.method != "GET") {
    nlohmann::json doc = {{"error",
                           {{"code", "method_not_allowed"},
                            {"message", request.method + " is not allowed on " +
                                            std::string(path) + "; allowed: GET"}}}};
    HttpReply reply{405, doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "GET"};
    reply.error_code = "method_not_allowed";
    return refuse(std::move(reply));
  }
  const auto parts = SplitPath(path);
  const std::string id(parts[2]);
  if (auto st = ValidateSandboxId(id); !st) return refuse_error(st.error());
  if (auto st = CheckOwner(*caller, id); !st) return refuse_error(st.error());
  const bool exec = parts.size() == 5;
  std::optional<int32_t> pid;
  bool replay = true;
  if (exec) {
    if (!raw_query.empty()) {
      return refuse_error(Error(ErrorCode::kInvalidArgument, "this route takes no query string"));
    }
  } else {
    auto parsed_pid = api::ParsePid(parts[4]);
    if (!parsed_pid) return refuse_error(parsed_pid.error());
    pid = *parsed_pid;
    auto params = api::ParseQueryString(raw_query);
    if (!params) return refuse_error(params.error());
    auto query = api::ReplayQuery::FromQuery(*params);
    if (!query) return refuse_error(query.error());
    replay = query->replay;
  }
  if (!request.websocket) {
    return refuse_error(Error(ErrorCode::kInvalidArgument,
                              std::string(path) +
                                  " is a WebSocket route: connect with a WebSocket client "
                                  "(GET with Connection: Upgrade and Upgrade: websocket)"));
  }

  std::unique_ptr<WsSession> session;
  if (exec) {
    // The command starts with the client's first message; an unknown or stopped sandbox is
    // refused now, while the answer can still be an HTTP status.
    auto record = controller_.Get(id);
    if (!record) return refuse_error(record.error());
    const store::SandboxState running[] = {store::SandboxState::kRunning};
    // One the idle sweep paused is resumed by the command's start (SandboxTable::Acquire).
    if (auto st = store::RequireState(id, record->state, running);
        !st && !record->resources.contains(kAutoPaused)) {
      return refuse_error(st.error());
    }
    session = std::make_unique<ExecWsSession>(controller_, id);
  } else {
    auto output = controller_.exec().AttachOutput(id, *pid, replay, /*follow=*/true);
    if (!output) return refuse_error(output.error());
    auto control = controller_.exec().Control(id, *pid);
    std::unique_ptr<ProcessControl> input;
    if (control) {
      input = std::move(*control);
    } else if (control.error().code() != ErrorCode::kNotFound) {
      return refuse_error(control.error());
    }
    // kNotFound after a successful attach: the process ended in between; the output stream
    // still replays it and reports its exit.
    session = std::make_unique<AttachWsSession>(std::move(*output), std::move(input));
  }
  metrics_.CountReply(101, "");
  return session;
}

}  // namespace airlock::daemon
