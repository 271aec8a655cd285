"""EaDRA's tiled Triton kernels (`hf_headattn.methods.eadra.tiled_kernels`) compiled for a GPU architecture without
a GPU (Triton's own ptxas): the check that what the tests run under Triton's interpreter also compiles, for each
kernel, float32 and bfloat16 heads, with and without an additive bias, at the GPU's tiles (64 x 64, D = 64).

    python benchmarks/triton_compile_check.py            # sm_90 (H100, H200)
    python benchmarks/triton_compile_check.py --arch 80  # sm_80 (A100)

Run it without TRITON_INTERPRET (the kernels are built for the compiler then). Prints each kernel's shared memory;
exits 1 when a kernel fails to compile (its error printed).
"""

from __future__ import annotations

import argparse
import os
import sys

from hf_headattn.methods.eadra import tiled_kernels as kernels
from hf_headattn.methods.eadra.tiled import BLOCK_M, BLOCK_N

SIZES = {"B", "H", "T", "S", "D", "KEY_BLOCKS"}


def signature(fn, heads: str, constants: dict) -> dict[str, str]:
    """Triton's signature of a kernel: the heads and the gradients in `heads`' type, the support as uint8, the
    sizes and strides int32, every other pointer float32."""
    found = {}
    for name in fn.arg_names:
        if name in constants:
            found[name] = "constexpr"
        elif name in ("Q", "K", "DQ", "DK"):
            found[name] = f"*{heads}"
        elif name == "SUP":
            found[name] = "*u8"
        elif name.startswith("stride_") or name in SIZES:
            found[name] = "i32"
        elif name == "scaling":
            found[name] = "fp32"
        else:
            found[name] = "*fp32"
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90 (sm_90)")
    args = parser.parse_args(argv)
    if kernels.triton is None or os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("needs Triton, without TRITON_INTERPRET=1")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernels.build()
    failed = 0
    for heads, precision in (("fp32", "ieee"), ("bf16", "tf32")):
        for has_bias in (False, True):
            forward = dict(HAS_BIAS=has_bias, PRECISION=precision, BM=BLOCK_M, BN=BLOCK_N, BD=64)
            backward = dict(forward, HAS_PEAK=True, HAS_SENT=True, HAS_DIST=True)
            difference = "ieee" if precision == "ieee" else "tf32x3"
            for fn, constants in ((kernels.forward_rows_kernel, forward), (kernels.forward_abar_kernel, forward),
                                  (kernels.backward_rows_kernel, dict(backward, DIFFERENCE_PRECISION=difference)),
                                  (kernels.backward_keys_kernel, backward)):
                what = f"{fn.__name__} {heads} heads, bias {has_bias}"
                try:
                    compiled = kernels.triton.compile(ASTSource(fn, signature(fn, heads, constants), constants),
                                                      target=GPUTarget("cuda", args.arch, 32),
                                                      options={"num_warps": 8})
                except Exception as error:  # a result: which kernel, and why
                    failed += 1
                    print(f"FAILED {what}: {type(error).__name__}: {error}", flush=True)
                else:
                    print(f"ok {what}: {compiled.metadata.shared} bytes of shared memory", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
