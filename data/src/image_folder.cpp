// ImageFolderDataset: the file index (torchvision's find_classes + make_dataset order) and the
// per-sample load.
#include "tandem/data/image_folder.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "codec_util.h"
#include "dataset_util.h"
#include "posix_fs.h"
#include "tandem/data/decode.h"
#include "tandem/error.h"

namespace tandem::data {
namespace {

constexpr const char* kWho = "ImageFolder";

// One folder met by the walk: its path as os.walk spells it (root joined with the names below
// it) and the names of the image files directly in it.
struct WalkedFolder {
  std::string path;
  std::vector<std::string> files;
};

// os.walk(dir, followlinks=True): every folder below `dir`, following symlinked folders; a
// folder whose real path is already on the current branch (a symlink cycle) is not re-entered.
void walk(const std::string& dir, std::set<std::string>& branch, std::vector<WalkedFolder>& out) {
  const std::string real = detail::real_path(dir, kWho);
  if (!branch.insert(real).second) return;  // symlink cycle
  WalkedFolder folder{dir, {}};
  std::vector<std::string> subfolders;
  for (const detail::DirEntry& entry : detail::list_dir(dir, kWho)) {
    if (entry.is_directory)
      subfolders.push_back(detail::join_path(dir, entry.name));
    else if (detail::has_image_extension(entry.name))  // a broken link counts, as in os.walk
      folder.files.push_back(entry.name);
  }
  std::sort(folder.files.begin(), folder.files.end());
  out.push_back(std::move(folder));
  for (const std::string& sub : subfolders) walk(sub, branch, out);
  branch.erase(real);
}

std::string join(const std::vector<std::string>& names, const char* separator) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i > 0 ? separator : "") + names[i];
  return text;
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(std::string root, ImageFolderOptions options)
    : root_(std::move(root)), options_(options) {
  TANDEM_CHECK_ARG(options_.image_size >= 1, "ImageFolder: image_size must be >= 1, got ",
                   options_.image_size);
  TANDEM_CHECK_ARG(options_.channels == 1 || options_.channels == 3,
                   "ImageFolder: channels must be 1 or 3, got ", options_.channels);
  const detail::PathStatus status = detail::path_status(root_);
  TANDEM_CHECK_ARG(status.exists, "ImageFolder: root '", root_, "' does not exist (",
                   detail::errno_text(status.error), ")");
  TANDEM_CHECK_ARG(status.is_directory, "ImageFolder: root '", root_,
                   "' is not a folder (expected one subfolder of images per class)");

  // find_classes: the subfolders of root (symlinks followed), sorted by name.
  for (const detail::DirEntry& entry : detail::list_dir(root_, kWho))
    if (entry.is_directory) classes_.push_back(entry.name);
  TANDEM_CHECK_ARG(!classes_.empty(), "ImageFolder: found no class folder in '", root_,
                   "' (expected one subfolder of images per class)");
  std::sort(classes_.begin(), classes_.end());

  // make_dataset: per class, the folders of sorted(os.walk(...)) — ordered by path string —
  // and in each the files sorted by name.
  std::vector<std::string> empty_classes;
  for (size_t label = 0; label < classes_.size(); ++label) {
    std::vector<WalkedFolder> folders;
    std::set<std::string> branch;
    walk(detail::join_path(root_, classes_[label]), branch, folders);
    std::sort(folders.begin(), folders.end(),
              [](const WalkedFolder& a, const WalkedFolder& b) { return a.path < b.path; });
    const size_t before = samples_.size();
    for (const WalkedFolder& folder : folders)
      for (const std::string& file : folder.files)
        samples_.push_back({detail::join_path(folder.path, file), static_cast<int64_t>(label)});
    if (samples_.size() == before) empty_classes.push_back(classes_[label]);
  }
  TANDEM_CHECK_ARG(empty_classes.empty(), "ImageFolder '", root_,
                   "': found no valid file for the classes ", join(empty_classes, ", "),
                   ". Supported extensions are: .jpg, .jpeg, .png (any letter case)");
}

std::vector<FieldSpec> ImageFolderDataset::fields() const {
  const int64_t s = options_.image_size;
  if (options_.output == ImageFolderOutput::kEncoded)  // typical: a 4:2:0 JPEG of 2S x 2S
    return {{"jpeg", {s * s}, at::kByte, true, true}, {"label", {}, at::kLong}};
  if (options_.output == ImageFolderOutput::kDecoded)  // typical: between S and 2S a side
    return {{"image", {3 * s / 2, 3 * s / 2, options_.channels}, at::kByte, true},
            {"label", {}, at::kLong}};
  return {{"image", {options_.channels, s, s}, at::kByte}, {"label", {}, at::kLong}};
}

std::vector<ImageFolderDataset::Sample> ImageFolderDataset::spread_samples(int64_t n) const {
  const int64_t total = size();
  n = std::min(n, total);
  std::vector<Sample> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(samples_[static_cast<size_t>(i * total / n)]);
  return out;
}

ImageFolderDataset ImageFolderDataset::with_output(ImageFolderOutput output) const {
  ImageFolderDataset copy = *this;
  copy.options_.output = output;
  return copy;
}

void ImageFolderDataset::get(int64_t index, const std::vector<at::Tensor>& out) const {
  TANDEM_CHECK_ARG(options_.output == ImageFolderOutput::kCenterCrop,
                   "ImageFolder: samples decoded at their own size have no fixed shape: read "
                   "them with get_sample()");
  std::vector<at::Tensor> views = out;
  get_sample(index, views);
}

void ImageFolderDataset::get_sample(int64_t index, std::vector<at::Tensor>& out) const {
  TANDEM_CHECK_ARG(index >= 0 && index < size(), "ImageFolder: sample index ", index,
                   " out of range [0, ", size(), ")");
  TANDEM_CHECK_ARG(out.size() == 2, "ImageFolder: get() needs 2 output tensors (image, label), ",
                   "got ", out.size());
  const Sample& sample = samples_[static_cast<size_t>(index)];
  const std::vector<uint8_t> bytes = read_file(sample.path);
  if (options_.output == ImageFolderOutput::kEncoded) {
    const ImageInfo info = read_image_info(bytes, sample.path);  // names a bad file
    if (info.format != ImageFormat::kJpeg)
      detail::fail(sample.path, std::string("a ") + format_name(info.format) +
                                    " file: GPU decode reads JPEGs (decode on the CPU instead)");
    if (info.channels == 4)
      detail::fail(sample.path, "a CMYK JPEG: GPU decode reads gray and YCbCr JPEGs (decode on "
                                "the CPU instead)");
    at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::memcpy(t.data_ptr<uint8_t>(), bytes.data(), bytes.size());
    out[0] = t;
  } else if (options_.output == ImageFolderOutput::kDecoded) {
    out[0] = decode_image_interleaved(bytes, sample.path, options_.channels,
                                      options_.image_size, options_.image_size);
  } else {
    const ImageInfo info = read_image_info(bytes, sample.path);
    out[0].copy_(detail::load_eval_image(bytes, sample.path, options_.channels,
                                         options_.image_size, info));
  }
  out[1].fill_(sample.label);
}

}  // namespace tandem::data
