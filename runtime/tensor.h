// A dense, row-major, host-resident tensor of one DType. Owns its bytes.
//
// Shape: a list of extents (int64). numel() is their product (1 for a scalar shape {}).
// Access: data() gives the raw bytes; f32()/bf16() give typed pointers and throw std::logic_error when the
// dtype does not match. to_float()/from_float() convert with the dtype's rounding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/dtype.h"

namespace shardsim::runtime {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "[512, 4096]"
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);  // zero-filled

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return bytes_.size(); }

  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  float* f32();
  const float* f32() const;
  uint16_t* bf16();
  const uint16_t* bf16() const;

  float get(int64_t i) const { return load_as_float(data(), static_cast<size_t>(i), dtype_); }
  void set(int64_t i, float v) { store_from_float(data(), static_cast<size_t>(i), dtype_, v); }

  std::vector<float> to_float() const;
  static Tensor from_float(const std::vector<float>& values, DType dtype, Shape shape);

  bool bit_equal(const Tensor& other) const;

  // The same bytes under SHAPE (same number of elements; std::invalid_argument otherwise). No copy.
  Tensor&& reshaped(Shape shape) &&;

  // Rows [R0, R0+N) along the first dimension, as a new tensor (other dimensions kept). std::out_of_range if
  // they are not all inside.
  Tensor rows(int64_t r0, int64_t n) const;
  // Copies SRC over rows [R0, R0 + SRC.dim(0)); SRC must match in dtype and in every other dimension
  // (std::invalid_argument), and fit (std::out_of_range).
  void set_rows(int64_t r0, const Tensor& src);

 private:
  DType dtype_ = DType::fp32;
  Shape shape_;
  int64_t numel_ = 0;
  std::vector<unsigned char> bytes_;
};

}  // namespace shardsim::runtime
