#pragma once
// Reading what a sandbox uses from its cgroups and its writable layer's file system, shared by
// the engines that have host cgroups (the jail's own, runsc's for gVisor). A few small reads, no
// fork: the daemon's sampler calls them for every live sandbox every few seconds
// (docs/design/metrics.md).

#include <string>
#include <vector>

#include "runtime/engine.h"

namespace airlock::runtime {

// Fills cpu, memory, peak memory and pids of `stats` from the first of `dirs` that has each:
//   v2: cpu.stat usage_usec, memory.current, memory.peak (kernel 5.19+), pids.current
//   v1: cpuacct.usage (ns), memory.usage_in_bytes, memory.max_usage_in_bytes, pids.current
// What no dir has stays as it was (0). Missing files are not an error: a v1 host may mount
// cpuacct nowhere, an old kernel has no memory.peak.
void ReadCgroupStats(const std::vector<std::string>& dirs, SandboxStats& stats);

// Bytes in use on the file system at `path` (statfs: blocks minus free blocks); 0 if it cannot
// be read.
uint64_t FileSystemUsedBytes(const std::string& path);

}  // namespace airlock::runtime
