// A JPEG's marker segments walked without decoding anything: what the GPU decoder checks on the
// host before any GPU work (nvjpeg_decoder.cpp), and what a loader worker checks for a sample it
// leaves to the JPEG engines (image_folder.cpp), so a file cut short is named by the worker —
// and skipped under skip_bad — rather than failing a whole batch on the GPU; and the metadata a
// photo written again by shrink keeps (shrink.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::data::detail {

// Calls visit(marker, pos, length) for each marker segment after SOI (FF D8, which the caller has
// sniffed) up to the first SOS, then for that SOS (length 0); pos is the segment's FF, length its
// bytes from that FF on (2 for the markers without a length field). Stops where visit returns
// false or the bytes end. Junk between segments is skipped up to the next 0xFF, as libjpeg does
// (with a warning).
template <typename Visit>
void for_each_segment(const uint8_t* p, size_t n, Visit&& visit) {
  size_t pos = 2;
  while (pos + 1 < n) {
    if (p[pos] != 0xFF) {
      ++pos;
      continue;
    }
    const uint8_t marker = p[pos + 1];
    if (marker == 0xFF || marker == 0x00) {  // a fill byte, or a stray 0xFF in junk
      ++pos;
      continue;
    }
    if (marker == 0xDA) {
      visit(marker, pos, size_t{0});
      return;
    }
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD9)) {  // no length field
      if (!visit(marker, pos, size_t{2})) return;
      pos += 2;
      continue;
    }
    if (pos + 3 >= n) return;
    const size_t length = 2 + ((static_cast<size_t>(p[pos + 2]) << 8) | p[pos + 3]);
    if (!visit(marker, pos, std::min(length, n - pos))) return;
    pos += length;
  }
}

// What a walk over the marker segments after SOI finds, without decoding anything.
struct JpegMarkers {
  int components = 0;     // Nf of the frame header (SOFn); 0 when none was reached
  uint8_t frame = 0;      // its marker (C0 baseline, C1 extended, C2 progressive, ...); 0: none
  size_t first_scan = 0;  // offset of the first SOS marker; 0 when the headers end before it
};

inline JpegMarkers walk_markers(const uint8_t* p, size_t n) {
  JpegMarkers found;
  for_each_segment(p, n, [&](uint8_t marker, size_t pos, size_t) {
    if (marker == 0xDA) {
      found.first_scan = pos;
      return false;
    }
    // SOF0..SOF15 but DHT (C4), JPG (C8), DAC (CC): FF Cn, length(2), P, Y(2), X(2), Nf.
    const bool frame =
        marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (frame && pos + 9 < n) {
      found.components = p[pos + 9];
      found.frame = marker;
    }
    return true;
  });
  return found;
}

// Whether a frame marker (SOFn) codes its scans progressively: SOF2, 6, 10 and 14.
inline bool is_progressive_frame(uint8_t frame) {
  return frame == 0xC2 || frame == 0xC6 || frame == 0xCA || frame == 0xCE;
}

// Whether a segment carries the photo's metadata rather than how its pixels are coded: APP0
// (JFIF) to APP13 (EXIF and XMP in APP1, the ICC profile in APP2, IPTC in APP13), APP15 and
// COM. APP14 (Adobe) is left out: it says how the file's own samples are transformed (RGB,
// YCbCr, YCCK), which a file encoded again does not share.
inline bool is_metadata_marker(uint8_t marker) {
  return (marker >= 0xE0 && marker <= 0xED) || marker == 0xEF || marker == 0xFE;
}

// The metadata segments of a JPEG's headers (is_metadata_marker), whole and in file order.
inline std::vector<uint8_t> metadata_segments(const uint8_t* p, size_t n) {
  std::vector<uint8_t> out;
  for_each_segment(p, n, [&](uint8_t marker, size_t pos, size_t length) {
    if (is_metadata_marker(marker)) out.insert(out.end(), p + pos, p + pos + length);
    return marker != 0xDA;
  });
  return out;
}

// `encoded` (a JPEG this program wrote) with `original`'s metadata segments in place of its own:
// SOI, the original's segments, then everything of `encoded` after its leading metadata
// segments (the encoder's JFIF header). `encoded` as it is where the original has none.
inline std::vector<uint8_t> with_metadata_of(const std::vector<uint8_t>& original,
                                             const std::vector<uint8_t>& encoded) {
  const std::vector<uint8_t> kept = metadata_segments(original.data(), original.size());
  if (kept.empty() || encoded.size() < 4) return encoded;
  size_t rest = 2;
  for_each_segment(encoded.data(), encoded.size(), [&](uint8_t marker, size_t pos, size_t length) {
    if (!is_metadata_marker(marker) || pos != rest) return false;
    rest = pos + length;
    return true;
  });
  std::vector<uint8_t> out(encoded.begin(), encoded.begin() + 2);  // SOI
  out.insert(out.end(), kept.begin(), kept.end());
  out.insert(out.end(), encoded.begin() + static_cast<long>(rest), encoded.end());
  return out;
}

// Whether an EOI marker (FF D9) follows the first scan. Entropy-coded data byte-stuffs every
// 0xFF (FF 00), so FF D9 there is a real marker; an EXIF thumbnail's EOI lies before the scan.
// nvJPEG, like libjpeg, decodes a file cut short inside its scan data without an error (the
// missing blocks come out flat), so this is how a truncated file becomes an error, as it is
// in decode_image.
inline bool has_end_after_scan(const uint8_t* p, size_t n, size_t scan) {
  if (scan == 0) return false;
  for (size_t i = n - 1; i > scan + 1; --i)  // EOI is almost always the last two bytes
    if (p[i] == 0xD9 && p[i - 1] == 0xFF) return true;
  return false;
}

/// Whether the JPEG's first scan is followed by an end-of-image marker (not cut short).
inline bool jpeg_is_complete(const uint8_t* p, size_t n) {
  return n >= 4 && has_end_after_scan(p, n, walk_markers(p, n).first_scan);
}

}  // namespace tandem::data::detail
