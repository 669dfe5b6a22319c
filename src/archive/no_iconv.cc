// Linked into the static sbx-agent only, with -Wl,--wrap=iconv_open (src/agent/CMakeLists.txt):
// every call of iconv_open in the agent lands here and fails, as if the conversion were
// unknown. The agent is PID 1 of a sandbox and its root is the sandbox's file system: glibc's
// iconv_open would read gconv-modules(.cache) from the sandbox's /usr/lib and could dlopen a
// conversion module from there into the agent. libarchive (the only caller) then keeps a
// name's bytes as they are, which is what extracting to a file system wants.
#include <iconv.h>

#include <cerrno>

extern "C" iconv_t __wrap_iconv_open(const char* /*tocode*/, const char* /*fromcode*/) {
  errno = EINVAL;
  return reinterpret_cast<iconv_t>(-1);
}
