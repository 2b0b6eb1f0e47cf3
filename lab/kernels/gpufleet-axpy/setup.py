"""gpufleet-axpy: one CUDA kernel (y <- a*x + y) built with torch.utils.cpp_extension.

The architectures come from TORCH_CUDA_ARCH_LIST (the ml_env role derives it from the GPU facts,
e.g. "9.0;12.0" -> -gencode arch=compute_90,code=sm_90 and arch=compute_120,code=sm_120), the job
count from MAX_JOBS, the compiler from CUDA_HOME (nvcc) and the host compiler (g++).
"""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    packages=["gpufleet_axpy"],
    ext_modules=[
        CUDAExtension(
            name="gpufleet_axpy._C",
            sources=["csrc/axpy.cpp", "csrc/axpy_kernel.cu"],
            extra_compile_args={"cxx": ["-O2"], "nvcc": ["-O3", "--use_fast_math"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
