#include "protocol/frame_decoder.h"

namespace airlock::protocol {
namespace {

uint32_t Le32(const char* p) {
  return static_cast<uint32_t>(static_cast<uint8_t>(p[0])) |
         static_cast<uint32_t>(static_cast<uint8_t>(p[1])) << 8 |
         static_cast<uint32_t>(static_cast<uint8_t>(p[2])) << 16 |
         static_cast<uint32_t>(static_cast<uint8_t>(p[3])) << 24;
}

}  // namespace

void FrameDecoder::Feed(std::string_view bytes) {
  if (pos_ > 0 && pos_ >= buf_.size() / 2) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(bytes);
}

Result<std::optional<Frame>> FrameDecoder::Next() {
  if (error_) return std::unexpected(*error_);
  if (buffered() < kHeaderSize) return std::nullopt;
  const char* h = buf_.data() + pos_;
  uint32_t len = Le32(h);
  uint8_t version = static_cast<uint8_t>(h[4]);
  uint8_t type = static_cast<uint8_t>(h[5]);
  uint16_t flags =
      static_cast<uint16_t>(static_cast<uint8_t>(h[6]) | static_cast<uint8_t>(h[7]) << 8);
  uint32_t stream = Le32(h + 8);
  if (version != kProtocolVersion) {
    error_ = Error(ErrorCode::kProtocol, "frame has protocol version " + std::to_string(version) +
                                             ", expected " + std::to_string(kProtocolVersion));
  } else if (!IsKnownMsgType(type)) {
    error_ = Error(ErrorCode::kProtocol, "frame has unknown type " + std::to_string(type));
  } else if (flags != 0) {
    error_ = Error(ErrorCode::kProtocol, "frame has reserved flags set");
  } else if (len > kMaxPayload) {
    error_ = Error(ErrorCode::kProtocol, "frame payload of " + std::to_string(len) +
                                             " bytes exceeds the limit of " +
                                             std::to_string(kMaxPayload));
  }
  if (error_) return std::unexpected(*error_);
  if (buffered() < kHeaderSize + len) return std::nullopt;
  Frame frame{static_cast<MsgType>(type), stream, buf_.substr(pos_ + kHeaderSize, len)};
  pos_ += kHeaderSize + len;
  return frame;
}

}  // namespace airlock::protocol
