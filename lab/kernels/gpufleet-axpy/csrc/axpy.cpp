// gpufleet-axpy: the Python binding and the checks of y <- a*x + y (in place on y).
#include <torch/extension.h>

void axpy_cuda(double alpha, const torch::Tensor& x, torch::Tensor& y);

torch::Tensor axpy(double alpha, const torch::Tensor& x, torch::Tensor y) {
  TORCH_CHECK(x.is_cuda() && y.is_cuda(), "axpy: x and y must be CUDA tensors");
  TORCH_CHECK(x.sizes() == y.sizes(), "axpy: x and y must have the same shape");
  TORCH_CHECK(x.scalar_type() == y.scalar_type(), "axpy: x and y must have the same dtype");
  TORCH_CHECK(x.is_contiguous() && y.is_contiguous(), "axpy: x and y must be contiguous");
  axpy_cuda(alpha, x, y);
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("axpy", &axpy, "y <- alpha * x + y (CUDA)", pybind11::arg("alpha"), pybind11::arg("x"), pybind11::arg("y"));
}
