"""hf-headattn: attention-head methods for mBART and Marian translation models in HF Transformers.

Importing the package registers the configs and models with the Auto classes. The command line: `hf-headattn`
([`hf_headattn.cli`][hf_headattn.cli], the commands in `hf_headattn.commands`); importing the package reads no command
line.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .attention import HeadAttnContext
from .configuration import HeadAttnMarianConfig, HeadAttnMBartConfig
from .deprecation import install_moved_modules
from .losses import label_smoothed_nll_loss
from .modeling import (
    HeadAttnMarianModel,
    HeadAttnMarianMTModel,
    HeadAttnMBartForConditionalGeneration,
    HeadAttnMBartModel,
    HeadAttnSeq2SeqLMOutput,
    HeadAttnSeq2SeqModelOutput,
)
from .version import __version__ as __version__  # re-exported

for _config, _model, _lm in (
    (HeadAttnMBartConfig, HeadAttnMBartModel, HeadAttnMBartForConditionalGeneration),
    (HeadAttnMarianConfig, HeadAttnMarianModel, HeadAttnMarianMTModel),
):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForSeq2SeqLM.register(_config, _lm, exist_ok=True)
install_moved_modules()  # moved module paths (hf_headattn.sea, hf_headattn.analysis, ...) still import, with a warning
# (save_pretrained writes the model's code and auto_map itself, flat, so that users without the package load a saved
# folder with trust_remote_code=True: hf_headattn.remote_code)


def __getattr__(name):
    """`hf_headattn.translate`, imported on first use: the experiment kit is not loaded with the model core."""
    if name == "translate":
        from .experiment.translate import translate

        return translate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "HeadAttnContext",
    "HeadAttnMBartConfig",
    "HeadAttnMBartModel",
    "HeadAttnMBartForConditionalGeneration",
    "HeadAttnMarianConfig",
    "HeadAttnMarianModel",
    "HeadAttnMarianMTModel",
    "HeadAttnSeq2SeqLMOutput",
    "HeadAttnSeq2SeqModelOutput",
    "label_smoothed_nll_loss",
    "translate",
]
