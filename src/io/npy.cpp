// .npy reader/writer (see include/blasst/npy.hpp). The header is a Python dict literal; we parse
// exactly the subset numpy writes (string keys, string / bool / tuple-of-int values) and refuse
// everything else with an Error, so a hostile file can never cause more than an exception.
#include "blasst/npy.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>

#include "blasst/half.hpp"
#include "core/text.hpp"
#include "io/files.hpp"

namespace blasst::npy {

namespace {

constexpr unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw Error(detail::printable(name, 300) + ": " + what);
}

struct Header {
  Elem elem = Elem::f32;
  std::vector<std::int64_t> shape;
  std::size_t data_offset = 0;  // bytes before the payload
  std::uint64_t nbytes = 0;     // payload size promised by the header
};

// Recursive-descent parser for the header dict. Positions are bounded by the header length.
class DictParser {
 public:
  DictParser(const char* s, std::size_t n, const std::string& name) : s_(s), n_(n), name_(name) {}

  Header parse_into(Header h) {
    std::optional<std::string> descr_v;
    std::optional<bool> fortran;
    std::optional<std::vector<std::int64_t>> shape;
    ws();
    expect('{');
    ws();
    while (peek() != '}') {
      const std::string key = string_lit();
      ws();
      expect(':');
      ws();
      if (key == "descr") {
        if (descr_v) bad("duplicate key 'descr'");
        if (peek() == '[') bad("structured dtypes (a descr list) are not supported");
        descr_v = string_lit();
      } else if (key == "fortran_order") {
        if (fortran) bad("duplicate key 'fortran_order'");
        fortran = bool_lit();
      } else if (key == "shape") {
        if (shape) bad("duplicate key 'shape'");
        shape = tuple_lit();
      } else {
        bad("unexpected key " + detail::single_quoted(key) + " (expected descr, fortran_order, shape)");
      }
      ws();
      if (peek() == ',') {
        ++i_;
        ws();
      } else if (peek() != '}') {
        bad("expected ',' or '}' in the header dict");
      }
    }
    ++i_;  // '}'
    while (i_ < n_) {
      const char c = s_[i_++];
      if (c != ' ' && c != '\n' && c != '\t' && c != '\r' && c != '\0')
        bad("unexpected characters after the header dict");
    }
    if (!descr_v) bad("header lacks 'descr'");
    if (!fortran) bad("header lacks 'fortran_order'");
    if (!shape) bad("header lacks 'shape'");
    if (*fortran)
      fail(name_, "fortran_order is True; only C-order arrays are supported "
                  "(save np.ascontiguousarray(x))");
    h.elem = elem_of(*descr_v);
    h.shape = std::move(*shape);
    return h;
  }

