#!/usr/bin/env python
"""Train and evaluate a translation model with any combination of the hf-headattn methods.

In the style of HF's ``run_translation.py`` (its common flags keep their names), plus the method settings:

    # Multi30k En-De from scratch (no data flag: Multi30k, found or downloaded), DHICM on, on the CPU
    python recipes/train_translation.py --source_lang en --target_lang de \
        --model_shape tiny --method dhicm --output_dir outputs/dhicm --num_train_epochs 5 \
        --per_device_train_batch_size 64 --learning_rate 1e-3 --eval_strategy epoch --save_strategy epoch

    # a pretrained checkpoint, methods combined with "+", extra fields as JSON
    python recipes/train_translation.py --model_name_or_path facebook/mbart-large-50 --dataset_name wmt16 \
        --dataset_config_name ro-en --source_lang en --target_lang ro --method dhicm+eadra \
        --method_settings '{"dhicm": {"mode": "scaled_out_proj"}}' --output_dir outputs/mbart

    # a paper's preset (hf_headattn.experiment.presets.paper_presets()): DHICM Table 2's Be-En column and §4.3's
    # training, early stopping included; the flags you pass win over the preset's (here the shape and the epochs)
    python recipes/train_translation.py --preset dhicm_be_en --model_shape small --num_train_epochs 100 \
        --output_dir outputs/dhicm_be_en

    # a method kept outside the package: its module is imported first, so --method and its own flags know it
    python recipes/train_translation.py --method_modules my_pkg.my_method --method my_method --output_dir outputs/mine

An interrupted run continues with ``--resume_from_checkpoint true`` (the latest ``checkpoint-N`` in ``--output_dir``)
or ``--resume_from_checkpoint <checkpoint folder>``. Without it, an ``--output_dir`` that holds ``checkpoint-N``
folders is refused unless ``--overwrite_output_dir`` (start afresh: they are removed before training); one that is
the model, tokenizer or data the run reads is refused always.

Writes ``results.json`` (sacreBLEU/chrF with signatures per test split, settings, train time) and one
``predictions_<split>.txt`` per test split into ``--output_dir``. ``train_time_s`` is this run's wall time in
``Trainer.train`` (after a resume: the resumed part only); ``total_train_time_s`` adds the time of the runs before,
up to the resumed checkpoint (each checkpoint keeps it in ``train_time.json``; null for a checkpoint written before
that file was); ``resumed_from`` names that checkpoint, its step and that earlier time (null: not resumed). Loss
components are logged beside ``loss`` (``--report_to tensorboard`` for TensorBoard).
"""

from __future__ import annotations

import torch

from hf_headattn.experiment.translation_recipe import main

if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
