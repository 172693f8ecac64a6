// The file-system calls the libraries and the CLI share (the folder datasets, the checkpoints and
// the data fingerprint, the safetensors files, the CLI's output paths), on POSIX calls. Not
// std::filesystem: the PyPI libtorch.so exports its own copies of std::filesystem's free
// functions (status, canonical, remove_all, ...), built against another libstdc++, and the
// dynamic linker binds ours to them — remove_all crashes through a null pointer. Plain POSIX has
// no such clash.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "tandem/error.h"

namespace tandem::fs {

inline std::string errno_text(int code) {
  return std::error_code(code, std::generic_category()).message();
}

/// What stat() (following symlinks) says about a path.
struct PathStatus {
  bool exists = false;
  bool is_directory = false;
  int error = 0;     ///< errno when !exists
  dev_t device = 0;  ///< (device, inode): the identity of what `path` leads to
  ino_t inode = 0;
  bool is_regular_file = false;
};

inline PathStatus path_status(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {false, false, errno};
  return {true, S_ISDIR(st.st_mode), 0, st.st_dev, st.st_ino, S_ISREG(st.st_mode)};
}

inline bool exists(const std::string& path) { return path_status(path).exists; }
inline bool is_dir(const std::string& path) { return path_status(path).is_directory; }

/// os.path.join(a, b) for a relative b.
inline std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty() || a.back() == '/') return a + b;
  return a + "/" + b;
}

/// The folder `path` names its entry in: "." for a bare name, "/" for "/x"; trailing slashes
/// name the same entry ("a/b/" is in "a").
inline std::string parent_of(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

/// mkdir -p: `path` and every missing folder above it (mode 0755). Throws tandem::Error naming
/// the folder that could not be made.
inline void make_dirs(const std::string& path) {
  if (path.empty() || is_dir(path)) return;
  make_dirs(parent_of(path));
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    throw Error("cannot make the folder " + path + ": " + errno_text(errno));
}

/// The name without its last extension, as Python's Path.stem: "a.b.png" -> "a.b",
/// ".hidden" -> ".hidden".
inline std::string stem_of(const std::string& name) {
  const size_t dot = name.find_last_of('.');
  return dot == std::string::npos || dot == 0 ? name : name.substr(0, dot);
}

/// realpath(3); throws tandem::Error naming `path` on failure.
inline std::string real_path(const std::string& path, const char* who) {
  std::unique_ptr<char, void (*)(void*)> resolved(::realpath(path.c_str(), nullptr), std::free);
  if (!resolved)
    throw Error(std::string(who) + ": cannot resolve '" + path + "': " + errno_text(errno));
  return resolved.get();
}

/// What a stat() mode is when it is not a folder or a regular file: "a named pipe", "a socket",
/// "a character device", "a block device"; nullptr for a folder or a regular file. Such a file
/// is never opened as a sample: open() of a FIFO blocks until a writer comes, and opening a
/// device can act on it (a tape rewinds).
inline const char* special_file_kind(mode_t mode) {
  if (S_ISREG(mode) || S_ISDIR(mode)) return nullptr;
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "an unknown kind of file";
}

/// What a folder entry leads to, following symlinks.
enum class EntryKind { kFolder, kRegularFile, kSpecialFile, kBroken };

struct DirEntry {
  std::string name;
  EntryKind kind = EntryKind::kBroken;  ///< kBroken: stat() failed (a dangling symlink)
  dev_t device = 0;  ///< (device, inode): the identity of what it leads to, for cycle checks
  ino_t inode = 0;
  off_t size = 0;  ///< in bytes, of what it leads to
  bool is_folder() const { return kind == EntryKind::kFolder; }
};

/// The entries of `dir` except . and .., unsorted; stat()ed, never opened. Throws tandem::Error
/// naming `dir` when it cannot be listed.
inline std::vector<DirEntry> list_dir(const std::string& dir, const char* who) {
  std::unique_ptr<DIR, int (*)(DIR*)> handle(::opendir(dir.c_str()), ::closedir);
  if (!handle)
    throw Error(std::string(who) + ": cannot list folder '" + dir + "': " + errno_text(errno));
  std::vector<DirEntry> entries;
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(handle.get());
    if (entry == nullptr) {
      if (errno != 0)
        throw Error(std::string(who) + ": cannot list folder '" + dir + "': " + errno_text(errno));
      break;
    }
    DirEntry out{entry->d_name};
    if (out.name == "." || out.name == "..") continue;
    struct stat st {};
    if (::stat(join_path(dir, out.name).c_str(), &st) == 0) {
      out.kind = S_ISDIR(st.st_mode)   ? EntryKind::kFolder
                 : S_ISREG(st.st_mode) ? EntryKind::kRegularFile
                                       : EntryKind::kSpecialFile;
      out.device = st.st_dev;
      out.inode = st.st_ino;
      out.size = st.st_size;
    }
    entries.push_back(std::move(out));
  }
  return entries;
}

