// CheckpointStore: atomic, checksummed checkpoint folders, and the data fingerprint a checkpoint
// identifies its data by (see checkpoint.h). POSIX calls, not
// std::filesystem: the PyPI LibTorch this project links is built with an older libstdc++ ABI
// setting that makes std::filesystem symbols clash.
#include "tandem/train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "posix_fs.h"
#include "tandem/data/idx.h"  // read_maybe_gzip
#include "tandem/error.h"

namespace tandem::train {

namespace {

std::string reason() { return std::strerror(errno); }

using fs::fsync_path;
using fs::is_dir;
using fs::remove_tree;

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%09lld", static_cast<long long>(step));
  return buf;
}

using fs::parent_of;

// A 64-bit hash for identity (not security): 8-byte words through a multiply-rotate mix, then
// murmur3's finalizer. A short tail is padded to a word, so the value depends on how the bytes
// are split into update() calls: the same calls give the same value (hash_file's chunks are
// whole MiB but the last).
class Hash64 {
 public:
  explicit Hash64(uint64_t seed = 0x6a09e667f3bcc909ULL) : h_(seed) {}
  void update(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    size_t i = 0;
    for (; i + 8 <= size; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix(w);
    }
    if (i < size) {
      uint64_t w = 0;
      std::memcpy(&w, p + i, size - i);
      mix(w ^ (static_cast<uint64_t>(size - i) << 59));
    }
    length_ += size;
  }
  void update(uint64_t v) { update(&v, sizeof v); }
  void update(const std::string& s) {
    update(static_cast<uint64_t>(s.size()));
    update(s.data(), s.size());
  }
  uint64_t value() const {
    uint64_t k = h_ ^ length_;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
  }

 private:
  void mix(uint64_t w) {
    w *= 0x87c37b91114253d5ULL;
    w = (w << 31) | (w >> 33);
    h_ ^= w * 0x4cf5ad432745937fULL;
    h_ = ((h_ << 27) | (h_ >> 37)) * 5 + 0x52dce729;
  }
  uint64_t h_;
  uint64_t length_ = 0;
};

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The size and content hash of the file at `path`, read in 1 MiB chunks. Throws tandem::Error.
std::pair<uint64_t, uint64_t> hash_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot read " + path + ": " + reason());
  std::vector<uint8_t> buf(1 << 20);
  Hash64 h;
  uint64_t total = 0;
  for (;;) {
    size_t filled = 0;  // fill the chunk whole, so update() sees multiples of 8 (see Hash64)
    while (filled < buf.size()) {
      const ssize_t n = ::read(fd, buf.data() + filled, buf.size() - filled);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const std::string why = reason();
        ::close(fd);
        throw Error("cannot read " + path + ": " + why);
      }
      if (n == 0) break;
      filled += static_cast<size_t>(n);
    }
    h.update(buf.data(), filled);
    total += filled;
    if (filled < buf.size()) break;
  }
  ::close(fd);
  return {total, h.value()};
}

constexpr const char* kTensorFiles[] = {"model.safetensors", "optimizer.safetensors",
                                        "rng.safetensors"};

}  // namespace

void make_dirs(const std::string& path) { fs::make_dirs(path); }

void write_file_atomic(const std::string& path, const std::string& text) {
  fs::write_file_atomic(path, text, path + ".tmp");
}