 private:
  [[noreturn]] void bad(const std::string& what) { fail(name_, "malformed .npy header: " + what); }
  char peek() {
    if (i_ >= n_) bad("unexpected end of the header");
    return s_[i_];
  }
  void ws() {
    while (i_ < n_ && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) bad(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string_lit() {
    const char q = peek();
    if (q != '\'' && q != '"') bad("expected a quoted string");
    ++i_;
    std::string out;
    while (peek() != q) {
      const char c = s_[i_++];
      if (c == '\\' || c == '\n') bad("unsupported character in a header string");
      out.push_back(c);
      if (out.size() > 64) bad("header string too long");
    }
    ++i_;
    return out;
  }
  bool bool_lit() {
    if (n_ - i_ >= 4 && std::memcmp(s_ + i_, "True", 4) == 0) {
      i_ += 4;
      return true;
    }
    if (n_ - i_ >= 5 && std::memcmp(s_ + i_, "False", 5) == 0) {
      i_ += 5;
      return false;
    }
    bad("fortran_order must be True or False");
  }
  std::vector<std::int64_t> tuple_lit() {
    expect('(');
    std::vector<std::int64_t> dims;
    ws();
    bool trailing_comma = false;
    while (peek() != ')') {
      if (!std::isdigit(static_cast<unsigned char>(peek()))) bad("shape entries must be non-negative integers");
      std::int64_t v = 0;
      while (i_ < n_ && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
        const int digit = s_[i_++] - '0';
        if (v > (std::numeric_limits<std::int64_t>::max() - digit) / 10) bad("shape entry overflows");
        v = v * 10 + digit;
      }
      if (i_ < n_ && (s_[i_] == 'L' || s_[i_] == 'l')) ++i_;  // Python 2 long suffix
      dims.push_back(v);
      if (dims.size() > 32) bad("more than 32 dimensions");
      ws();
      trailing_comma = false;
      if (peek() == ',') {
        ++i_;
        ws();
        trailing_comma = true;
      } else if (peek() != ')') {
        bad("expected ',' or ')' in shape");
      }
    }
    ++i_;
    if (dims.size() == 1 && !trailing_comma) bad("a one-element shape needs a trailing comma, e.g. (5,)");
    return dims;
  }
  Elem elem_of(const std::string& d) {
    if (d.size() >= 2 && d[0] == '>' && d.substr(1) != "V2")
      fail(name_, "big-endian data (" + detail::single_quoted(d) + ") is not supported; save with a little-endian dtype "
                  "(x.astype(x.dtype.newbyteorder('<')))");
    if (d == "<f4") return Elem::f32;
    if (d == "<f2") return Elem::f16;
    if (d == "<f8") return Elem::f64;
    if (d == "<u2") return Elem::u16;
    if (d == "|V2" || d == "<V2" || d == ">V2" || d == "V2") return Elem::bf16;
    fail(name_, "unsupported dtype " + detail::single_quoted(d) + " (supported: <f4, <f2, <f8, <u2 with --dtype bf16, "
                "|V2 = ml_dtypes bfloat16)");
  }

  const char* s_;
  std::size_t n_;
  std::size_t i_ = 0;
  const std::string& name_;
};

// Parses magic, version, header length and dict from the first `avail` bytes of the file.
Header parse_header(const unsigned char* p, std::size_t avail, const std::string& name,
                    std::uint64_t max_bytes) {
  if (avail < 10 || std::memcmp(p, kMagic, 6) != 0) fail(name, "not a .npy file (bad magic)");
  const unsigned major = p[6], minor = p[7];
  if (minor != 0 || major < 1 || major > 3)
    fail(name, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor));
  std::size_t prefix = 0;
  std::uint64_t hlen = 0;
  if (major == 1) {
    prefix = 10;
    hlen = static_cast<std::uint64_t>(p[8]) | (static_cast<std::uint64_t>(p[9]) << 8);
  } else {
    if (avail < 12) fail(name, "truncated .npy header");
    prefix = 12;
    hlen = static_cast<std::uint64_t>(p[8]) | (static_cast<std::uint64_t>(p[9]) << 8) |
           (static_cast<std::uint64_t>(p[10]) << 16) | (static_cast<std::uint64_t>(p[11]) << 24);
  }
  if (hlen > kMaxHeaderBytes)
    fail(name, ".npy header too long (" + std::to_string(hlen) + " bytes, limit " +
                   std::to_string(kMaxHeaderBytes) + ")");
  if (prefix + hlen > avail) fail(name, "truncated .npy header");
  Header h;
  h.data_offset = prefix + static_cast<std::size_t>(hlen);
  DictParser dp(reinterpret_cast<const char*>(p + prefix), static_cast<std::size_t>(hlen), name);
  h = dp.parse_into(h);
  // The product of the nonzero dimensions must fit int64, even when a zero makes the array empty:
  // then every running product of the shape (Array::numel, Tensor::numel) fits as well (the fuzzer
  // found (3709551615, 4290967296, 0), whose first two dims overflow int64 before the zero).
  std::uint64_t n = 1, nonzero = 1;
  for (std::int64_t dim : h.shape) {
    if (dim == 0) {
      n = 0;
      continue;
    }
    if (nonzero > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / static_cast<std::uint64_t>(dim))
      fail(name, "shape product overflows");
    nonzero *= static_cast<std::uint64_t>(dim);
    n *= static_cast<std::uint64_t>(dim);
  }
  const std::uint64_t es = elem_size(h.elem);
  if (n > max_bytes / es)
    fail(name, "array too large (" + std::to_string(n) + " elements of " + std::to_string(es) +
                   " bytes; limit " + std::to_string(max_bytes) + " bytes)");
  h.nbytes = n * es;
  return h;
}

void check_payload(const Header& h, std::uint64_t file_size, const std::string& name) {
  const std::uint64_t have = file_size - h.data_offset;
  if (have < h.nbytes)
    fail(name, "truncated .npy file: the header promises " + std::to_string(h.nbytes) +
                   " data bytes, the file holds " + std::to_string(have));
  if (have > h.nbytes)
    fail(name, "shape/size mismatch: " + std::to_string(have - h.nbytes) +
                   " bytes after the data the header describes");
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  if (s.size() == 1) out += ",";
  return out + ")";
}

// As the reader's rule: the product of the nonzero dimensions fits int64.
std::uint64_t checked_numel(const std::vector<std::int64_t>& shape, const char* what) {
  std::uint64_t n = 1, nonzero = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw Error(std::string(what) + ": negative dimension");
    if (d == 0) {
      n = 0;
      continue;
    }
    if (nonzero > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / static_cast<std::uint64_t>(d))
      throw Error(std::string(what) + ": shape product overflows");
    nonzero *= static_cast<std::uint64_t>(d);
    n *= static_cast<std::uint64_t>(d);
  }
  return n;
}

}  // namespace

