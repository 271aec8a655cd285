"""Stand-in for ``config_common_kwargs`` of transformers' tests/utils/test_configuration_utils.py (not in the sdist).

``ConfigTester.check_config_arguments_init`` builds a config from these and checks each one is kept: every common
``PreTrainedConfig`` field of transformers 5.23 and 5.24 with a value that differs from its default.
"""

config_common_kwargs = {
    "return_dict": False,
    "output_hidden_states": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["BertModel"],
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "problem_type": "regression",
}