CheckpointStore::CheckpointStore(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {
  TANDEM_CHECK_ARG(keep_ >= 1, "checkpoints to keep ", keep_, " is not valid: expected >= 1");
  make_dirs(dir_);
}

std::vector<std::string> CheckpointStore::list() const {
  std::vector<std::string> names;
  if (is_dir(dir_))
    for (const fs::DirEntry& e : fs::list_dir(dir_, "listing the checkpoints")) {
      // "step-" and nine digits exactly: step-N.tmp (a save in progress or cut short) is not one.
      if (e.is_folder() && e.name.size() == 14 && e.name.rfind("step-", 0) == 0 &&
          std::all_of(e.name.begin() + 5, e.name.end(),
                      [](char c) { return c >= '0' && c <= '9'; }))
        names.push_back(e.name);
    }
  std::sort(names.begin(), names.end());
  for (auto& n : names) n = dir_ + "/" + n;
  return names;
}

std::optional<std::string> CheckpointStore::latest() const {
  const std::vector<std::string> all = list();
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::string CheckpointStore::save(const Checkpoint& c) {
  const std::string final_dir = dir_ + "/" + step_name(c.step);
  const std::string tmp = final_dir + ".tmp";
  remove_tree(tmp);  // a save cut short before
  try {
    if (::mkdir(tmp.c_str(), 0755) != 0)
      throw Error("cannot make the checkpoint folder " + tmp + ": " + reason());
    models::save_safetensors(tmp + "/model.safetensors", c.model);
    models::save_safetensors(tmp + "/optimizer.safetensors", c.optimizer);
    models::save_safetensors(tmp + "/rng.safetensors", c.rng);
    nlohmann::json state = c.state;
    state["step"] = c.step;
    state["format"] = kCheckpointFormat;
    // Read back from the page cache: the checksum is of the bytes a resume will read.
    nlohmann::json files = nlohmann::json::object();
    for (const char* name : kTensorFiles) {
      const auto [bytes, hash] = hash_file(tmp + "/" + name);
      files[name] = {{"bytes", bytes}, {"hash", hex(hash)}};
    }
    state["files"] = files;
    write_file_atomic(tmp + "/state.json", state.dump(2) + "\n");
    fsync_path(tmp);
    if (is_dir(final_dir)) remove_tree(final_dir);  // the same step saved again (a resumed run)
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
      throw Error("cannot rename " + tmp + " to " + final_dir + ": " + reason());
    fsync_path(dir_);
  } catch (const std::exception& e) {
    remove_tree(tmp);
    const bool earlier = !list().empty();
    throw Error(std::string("checkpoint at step ") + std::to_string(c.step) + " not written (" +
                (earlier ? "the earlier ones are intact" : "there is no earlier one") +
                "): " + e.what());
  }
  const std::vector<std::string> all = list();
  for (size_t i = 0; i + keep_ < all.size(); ++i) remove_tree(all[i]);
  return final_dir;
}

Checkpoint CheckpointStore::load(const std::string& folder) {
  Checkpoint c;
  const std::string state_path = folder + "/state.json";
  std::ifstream in(state_path);
  if (!in) throw Error("cannot read " + state_path + ": " + reason());
  try {
    in >> c.state;
  } catch (const std::exception& e) {
    throw Error(state_path + " is not valid JSON: " + e.what());
  }
  if (!c.state.is_object() || !c.state.contains("step") || !c.state["step"].is_number_integer())
    throw Error(state_path + " has no integer \"step\"");
  c.step = c.state["step"].get<int64_t>();
  const std::string base = folder.substr(folder.find_last_of('/') + 1);
  if (base.rfind("step-", 0) == 0 && base != step_name(c.step))
    throw Error(state_path + " says step " + std::to_string(c.step) + ": expected the folder's, " +
                base);
  // Format 1 has no checksums: its files are checked only by parsing.
  if (c.state.contains("files")) {
    for (const char* name : kTensorFiles) {
      const nlohmann::json& want = c.state["files"].value(name, nlohmann::json::object());
      if (!want.contains("bytes") || !want.contains("hash"))
        throw Error(state_path + " records no size and checksum of " + name);
      const std::string path = folder + "/" + name;
      const auto [bytes, hash] = hash_file(path);
      if (bytes != want["bytes"].get<uint64_t>())
        throw Error(path + " has " + std::to_string(bytes) + " bytes: expected " +
                    std::to_string(want["bytes"].get<uint64_t>()) +
                    " (state.json): truncated "
                    "or replaced");
      if (hex(hash) != want["hash"].get<std::string>())
        throw Error(path + " has checksum " + hex(hash) + ": expected " +
                    want["hash"].get<std::string>() + " (state.json): its content is damaged");
    }
  }
  c.model = models::load_safetensors(folder + "/model.safetensors");
  c.optimizer = models::load_safetensors(folder + "/optimizer.safetensors");
  c.rng = models::load_safetensors(folder + "/rng.safetensors");
  return c;
}

std::string resolve_path(const std::string& path) {
  char buf[PATH_MAX];
  if (path.empty() || ::realpath(path.c_str(), buf) == nullptr) return path;
  return buf;
}

namespace {

bool ends_with(const std::string& s, const char* tail) {
  const size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

// The files the datasets read (checkpoint.h): images by extension, IDX by name.
enum class DataFile { kNone, kImage, kIdx };
DataFile data_file_kind(const std::string& name) {
  std::string lower = name;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (ends_with(lower, ".jpg") || ends_with(lower, ".jpeg") || ends_with(lower, ".png"))
    return DataFile::kImage;
  if (lower.find("-idx") != std::string::npos &&
      (ends_with(lower, "-ubyte") || ends_with(lower, "-ubyte.gz")))
    return DataFile::kIdx;
  return DataFile::kNone;
}

struct Tally {
  int64_t files = 0;
  uint64_t bytes = 0;
  Hash64 hash;
  nlohmann::json json() const {
    return {{"files", files}, {"bytes", bytes}, {"hash", hex(hash.value())}};
  }
};

// Depth first in name order, so the hashes do not depend on readdir's order. `on_path` holds
// the folders being walked (device, inode): a symlink back to one of them is not re-entered.
void walk(const std::string& root, const std::string& rel, Tally& total,
          std::map<std::string, Tally>& parts, std::set<std::pair<dev_t, ino_t>>& on_path,
          IdxIdentity idx) {
  const std::string dir = rel.empty() ? root : root + "/" + rel;
  std::vector<fs::DirEntry> entries = fs::list_dir(dir, "identifying the data");
  std::sort(entries.begin(), entries.end(),
            [](const fs::DirEntry& a, const fs::DirEntry& b) { return a.name < b.name; });
  for (const fs::DirEntry& entry : entries) {
    const std::string& name = entry.name;
    if (name[0] == '.') continue;
    const std::string child_rel = rel.empty() ? name : rel + "/" + name;
    const std::string path = root + "/" + child_rel;
    if (entry.kind == fs::EntryKind::kBroken) continue;  // a dangling symlink: none reads it
    if (entry.is_folder()) {
      const std::pair<dev_t, ino_t> id{entry.device, entry.inode};
      if (!on_path.insert(id).second) continue;
      walk(root, child_rel, total, parts, on_path, idx);
      on_path.erase(id);
      continue;
    }
    const DataFile kind =
        entry.kind == fs::EntryKind::kRegularFile ? data_file_kind(name) : DataFile::kNone;
    if (kind == DataFile::kNone) continue;
    Hash64 file;
    uint64_t bytes = static_cast<uint64_t>(entry.size);
    std::string name_kept = child_rel;
    // An IDX file is read whole by its dataset (and is tens of MB), so its content is cheap to
    // hash; an image folder's million files are identified by name and size alone. The IDX
    // content is what the dataset reads: gzipped or not, compressed again or not, the same data
    // (the name without ".gz", the size and hash of the uncompressed bytes).
    uint64_t content = 0;
    if (kind == DataFile::kIdx && idx == IdxIdentity::kContent) {
      const std::vector<uint8_t> data = data::read_maybe_gzip(path);
      Hash64 h;
      h.update(data.data(), data.size());
      content = h.value();
      bytes = data.size();
      if (ends_with(name_kept, ".gz") || ends_with(name_kept, ".GZ"))
        name_kept.resize(name_kept.size() - 3);
    } else if (kind == DataFile::kIdx) {
      content = hash_file(path).second;
    }
    file.update(name_kept);
    file.update(bytes);
    if (kind == DataFile::kIdx) file.update(content);
    const uint64_t h = file.value();
    const std::string part = name_kept.substr(0, name_kept.find('/'));
    for (Tally* t : {&total, &parts[part]}) {
      t->files += 1;
      t->bytes += bytes;
      t->hash.update(h);
    }
  }
}

}  // namespace

nlohmann::json fingerprint_data(const std::string& dir, IdxIdentity idx) {
  Tally total;
  std::map<std::string, Tally> parts;
  std::set<std::pair<dev_t, ino_t>> on_path;
  if (const fs::PathStatus s = fs::path_status(dir); s.exists) on_path.insert({s.device, s.inode});
  walk(dir, "", total, parts, on_path, idx);
  nlohmann::json out = total.json();
  if (idx == IdxIdentity::kContent) out["idx"] = "content";
  if (parts.size() <= 10000) {
    nlohmann::json p = nlohmann::json::object();
    for (const auto& [name, t] : parts) p[name] = t.json();
    out["parts"] = p;
  }
  return out;
}

std::string fingerprint_difference(const nlohmann::json& saved, const nlohmann::json& now) {
  auto field = [](const nlohmann::json& j, const char* k) {
    return j.contains(k) ? j.at(k).dump() : std::string("?");
  };
  if (field(saved, "hash") == field(now, "hash") && field(saved, "files") == field(now, "files") &&
      field(saved, "bytes") == field(now, "bytes"))
    return "";
  std::vector<std::string> says;
  if (field(saved, "files") != field(now, "files"))
    says.push_back(field(now, "files") + " files now, " + field(saved, "files") +
                   " in the checkpoint");
  if (field(saved, "bytes") != field(now, "bytes"))
    says.push_back(field(now, "bytes") + " bytes now, " + field(saved, "bytes") +
                   " in the checkpoint");
  const nlohmann::json none = nlohmann::json::object();
  const nlohmann::json& sp = saved.contains("parts") ? saved.at("parts") : none;
  const nlohmann::json& np = now.contains("parts") ? now.at("parts") : none;
  std::set<std::string> names;
  for (const auto& [k, v] : sp.items()) names.insert(k);
  for (const auto& [k, v] : np.items()) names.insert(k);
  int listed = 0, more = 0;
  for (const std::string& name : names) {
    std::string what;
    if (!sp.contains(name))
      what = name + ": only now (" + field(np.at(name), "files") + " files)";
    else if (!np.contains(name))
      what = name + ": only in the checkpoint (" + field(sp.at(name), "files") + " files)";
    else if (field(sp.at(name), "files") != field(np.at(name), "files"))
      what = name + ": " + field(np.at(name), "files") + " files now, " +
             field(sp.at(name), "files") + " in the checkpoint";
    else if (field(sp.at(name), "bytes") != field(np.at(name), "bytes"))
      what = name + ": " + field(np.at(name), "bytes") + " bytes now, " +
             field(sp.at(name), "bytes") + " in the checkpoint";
    else if (field(sp.at(name), "hash") != field(np.at(name), "hash"))
      what = name + ": the same count and size, other file names or content";
    if (what.empty()) continue;
    if (listed < 5) {
      says.push_back(what);
      ++listed;
    } else {
      ++more;
    }
  }
  if (more > 0) says.push_back("and " + std::to_string(more) + " more parts");
  if (says.empty()) says.push_back("the same file count and size, other file names or content");
  std::string out;
  for (const auto& s : says) out += (out.empty() ? "" : "; ") + s;
  return out;
}

}  // namespace tandem::train
