// airlock-agent: the guest agent. PID 1 inside a sandbox, or an ordinary process in tests.
//
//   airlock-agent --fd 3                 serve the channel inherited as fd 3; exit when it closes
//   airlock-agent --listen /run/a.sock   accept channels on a unix socket until SIGTERM
//   airlock-agent --listen-fd 3          accept channels on an inherited listening socket (the jail)
//
// See docs/agent.md for every option.

#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "agent/agent.h"
#include "common/build_id.h"
#include "common/log.h"
#include "common/syscall.h"
#include "runtime/seccomp_policy.h"

namespace {

using airlock::agent::AgentOptions;

void Usage(FILE* out) {
  std::fputs(
      "usage: airlock-agent (--fd N | --listen PATH | --listen-fd N) [options]\n"
      "  --fd N               serve the connected socket inherited as fd N; exit when it closes\n"
      "  --listen PATH        accept channels on a unix socket at PATH until SIGTERM\n"
      "  --listen-fd N        accept channels on the listening socket inherited as fd N\n"
      "  --root DIR           confine file operations below DIR (default /)\n"
      "  --user NAME|UID      run commands as this user unless a request names one\n"
      "  --etc DIR            read passwd and group from DIR (default /etc)\n"
      "  --env KEY=VALUE      add to every command's environment (repeatable)\n"
      "  --output-cap BYTES   default cap on stdout+stderr delivered per command (16 MiB)\n"
      "  --kill-grace-ms MS   SIGTERM to SIGKILL grace on timeout and shutdown (1000)\n"
      "  --linger-ms MS       wait for output held open by background processes (200)\n"
      "  --drop-caps          commands run with no capability, even as root (the jail sets it)\n"
      "  --seccomp PATH       install the compiled seccomp program in PATH (raw BPF) on the\n"
      "                       agent and so on every command, before serving (gVisor sets it)\n"
      "  --log-level LEVEL    trace, debug, info, warn, error, off (info)\n"
      "  --version            print the build id and exit\n",
      out);
}

bool ParseNumber(const char* s, uint64_t& out) {
  std::string_view v(s);
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc() && end == v.data() + v.size();
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "airlock-agent: %s\n", message.c_str());
  std::exit(2);
}

