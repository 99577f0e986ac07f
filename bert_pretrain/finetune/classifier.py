"""The classification graph and its metrics: BERT with a classifier on the pooled [CLS]
output (Google's run_classifier names: output_weights, output_bias), accuracy, F1 and
Matthews' correlation. Reads no flags; run_classifier.py drives it.

  outputs = build_classifier(bert_config, features, num_labels=2, is_training=True,
                             dtype=tf.float32)
  classification_metrics("mrpc", label_ids, predictions)  # {"accuracy": ..., "f1": ...}
"""

import numpy as np
import tensorflow.compat.v1 as tf

from bert_pretrain.model import modeling
from bert_pretrain.model import dropout as dropout_lib


def build_classifier(bert_config, features, num_labels, is_training, dtype):
  """BERT with a classification layer on the pooled [CLS] output.

  Args:
    bert_config: modeling.BertConfig.
    features: dict of int32 Tensors: input_ids, input_mask, segment_ids of shape
      [batch_size, seq_length], label_ids of shape [batch_size].
    num_labels: classes.
    is_training: dropout on.
    dtype: compute type; weights stay float32.

  Returns:
    dict of float32 Tensors: loss (scalar), per_example_loss [batch_size],
    probabilities [batch_size, num_labels]; and predictions (int32 [batch_size]).
  """
  model = modeling.BertModel(config=bert_config, is_training=is_training,
                             input_ids=features["input_ids"],
                             input_mask=features["input_mask"],
                             token_type_ids=features["segment_ids"], compute_type=dtype)
  # The head computes in float32 (a [hidden, labels] product): full-precision logits.
  pooled = tf.cast(model.get_pooled_output(), tf.float32)
  output_weights = tf.get_variable(
      "output_weights", [num_labels, bert_config.hidden_size],
      initializer=modeling.create_initializer(bert_config.initializer_range))
  output_bias = tf.get_variable("output_bias", [num_labels], initializer=tf.zeros_initializer())
  with tf.name_scope("loss"):
    if is_training:
      pooled = dropout_lib.dropout(pooled, 0.1)
    logits = tf.nn.bias_add(tf.matmul(pooled, output_weights, transpose_b=True), output_bias)
    per_example_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=features["label_ids"], logits=logits)
    return {"loss": tf.reduce_mean(per_example_loss), "per_example_loss": per_example_loss,
            "probabilities": tf.nn.softmax(logits, axis=-1),
            "predictions": tf.argmax(logits, axis=-1, output_type=tf.int32)}


def classification_metrics(task_name, label_ids, predictions):
  """accuracy, and for MRPC the F1 of class 1, for CoLA Matthews' correlation.

  Args:
    task_name: the task.
    label_ids, predictions: int arrays of the same length.

  Returns:
    dict of floats.
  """
  label_ids, predictions = np.asarray(label_ids), np.asarray(predictions)
  results = {"accuracy": float(np.mean(label_ids == predictions)) if len(label_ids) else 0.0}
  tp = float(np.sum((predictions == 1) & (label_ids == 1)))
  fp = float(np.sum((predictions == 1) & (label_ids != 1)))
  fn = float(np.sum((predictions != 1) & (label_ids == 1)))
  tn = float(np.sum((predictions != 1) & (label_ids != 1)))
  if task_name == "mrpc":
    results["f1"] = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
  if task_name == "cola":
    denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    results["matthews_corr"] = float((tp * tn - fp * fn) / denominator) if denominator else 0.0
  return results
