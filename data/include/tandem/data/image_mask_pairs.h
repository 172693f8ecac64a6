// Image + mask pairs for semantic segmentation: root/images/*.{jpg,jpeg,png} and
// root/masks/*.png (class ids) matched by file stem, resized + center-cropped together (bilinear
// for the image, nearest for the mask, so ids are never blended).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/loader.h"

namespace tandem::data {

struct ImageMaskPairsOptions {
  int64_t image_size = 512;    ///< S: Resize(S) + CenterCrop(S) of both image and mask
  int64_t classes = 0;         ///< class count (required): ids are 0 .. classes - 1
  int64_t ignore_index = 255;  ///< the one id >= classes a mask may hold (VOC's border)
};

/// Whether `root` has the layout ImageMaskPairs reads: folders images/ and masks/ under it
/// (symlinks followed). Read as an ImageFolder, such a folder would be two classes.
bool is_image_mask_pairs_folder(const std::string& root);

/// Fields: {"image", {3, S, S}, kByte}, {"mask", {S, S}, kLong}.
///
/// The index, built once: the image files directly in root/images (extensions .jpg, .jpeg, .png
/// in any letter case) and the .png files directly in root/masks, paired by stem (the name
/// without its last extension), sorted by stem. A mask is a gray PNG of ids or a palette PNG
/// whose indices are the ids (as PASCAL VOC's are); see decode_mask. Entries are stat()ed, never
/// opened: a named pipe, socket or device is a pair that fails to load naming its path and kind.
class ImageMaskPairs : public Dataset {
 public:
  struct Pair {
    std::string stem;
    std::string image_path;
    std::string mask_path;
  };

  /// Throws InvalidArgument naming the path when root, root/images or root/masks is missing or
  /// not a folder, no pair is found, two files share a stem, an image has no mask or a mask no
  /// image (listing up to 5 stems of each), or the options are out of range (image_size >= 1,
  /// classes >= 1, ignore_index >= 0).
  ImageMaskPairs(std::string root, ImageMaskPairsOptions options);

  int64_t size() const override { return static_cast<int64_t>(pairs_.size()); }
  std::vector<FieldSpec> fields() const override;
  /// Throws tandem::Error naming the file when a file cannot be read or decoded, the mask's
  /// size differs from its image's, or a mask holds an id >= classes that is not ignore_index
  /// (naming the value); InvalidArgument for an index out of range.
  void get(int64_t index, const std::vector<at::Tensor>& out) const override;
  /// The pair's image path ("" for an index out of range).
  std::string sample_source(int64_t index) const override;

  const std::string& root() const { return root_; }
  const ImageMaskPairsOptions& options() const { return options_; }
  const std::vector<Pair>& pairs() const { return pairs_; }

 private:
  std::string root_;
  ImageMaskPairsOptions options_;
  std::vector<Pair> pairs_;
};

}  // namespace tandem::data
