"""Signs that a model server ran out of memory while it started.

llama.cpp, PyTorch (vLLM, diffusers), whisper.cpp and their GPU backends say so in their
own words; ``out_of_memory`` knows the usual ones:

* CUDA: ``cudaMalloc failed: out of memory``, ``CUDA error: out of memory``,
  ``torch.OutOfMemoryError: CUDA out of memory``, ``cudaErrorMemoryAllocation``;
* ROCm/HIP: ``hipMalloc failed: out of memory``, ``hipErrorOutOfMemory``;
* Metal: ``failed to allocate buffer``, ``Insufficient Memory``
  (``kIOGPUCommandBufferCallbackErrorOutOfMemory``);
* Vulkan: ``ErrorOutOfDeviceMemory``, ``VK_ERROR_OUT_OF_DEVICE_MEMORY``;
* llama.cpp's own: ``failed to allocate CUDA0 buffer``, ``unable to allocate ROCm0 buffer``,
  ``failed to allocate compute buffers``.
"""

from __future__ import annotations

import re

__all__ = ["out_of_memory"]

_SIGNS = re.compile(
    r"out of memory"
    r"|OutOfMemory"
    r"|out_?of_?device_?memory"
    r"|cudaErrorMemoryAllocation"
    r"|insufficient memory"
    r"|(?:failed|unable) to allocate \S*\s*(?:\S+ )?buffer",
    re.IGNORECASE,
)


def out_of_memory(line: str) -> bool:
    """Whether ``line`` of a server's output says an allocation on a device failed."""
    return _SIGNS.search(line) is not None
