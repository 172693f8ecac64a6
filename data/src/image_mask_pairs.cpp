// ImageMaskPairs: pairing images and masks by stem, and the joint load (see image_mask_pairs.h).
#include "tandem/data/image_mask_pairs.h"

#include <algorithm>
#include <map>
#include <utility>

#include "dataset_util.h"
#include "posix_fs.h"
#include "tandem/data/decode.h"
#include "tandem/data/resize.h"
#include "tandem/error.h"

namespace tandem::data {
namespace {

constexpr const char* kWho = "ImageMaskPairs";

// stem -> path of the files directly in `dir` accepted by `keep`; two files with one stem are
// an error (which one would be meant?).
template <typename Keep>
std::map<std::string, std::string> files_by_stem(const std::string& dir, Keep keep) {
  const fs::PathStatus status = fs::path_status(dir);
  TANDEM_CHECK_ARG(status.exists, "ImageMaskPairs: folder '", dir,
                   "' does not exist (expected images/ and masks/ under the root)");
  TANDEM_CHECK_ARG(status.is_directory, "ImageMaskPairs: '", dir, "' is not a folder");
  std::map<std::string, std::string> files;
  for (const fs::DirEntry& entry : fs::list_dir(dir, kWho)) {
    if (entry.is_folder() || !keep(entry.name)) continue;  // a FIFO stays: its load names it
    const std::string stem = fs::stem_of(entry.name);
    const std::string path = fs::join_path(dir, entry.name);
    const auto [where, inserted] = files.emplace(stem, path);
    TANDEM_CHECK_ARG(inserted, "ImageMaskPairs: two files with the stem '", stem, "' in '", dir,
                     "': '", where->second, "' and '", path, "'");
  }
  return files;
}

// "3 images have no mask (a, b, c)", at most 5 stems named.
std::string unmatched(const std::vector<std::string>& stems, const char* what) {
  std::string text = std::to_string(stems.size()) + " " + what + " (";
  for (size_t i = 0; i < stems.size() && i < 5; ++i) text += (i > 0 ? ", " : "") + stems[i];
  if (stems.size() > 5) text += ", ...";
  return text + ")";
}

}  // namespace

bool is_image_mask_pairs_folder(const std::string& root) {
  return fs::path_status(fs::join_path(root, "images")).is_directory &&
         fs::path_status(fs::join_path(root, "masks")).is_directory;
}

ImageMaskPairs::ImageMaskPairs(std::string root, ImageMaskPairsOptions options)
    : root_(std::move(root)), options_(options) {
  TANDEM_CHECK_ARG(options_.image_size >= 1, "ImageMaskPairs: image_size must be >= 1, got ",
                   options_.image_size);
  TANDEM_CHECK_ARG(options_.classes >= 1, "ImageMaskPairs: classes must be >= 1, got ",
                   options_.classes);
  TANDEM_CHECK_ARG(options_.ignore_index >= 0, "ImageMaskPairs: ignore_index must be >= 0, got ",
                   options_.ignore_index);
  const fs::PathStatus status = fs::path_status(root_);
  TANDEM_CHECK_ARG(status.exists, "ImageMaskPairs: root '", root_, "' does not exist (",
                   fs::errno_text(status.error), ")");
  TANDEM_CHECK_ARG(status.is_directory, "ImageMaskPairs: root '", root_,
                   "' is not a folder (expected images/ and masks/ under it)");

  const auto images = files_by_stem(fs::join_path(root_, "images"), [](const std::string& name) {
    return detail::has_image_extension(name);
  });
  const auto masks = files_by_stem(fs::join_path(root_, "masks"), [](const std::string& name) {
    return detail::lower_extension(name) == ".png";
  });
  std::vector<std::string> no_mask, no_image;
  for (const auto& [stem, path] : images) {
    const auto mask = masks.find(stem);
    if (mask == masks.end())
      no_mask.push_back(stem);
    else
      pairs_.push_back({stem, path, mask->second});
  }
  for (const auto& [stem, path] : masks)
    if (images.count(stem) == 0) no_image.push_back(stem);
  if (!no_mask.empty() || !no_image.empty()) {
    std::string problems;
    if (!no_mask.empty()) problems = unmatched(no_mask, "image(s) have no mask");
    if (!no_image.empty())
      problems += (problems.empty() ? "" : "; ") + unmatched(no_image, "mask(s) have no image");
    throw InvalidArgument("ImageMaskPairs '" + root_ + "': " + problems +
                          " (images/ and masks/ are paired by file stem)");
  }
  TANDEM_CHECK_ARG(!pairs_.empty(), "ImageMaskPairs '", root_,
                   "': no image in images/ (.jpg, .jpeg, .png in any letter case)");
}

std::vector<FieldSpec> ImageMaskPairs::fields() const {
  const int64_t s = options_.image_size;
  return {{"image", {3, s, s}, at::kByte}, {"mask", {s, s}, at::kLong}};
}

std::string ImageMaskPairs::sample_source(int64_t index) const {
  return index >= 0 && index < size() ? pairs_[static_cast<size_t>(index)].image_path : "";
}

void ImageMaskPairs::get(int64_t index, const std::vector<at::Tensor>& out) const {
  TANDEM_CHECK_ARG(index >= 0 && index < size(), "ImageMaskPairs: sample index ", index,
                   " out of range [0, ", size(), ")");
  TANDEM_CHECK_ARG(out.size() == 2, "ImageMaskPairs: get() needs 2 output tensors (image, mask), ",
                   "got ", out.size());
  const Pair& pair = pairs_[static_cast<size_t>(index)];
  const std::vector<uint8_t> image_bytes = read_file(pair.image_path);
  const ImageInfo info = read_image_info(image_bytes, pair.image_path);
  const at::Tensor mask = decode_mask(read_file(pair.mask_path), pair.mask_path);
  if (mask.size(0) != info.height || mask.size(1) != info.width)
    throw Error(pair.mask_path + ": mask is " + std::to_string(mask.size(1)) + " x " +
                std::to_string(mask.size(0)) + " but its image '" + pair.image_path + "' is " +
                std::to_string(info.width) + " x " + std::to_string(info.height));
  // Every id must be a class or the ignore index; report the first offender.
  const int64_t* ids = mask.data_ptr<int64_t>();
  for (int64_t i = 0, n = mask.numel(); i < n; ++i) {
    const int64_t id = ids[i];
    if (id >= options_.classes && id != options_.ignore_index)
      throw Error(pair.mask_path + ": mask value " + std::to_string(id) + " at (row " +
                  std::to_string(i / mask.size(1)) + ", column " +
                  std::to_string(i % mask.size(1)) +
                  ") is not a class id (classes = " + std::to_string(options_.classes) +
                  ", ignore_index = " + std::to_string(options_.ignore_index) + ")");
  }
  const int64_t s = options_.image_size;
  out[0].copy_(detail::load_eval_image(image_bytes, pair.image_path, 3, s, info));
  const auto target = resized_shape(info.height, info.width, s);
  out[1].copy_(center_crop(resize_nearest(mask, target[0], target[1]), s));
}

}  // namespace tandem::data
