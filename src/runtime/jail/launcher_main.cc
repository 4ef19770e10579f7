// airlock-jail: the single-threaded launcher that makes one jail sandbox. The daemon (which is
// multithreaded and never clones sandboxes itself) starts it per sandbox; it clones the sandbox
// process into new namespaces, maps its ids, and reports one line on --report-fd:
// "ok <pid>" or "error <step> <errno> <pid>" (see contain.h). The seccomp program comes
// compiled (raw BPF on --seccomp-fd), so the launcher does no policy work of its own.
//
//   airlock-jail --id ID --sandbox-dir DIR --template-dir DIR --uid-base N --agent PATH
//                --channel-fd N --report-fd N --seccomp-fd N [--disk-mb N] [--tmp-mb N] [--nofile
//                N]
//                [--cgroup-procs FILE]... [--cgroup-bind HOST=INSIDE]... [--ro-bind DIR]...
//                [--usr-dir NAME]... (of the host's /usr, kHostUsrDirs) [--host-usr-local]
//                [--layer DIR]... (topmost first) [--rootfs] (the layers hold a whole root)
//                [--netns PATH --nameserver IP] (join a network namespace the host made)
//                [--limits-view] (SANDBOX_DIR/view/{meminfo,cpu_online} over /proc/meminfo and
//                /sys/devices/system/cpu/online, read-only)
//                [-- AGENT-ARGS...]

#include <getopt.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <string>

#include "common/ids.h"
#include "common/syscall.h"
#include "runtime/guest_files.h"
#include "runtime/jail/contain.h"

namespace {

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr, "airlock-jail: %s (see the comment at the top of launcher_main.cc)\n",
               why.c_str());
  std::exit(2);
}

