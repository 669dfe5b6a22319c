#include "common/log_format.h"

#include <charconv>
#include <cmath>
#include <ctime>

namespace sbx::log {
namespace {

constexpr char kHex[] = "0123456789abcdef";

unsigned char At(std::string_view s, size_t i) { return static_cast<unsigned char>(s[i]); }

// The length of the well-formed UTF-8 sequence at s[i] (2 to 4; the caller handles ASCII), or
// 0 with *bad set to the length of the maximal ill-formed subpart there (Unicode's "maximal
// subpart" rule: one replacement per broken sequence, not one per byte).
size_t Utf8Sequence(std::string_view s, size_t i, size_t* bad) {
  const unsigned char c = At(s, i);
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte; later ones are 80..BF
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2, lo = 0xA0;  // no overlongs
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    need = 2;
  } else if (c == 0xED) {
    need = 2, hi = 0x9F;  // no surrogates
  } else if (c == 0xF0) {
    need = 3, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3, hi = 0x8F;  // nothing above U+10FFFF
  } else {
    *bad = 1;  // a continuation byte, C0, C1 or F5..FF as a lead
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      *bad = k;
      return 0;
    }
    const unsigned char x = At(s, i + k);
    if (x < (k == 1 ? lo : 0x80) || x > (k == 1 ? hi : 0xBF)) {
      *bad = k;
      return 0;
    }
  }
  return need + 1;
}

// U+0080..U+009F: C1 controls, which some terminals act on (0x9B is CSI).
bool IsC1(std::string_view s, size_t i, size_t len) {
  return len == 2 && At(s, i) == 0xC2 && At(s, i + 1) < 0xA0;
}

void AppendU00(std::string& out, unsigned v) {
  out += "\\u00";
  out += kHex[(v >> 4) & 0xF];
  out += kHex[v & 0xF];
}

void AppendX(std::string& out, unsigned char v) {
  out += "\\x";
  out += kHex[v >> 4];
  out += kHex[v & 0xF];
}

// Printable ASCII that needs no escape in either format (the JSON one adds '"' and '\').
bool PlainAscii(unsigned char c) { return c >= 0x20 && c < 0x7F; }

void AppendJsonNumber(std::string& out, const Attr& a) {
  char buf[64];
  std::to_chars_result r{};
  if (a.kind() == Attr::Kind::kInt) {
    r = std::to_chars(buf, buf + sizeof(buf), a.integer());
  } else if (!std::isfinite(a.number())) {
    out += "null";
    return;
  } else {
    r = std::to_chars(buf, buf + sizeof(buf), a.number(), std::chars_format::fixed, 3);
  }
  if (r.ec != std::errc()) {
    out += "null";
    return;
  }
  out.append(buf, r.ptr);
}

// Text values are bare when they are a single printable token, else quoted like JSON strings.
void AppendTextValue(std::string& out, std::string_view v) {
  bool bare = !v.empty();
  for (char ch : v) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7F || c == '"' || c == '=' || c == '\\') {
      bare = false;
      break;
    }
  }
  if (bare) {
    out += v;
  } else {
    AppendJsonString(out, v);
  }
}

struct TimestampCache {
  int64_t second = INT64_MIN;
  char prefix[20];  // "2026-11-30T14:00:00"
};

}  // namespace

void AppendJsonString(std::string& out, std::string_view s) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    // Runs of plain ASCII are copied at once: most messages are nothing else.
    size_t j = i;
    while (j < s.size() && PlainAscii(At(s, j)) && s[j] != '"' && s[j] != '\\') ++j;
    out.append(s.data() + i, j - i);
    i = j;
    if (i >= s.size()) break;
    const unsigned char c = At(s, i);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default: AppendU00(out, c);  // other C0 controls and DEL
      }
      ++i;
      continue;
    }
    size_t bad = 0;
    const size_t len = Utf8Sequence(s, i, &bad);
    if (len == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += bad;
    } else if (IsC1(s, i, len)) {
      AppendU00(out, At(s, i + 1));
      i += len;
    } else {
      out.append(s.data() + i, len);
      i += len;
    }
  }
  out += '"';
}

