// clone3 of a child that shares the caller's memory (CLONE_VM) and runs on a stack of its own,
// the way posix_spawn does: no page tables are copied, which on these VMs is most of the cost
// of a fork of sbxd. Used by the launcher (with CLONE_VFORK) and by MakeUserNamespace.
//
// Sanitizer runtimes do not expect a second task on their thread's memory, and the trampoline
// is x86-64 assembly, so other builds fall back to the copying clone (kCloneSharesVm false).
#pragma once

#include <linux/sched.h>

#include <cstddef>

#include "absl/status/statusor.h"

namespace sbx::runtime::ns {

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) && \
    !defined(SBX_LAUNCH_COPIES_VM)
inline constexpr bool kCloneSharesVm = true;
#else
inline constexpr bool kCloneSharesVm = false;
#endif

// A child stack: mmap'd, its lowest page a guard so an overflow faults instead of writing into
// other memory. Unmapped on destruction: only after the child has exec'd or exited.
class ChildStack {
 public:
  static absl::StatusOr<ChildStack> Make(size_t bytes);
  ChildStack(ChildStack&& o) noexcept : base_(o.base_), size_(o.size_) { o.base_ = nullptr; }
  ChildStack& operator=(ChildStack&&) = delete;
  ~ChildStack();
  void* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  ChildStack(void* base, size_t size) : base_(base), size_(size) {}
  void* base_;
  size_t size_;
};

// clone3(args) whose child calls fn(arg) and exits with its result; returns the child's pid in
// the parent, or -errno. When kCloneSharesVm, args->stack/stack_size must name a ChildStack
// (the caller adds CLONE_VM itself); otherwise the child runs on a copy of the caller's memory.
long CloneRun(struct clone_args* args, int (*fn)(void*), void* arg);

}  // namespace sbx::runtime::ns