std::size_t elem_size(Elem e) {
  switch (e) {
    case Elem::f32: return 4;
    case Elem::f64: return 8;
    case Elem::f16:
    case Elem::u16:
    case Elem::bf16: return 2;
  }
  return 0;
}

const char* descr(Elem e) {
  switch (e) {
    case Elem::f32: return "<f4";
    case Elem::f16: return "<f2";
    case Elem::f64: return "<f8";
    case Elem::u16: return "<u2";
    case Elem::bf16: return "|V2";
  }
  return "?";
}

std::int64_t Array::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

const float* Array::f32() const {
  if (elem != Elem::f32) throw Error("npy::Array: not a float32 array");
  return reinterpret_cast<const float*>(bytes.data());
}
const double* Array::f64() const {
  if (elem != Elem::f64) throw Error("npy::Array: not a float64 array");
  return reinterpret_cast<const double*>(bytes.data());
}
const std::uint16_t* Array::u16() const {
  if (elem_size(elem) != 2) throw Error("npy::Array: not a 16-bit array");
  return reinterpret_cast<const std::uint16_t*>(bytes.data());
}

Array parse(const void* data, std::size_t size, const std::string& name, std::uint64_t max_bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  if (p == nullptr && size != 0) fail(name, "null buffer");
  const Header h = parse_header(p, size, name, max_bytes);
  check_payload(h, size, name);
  Array a;
  a.elem = h.elem;
  a.shape = h.shape;
  a.bytes.assign(p + h.data_offset, p + h.data_offset + h.nbytes);
  return a;
}

Array read(const std::string& path, std::uint64_t max_bytes) {
  // A regular file only: a FIFO or a device is refused before a read could block.
  const io::InputFile f(path);
  const std::uint64_t file_size = f.size();
  // Only the header is read before the sizes are checked: a lying header cannot make us allocate.
  const std::size_t head_n =
      static_cast<std::size_t>(std::min<std::uint64_t>(file_size, 12 + kMaxHeaderBytes));
  std::vector<unsigned char> head(head_n);
  f.read_at(0, head.data(), head_n);
  const Header h = parse_header(head.data(), head.size(), path, max_bytes);
  check_payload(h, file_size, path);
  Array a;
  a.elem = h.elem;
  a.shape = h.shape;
  a.bytes.resize(static_cast<std::size_t>(h.nbytes));
  f.read_at(h.data_offset, a.bytes.data(), a.bytes.size());
  return a;
}