void AppendTextEscaped(std::string& out, std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    while (j < s.size() && PlainAscii(At(s, j))) ++j;
    out.append(s.data() + i, j - i);
    i = j;
    if (i >= s.size()) break;
    const unsigned char c = At(s, i);
    if (c < 0x80) {
      switch (c) {
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default: AppendX(out, c);
      }
      ++i;
      continue;
    }
    size_t bad = 0;
    const size_t len = Utf8Sequence(s, i, &bad);
    if (len == 0) {
      for (size_t k = 0; k < bad; ++k) AppendX(out, At(s, i + k));
      i += bad;
    } else if (IsC1(s, i, len)) {
      AppendU00(out, At(s, i + 1));
      i += len;
    } else {
      out.append(s.data() + i, len);
      i += len;
    }
  }
}

void AppendTimestamp(std::string& out, std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const int64_t ms = duration_cast<milliseconds>(t.time_since_epoch()).count();
  int64_t sec = ms / 1000;
  int64_t frac = ms % 1000;
  if (frac < 0) {  // before 1970: floor, not truncate
    frac += 1000;
    --sec;
  }
  // gmtime_r and the digits once per second and thread, not once per record.
  thread_local TimestampCache cache;
  if (cache.second != sec) {
    time_t tt = static_cast<time_t>(sec);
    struct tm tm {};
    gmtime_r(&tt, &tm);
    const int parts[] = {tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                         tm.tm_hour,        tm.tm_min,     tm.tm_sec};
    char* p = cache.prefix;
    const int year = parts[0] < 0 ? 0 : parts[0] > 9999 ? 9999 : parts[0];
    *p++ = static_cast<char>('0' + year / 1000);
    *p++ = static_cast<char>('0' + year / 100 % 10);
    *p++ = static_cast<char>('0' + year / 10 % 10);
    *p++ = static_cast<char>('0' + year % 10);
    const char seps[] = {'-', '-', 'T', ':', ':'};
    for (int k = 1; k < 6; ++k) {
      *p++ = seps[k - 1];
      *p++ = static_cast<char>('0' + parts[k] / 10);
      *p++ = static_cast<char>('0' + parts[k] % 10);
    }
    cache.second = sec;
  }
  out.append(cache.prefix, sizeof(cache.prefix) - 1);
  out += '.';
  out += static_cast<char>('0' + frac / 100);
  out += static_cast<char>('0' + frac / 10 % 10);
  out += static_cast<char>('0' + frac % 10);
  out += 'Z';
}

void AppendRecord(std::string& out, Format format, const Record& r, std::string_view level_color) {
  if (format == Format::kJson) {
    out += "{\"ts\":\"";
    AppendTimestamp(out, r.time);
    out += "\",\"level\":";
    AppendJsonString(out, r.level);
    out += ",\"msg\":";
    AppendJsonString(out, r.msg);
    for (const Field& f : r.fields) {
      if (f.value.empty()) continue;
      out += ',';
      AppendJsonString(out, f.key);
      out += ':';
      AppendJsonString(out, f.value);
    }
    for (const Attr& a : r.attrs) {
      out += ',';
      AppendJsonString(out, a.key());
      out += ':';
      if (a.kind() == Attr::Kind::kString) {
        AppendJsonString(out, a.str());
      } else {
        AppendJsonNumber(out, a);
      }
    }
    out += "}\n";
    return;
  }
  AppendTimestamp(out, r.time);
  out += ' ';
  if (!level_color.empty()) out += level_color;
  AppendTextEscaped(out, r.level);
  if (!level_color.empty()) out += "\x1b[m";
  out += ' ';
  AppendTextEscaped(out, r.msg);
  for (const Field& f : r.fields) {
    if (f.value.empty()) continue;
    out += ' ';
    AppendTextEscaped(out, f.key);
    out += '=';
    AppendTextValue(out, f.value);
  }
  out += '\n';
}

}  // namespace sbx::log
