#include "net/ip_prefix.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <charconv>

#include <fmt/format.h>

#include "absl/status/status.h"

namespace sbx::net {

static_assert(AF_INET == 2, "is_v4() and bits() assume Linux's AF_INET");

absl::StatusOr<IpPrefix> IpPrefix::Parse(std::string_view text) {
  std::string_view addr_text = text;
  int len = -1;
  if (size_t slash = text.find('/'); slash != std::string_view::npos) {
    addr_text = text.substr(0, slash);
    std::string_view len_text = text.substr(slash + 1);
    int v = 0;
    auto [ptr, ec] = std::from_chars(len_text.data(), len_text.data() + len_text.size(), v);
    if (len_text.empty() || len_text.size() > 3 || len_text[0] < '0' || len_text[0] > '9' ||
        ec != std::errc() ||
        ptr != len_text.data() + len_text.size()) {
      return absl::InvalidArgumentError(
          fmt::format("'{}' is not an address range: the prefix length is not a number", text));
    }
    len = v;
  }
  if (addr_text.empty() || addr_text.size() > 45) {
    return absl::InvalidArgumentError(fmt::format("'{}' is not an IP address or range", text));
  }
  std::string a(addr_text);
  IpPrefix p;
  if (::inet_pton(AF_INET, a.c_str(), p.addr.data()) == 1) {
    p.family = AF_INET;
  } else if (::inet_pton(AF_INET6, a.c_str(), p.addr.data()) == 1) {
    p.family = AF_INET6;
  } else {
    return absl::InvalidArgumentError(fmt::format("'{}' is not an IP address or range", text));
  }
  if (len < 0) len = p.bits();
  if (len > p.bits()) {
    return absl::InvalidArgumentError(
        fmt::format("'{}': prefix length {} is longer than {}", text, len, p.bits()));
  }
  p.len = len;
  for (int bit = len; bit < p.bits(); ++bit) {
    if (p.addr[bit / 8] & (0x80 >> (bit % 8))) {
      return absl::InvalidArgumentError(fmt::format(
          "'{}' has address bits set past its /{} (did you mean {}?)", text, len,
          IpPrefix{p.family, [&] {
                     auto m = p.addr;
                     for (int b = len; b < p.bits(); ++b) m[b / 8] &= ~(0x80 >> (b % 8));
                     return m;
                   }(),
                   len}
              .ToString()));
    }
  }
  return p;
}

IpPrefix IpPrefix::Host(int family, const uint8_t* bytes) {
  IpPrefix p;
  p.family = family;
  p.len = family == AF_INET ? 32 : 128;
  for (int i = 0; i < p.len / 8; ++i) p.addr[i] = bytes[i];
  return p;
}

bool IpPrefix::Contains(const IpPrefix& o) const {
  if (family != o.family || o.len < len) return false;
  int full = len / 8;
  for (int i = 0; i < full; ++i) {
    if (addr[i] != o.addr[i]) return false;
  }
  if (int rest = len % 8; rest != 0) {
    uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
    if ((addr[full] & mask) != (o.addr[full] & mask)) return false;
  }
  return true;
}

std::string IpPrefix::AddressString() const {
  char buf[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(family, addr.data(), buf, sizeof(buf));
  return buf;
}

std::string IpPrefix::ToString() const { return fmt::format("{}/{}", AddressString(), len); }

IpPrefix IpPrefix::Offset(uint64_t offset, int new_len) const {
  IpPrefix p = *this;
  p.len = new_len;
  int i = bytes() - 1;
  unsigned carry = 0;
  while (i >= 0 && (offset != 0 || carry != 0)) {
    unsigned sum = p.addr[i] + static_cast<unsigned>(offset & 0xff) + carry;
    p.addr[i] = static_cast<uint8_t>(sum);
    carry = sum >> 8;
    offset >>= 8;
    --i;
  }
  return p;
}

}  // namespace sbx::net
