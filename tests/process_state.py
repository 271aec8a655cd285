"""What a module of ours could switch for the whole process (``tests/test_global_state.py``). Imports only torch,
transformers and datasets, so that a fresh interpreter can take the state before it imports hf-headattn."""

import datasets
import torch
import transformers


def process_state() -> dict:
    """torch's numerics and backend switches, transformers' and datasets' logging, progress bars and caching."""
    matmul = torch.backends.cuda.matmul
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul": [matmul.allow_tf32, matmul.allow_fp16_reduced_precision_reduction,
                        matmul.allow_bf16_reduced_precision_reduction],
        "cudnn": [torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic],
        "sdp": [torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
                torch.backends.cuda.math_sdp_enabled()],
        "mha_fastpath": torch.backends.mha.get_fastpath_enabled(),
        "deterministic": [torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled()],
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
        "threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
        "transformers_verbosity": transformers.logging.get_verbosity(),
        "datasets_progress_bars": datasets.is_progress_bar_enabled(),
        "datasets_caching": datasets.is_caching_enabled(),
    }


if __name__ == "__main__":  # the state before and after importing every module of the package, as JSON
    import importlib
    import json
    import pkgutil

    before = process_state()
    import hf_headattn

    for module in pkgutil.walk_packages(hf_headattn.__path__, "hf_headattn."):
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as error:  # an optional dependency (optuna, benepar, ...)
            if error.name.startswith("hf_headattn"):
                raise
    print(json.dumps([before, process_state()]))
