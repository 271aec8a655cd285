"""The toy method's analysis: each head's scale, averaged over a dataset's batches."""

import torch


@torch.no_grad()
def mean_scales(model, batches) -> dict[str, list[float]]:
    """{module name: per-head scale, averaged over ``batches``} from the ``output_toy_scales`` read-out."""
    sums, count = {}, 0
    for batch in batches:
        for name, scale in model(**batch, output_toy_scales=True).toy_scales.items():
            sums[name] = sums.get(name, 0) + scale
        count += 1
    return {name: (total / count).tolist() for name, total in sums.items()}
