#include "runtime/tensor.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace shardsim::runtime {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) {
    if (d < 0) throw std::invalid_argument("negative extent in shape " + shape_str(s));
    n *= d;
  }
  return n;
}

Tensor::Tensor(DType dtype, Shape shape)
    : dtype_(dtype), shape_(std::move(shape)), numel_(shape_numel(shape_)),
      bytes_(static_cast<size_t>(numel_) * dtype_size(dtype), 0) {}

Tensor Tensor::shape_only(Shape shape, DType dtype) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = shape_numel(t.shape_);
  t.storage_ = false;
  return t;
}

void Tensor::drop_storage() {
  std::vector<unsigned char>().swap(bytes_);
  storage_ = false;
}

void Tensor::no_storage(const char* what) const {
  throw std::logic_error(std::string("tensor ") + shape_str(shape_) + " " + dtype_name(dtype_) +
                         " is shape-only (no storage): " + what + " is not available");
}

float* Tensor::f32() {
  if (dtype_ != DType::fp32) throw std::logic_error("tensor is " + dtype_name(dtype_) + ", not fp32");
  if (!storage_) no_storage("f32()");
  return reinterpret_cast<float*>(bytes_.data());
}
const float* Tensor::f32() const { return const_cast<Tensor*>(this)->f32(); }
uint16_t* Tensor::bf16() {
  if (dtype_ != DType::bf16) throw std::logic_error("tensor is " + dtype_name(dtype_) + ", not bf16");
  if (!storage_) no_storage("bf16()");
  return reinterpret_cast<uint16_t*>(bytes_.data());
}
const uint16_t* Tensor::bf16() const { return const_cast<Tensor*>(this)->bf16(); }

std::vector<float> Tensor::to_float() const {
  if (!storage_) no_storage("to_float()");
  std::vector<float> out(static_cast<size_t>(numel_));
  if (dtype_ == DType::fp32) {
    std::memcpy(out.data(), bytes_.data(), bytes_.size());
  } else {
    for (size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(bytes_.data(), i, dtype_);
  }
  return out;
}

Tensor Tensor::from_float(const std::vector<float>& values, DType dtype, Shape shape) {
  Tensor t(dtype, std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw std::invalid_argument("from_float: " + std::to_string(values.size()) + " values for shape " +
                                shape_str(t.shape()));
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

bool Tensor::bit_equal(const Tensor& o) const {
  return dtype_ == o.dtype_ && shape_ == o.shape_ && storage_ == o.storage_ && bytes_ == o.bytes_;
}

namespace {
size_t row_bytes(const Tensor& t) {
  return t.rank() == 0 || t.dim(0) == 0 ? 0 : t.nbytes() / static_cast<size_t>(t.dim(0));
}
}  // namespace

Tensor&& Tensor::reshaped(Shape shape) && {
  if (shape_numel(shape) != numel_)
    throw std::invalid_argument("reshape " + shape_str(shape_) + " to " + shape_str(shape) + ": element counts differ");
  shape_ = std::move(shape);
  return std::move(*this);
}

Tensor Tensor::rows(int64_t r0, int64_t n) const {
  if (rank() == 0 || r0 < 0 || n < 0 || r0 + n > dim(0))
    throw std::out_of_range("rows [" + std::to_string(r0) + ", " + std::to_string(r0 + n) + ") of a " +
                            shape_str(shape_) + " tensor");
  Shape s = shape_;
  s[0] = n;
  if (!storage_) return shape_only(std::move(s), dtype_);
  Tensor out(dtype_, s);
  const size_t rb = row_bytes(*this);
  if (n > 0) std::memcpy(out.data(), bytes_.data() + static_cast<size_t>(r0) * rb, static_cast<size_t>(n) * rb);
  return out;
}

void Tensor::set_rows(int64_t r0, const Tensor& src) {
  if (src.dtype_ != dtype_ || src.rank() != rank() || rank() == 0 ||
      !std::equal(src.shape_.begin() + 1, src.shape_.end(), shape_.begin() + 1))
    throw std::invalid_argument("set_rows: " + shape_str(src.shape_) + " " + dtype_name(src.dtype_) + " into " +
                                shape_str(shape_) + " " + dtype_name(dtype_));
  if (r0 < 0 || r0 + src.dim(0) > dim(0))
    throw std::out_of_range("set_rows: rows [" + std::to_string(r0) + ", " + std::to_string(r0 + src.dim(0)) +
                            ") of a " + shape_str(shape_) + " tensor");
  if (!storage_ && !src.storage_) return;
  if (!storage_ || !src.storage_)
    throw std::logic_error("set_rows: " + std::string(storage_ ? "a shape-only " : "a real ") + shape_str(src.shape_) +
                           " into a " + (storage_ ? "real " : "shape-only ") + shape_str(shape_) + " tensor");
  if (src.nbytes() > 0)
    std::memcpy(bytes_.data() + static_cast<size_t>(r0) * row_bytes(*this), src.data(), src.nbytes());
}

}  // namespace shardsim::runtime