/// Whether `path` is a folder with at least one entry besides . and .. (false when it cannot be
/// listed).
inline bool is_non_empty_dir(const std::string& path) {
  std::unique_ptr<DIR, int (*)(DIR*)> handle(::opendir(path.c_str()), ::closedir);
  if (!handle) return false;
  while (const dirent* e = ::readdir(handle.get())) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") return true;
  }
  return false;
}

/// fsync of a file or folder by path: makes its content (a folder: its entries) durable.
/// Throws tandem::Error naming `path`.
inline void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open " + path + " to flush it: " + errno_text(errno));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) throw Error("cannot flush " + path + " to disk: " + errno_text(saved));
}

/// Writes `text` to `path` atomically: to `temporary` beside it, flushed to disk, renamed over
/// `path`, the folder flushed. A reader sees the old file or the new one, never half; on failure
/// the temporary is removed and `path` stays as it was. Throws tandem::Error naming the file.
inline void write_file_atomic(const std::string& path, const std::string& text,
                              const std::string& temporary) {
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write " + temporary + ": " + errno_text(errno));
  size_t done = 0;
  int failed = 0;
  while (done < text.size() && failed == 0) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      failed = errno;
    else
      done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && failed == 0) failed = errno;
  if (failed != 0) {
    ::unlink(temporary.c_str());
    throw Error("cannot write " + temporary + ": " + errno_text(failed));
  }
  try {
    fsync_path(temporary);
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(temporary.c_str());
    throw Error("cannot rename " + temporary + " to " + path + ": " + errno_text(e));
  }
  fsync_path(parent_of(path));
}

/// rm -r of the folder `path`, silently: what cannot be removed stays, and a `path` that is not
/// a folder is left as it is. A symlink inside is removed, never followed.
inline void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;
  std::vector<std::string> names;
  if (std::unique_ptr<DIR, int (*)(DIR*)> handle(::opendir(path.c_str()), ::closedir); handle)
    while (const dirent* e = ::readdir(handle.get())) names.emplace_back(e->d_name);
  for (const std::string& name : names) {
    if (name == "." || name == "..") continue;
    const std::string child = join_path(path, name);
    struct stat cs {};
    if (::lstat(child.c_str(), &cs) == 0 && S_ISDIR(cs.st_mode))
      remove_tree(child);
    else
      ::unlink(child.c_str());
  }
  ::rmdir(path.c_str());
}

/// The whole of a regular file, or nullopt with the reason in `*why` ("is a folder, not a
/// file", "shorter than its size", the system's).
inline std::optional<std::vector<uint8_t>> read_file(const std::string& path, std::string* why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = errno_text(errno);
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *why = S_ISDIR(st.st_mode) ? "is a folder, not a file" : errno_text(errno);
    ::close(fd);
    return std::nullopt;
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *why = n == 0 ? "shorter than its size" : errno_text(errno);
      ::close(fd);
      return std::nullopt;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return bytes;
}

}  // namespace tandem::fs
