// A template's tree (a layer in the template store) as a read-only ext4 image, so that a
// microVM reads it as a virtio disk instead of a 9p share: QEMU cannot migrate a VM with a 9p
// share mounted, and suspend is a migration to a file (docs/microvm.md, "Suspend").
//
// Made once per tree with `mke2fs -d` (which copies modes, owners, xattrs such as overlay's
// opaque markers, device nodes such as its whiteouts, and hard links) into the cache
// directory, and shared read-only by every VM of every sandbox that uses the tree. Layer trees
// are immutable once stored, so the tree's path and its root's identity (device, inode, change
// time) name the image: nothing below the root is read on a hit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sbx::runtime::microvm {

struct TreeSize {
  uint64_t data_bytes = 0;  // file contents and directories, in whole 4 KiB blocks
  uint64_t inodes = 0;
};

// What `tree` holds (not following symlinks).
absl::StatusOr<TreeSize> MeasureTree(const std::string& tree);

// The image's size in MiB for a tree of `s`: its blocks, its inode tables and ext4's own
// metadata, with a margin (mke2fs -d fails when the image is full).
int64_t TreeImageMib(const TreeSize& s);

// The image of `tree` under `cache_dir` (tree-<key>.img), made now when it is not there yet.
// Safe against concurrent callers for the same tree (each makes a temporary file and renames
// it into place) and against a crash midway (a `.tmp-` file the backend's sweep removes).
absl::StatusOr<std::string> TreeImage(const std::string& tree, const std::string& cache_dir);

// The start-up sweep's part for what VMs share (docs/microvm.md, "How a sandbox is built"):
// removes the tree images (tree-*.img) and masked views (views/*) under `assets_dir` that no
// VM under `vm_root` uses (named in its vm.json's VMM command line or its jail.json, or, for
// an image, hard-linked into a Firecracker root) and that are older than `min_age_s` (one a
// create is making or about to use is younger). Returns what it removed.
std::vector<std::string> SweepSharedAssets(const std::string& assets_dir, const std::string& vm_root,
                                           int64_t min_age_s);

}  // namespace sbx::runtime::microvm