// A process that starts with stdio closed would hand out fds 0-2 as pipes; keep them taken.
void EnsureStdio() {
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0) {
      int null = ::open("/dev/null", O_RDWR);
      if (null >= 0 && null != fd) {
        ::dup2(null, fd);
        ::close(null);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  EnsureStdio();
  AgentOptions options;
  int channel_fd = -1, listen_fd = -1;
  std::string listen_path, user, seccomp_path, log_level = "info";
  enum {
    kFd = 1,
    kListen,
    kListenFd,
    kRoot,
    kUser,
    kEtc,
    kEnv,
    kCap,
    kGrace,
    kLinger,
    kLog,
    kVersion,
    kHelp,
    kDropCaps,
    kSeccomp
  };
  static const option kLong[] = {{"fd", required_argument, nullptr, kFd},
                                 {"listen", required_argument, nullptr, kListen},
                                 {"listen-fd", required_argument, nullptr, kListenFd},
                                 {"root", required_argument, nullptr, kRoot},
                                 {"user", required_argument, nullptr, kUser},
                                 {"etc", required_argument, nullptr, kEtc},
                                 {"env", required_argument, nullptr, kEnv},
                                 {"output-cap", required_argument, nullptr, kCap},
                                 {"kill-grace-ms", required_argument, nullptr, kGrace},
                                 {"linger-ms", required_argument, nullptr, kLinger},
                                 {"log-level", required_argument, nullptr, kLog},
                                 {"drop-caps", no_argument, nullptr, kDropCaps},
                                 {"seccomp", required_argument, nullptr, kSeccomp},
                                 {"version", no_argument, nullptr, kVersion},
                                 {"help", no_argument, nullptr, kHelp},
                                 {nullptr, 0, nullptr, 0}};
  int opt;
  uint64_t n = 0;
  while ((opt = getopt_long(argc, argv, "", kLong, nullptr)) != -1) {
    switch (opt) {
      case kFd:
        if (!ParseNumber(optarg, n) || n < 3 || n > 65535) Die("--fd takes a number from 3");
        channel_fd = static_cast<int>(n);
        break;
      case kListen:
        listen_path = optarg;
        break;
      case kListenFd:
        if (!ParseNumber(optarg, n) || n < 3 || n > 65535) Die("--listen-fd takes a number from 3");
        listen_fd = static_cast<int>(n);
        break;
      case kRoot:
        options.file_root = optarg;
        break;
      case kUser:
        user = optarg;
        break;
      case kEtc:
        options.exec.etc_dir = optarg;
        break;
      case kEnv:
        if (!std::strchr(optarg, '=') || optarg[0] == '=') Die("--env takes KEY=VALUE");
        options.exec.env.emplace_back(optarg);
        break;
      case kCap:
        if (!ParseNumber(optarg, n) || n == 0) Die("--output-cap takes a positive number");
        options.default_output_cap = n;
        break;
      case kGrace:
        if (!ParseNumber(optarg, n) || n > 3600000) Die("--kill-grace-ms takes milliseconds");
        options.default_kill_grace_ms = static_cast<uint32_t>(n);
        break;
      case kLinger:
        if (!ParseNumber(optarg, n) || n > 3600000) Die("--linger-ms takes milliseconds");
        options.linger_ms = static_cast<uint32_t>(n);
        break;
      case kLog:
        log_level = optarg;
        break;
      case kDropCaps:
        options.exec.drop_caps = true;
        break;
      case kSeccomp:
        seccomp_path = optarg;
        break;
      case kVersion:
        std::printf("airlock-agent %s\n", airlock::kBuildId);
        return 0;
      case kHelp:
        Usage(stdout);
        return 0;
      default:
        Usage(stderr);
        return 2;
    }
  }
  if (optind != argc) Die(std::string("unexpected argument: ") + argv[optind]);
  if ((channel_fd >= 0) + !listen_path.empty() + (listen_fd >= 0) != 1) {
    Die("give exactly one of --fd, --listen and --listen-fd");
  }
  airlock::InitLogging("airlock-agent", log_level);

  // Start from a clean signal state whatever the parent left, then ignore SIGPIPE: a closed
  // channel or pipe is an error return, not a death.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  ::umask(0);
  // Orphaned grandchildren come back to the agent to be reaped (PID 1 gets them anyway).
  if (::getpid() != 1) ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Hundreds of commands at once need more fds than the usual soft limit of 1024; commands
  // themselves get the limit the agent was started with.
  rlimit nofile;
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    options.exec.nofile = nofile;
    rlimit raised = nofile;
    raised.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &raised);
  }
  if (!user.empty()) {
    auto u = airlock::agent::LookupUser(user, options.exec.etc_dir);
    if (!u) Die(u.error().message());
    options.exec.default_user = std::move(*u);
  }

  // The sandbox's seccomp policy, where the engine cannot install it before the agent starts
  // (gVisor: runsc execs the agent directly). Installed before anything is served, so that no
  // command ever runs without it; a program that does not load or install ends the agent.
  if (!seccomp_path.empty()) {
    auto bytes = airlock::ReadFileToString(seccomp_path, 1 << 20);
    if (!bytes) Die("--seccomp: " + bytes.error().message());
    auto program = airlock::runtime::SeccompProgram::FromBytes(*bytes);
    if (!program) Die("--seccomp " + seccomp_path + ": " + program.error().message());
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) Die("--seccomp: no_new_privs failed");
    if (int err = airlock::runtime::InstallSeccomp(program->prog()); err != 0) {
      Die("--seccomp: installing the program failed: " + std::string(std::strerror(err)));
    }
  }

  auto agent = airlock::agent::Agent::Create(std::move(options));
  if (!agent) Die(agent.error().message());
  if (channel_fd >= 0) {
    if (::fcntl(channel_fd, F_GETFD) < 0)
      Die("--fd " + std::to_string(channel_fd) + " is not open");
    ::fcntl(channel_fd, F_SETFD, FD_CLOEXEC);
    if (auto st = (*agent)->AddChannel(airlock::UniqueFd(channel_fd)); !st) {
      Die(st.error().message());
    }
  } else if (listen_fd >= 0) {
    if (::fcntl(listen_fd, F_GETFD) < 0) {
      Die("--listen-fd " + std::to_string(listen_fd) + " is not open");
    }
    if (auto st = (*agent)->ListenOn(airlock::UniqueFd(listen_fd)); !st) Die(st.error().message());
  } else if (auto st = (*agent)->Listen(listen_path); !st) {
    Die(st.error().message());
  }
  spdlog::debug("airlock-agent {} serving", airlock::kBuildId);
  return (*agent)->Run();
}
