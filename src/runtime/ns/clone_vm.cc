#include "runtime/ns/clone_vm.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::runtime::ns {

absl::StatusOr<ChildStack> ChildStack::Make(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, "clone: mmap(child stack)");
  if (::mprotect(p, 4096, PROT_NONE) != 0) {
    int err = errno;
    ::munmap(p, bytes);
    return ErrnoStatus(err, "clone: mprotect(child stack guard)");
  }
  return ChildStack(p, bytes);
}

ChildStack::~ChildStack() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

namespace {

#if defined(__x86_64__)
// The child starts on args->stack: it must not return into this frame (which lives on the
// parent's stack), so it calls fn(arg) from assembly and exits if fn ever returns.
__attribute__((noinline)) long Clone3OnStack(struct clone_args* args, int (*fn)(void*), void* arg) {
  long ret;
  register int (*entry)(void*) asm("r12") = fn;
  register void* entry_arg asm("r13") = arg;
  asm volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xor %%ebp, %%ebp\n\t"
      "mov %%r13, %%rdi\n\t"
      "call *%%r12\n\t"
      "mov %%eax, %%edi\n\t"
      "mov $60, %%eax\n\t"  // SYS_exit
      "syscall\n\t"
      "hlt\n\t"
      "1:\n\t"
      : "=a"(ret)
      : "0"(static_cast<long>(SYS_clone3)), "D"(args), "S"(sizeof(*args)), "r"(entry), "r"(entry_arg)
      : "rcx", "r11", "memory");
  return ret;
}
#endif

}  // namespace

long CloneRun(struct clone_args* args, int (*fn)(void*), void* arg) {
  if constexpr (kCloneSharesVm) {
#if defined(__x86_64__)
    return Clone3OnStack(args, fn, arg);
#endif
  }
  long rc = ::syscall(SYS_clone3, args, sizeof(*args));
  if (rc < 0) return -errno;
  if (rc == 0) ::_exit(fn(arg));
  return rc;
}

}  // namespace sbx::runtime::ns
