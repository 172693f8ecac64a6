// CheckpointStore: atomic checkpoint folders (see checkpoint.h). POSIX calls, not
// std::filesystem: the PyPI LibTorch this project links is built with an older libstdc++ ABI
// setting that makes std::filesystem symbols clash.
#include "tandem/train/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tandem/error.h"

namespace tandem::train {

namespace {

std::string reason() { return std::strerror(errno); }

bool is_dir(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// fsync of a file or folder by path: makes its content (a folder: its entries) durable.
void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("cannot open " + path + " to flush it: " + reason());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) throw Error("cannot flush " + path + " to disk: " + reason());
}

void remove_tree(const std::string& path) {
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string child = path + "/" + name;
      if (is_dir(child))
        remove_tree(child);
      else
        ::unlink(child.c_str());
    }
    ::closedir(d);
  }
  ::rmdir(path.c_str());
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%09lld", static_cast<long long>(step));
  return buf;
}

std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

void make_dirs(const std::string& path) {
  if (path.empty() || is_dir(path)) return;
  make_dirs(parent_of(path));
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    throw Error("cannot make the folder " + path + ": " + reason());
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write " + tmp + ": " + reason());
    out << text;
    out.flush();
    if (!out) {
      const std::string why = reason();
      ::unlink(tmp.c_str());
      throw Error("cannot write " + tmp + ": " + why);
    }
  }
  try {
    fsync_path(tmp);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = reason();
    ::unlink(tmp.c_str());
    throw Error("cannot rename " + tmp + " to " + path + ": " + why);
  }
  fsync_path(parent_of(path));
}

CheckpointStore::CheckpointStore(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {
  TANDEM_CHECK_ARG(keep_ >= 1, "checkpoints to keep ", keep_, " is not valid: expected >= 1");
  make_dirs(dir_);
}

std::vector<std::string> CheckpointStore::list() const {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir_.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      // "step-" and nine digits exactly: step-N.tmp (a save in progress or cut short) is not one.
      if (name.size() == 14 && name.rfind("step-", 0) == 0 &&
          std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
          is_dir(dir_ + "/" + name))
        names.push_back(name);
    }
    ::closedir(d);
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
    write_file_atomic(tmp + "/state.json", state.dump(2) + "\n");
    fsync_path(tmp);
    if (is_dir(final_dir)) remove_tree(final_dir);  // the same step saved again (a resumed run)
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
      throw Error("cannot rename " + tmp + " to " + final_dir + ": " + reason());
    fsync_path(dir_);
  } catch (const std::exception& e) {
    remove_tree(tmp);
    throw Error(std::string("checkpoint at step ") + std::to_string(c.step) +
                " not written (the earlier ones are intact): " + e.what());
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
  if (!c.state.contains("step") || !c.state["step"].is_number_integer())
    throw Error(state_path + " has no integer \"step\"");
  c.step = c.state["step"].get<int64_t>();
  c.model = models::load_safetensors(folder + "/model.safetensors");
  c.optimizer = models::load_safetensors(folder + "/optimizer.safetensors");
  c.rng = models::load_safetensors(folder + "/rng.safetensors");
  return c;
}

}  // namespace tandem::train
