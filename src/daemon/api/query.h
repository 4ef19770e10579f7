#pragma once
// URL query strings: "path=%2Ftmp%2Fa&recursive=true" -> [("path", "/tmp/a"), ("recursive", ...)].

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"

namespace airlock::api {

// Decoded name/value pairs in the order given; a name may repeat.
using QueryParams = std::vector<std::pair<std::string, std::string>>;

// Splits on '&', decodes '+' as a space and %XX strictly (a '%' not followed by two hex digits
// is kInvalidArgument). Empty segments ("a=1&&b=2") are skipped; "flag" alone has value "".
// An empty name ("=x") is kInvalidArgument. Decoded bytes may be anything, NUL included: the
// request types validate what they accept. `raw` excludes the '?'.
[[nodiscard]] Result<QueryParams> ParseQueryString(std::string_view raw);

}  // namespace airlock::api
