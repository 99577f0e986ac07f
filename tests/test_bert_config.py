"""bert_config.json must hold every key of Google's format: no silent defaults."""

import json
import os

import pytest

from bert_pretrain import demo
from bert_pretrain.model import modeling
from conftest import TINY_CONFIG, base_flags, run_pretraining


@pytest.mark.parametrize("key", modeling.BertConfig.REQUIRED_KEYS)
def test_each_missing_key_is_an_error_naming_it_and_the_file(tmp_path, key):
  path = tmp_path / "bert_config.json"
  path.write_text(json.dumps({k: v for k, v in TINY_CONFIG.items() if k != key}))
  with pytest.raises(ValueError) as error:
    modeling.BertConfig.from_json_file(str(path))
  message = str(error.value)
  assert message.startswith("bert config %s lacks %s (" % (path, key)), message
  assert "\n" not in message


def test_a_config_without_hidden_size_does_not_train(pretraining_data, tmp_path):
  """A run refuses it before anything is written, with one line naming both missing keys
  and the file."""
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps({k: v for k, v in TINY_CONFIG.items()
                                if k not in ("hidden_size", "initializer_range")}))
  out = tmp_path / "out"
  result = run_pretraining(*base_flags(pretraining_data, out, bert_config_file=str(config)))
  assert result.returncode != 0
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert errors == ["run_pretraining: error: bert config %s lacks hidden_size, "
                    "initializer_range (no default is taken: Google's format has all of %s); "
                    "add them to the file"
                    % (config, ", ".join(modeling.BertConfig.REQUIRED_KEYS))], result.stderr
  assert "Traceback" not in result.stderr
  assert not out.exists()


def test_the_demo_and_test_configs_hold_every_key(tmp_path):
  """Google's BERT-Base layout, the demo's config and the tests' configs all load."""
  base = {"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
          "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
          "intermediate_size": 3072, "max_position_embeddings": 512,
          "num_attention_heads": 12, "num_hidden_layers": 12, "type_vocab_size": 2,
          "vocab_size": 30522}
  for name, values in (("google_base", base), ("demo", demo.DEMO_CONFIG),
                       ("tiny", TINY_CONFIG)):
    path = os.path.join(str(tmp_path), name + ".json")
    with open(path, "w") as f:
      json.dump(values, f)
    assert modeling.BertConfig.from_json_file(path).to_dict() == values