std::vector<unsigned char> serialize(const Array& a) {
  const std::uint64_t n = checked_numel(a.shape, "npy::serialize");
  if (n * elem_size(a.elem) != a.bytes.size())
    throw Error("npy::serialize: " + std::to_string(a.bytes.size()) + " bytes do not match shape " +
                shape_str(a.shape) + " of " + descr(a.elem));
  std::string dict = std::string("{'descr': '") + descr(a.elem) +
                     "', 'fortran_order': False, 'shape': " + shape_str(a.shape) + ", }";
  // Pad with spaces so that the payload starts at a multiple of 64 bytes, as numpy does.
  auto padded = [&](std::size_t prefix) {
    std::string d = dict;
    const std::size_t total = prefix + d.size() + 1;
    d.append((64 - total % 64) % 64, ' ');
    d.push_back('\n');
    return d;
  };
  std::string hdr = padded(10);
  int major = 1;
  if (hdr.size() > 65535) {
    major = 2;
    hdr = padded(12);
  }
  std::vector<unsigned char> out(kMagic, kMagic + 6);
  out.push_back(static_cast<unsigned char>(major));
  out.push_back(0);
  const std::uint64_t hl = hdr.size();
  out.push_back(static_cast<unsigned char>(hl & 0xff));
  out.push_back(static_cast<unsigned char>((hl >> 8) & 0xff));
  if (major >= 2) {
    out.push_back(static_cast<unsigned char>((hl >> 16) & 0xff));
    out.push_back(static_cast<unsigned char>((hl >> 24) & 0xff));
  }
  out.insert(out.end(), hdr.begin(), hdr.end());
  out.insert(out.end(), a.bytes.begin(), a.bytes.end());
  return out;
}

void write(const std::string& path, const Array& a) {
  const std::vector<unsigned char> img = serialize(a);
  // Staged next to the target and renamed into place: a failed write leaves the old file.
  io::OutputFile f(path);
  f.stage(img.data(), img.size());
  f.commit();
}

namespace {
template <class T>
Array from_raw(const T* data, const std::vector<std::int64_t>& shape, Elem e) {
  const std::uint64_t n = checked_numel(shape, "npy array");
  Array a;
  a.elem = e;
  a.shape = shape;
  a.bytes.resize(static_cast<std::size_t>(n * sizeof(T)));
  if (n) {
    if (data == nullptr) throw Error("npy array: null data");
    std::memcpy(a.bytes.data(), data, a.bytes.size());
  }
  return a;
}
}  // namespace

Array from_f32(const float* data, const std::vector<std::int64_t>& shape) {
  return from_raw(data, shape, Elem::f32);
}
Array from_f64(const double* data, const std::vector<std::int64_t>& shape) {
  return from_raw(data, shape, Elem::f64);
}
Array from_u16(const std::uint16_t* data, const std::vector<std::int64_t>& shape, Elem e) {
  if (elem_size(e) != 2) throw Error("npy::from_u16: element type must be 16-bit");
  return from_raw(data, shape, e);
}

DType library_dtype(const Array& a, bool as_bf16, const std::string& name) {
  switch (a.elem) {
    case Elem::f32: return DType::f32;
    case Elem::f16: return DType::f16;
    case Elem::f64: return DType::f64;
    case Elem::bf16: return DType::bf16;
    case Elem::u16:
      if (as_bf16) return DType::bf16;
      throw Error(name + ": uint16 ('<u2') array; if it holds bfloat16 bit patterns pass --dtype bf16");
  }
  throw Error(name + ": unknown element type");
}

std::vector<float> to_f32(const Array& a, DType t) {
  const auto n = static_cast<std::size_t>(a.numel());
  std::vector<float> out(n);
  const std::size_t want = t == DType::f32 ? 4 : t == DType::f64 ? 8 : 2;
  if (elem_size(a.elem) != want) throw Error("npy::to_f32: element size does not match the dtype");
  switch (t) {
    case DType::f32: std::memcpy(out.data(), a.bytes.data(), n * 4); break;
    case DType::f64: {
      const auto* p = reinterpret_cast<const double*>(a.bytes.data());
      for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
      break;
    }
    case DType::f16: {
      const auto* p = reinterpret_cast<const std::uint16_t*>(a.bytes.data());
      for (std::size_t i = 0; i < n; ++i) out[i] = f16_to_float(p[i]);
      break;
    }
    case DType::bf16: {
      const auto* p = reinterpret_cast<const std::uint16_t*>(a.bytes.data());
      for (std::size_t i = 0; i < n; ++i) out[i] = bf16_to_float(p[i]);
      break;
    }
  }
  return out;
}

}  // namespace blasst::npy
