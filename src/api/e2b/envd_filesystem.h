// What envd's filesystem service and its /files routes share (envd_filesystem.cc,
// envd_files.cc), pure functions of sbx's file entries and watch events, tested in
// envd_files_test.cc.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/e2b/guest_ids.h"
#include "service/agent_types.h"

namespace sbx::api::e2b {

// EntryInfo (e2b-compat.md §9) of an sbx entry: type FILE_TYPE_FILE / DIRECTORY / SYMLINK
// (always set: the SDKs' list drops entries without one, so sbx's "other" — a FIFO, socket or
// device — is listed as a file), size as an int64 string, mode the permission bits,
// permissions as Go's FileMode.String() ("-rw-r--r--", "drwxr-xr-x", "Lrwxrwxrwx",
// "dtrwxrwxrwx"), owner and group the numeric ids as strings, modifiedTime RFC 3339,
// symlinkTarget for a symlink.
nlohmann::json EntryInfo(const service::FileEntry& e);
// envd names the owner and group ("user", "root"): their names in the sandbox's /etc/passwd
// and /etc/group replace the numbers of `info` (an EntryInfo), where those files name them.
void NameOwners(nlohmann::json& info, const GuestIds& ids);
// Go's os.FileMode(...).String() of an sbx type and permission bits.
std::string GoPermissions(std::string_view type, uint64_t mode);
// An entry of the agent's listing ({name, path, type, size, mode, uid, gid, mtime
// [, symlink_target]}) as EntryInfo; nullopt when it is not one.
std::optional<nlohmann::json> EntryInfoFromListing(const nlohmann::json& entry);

// envd's FilesystemEvents ({"name", "type": "EVENT_TYPE_*"}) for one sbx watch event under
// the watched directory `root` (absolute, normalized): names are relative to it, as envd's.
// create → CREATE, modify → WRITE, delete → REMOVE, a move → RENAME of the old name and CREATE
// of the new (as fsnotify reports a rename). sbx's uploads write a temporary file
// (.sbx-upload-*), rename it into place and close it: the temporary file's events are hidden,
// the rename is a CREATE of the file and the close its WRITE, what envd's in-place write
// gives. overflow: nothing.
std::vector<nlohmann::json> FilesystemEvents(std::string_view root,
                                             const service::FileWatchEvent& ev);

}  // namespace sbx::api::e2b
