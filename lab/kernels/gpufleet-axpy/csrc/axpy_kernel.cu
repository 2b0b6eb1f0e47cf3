// gpufleet-axpy: the CUDA kernel, a grid-stride loop over float, half and bfloat16.
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/types.h>

#include <algorithm>

template <typename scalar_t>
__global__ void axpy_kernel(float alpha, const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    y[i] = static_cast<scalar_t>(alpha * static_cast<float>(x[i]) + static_cast<float>(y[i]));
  }
}

void axpy_cuda(double alpha, const torch::Tensor& x, torch::Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535));
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, x.scalar_type(), "axpy", [&] {
    axpy_kernel<scalar_t><<<blocks, threads, 0, stream>>>(static_cast<float>(alpha), x.data_ptr<scalar_t>(),
                                                          y.data_ptr<scalar_t>(), n);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
