// decode_jpeg_window through libjpeg's API. libjpeg reports errors by calling error_exit, which
// must not return: it longjmps back here. Nothing with a destructor lives in the frames it jumps
// over (libjpeg's C), and everything this function changes after setjmp sits in a heap State
// reached through an unchanged pointer (its other locals are const, set once), so nothing the
// jump returns to is left half-updated.
#include "jpeg_window.h"

#ifdef TANDEM_HAVE_JPEGLIB
#include <ATen/ops/empty.h>
#include <jpeglib.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE
#include <memory>
#endif

namespace tandem::data::detail {

#ifdef TANDEM_HAVE_JPEGLIB
namespace {

struct ErrorManager {
  jpeg_error_mgr pub;  // first: libjpeg hands back a pointer to it
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  char warning[JMSG_LENGTH_MAX];
};

void on_error(j_common_ptr c) {
  auto* e = reinterpret_cast<ErrorManager*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

// Level -1: corrupt data libjpeg decoded past (a warning); higher levels are trace messages.
void on_message(j_common_ptr c, int level) {
  auto* e = reinterpret_cast<ErrorManager*>(c->err);
  if (level < 0 && e->warning[0] == '\0') (*c->err->format_message)(c, e->warning);
  if (level < 0) ++c->err->num_warnings;
}

struct State {
  jpeg_decompress_struct cinfo{};
  ErrorManager err{};
  bool created = false;
  JpegWindow out;
  std::vector<JSAMPROW> rows;
  JDIMENSION left = 0, cols = 0;  // the decoded columns (jpeg_crop_scanline widens them)
};

}  // namespace

bool jpeg_window_available() { return true; }

JpegWindow decode_jpeg_window(const std::vector<uint8_t>& bytes, int channels, int denom, bool fast,
                              int64_t y0, int64_t y1, int64_t x0, int64_t x1) {
  const std::unique_ptr<State> s = std::make_unique<State>();
  State* const st = s.get();
  st->cinfo.err = jpeg_std_error(&st->err.pub);
  st->err.pub.error_exit = on_error;
  st->err.pub.emit_message = on_message;
  if (setjmp(st->err.jump)) {
    if (st->created) jpeg_destroy_decompress(&st->cinfo);
    st->out.image = at::Tensor();
    st->out.error = st->err.message;
    return std::move(st->out);
  }
  jpeg_create_decompress(&st->cinfo);
  st->created = true;
  jpeg_mem_src(&st->cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&st->cinfo, TRUE);
  st->cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  st->cinfo.scale_num = 1;
  st->cinfo.scale_denom = static_cast<unsigned int>(denom);
  if (fast) {
    st->cinfo.dct_method = JDCT_IFAST;
    st->cinfo.do_fancy_upsampling = FALSE;
  }
  jpeg_start_decompress(&st->cinfo);
  const int64_t height = st->cinfo.output_height, width = st->cinfo.output_width;
  const int64_t end_row = std::min(y1, height), end_col = std::min(x1, width);
  st->left = static_cast<JDIMENSION>(x0);
  st->cols = static_cast<JDIMENSION>(end_col - x0);
  if (x0 > 0 || end_col < width)
    jpeg_crop_scanline(&st->cinfo, &st->left, &st->cols);  // widened to the block grid
  if (y0 > 0) jpeg_skip_scanlines(&st->cinfo, static_cast<JDIMENSION>(y0));
  const int64_t n = end_row - y0, cols = st->cols;
  st->out.image = at::empty({n, cols, channels}, at::kByte);
  uint8_t* base = st->out.image.data_ptr<uint8_t>();
  st->rows.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) st->rows[static_cast<size_t>(r)] = base + r * cols * channels;
  while (static_cast<int64_t>(st->cinfo.output_scanline) < end_row) {
    const int64_t at = st->cinfo.output_scanline - y0;
    jpeg_read_scanlines(&st->cinfo, st->rows.data() + at, static_cast<JDIMENSION>(n - at));
  }
  st->out.top = y0;
  st->out.left = st->left;
  if (st->err.pub.num_warnings > 0) st->out.warning = st->err.warning;
  jpeg_abort_decompress(&st->cinfo);  // the rows below the window are never read
  jpeg_destroy_decompress(&st->cinfo);
  st->created = false;
  return std::move(st->out);
}

#else

bool jpeg_window_available() { return false; }

JpegWindow decode_jpeg_window(const std::vector<uint8_t>&, int, int, bool, int64_t, int64_t,
                              int64_t, int64_t) {
  JpegWindow w;
  w.error = "built without libjpeg's API";
  return w;
}

#endif

}  // namespace tandem::data::detail
