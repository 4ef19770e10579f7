#include "common/elf.h"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "common/unique_fd.h"

namespace airlock {

Result<bool> ElfNeedsInterpreter(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return FailErrno("opening " + path, errno);
  Elf64_Ehdr eh;
  if (::pread(fd.get(), &eh, sizeof eh, 0) != static_cast<ssize_t>(sizeof eh) ||
      std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > 4096) {
    return Fail(ErrorCode::kInvalidArgument, path + " is not a 64-bit ELF executable");
  }
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    const off_t at = static_cast<off_t>(eh.e_phoff + i * sizeof ph);
    if (::pread(fd.get(), &ph, sizeof ph, at) != static_cast<ssize_t>(sizeof ph)) {
      return Fail(ErrorCode::kInvalidArgument, path + ": a program header cannot be read");
    }
    if (ph.p_type == PT_INTERP) return true;
  }
  return false;
}

}  // namespace airlock
