#pragma once
// Strict UTF-8 validation (Unicode 15, table 3-7): exec output is returned as a JSON string only
// when it is valid UTF-8; anything else goes back as base64.

#include <string_view>

namespace airlock::api {

// True if `bytes` is well-formed UTF-8: no overlong forms, no surrogates (U+D800..U+DFFF),
// nothing above U+10FFFF, no truncated sequences. NUL bytes are valid (U+0000).
bool IsValidUtf8(std::string_view bytes);

}  // namespace airlock::api
