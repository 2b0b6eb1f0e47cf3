"""gpufleet lab CUDA mirror: lab equipment that builds a local, signed apt repository of CUDA 12.8.

PyPI has no complete CUDA 12.x compiler, but it does carry the real CUDA 12.8 pieces (``ptxas``
12.8.93, libnvvm and libdevice, headers, cudart 12.8.90, NVRTC 12.8.93). This package downloads
those wheels once (pinned by sha256), repacks them as Debian packages laid out like NVIDIA's own
(``/usr/local/cuda-12.8``), adds a stand-in ``nvcc`` that only reports its version and says it is
a lab stand-in, and publishes them as a flat apt repository (the layout of NVIDIA's network
repository) whose ``Release`` is signed with a lab key. It also caches the CUDA 13.0 compiler
wheels (a wheelhouse) and builds a stand-in ``.run`` installer, so every install method of the
``cuda_toolkit`` role can be exercised without NVIDIA's servers.

Only the lab uses this; no product role installs it. Serve it with
``python -m gpufleet_lab cuda-mirror up`` (see lab/gpufleet_lab/cuda_mirror.py).
"""
