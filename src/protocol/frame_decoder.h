#pragma once
// FrameDecoder: turns a byte stream into frames, rejecting bad headers as soon as they arrive.

#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"
#include "protocol/wire.h"

namespace airlock::protocol {

class FrameDecoder {
 public:
  // Appends bytes read from the channel.
  void Feed(std::string_view bytes);
  // The next whole frame; nullopt when more bytes are needed. A header with the wrong version,
  // an unknown type, reserved flags set or a payload over kMaxPayload is an error, and every
  // later call returns the same error: the channel cannot be resynchronised.
  [[nodiscard]] Result<std::optional<Frame>> Next();
  // Bytes held that are not yet part of a returned frame.
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
  std::optional<Error> error_;
};

}  // namespace airlock::protocol
