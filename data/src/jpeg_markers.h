// A JPEG's marker segments walked without decoding anything: what the GPU decoder checks on the
// host before any GPU work (nvjpeg_decoder.cpp), and what a loader worker checks for a sample it
// leaves to the JPEG engines (image_folder.cpp), so a file cut short is named by the worker —
// and skipped under skip_bad — rather than failing a whole batch on the GPU.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::data::detail {

// What a walk over the marker segments after SOI finds, without decoding anything.
struct JpegMarkers {
  int components = 0;     // Nf of the frame header (SOFn); 0 when none was reached
  size_t first_scan = 0;  // offset of the first SOS marker; 0 when the headers end before it
};

// Junk between segments is skipped up to the next 0xFF, as libjpeg does (with a warning).
inline JpegMarkers walk_markers(const uint8_t* p, size_t n) {
  JpegMarkers found;
  size_t pos = 2;  // after SOI (FF D8), which the caller has sniffed
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
      found.first_scan = pos;
      return found;
    }
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD9)) {  // no length field
      pos += 2;
      continue;
    }
    // SOF0..SOF15 but DHT (C4), JPG (C8), DAC (CC): FF Cn, length(2), P, Y(2), X(2), Nf.
    const bool frame =
        marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (frame && pos + 9 < n) found.components = p[pos + 9];
    if (pos + 3 >= n) return found;
    pos += 2 + ((static_cast<size_t>(p[pos + 2]) << 8) | p[pos + 3]);
  }
  return found;
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
