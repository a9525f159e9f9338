// NumPy .npy files (format versions 1.0, 2.0 and 3.0), the exchange format of the `blasst` CLI.
// Implemented in src/io/npy.cpp; documented in docs/cli.md.
//
// Supported element types (little-endian, C order only):
//   '<f4' float32, '<f2' float16, '<f8' float64,
//   '<u2' uint16  (bfloat16 bit patterns: numpy has no bfloat16, so pass the raw bits as uint16,
//                  e.g. `x.view(np.uint16)` of a torch/ml_dtypes array, and say `--dtype bf16`),
//   '|V2' / '<V2' (what numpy writes for ml_dtypes' bfloat16: always read as bfloat16).
// Everything else -- fortran_order True, big-endian data, other dtypes, truncated or oversized
// files, malformed headers -- raises blasst::Error naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "blasst/blasst.hpp"

namespace blasst::npy {

enum class Elem : std::uint8_t {
  f32,   // '<f4'
  f16,   // '<f2'
  f64,   // '<f8'
  u16,   // '<u2' (bfloat16 bits when the caller says so)
  bf16,  // '|V2' (ml_dtypes bfloat16)
};

std::size_t elem_size(Elem e);
const char* descr(Elem e);  // the header descr written for e ('<f4', ..., '|V2')

// Largest payload read or written (bytes). Larger files are refused before any allocation.
inline constexpr std::uint64_t kMaxBytes = std::uint64_t{16} << 30;
// numpy's own default limit on the header dictionary (np.load max_header_size).
inline constexpr std::size_t kMaxHeaderBytes = 10000;

struct Array {
  Elem elem = Elem::f32;
  std::vector<std::int64_t> shape;     // () is a scalar
  std::vector<unsigned char> bytes;    // C order, little endian, numel() * elem_size(elem)

  std::int64_t numel() const;
  // Typed views; throw Error if elem does not match.
  const float* f32() const;
  const double* f64() const;
  const std::uint16_t* u16() const;    // f16, u16 and bf16 storage
};

// Parse a whole .npy image held in memory; `name` is used in error messages.
Array parse(const void* data, std::size_t size, const std::string& name,
            std::uint64_t max_bytes = kMaxBytes);
// Read a file (its size is checked against the header before the payload is allocated).
Array read(const std::string& path, std::uint64_t max_bytes = kMaxBytes);

// Serialise (version 1.0, or 2.0 when the header does not fit 1.0). Throws Error when the
// byte count does not match the shape.
std::vector<unsigned char> serialize(const Array& a);
void write(const std::string& path, const Array& a);

// Convenience constructors (copy the data).
Array from_f32(const float* data, const std::vector<std::int64_t>& shape);
Array from_f64(const double* data, const std::vector<std::int64_t>& shape);
Array from_u16(const std::uint16_t* data, const std::vector<std::int64_t>& shape, Elem e);

// The library dtype of an array. `as_bf16` (the CLI's --dtype bf16) reinterprets '<u2' as
// bfloat16 bits; without it a '<u2' array is an Error (integers are not attention inputs).
DType library_dtype(const Array& a, bool as_bf16, const std::string& name);
// Values widened to float (f64 narrowed) using the dtype from library_dtype.
std::vector<float> to_f32(const Array& a, DType t);

}  // namespace blasst::npy
