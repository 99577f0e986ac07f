"""BertConfig: the sizes of a BERT model, read from and written to bert_config.json.

modeling.BertConfig is this class (Google's modeling.py defines it there).
"""

import copy
import json

import tensorflow.compat.v1 as tf

# hidden_act values, modeling.ACTIVATIONS' names.
ACTIVATION_NAMES = ("gelu", "relu", "tanh", "linear")


class BertConfig(object):
  """Hyperparameters of a BertModel (the contents of bert_config.json).

  A bert_config.json must hold every key of Google's format (REQUIRED_KEYS): a file
  without hidden_size would otherwise build a 768-wide model where 128 was meant.
  """

  # The keys of Google's bert_config.json, in its order.
  REQUIRED_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                   "intermediate_size", "hidden_act", "hidden_dropout_prob",
                   "attention_probs_dropout_prob", "max_position_embeddings",
                   "type_vocab_size", "initializer_range")

  def __init__(self,
               vocab_size,
               hidden_size=768,
               num_hidden_layers=12,
               num_attention_heads=12,
               intermediate_size=3072,
               hidden_act="gelu",
               hidden_dropout_prob=0.1,
               attention_probs_dropout_prob=0.1,
               max_position_embeddings=512,
               type_vocab_size=2,
               initializer_range=0.02):
    """Constructs a BertConfig.

    Args:
      vocab_size: Size of the WordPiece vocabulary (rows of the embedding table).
      hidden_size: Width of the encoder layers and the embeddings.
      num_hidden_layers: Number of Transformer layers.
      num_attention_heads: Attention heads per layer; must divide hidden_size.
      intermediate_size: Width of the feed-forward layer inside each Transformer layer.
      hidden_act: Activation of the feed-forward layer: "gelu", "relu", "tanh" or "linear".
      hidden_dropout_prob: Dropout on embeddings, encoder and pooler outputs.
      attention_probs_dropout_prob: Dropout on the attention probabilities.
      max_position_embeddings: Longest sequence the model accepts.
      type_vocab_size: Number of segment ids (2 for sentence A / B).
      initializer_range: Stddev of the truncated-normal weight initializer.
    """
    self.vocab_size = vocab_size
    self.hidden_size = hidden_size
    self.num_hidden_layers = num_hidden_layers
    self.num_attention_heads = num_attention_heads
    self.hidden_act = hidden_act
    self.intermediate_size = intermediate_size
    self.hidden_dropout_prob = hidden_dropout_prob
    self.attention_probs_dropout_prob = attention_probs_dropout_prob
    self.max_position_embeddings = max_position_embeddings
    self.type_vocab_size = type_vocab_size
    self.initializer_range = initializer_range

  @classmethod
  def from_dict(cls, json_object):
    """Constructs a BertConfig from a dict; unknown keys are kept as attributes."""
    if "vocab_size" not in json_object:
      raise ValueError("bert config has no vocab_size; add it to bert_config.json")
    config = BertConfig(vocab_size=None)
    for (key, value) in json_object.items():
      config.__dict__[key] = value
    return config

  @classmethod
  def from_json_file(cls, json_file):
    """Constructs a BertConfig from a json file of parameters.

    Raises:
      ValueError: the file is missing, not JSON, or lacks a key of REQUIRED_KEYS
        (no default is taken); the message names the file, the keys and the fix.
    """
    if not tf.gfile.Exists(json_file) or tf.gfile.IsDirectory(json_file):
      raise ValueError("bert config %s %s; pass --bert_config_file=PATH/bert_config.json"
                       % (json_file, "is a folder" if tf.gfile.Exists(json_file)
                          else "does not exist"))
    with tf.gfile.GFile(json_file, "r") as reader:
      text = reader.read()
    try:
      values = json.loads(text)
    except ValueError as e:
      raise ValueError("bert config %s is not valid JSON (%s); fix the file or pass another "
                       "--bert_config_file" % (json_file, e))
    if not isinstance(values, dict):
      raise ValueError("bert config %s must hold a JSON object; fix the file" % json_file)
    missing = [key for key in cls.REQUIRED_KEYS if key not in values]
    if missing:
      raise ValueError("bert config %s lacks %s (no default is taken: Google's format has "
                       "all of %s); add %s to the file"
                       % (json_file, ", ".join(missing), ", ".join(cls.REQUIRED_KEYS),
                          "it" if len(missing) == 1 else "them"))
    config = cls.from_dict(values)
    config.validate(json_file)
    return config

  def validate(self, source="bert config"):
    """Raises ValueError when the hyperparameters cannot build a model."""
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size"):
      value = getattr(self, key, None)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("%s: %s must be a positive integer, got %r; fix bert_config.json"
                         % (source, key, value))
    if self.hidden_size % self.num_attention_heads:
      raise ValueError("%s: hidden_size %d is not a multiple of num_attention_heads %d; fix "
                       "bert_config.json" % (source, self.hidden_size, self.num_attention_heads))
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
      value = getattr(self, key, None)
      if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
        raise ValueError("%s: %s must be a probability from 0 to below 1, got %r; fix "
                         "bert_config.json" % (source, key, value))
    value = self.initializer_range
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1e6:
      raise ValueError("%s: initializer_range must be a positive number (the weights' "
                       "initial standard deviation, 0.02 in BERT), got %r; fix "
                       "bert_config.json" % (source, value))
    if self.hidden_act not in ACTIVATION_NAMES:
      raise ValueError("%s: hidden_act %r is not one of %s; fix bert_config.json"
                       % (source, self.hidden_act, sorted(ACTIVATION_NAMES)))

  def to_dict(self):
    """Serializes this instance to a Python dictionary."""
    return copy.deepcopy(self.__dict__)

  def to_json_string(self):
    """Serializes this instance to a JSON string."""
    return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
