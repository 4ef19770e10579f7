#pragma once
// Whether an executable needs a program interpreter (ld.so): a dynamically linked binary can
// run only where its interpreter and libraries are, which a sandbox on its own root file
// system does not have.

#include <string>

#include "common/error.h"

namespace airlock {

// True when the ELF file at `path` has a PT_INTERP program header; kInvalidArgument when it is
// not a 64-bit ELF file.
[[nodiscard]] Result<bool> ElfNeedsInterpreter(const std::string& path);

}  // namespace airlock
