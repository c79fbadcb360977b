// A dense, row-major, host-resident tensor of one DType. Owns its bytes -- or, shape-only, none at all.
//
// Shape: a list of extents (int64). numel() is their product (1 for a scalar shape {}).
// Access: data() gives the raw bytes; f32()/bf16() give typed pointers and throw std::logic_error when the
// dtype does not match. to_float()/from_float() convert with the dtype's rounding.
//
// Shape-only tensors (PyTorch's "meta" device): Tensor::shape_only(shape, dtype) carries shape and dtype but
// allocates nothing; has_storage() is false. nbytes() is still the logical size (numel · element size), so the
// simulated HBM accounting is the same as for a real tensor. Everything that would touch the bytes -- data(),
// f32(), bf16(), get(), set(), to_float(), set_rows() into or from a real tensor -- throws std::logic_error
// naming the shape; rows() and reshaped() give shape-only results. The kernels in kernels/ accept shape-only
// operands and then only charge their cost (the rule is in kernels/kernel_cost.h).
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
  // A tensor without storage (see above). std::invalid_argument on a negative extent.
  static Tensor shape_only(Shape shape, DType dtype);
  // Zero-filled when STORAGE is true, shape-only otherwise: how code that runs in both modes allocates.
  static Tensor make(DType dtype, Shape shape, bool storage) {
    return storage ? Tensor(dtype, std::move(shape)) : shape_only(std::move(shape), dtype);
  }

  bool has_storage() const { return storage_; }
  // Frees the bytes and makes this tensor shape-only (shape and dtype kept). What a kernel does to its outputs
  // when an input has no storage, so no stale values can pass for a result.
  void drop_storage();

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const { return numel_; }
  // Logical size numel · element size (also for a shape-only tensor).
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }

  void* data() {
    if (!storage_) no_storage("data()");
    return bytes_.data();
  }
  const void* data() const {
    if (!storage_) no_storage("data()");
    return bytes_.data();
  }
  // data(), or nullptr for a shape-only tensor: the buffer argument of a collective, which in shape-only mode
  // (Transport::set_shape_only) moves no payload and takes null buffers.
  void* data_if_stored() { return storage_ ? bytes_.data() : nullptr; }
  const void* data_if_stored() const { return storage_ ? bytes_.data() : nullptr; }
  float* f32();
  const float* f32() const;
  uint16_t* bf16();
  const uint16_t* bf16() const;

  float get(int64_t i) const { return load_as_float(data(), static_cast<size_t>(i), dtype_); }
  void set(int64_t i, float v) { store_from_float(data(), static_cast<size_t>(i), dtype_, v); }

  std::vector<float> to_float() const;
  static Tensor from_float(const std::vector<float>& values, DType dtype, Shape shape);

  // Same dtype, shape and bytes (two shape-only tensors of one dtype and shape are equal; a shape-only and a
  // real one are not).
  bool bit_equal(const Tensor& other) const;

  // The same bytes under SHAPE (same number of elements; std::invalid_argument otherwise). No copy.
  Tensor&& reshaped(Shape shape) &&;

  // Rows [R0, R0+N) along the first dimension, as a new tensor (other dimensions kept; shape-only if this is).
  // std::out_of_range if they are not all inside.
  Tensor rows(int64_t r0, int64_t n) const;
  // Copies SRC over rows [R0, R0 + SRC.dim(0)); SRC must match in dtype and in every other dimension
  // (std::invalid_argument), and fit (std::out_of_range). Both shape-only: checks only. One shape-only and the
  // other not: std::logic_error.
  void set_rows(int64_t r0, const Tensor& src);

 private:
  [[noreturn]] void no_storage(const char* what) const;

  DType dtype_ = DType::fp32;
  Shape shape_;
  int64_t numel_ = 0;
  std::vector<unsigned char> bytes_;
  bool storage_ = true;
};

}  // namespace shardsim::runtime
