// Replacing a small file so that a reader sees the old contents or the new, never a mix.
//
// The text goes to <path>.tmp in the same directory (created with `mode`, which is then set
// whatever the umask), which is then renamed over <path>. On any failure the temporary file is
// removed, <path> is left as it was and the error names the file and the reason. One writer per
// path at a time (the temporary name is fixed). Whatever lies at <path>.tmp is removed first and
// the temporary is created anew (O_EXCL, O_NOFOLLOW): a symbolic link planted there redirects
// nothing. The file and its directory are synced: once this returns, a crash keeps the new text.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "common/result.h"

namespace nvshare {

Status replace_file(const std::string& path, std::string_view text, mode_t mode = 0644);

// Creates the directories above `path` that do not exist yet; the error names the directory.
Status create_parent_directories(const std::string& path);

}  // namespace nvshare
