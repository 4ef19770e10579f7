#pragma once
// Canary files in the host's /usr, for tests of what a sandbox sees of it (docs/design/jail.md,
// "What a sandbox sees of the host"): unique names and contents, removed when the object goes
// out of scope, whatever the test's outcome. Needs root (they are written into the host's /usr).

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace airlock::testing {

class HostUsrCanaries {
 public:
  // Makes the canaries; error() says what failed (an empty path is a canary not made).
  HostUsrCanaries() {
    std::random_device rd;
    static const char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    for (int i = 0; i < 12; ++i) name_ += kChars[rd() % 36];
    name_ = "airlock-canary-" + name_;
    content_ = "host canary " + name_ + "\n";
    local_ = Make("/usr/local");
    bin_ = Make("/usr/bin");
    // Not every host has a /usr/src; none is made for the test.
    if (std::filesystem::is_directory("/usr/src")) src_ = Make("/usr/src");
  }
  HostUsrCanaries(const HostUsrCanaries&) = delete;
  ~HostUsrCanaries() {
    for (const std::string* path : {&local_, &bin_, &src_}) {
      if (!path->empty()) ::unlink(path->c_str());
    }
  }

  const std::string& error() const { return error_; }
  const std::string& name() const { return name_; }
  const std::string& content() const { return content_; }
  // In the host's /usr/local: hidden from base sandboxes unless the daemon is told to show it.
  const std::string& local() const { return local_; }
  // In the host's /usr/src (empty if the host has none): hidden from every sandbox.
  const std::string& src() const { return src_; }
  // In the host's /usr/bin: seen by base sandboxes (the positive control), not by a sandbox on
  // a root file system of its own.
  const std::string& bin() const { return bin_; }
  // Those made: local, bin, and src if the host has a /usr/src.
  std::vector<std::string> paths() const {
    std::vector<std::string> all = {local_, bin_};
    if (!src_.empty()) all.push_back(src_);
    return all;
  }

  // A shell command that prints one line per path, as Seen or Unseen below: whether its
  // directory lists it, whether stat finds it, and what reading it by its full path gives.
  static std::string Probe(const std::vector<std::string>& paths) {
    std::string cmd =
        "probe() { ls -a \"${1%/*}\" 2>/dev/null | grep -qxF \"${1##*/}\" && l=listed || "
        "l=unlisted; stat \"$1\" >/dev/null 2>&1 && s=stat || s=nostat; "
        "c=$(cat \"$1\" 2>/dev/null) && r=\"read:$c\" || r=noread; echo \"$1 $l $s $r\"; }";
    for (const std::string& path : paths) cmd += "; probe '" + path + "'";
    return cmd + "\n";
  }
  // Probe's line for a canary the sandbox sees whole, and for one it does not see at all.
  std::string Seen(const std::string& path) const {
    return path + " listed stat read:" + content_.substr(0, content_.size() - 1) + "\n";
  }
  static std::string Unseen(const std::string& path) { return path + " unlisted nostat noread\n"; }

 private:
  std::string Make(const std::string& dir) {
    const std::string path = dir + "/" + name_;
    std::ofstream out(path, std::ios::trunc);
    out << content_;
    out.close();
    if (!out || ::chmod(path.c_str(), 0644) != 0) {
      error_ += "cannot write " + path + "; ";
      ::unlink(path.c_str());
      return "";
    }
    return path;
  }

  std::string name_, content_, local_, bin_, src_, error_;
};

}  // namespace airlock::testing
