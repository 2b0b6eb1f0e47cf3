// gpufleet test program: a kernel plus host code, so nvcc must compile device code, run the host
// compiler and link. Without a GPU (lab hosts) it reports that no driver/device is usable and exits 0.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void axpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

int main() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  printf("gpufleet cuda probe: runtime %d, devices %d (%s)\n", runtime, count, cudaGetErrorString(err));
  return 0;
}
