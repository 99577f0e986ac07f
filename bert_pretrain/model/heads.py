"""BERT's pretraining heads: the masked-LM head (cls/predictions) and the next-sentence
head (cls/seq_relationship), with Google's variable names.

google-research/bert keeps them in run_pretraining.py; here they sit beside the model
so that pretraining, the export and the tests build the same heads.
"""

import tensorflow.compat.v1 as tf

from bert_pretrain.model import modeling
from bert_pretrain.model import shapes
from bert_pretrain.model import precision


def get_masked_lm_output(bert_config, input_tensor, output_weights, positions, label_ids,
                         label_weights):
  """The masked-LM head (cls/predictions), evaluated at the masked positions only.

  Gathering the masked positions first means the transform and the vocabulary
  projection run on batch_size * max_predictions_per_seq rows instead of
  batch_size * seq_length: the projection is the largest matmul of a small BERT.

  Args:
    bert_config: BertConfig.
    input_tensor: float Tensor [batch_size, seq_length, hidden_size], the sequence
      output; or, with positions None, [batch_size * max_predictions_per_seq,
      hidden_size], the output at the masked positions (BertModel's
      get_masked_positions_output()).
    output_weights: float Tensor [vocab_size, hidden_size], the word embedding table
      (the output projection shares it).
    positions: int Tensor [batch_size, max_predictions_per_seq], masked positions, or
      None.
    label_ids: int Tensor [batch_size, max_predictions_per_seq], the true token ids.
    label_weights: float Tensor [batch_size, max_predictions_per_seq], 1.0 for real
      predictions, 0.0 for padding.

  Returns:
    (loss, per_example_loss, log_probs): float32 scalar, float32 [batch_size *
    max_predictions_per_seq], float32 [batch_size * max_predictions_per_seq, vocab_size].
  """
  if positions is not None:
    input_tensor = gather_indexes(input_tensor, positions)

  with tf.variable_scope("cls/predictions"):
    # One more non-linear transform before the output layer; it is not used after
    # pretraining.
    with tf.variable_scope("transform"):
      input_tensor = modeling.dense_layer(
          input_tensor, bert_config.hidden_size, "dense",
          modeling.get_activation(bert_config.hidden_act), bert_config.initializer_range)
      input_tensor = modeling.layer_norm(input_tensor)

    # The output weights are the input embeddings, but there is an output-only bias
    # for each token.
    output_bias = tf.get_variable("output_bias", shape=[bert_config.vocab_size],
                                  dtype=input_tensor.dtype, initializer=tf.zeros_initializer())
    logits = tf.matmul(input_tensor, precision.cast(output_weights, input_tensor.dtype),
                       transpose_b=True)
    logits = precision.cast(precision.bias_add(logits, output_bias), tf.float32)
    log_probs = tf.nn.log_softmax(logits, axis=-1)

    label_ids = tf.reshape(label_ids, [-1])
    label_weights = tf.cast(tf.reshape(label_weights, [-1]), tf.float32)
    per_example_loss = precision.softmax_cross_entropy(logits, tf.cast(label_ids, tf.int32))
    # Padding predictions have weight 0; the epsilon keeps an all-padding batch at 0.
    numerator = tf.reduce_sum(label_weights * per_example_loss)
    denominator = tf.reduce_sum(label_weights) + 1e-5
    loss = numerator / denominator

  return (loss, per_example_loss, log_probs)


def get_next_sentence_output(bert_config, input_tensor, labels, weights=None):
  """The next-sentence head (cls/seq_relationship): is sentence B the real next one?

  Args:
    bert_config: BertConfig.
    input_tensor: float Tensor [batch_size, hidden_size], the pooled output.
    labels: int Tensor [batch_size] or [batch_size, 1]: 0 = B follows A, 1 = random B.
    weights: (optional) float Tensor of labels' size: 1.0 for a sequence, 0.0 for a
      packed record's empty slot. The loss is then the weighted mean, that of the
      sequences alone.

  Returns:
    (loss, per_example_loss, log_probs): float32 scalar, [batch_size], [batch_size, 2].
  """
  with tf.variable_scope("cls/seq_relationship"):
    output_weights = tf.get_variable(
        "output_weights", shape=[2, bert_config.hidden_size], dtype=input_tensor.dtype,
        initializer=modeling.create_initializer(bert_config.initializer_range))
    output_bias = tf.get_variable("output_bias", shape=[2], dtype=input_tensor.dtype,
                                  initializer=tf.zeros_initializer())

    logits = tf.matmul(input_tensor, output_weights, transpose_b=True)
    logits = precision.cast(precision.bias_add(logits, output_bias), tf.float32)
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    per_example_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits)
    if weights is None:
      loss = tf.reduce_mean(per_example_loss)
    else:
      weights = tf.cast(tf.reshape(weights, [-1]), tf.float32)
      loss = tf.reduce_sum(weights * per_example_loss) / tf.maximum(tf.reduce_sum(weights),
                                                                     1.0)
    return (loss, per_example_loss, log_probs)


def pretraining_variable_shapes(bert_config):
  """The shape of every weight of BERT with its pretraining heads (what
  pretraining.build_model makes), by Google's name: what a checkpoint is checked against
  before any graph is built (building BERT-Large's takes seconds).

  Returns:
    dict name -> list of ints, e.g. "bert/encoder/layer_0/intermediate/dense/kernel" ->
    [hidden_size, intermediate_size].
  """
  h, i, v = bert_config.hidden_size, bert_config.intermediate_size, bert_config.vocab_size
  dense = lambda name, rows, columns: {name + "/kernel": [rows, columns], name + "/bias": [columns]}
  norm = lambda name: {name + "/LayerNorm/gamma": [h], name + "/LayerNorm/beta": [h]}
  shapes = {"bert/embeddings/word_embeddings": [v, h],
            "bert/embeddings/position_embeddings": [bert_config.max_position_embeddings, h],
            "bert/embeddings/token_type_embeddings": [bert_config.type_vocab_size, h]}
  shapes.update(norm("bert/embeddings"))
  for layer in range(bert_config.num_hidden_layers):
    scope = "bert/encoder/layer_%d/" % layer
    for projection in ("query", "key", "value"):
      shapes.update(dense(scope + "attention/self/" + projection, h, h))
    shapes.update(dense(scope + "attention/output/dense", h, h))
    shapes.update(norm(scope + "attention/output"))
    shapes.update(dense(scope + "intermediate/dense", h, i))
    shapes.update(dense(scope + "output/dense", i, h))
    shapes.update(norm(scope + "output"))
  shapes.update(dense("bert/pooler/dense", h, h))
  shapes.update(dense("cls/predictions/transform/dense", h, h))
  shapes.update(norm("cls/predictions/transform"))
  shapes["cls/predictions/output_bias"] = [v]
  shapes["cls/seq_relationship/output_weights"] = [2, h]
  shapes["cls/seq_relationship/output_bias"] = [2]
  return shapes


def gather_indexes(sequence_tensor, positions):
  """Gathers the vectors at the given positions of each sequence of the batch.

  Args:
    sequence_tensor: float Tensor [batch_size, seq_length, width].
    positions: int Tensor [batch_size, num_positions].

  Returns:
    float Tensor [batch_size * num_positions, width].
  """
  sequence_shape = modeling.get_shape_list(sequence_tensor, expected_rank=3)
  batch_size = sequence_shape[0]
  seq_length = sequence_shape[1]
  width = sequence_shape[2]

  flat_sequence_tensor = tf.reshape(sequence_tensor, [batch_size * seq_length, width])
  return tf.gather(flat_sequence_tensor, shapes.flat_positions(positions, seq_length))
