// Byte scans of the stream readers' hot paths, and the CPU feature check their SIMD forms use.
// Header-only: the static sbx-agent builds sbx_common's sources itself, and these are small.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace sbx {

// AVX2, checked once per process: the SIMD paths are taken only where the CPU has it.
inline bool HaveAvx2() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return have;
}

namespace byte_scan_detail {
// 64 bytes per step while 64 can be read; returns the position of the first `a` or `b`, or
// the index where the scalar tail must take over (a multiple of 64 past `from`).
__attribute__((target("avx2"))) inline size_t FindEitherAvx2(const char* p, size_t from,
                                                              size_t n, char a, char b,
                                                              bool* found) {
  const __m256i va = _mm256_set1_epi8(a);
  const __m256i vb = _mm256_set1_epi8(b);
  size_t i = from;
  for (; i + 64 <= n; i += 64) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32));
    const __m256i hx = _mm256_or_si256(_mm256_cmpeq_epi8(x, va), _mm256_cmpeq_epi8(x, vb));
    const __m256i hy = _mm256_or_si256(_mm256_cmpeq_epi8(y, va), _mm256_cmpeq_epi8(y, vb));
    const uint64_t mask = static_cast<uint32_t>(_mm256_movemask_epi8(hx)) |
                          (uint64_t{static_cast<uint32_t>(_mm256_movemask_epi8(hy))} << 32);
    if (mask != 0) {
      *found = true;
      return i + static_cast<size_t>(__builtin_ctzll(mask));
    }
  }
  *found = false;
  return i;
}
}  // namespace byte_scan_detail

// The position of the first `a` or `b` in s[from, size), or s.size(). One pass where two
// memchr calls would read the bytes twice: an SSE reader looks for CR and LF in every byte of
// data lines that run to hundreds of KiB.
inline size_t FindEitherByte(std::string_view s, char a, char b, size_t from = 0) {
  const size_t n = s.size();
  if (from >= n) return n;
  size_t i = from;
  if (n - from >= 64 && HaveAvx2()) {
    bool found = false;
    i = byte_scan_detail::FindEitherAvx2(s.data(), from, n, a, b, &found);
    if (found) return i;
  }
  for (; i < n; ++i) {
    if (s[i] == a || s[i] == b) return i;
  }
  return n;
}

}  // namespace sbx