uint64_t Number(const char* flag, const char* s) {
  std::string_view v(s);
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size()) Usage(std::string(flag) + " takes a number");
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  // A sandbox that fails a step closes its end of the sync pipe: that is a report, not a death.
  ::signal(SIGPIPE, SIG_IGN);
  airlock::jail::JailConfig c;
  int report_fd = -1;
  enum {
    kId = 1,
    kDir,
    kTemplate,
    kUid,
    kAgent,
    kChannel,
    kReport,
    kDisk,
    kTmp,
    kNofile,
    kCg,
    kBind,
    kCgBind,
    kSeccomp,
    kLayer,
    kRootfs,
    kNetns,
    kNameserver,
    kUsrDir,
    kHostUsrLocal,
    kLimitsView
  };
  static const option kLong[] = {{"id", required_argument, nullptr, kId},
                                 {"sandbox-dir", required_argument, nullptr, kDir},
                                 {"template-dir", required_argument, nullptr, kTemplate},
                                 {"uid-base", required_argument, nullptr, kUid},
                                 {"agent", required_argument, nullptr, kAgent},
                                 {"channel-fd", required_argument, nullptr, kChannel},
                                 {"report-fd", required_argument, nullptr, kReport},
                                 {"disk-mb", required_argument, nullptr, kDisk},
                                 {"tmp-mb", required_argument, nullptr, kTmp},
                                 {"nofile", required_argument, nullptr, kNofile},
                                 {"cgroup-procs", required_argument, nullptr, kCg},
                                 {"ro-bind", required_argument, nullptr, kBind},
                                 {"cgroup-bind", required_argument, nullptr, kCgBind},
                                 {"seccomp-fd", required_argument, nullptr, kSeccomp},
                                 {"layer", required_argument, nullptr, kLayer},
                                 {"rootfs", no_argument, nullptr, kRootfs},
                                 {"netns", required_argument, nullptr, kNetns},
                                 {"nameserver", required_argument, nullptr, kNameserver},
                                 {"usr-dir", required_argument, nullptr, kUsrDir},
                                 {"host-usr-local", no_argument, nullptr, kHostUsrLocal},
                                 {"limits-view", no_argument, nullptr, kLimitsView},
                                 {nullptr, 0, nullptr, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "", kLong, nullptr)) != -1) {
    switch (opt) {
      case kId:
        c.id = optarg;
        break;
      case kDir:
        c.sandbox_dir = optarg;
        break;
      case kTemplate:
        c.template_dir = optarg;
        break;
      case kUid:
        c.uid_base = static_cast<uid_t>(Number("--uid-base", optarg));
        break;
      case kAgent:
        c.agent_path = optarg;
        break;
      case kChannel:
        c.channel_fd = static_cast<int>(Number("--channel-fd", optarg));
        break;
      case kReport:
        report_fd = static_cast<int>(Number("--report-fd", optarg));
        break;
      case kDisk:
        c.disk_mb = Number("--disk-mb", optarg);
        break;
      case kTmp:
        c.tmp_mb = Number("--tmp-mb", optarg);
        break;
      case kNofile:
        c.nofile = Number("--nofile", optarg);
        break;
      case kCg:
        c.cgroup_procs.emplace_back(optarg);
        break;
      case kSeccomp:
        c.seccomp_fd = static_cast<int>(Number("--seccomp-fd", optarg));
        break;
      case kCgBind: {
        std::string v = optarg;
        size_t eq = v.find('=');
        bool under_sys = eq != std::string::npos && (v.substr(eq + 1) == "/sys/fs/cgroup" ||
                                                     v.compare(eq + 1, 15, "/sys/fs/cgroup/") == 0);
        if (!under_sys || v[0] != '/') {
          Usage("--cgroup-bind takes HOST_DIR=/sys/fs/cgroup[/...]");
        }
        c.cgroup_binds.emplace_back(v.substr(0, eq), v.substr(eq + 1));
        break;
      }
      case kBind:
        if (optarg[0] != '/') Usage("--ro-bind takes an absolute path");
        c.ro_binds.emplace_back(optarg);
        break;
      case kLayer:
        if (optarg[0] != '/') Usage("--layer takes an absolute path");
        c.layers.emplace_back(optarg);
        break;
      case kRootfs:
        c.rootfs = true;
        break;
      case kNetns:
        if (optarg[0] != '/') Usage("--netns takes an absolute path");
        c.netns = optarg;
        break;
      case kNameserver:
        c.nameserver = optarg;
        break;
      case kUsrDir:
        // Only the directories the design lets a sandbox see: a name is a host path.
        if (std::ranges::find_if(airlock::runtime::guest::kHostUsrDirs, [](const char* dir) {
              return std::string_view(dir) == optarg;
            }) == std::end(airlock::runtime::guest::kHostUsrDirs)) {
          Usage("--usr-dir takes one of the names in kHostUsrDirs (runtime/guest_files.h)");
        }
        c.usr_dirs.emplace_back(optarg);
        break;
      case kHostUsrLocal:
        c.host_usr_local = true;
        break;
      case kLimitsView:
        c.limits_view = true;
        break;
      default:
        Usage("unknown option");
    }
  }
  for (int i = optind; i < argc; ++i) c.agent_args.emplace_back(argv[i]);
  if (!airlock::ValidateSandboxId(c.id)) Usage("--id must be a valid sandbox id");
  if (c.id.size() > 64) Usage("--id is too long for a hostname");
  if (c.sandbox_dir.empty() || c.template_dir.empty() || c.agent_path.empty()) {
    Usage("--sandbox-dir, --template-dir and --agent are required");
  }
  if (c.rootfs && c.layers.empty()) Usage("--rootfs needs the --layer that holds the root");
  if (c.rootfs && (!c.usr_dirs.empty() || c.host_usr_local)) {
    Usage("--rootfs shows nothing of the host: no --usr-dir, no --host-usr-local");
  }
  if (c.uid_base == 0) Usage("--uid-base must not be 0: root inside must not be root outside");
  if (c.channel_fd < 0 || report_fd < 0 || c.seccomp_fd < 0) {
    Usage("--channel-fd, --report-fd and --seccomp-fd are required");
  }

  auto report = airlock::jail::Launch(c);
  std::string line = airlock::jail::FormatReport(report);
  (void)airlock::WriteAll(report_fd, line);
  return report.failed_step.empty() ? 0 : 1;
}
