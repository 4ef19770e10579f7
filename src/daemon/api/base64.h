#pragma once
// Base64 (RFC 4648 section 4, the standard alphabet with '=' padding) for binary exec output and
// stdin carried inside JSON. Decoding is strict: it accepts only what Base64Encode produces.

#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock::api {

std::string Base64Encode(std::string_view bytes);

// kInvalidArgument for: a length that is not a multiple of 4, a character outside the alphabet
// (whitespace and line breaks included), misplaced or excess '=', or non-zero padding bits
// (so every input has exactly one accepted encoding).
[[nodiscard]] Result<std::string> Base64Decode(std::string_view text);

}  // namespace airlock::api
