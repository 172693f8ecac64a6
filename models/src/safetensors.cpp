// safetensors: see safetensors.h. POSIX file calls, not std::filesystem (the PyPI libtorch.so
// exports its own copies of std::filesystem's functions, and calls bind to them).
#include "tandem/models/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "posix_fs.h"
#include "tandem/error.h"
#include "tandem/models/resnet.h"

namespace tandem::models {

namespace {
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors is little-endian");

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("safetensors '" + path + "': " + what);
}

const std::vector<std::pair<std::string, at::ScalarType>>& dtypes() {
  static const std::vector<std::pair<std::string, at::ScalarType>> table{
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  return table;
}

std::string shape_text(at::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::string why;
  std::optional<std::vector<uint8_t>> bytes = fs::read_file(path, &why);
  if (!bytes) fail(path, why);
  return std::move(*bytes);
}

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error("writing '" + path + "' failed: " + std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
}
}  // namespace

NamedTensors load_safetensors(const std::string& path) {
  const std::vector<uint8_t> bytes = read_all(path);
  if (bytes.size() < 8) fail(path, "shorter than the 8-byte header length");
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  if (header_size > bytes.size() - 8)
    fail(path, "its header says " + std::to_string(header_size) + " bytes but the file has " +
                   std::to_string(bytes.size() - 8) +
                   " after the length: truncated, or not "
                   "a safetensors file");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + header_size);
  } catch (const std::exception& e) {
    fail(path, std::string("its header is not JSON (") + first_line(e.what()) + ")");
  }
  if (!header.is_object()) fail(path, "its header is not a JSON object");
  const uint8_t* data = bytes.data() + 8 + header_size;
  const uint64_t data_size = bytes.size() - 8 - header_size;
  NamedTensors out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      const std::string dtype = entry.at("dtype").get<std::string>();
      const auto shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      at::ScalarType type = at::kFloat;
      bool known = false;
      for (const auto& [n, t] : dtypes())
        if (n == dtype) type = t, known = true;
      if (!known) fail(path, "tensor '" + name + "' has dtype " + dtype + ", not one tandem reads");
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size)
        fail(path, "tensor '" + name + "' has byte range outside the file's " +
                       std::to_string(data_size) + " data bytes");
      int64_t numel = 1;
      for (const int64_t d : shape) {
        if (d < 0) fail(path, "tensor '" + name + "' has a negative dimension");
        numel *= d;
      }
      const uint64_t expected = static_cast<uint64_t>(numel) * c10::elementSize(type);
      if (offsets[1] - offsets[0] != expected)
        fail(path, "tensor '" + name + "' of shape " + shape_text(shape) + " and dtype " + dtype +
                       " needs " + std::to_string(expected) + " bytes but its range holds " +
                       std::to_string(offsets[1] - offsets[0]));
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
      if (expected) std::memcpy(t.data_ptr(), data + offsets[0], expected);
      out.emplace_back(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      fail(path, "tensor '" + name + "' has a malformed entry (" + first_line(e.what()) + ")");
    }
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<at::Tensor> cpu;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TANDEM_CHECK_ARG(names.insert(name).second, "save_safetensors: two tensors named '", name, "'");
    TANDEM_CHECK_ARG(name != "__metadata__", "save_safetensors: '__metadata__' is reserved");
    std::string dtype;
    for (const auto& [n, t] : dtypes())
      if (t == tensor.scalar_type()) dtype = n;
    TANDEM_CHECK_ARG(!dtype.empty(), "save_safetensors: tensor '", name, "' has dtype ",
                     tensor.scalar_type(), ", which safetensors files here do not hold");
    at::Tensor c = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t size = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[name] = {
        {"dtype", dtype}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + size}}};
    offset += size;
    cpu.push_back(std::move(c));
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t header_size = text.size();

  const std::string temp = path + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("writing '" + temp + "' failed: " + std::strerror(errno));
  try {
    write_all(fd, &header_size, 8, temp);
    write_all(fd, text.data(), text.size(), temp);
    for (const at::Tensor& c : cpu)
      if (c.numel()) write_all(fd, c.data_ptr(), c.numel() * c.element_size(), temp);
    if (::fsync(fd) != 0) throw Error("writing '" + temp + "' failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());  // the previous file under `path` stays as it was
    throw;
  }
  if (::close(fd) != 0 || ::rename(temp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(temp.c_str());
    throw Error("writing '" + path + "' failed: " + std::strerror(e));
  }
}

NamedTensors state_dict(const torch::nn::Module& module) {
  std::unordered_map<std::string, at::Tensor> by_name;
  for (const auto& p : module.named_parameters()) by_name[p.key()] = p.value();
  for (const auto& b : module.named_buffers()) by_name[b.key()] = b.value();
  NamedTensors out;
  for (const std::string& key : state_dict_keys(module)) out.emplace_back(key, by_name.at(key));
  return out;
}

void load_state_dict(torch::nn::Module& module, const NamedTensors& tensors, bool strict) {
  std::unordered_map<std::string, const at::Tensor*> given;
  for (const auto& [name, t] : tensors) given[name] = &t;
  const NamedTensors own = state_dict(module);
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> own_names;
  for (const auto& [name, t] : own) {
    own_names.insert(name);
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
    } else if (!it->second->sizes().equals(t.sizes())) {
      mismatched.push_back(name + " (file " + shape_text(it->second->sizes()) + ", model " +
                           shape_text(t.sizes()) + ")");
    }
  }
  for (const auto& [name, t] : tensors)
    if (!own_names.count(name)) unexpected.push_back(name);
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 20; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 20) s += ", ... (" + std::to_string(v.size() - 20) + " more)";
    return s;
  };
  std::string problems;
  if (strict && !missing.empty())
    problems += std::to_string(missing.size()) + " missing: " + list(missing) + "; ";
  if (strict && !unexpected.empty())
    problems += std::to_string(unexpected.size()) + " unexpected: " + list(unexpected) + "; ";
  if (!mismatched.empty())
    problems += std::to_string(mismatched.size()) + " of another shape: " + list(mismatched) + "; ";
  TANDEM_CHECK_ARG(problems.empty(),
                   "the weights do not fit the model: ", problems.substr(0, problems.size() - 2));
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : own) {
    auto it = given.find(name);
    if (it != given.end()) t.copy_(*it->second);
  }
}

}  // namespace tandem::models
