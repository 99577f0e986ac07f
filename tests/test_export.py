"""bert_pretrain.export: a checkpoint with Google's names -> a transformers folder."""

import json
import os
import shutil
import struct

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain.training import checkpoints
from bert_pretrain import demo
from bert_pretrain import export
from bert_pretrain.model import heads
from bert_pretrain.model import modeling
from conftest import (TINY_CONFIG, TWO_LAYER_CONFIG, base_flags, rewrite_checkpoint, run_command,
                      run_pretraining)

SEQ = 16


def _model_log_probs(config, input_ids, input_mask, segment_ids):
  """Our model's masked-LM log-probabilities at every position and next-sentence
  log-probabilities, in the graph being built: ([batch * SEQ, vocab], [batch, 2])."""
  model = modeling.BertModel(config, False, input_ids, input_mask, segment_ids)
  batch = input_ids.shape[0]
  positions = tf.tile(tf.range(SEQ)[None, :], [batch, 1])
  zeros = tf.zeros([batch, SEQ], tf.int32)
  _, _, mlm = heads.get_masked_lm_output(config, model.get_sequence_output(),
                                            model.get_embedding_table(), positions, zeros,
                                            tf.ones([batch, SEQ]))
  _, _, nsp = heads.get_next_sentence_output(config, model.get_pooled_output(),
                                                tf.zeros([batch, 1], tf.int32))
  return mlm, nsp


def _vocab_text(size):
  """A vocab.txt of `size` lines: BERT's special tokens, then made-up words."""
  tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  return "".join(t + "\n" for t in tokens + ["tok%d" % i for i in range(len(tokens), size)])


@pytest.fixture(scope="module")
def trained_like(tmp_path_factory):
  """A checkpoint whose every variable (biases, LayerNorm, heads) holds random values, as
  after training, with Adam slots and global_step beside the weights; the inputs and
  our model's outputs on them."""
  root = tmp_path_factory.mktemp("export")
  config = modeling.BertConfig.from_dict(TWO_LAYER_CONFIG)
  (root / "bert_config.json").write_text(json.dumps(TWO_LAYER_CONFIG))
  (root / "vocab.txt").write_text(_vocab_text(config.vocab_size))
  rng = np.random.RandomState(3)
  inputs = {"input_ids": rng.randint(5, config.vocab_size, (2, SEQ)).astype(np.int32),
            "input_mask": np.ones((2, SEQ), np.int32),
            "segment_ids": np.repeat([[0] * 9 + [1] * 7], 2, 0).astype(np.int32)}
  inputs["input_mask"][1, 12:] = 0
  with tf.Graph().as_default():
    mlm, nsp = _model_log_probs(config, *(tf.constant(inputs[k]) for k in
                                          ("input_ids", "input_mask", "segment_ids")))
    weights = tf.trainable_variables()
    for v in weights:
      tf.get_variable(v.op.name + "/adam_m", v.shape, initializer=tf.zeros_initializer())
    tf.train.get_or_create_global_step()
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      for v in weights:
        v.load(rng.normal(0, 0.2, v.shape.as_list()).astype(np.float32), sess)
      outputs = sess.run({"mlm": mlm, "nsp": nsp})
      prefix = tf.train.Saver().save(sess, str(root / "model.ckpt-7"), write_meta_graph=False)
  return {"root": root, "prefix": prefix, "inputs": inputs, "outputs": outputs,
          "config": config}


def _run_export(checkpoint, config, vocab, out):
  return run_command("bert_pretrain.export", "--checkpoint=%s" % checkpoint,
                     "--bert_config_file=%s" % config, "--vocab_file=%s" % vocab,
                     "--output_dir=%s" % out)


def _export(case, name):
  out = case["root"] / name
  result = _run_export(case["prefix"], case["root"] / "bert_config.json",
                       case["root"] / "vocab.txt", out)
  assert result.returncode == 0, result.stderr[-3000:]
  return out


def _read_safetensors(path):
  with open(path, "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
    data = f.read()
  assert (8 + length) % 8 == 0
  header.pop("__metadata__")
  return {name: np.frombuffer(data[start:end], "<f4").reshape(entry["shape"])
          for name, entry in header.items()
          for start, end in [entry["data_offsets"]]}


def test_export_writes_every_weight_once_in_transformers_names_and_layout(trained_like):
  out = _export(trained_like, "hf")
  tensors = _read_safetensors(str(out / "model.safetensors"))
  reader = tf.train.load_checkpoint(trained_like["prefix"])
  query = reader.get_tensor("bert/encoder/layer_1/attention/self/query/kernel")
  np.testing.assert_array_equal(tensors["bert.encoder.layer.1.attention.self.query.weight"],
                                query.T)
  np.testing.assert_array_equal(tensors["cls.seq_relationship.weight"],
                                reader.get_tensor("cls/seq_relationship/output_weights"))
  np.testing.assert_array_equal(tensors["bert.encoder.layer.0.output.LayerNorm.bias"],
                                reader.get_tensor("bert/encoder/layer_0/output/LayerNorm/beta"))
  # Every model weight, nothing of the optimizer: 16 per layer, 5 embeddings, 2 pooler,
  # 5 masked-LM head, 2 next-sentence head.
  assert len(tensors) == 16 * 2 + 5 + 2 + 5 + 2
  assert not any("adam" in name or "global_step" in name for name in tensors)
  config = json.loads((out / "config.json").read_text())
  assert config["hidden_act"] == "gelu_new" and config["hidden_size"] == 32
  assert (out / "vocab.txt").read_text() == (trained_like["root"] / "vocab.txt").read_text()


def test_transformers_gives_our_models_logits_on_the_same_input(trained_like):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  out = _export(trained_like, "hf_logits")
  model = transformers.BertForPreTraining.from_pretrained(str(out))
  model.eval()
  inputs = trained_like["inputs"]
  with torch.no_grad():
    result = model(input_ids=torch.tensor(inputs["input_ids"], dtype=torch.long),
                   attention_mask=torch.tensor(inputs["input_mask"], dtype=torch.long),
                   token_type_ids=torch.tensor(inputs["segment_ids"], dtype=torch.long))
  theirs_mlm = torch.log_softmax(result.prediction_logits, -1).numpy().reshape(-1, 600)
  theirs_nsp = torch.log_softmax(result.seq_relationship_logits, -1).numpy()
  ours = trained_like["outputs"]
  difference = max(np.abs(theirs_mlm - ours["mlm"]).max(), np.abs(theirs_nsp - ours["nsp"]).max())
  print("largest log-probability difference, transformers vs ours: %.3g" % difference)
  assert difference < 1e-4
  # And the tokenizer files load.
  tokenizer = transformers.BertTokenizer.from_pretrained(str(out))
  assert tokenizer.convert_tokens_to_ids("tok42") == 42


def test_a_vocab_larger_than_vocab_size_is_a_one_line_error_a_padded_one_exports(
    trained_like, tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text(_vocab_text(601))
  result = _run_export(trained_like["prefix"], trained_like["root"] / "bert_config.json",
                       vocab, tmp_path / "out")
  assert result.returncode == 2
  assert result.stderr.strip() == (
      "export: error: %s has 601 tokens but vocab_size is 600 in %s; pass the matching vocab "
      "and config" % (vocab, trained_like["root"] / "bert_config.json"))
  assert not (tmp_path / "out").exists()
  # vocab_size above the tokens: the rows past them are padding, as NVIDIA pads to 30528.
  vocab.write_text(_vocab_text(592))
  padded = _run_export(trained_like["prefix"], trained_like["root"] / "bert_config.json",
                       vocab, tmp_path / "padded")
  assert padded.returncode == 0, padded.stderr
  assert "warning" not in padded.stderr
  assert json.loads((tmp_path / "padded" / "config.json").read_text())["vocab_size"] == 600
  assert len((tmp_path / "padded" / "vocab.txt").read_text().splitlines()) == 592


def test_a_vocab_of_1024_tokens_or_more_below_vocab_size_is_warned_of(tmp_path):
  """Padding adds fewer rows (a multiple of 1024 at most): more, another model's vocab
  (a cased one's 28996 tokens for an uncased config's 30522, say)."""
  config = dict(TWO_LAYER_CONFIG, vocab_size=2048)
  (tmp_path / "bert_config.json").write_text(json.dumps(config))
  prefix = str(tmp_path / "init" / "model.ckpt-0")  # the folder is the checkpoint's alone
  demo.write_fresh_checkpoint(modeling.BertConfig.from_dict(config), prefix)
  vocab = tmp_path / "vocab.txt"
  for tokens, out, warned in ((1100, "padded", False), (1024, "other", True)):
    vocab.write_text(_vocab_text(tokens))
    result = _run_export(prefix, tmp_path / "bert_config.json", vocab, tmp_path / out)
    assert result.returncode == 0, result.stderr
    assert (result.stderr.strip() == (
        "export: warning: %s has 1024 tokens but vocab_size is 2048 in %s: 1024 rows past "
        "them, more than padding adds; check that it is the vocab the model was trained with"
        % (vocab, tmp_path / "bert_config.json"))) == warned, result.stderr
    assert warned or "warning" not in result.stderr


def test_a_cased_vocab_exported_lower_casing_is_a_warning(trained_like, tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text(_vocab_text(592).replace("tok9\n", "Tok9\n"))
  result = _run_export(trained_like["prefix"], trained_like["root"] / "bert_config.json",
                       vocab, tmp_path / "out")
  assert result.returncode == 0, result.stderr
  assert ("export: warning: --do_lower_case=true with %s: the vocab is cased: pass "
          "--do_lower_case=false, or --vocab_file=<an uncased vocab.txt>" % vocab
          ) in result.stderr.splitlines()
  # The uncased one the other tests export says nothing.
  vocab.write_text(_vocab_text(592))
  assert "warning" not in _run_export(trained_like["prefix"],
                                      trained_like["root"] / "bert_config.json", vocab,
                                      tmp_path / "uncased").stderr


def test_a_vocab_without_bert_special_tokens_is_a_one_line_error(trained_like, tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("".join("word%d\n" % i for i in range(600)))
  result = _run_export(trained_like["prefix"], trained_like["root"] / "bert_config.json",
                       vocab, tmp_path / "out")
  assert result.returncode == 2
  assert result.stderr.strip() == (
      "export: error: --vocab_file=%s lacks [UNK] [CLS] [SEP] [MASK], which the tokenizer "
      "needs; pass the BERT vocab.txt the model was trained with" % vocab)
  assert not (tmp_path / "out").exists()


def test_a_checkpoint_a_pretraining_run_wrote_is_exported_without_its_run_state(
    pretraining_data, tmp_path):
  run = run_pretraining(*base_flags(pretraining_data, tmp_path / "run", num_train_steps=2,
                                    num_accumulation_steps=2, nodo_eval=None))
  assert run.returncode == 0, run.stderr[-3000:]
  prefix = str(tmp_path / "run" / "model.ckpt-2")
  reader = tf.train.load_checkpoint(prefix)
  assert reader.has_tensor(checkpoints.DATA_POSITION)
  result = _run_export(tmp_path / "run", pretraining_data["config"], pretraining_data["vocab"],
                       tmp_path / "hf")
  assert result.returncode == 0, result.stderr[-3000:]
  tensors = _read_safetensors(str(tmp_path / "hf" / "model.safetensors"))
  layers = TINY_CONFIG["num_hidden_layers"]
  assert len(tensors) == 16 * layers + 5 + 2 + 5 + 2, sorted(tensors)
  np.testing.assert_array_equal(tensors["bert.embeddings.word_embeddings.weight"],
                                reader.get_tensor("bert/embeddings/word_embeddings"))


def test_what_is_no_weight_is_left_out_and_named_and_float16_weights_export_as_float32(
    trained_like, tmp_path):
  """tf.train.AdamOptimizer's slots and powers, a loss scale, a variable of nobody's,
  beside the weights stored in float16 (a converted checkpoint): the slots are counted,
  the rest named, the weights exported as float32 from the checkpoint the line names."""
  extra = {"beta1_power": np.float32(0.9), "current_loss_scale": np.float32(2.0 ** 15),
           "some_recipe/counter": np.ones([3], np.float32)}
  weights = heads.pretraining_variable_shapes(trained_like["config"])
  extra.update({"%s/%s" % (name, slot): np.zeros(shape, np.float32)
                for name, shape in weights.items() for slot in ("Adam", "Adam_1")})
  prefix = rewrite_checkpoint(
      trained_like["prefix"], str(tmp_path / "half" / "model.ckpt-9"),
      lambda name, value: value.astype(np.float16) if value.dtype == np.float32 else value,
      extra)
  result = _run_export(tmp_path / "half", trained_like["root"] / "bert_config.json",
                       trained_like["root"] / "vocab.txt", tmp_path / "hf")
  assert result.returncode == 0, result.stderr[-3000:]
  # trained_like's own Adam slots (adam_m) are counted with tf.train.AdamOptimizer's.
  assert result.stdout.splitlines() == [
      "export: left out %d optimizer slots of its weights and 4 other variables (beta1_power, "
      "current_loss_scale, global_step, some_recipe/counter), no weight of BertForPreTraining"
      % (3 * len(weights)),
      "export: %d tensors from %s -> %s (transformers: BertForPreTraining.from_pretrained(%r))"
      % (len(weights), prefix, tmp_path / "hf", str(tmp_path / "hf"))], result.stdout
  tensors = _read_safetensors(str(tmp_path / "hf" / "model.safetensors"))
  reader = tf.train.load_checkpoint(trained_like["prefix"])
  np.testing.assert_array_equal(
      tensors["bert.pooler.dense.weight"],
      reader.get_tensor("bert/pooler/dense/kernel").astype(np.float16).astype(np.float32).T)


def test_a_weight_of_another_architecture_is_refused_not_left_out(trained_like, tmp_path):
  extra = {"bert/encoder/layer_0/attention/self/relative_positions": np.ones([4], np.float32)}
  prefix = rewrite_checkpoint(trained_like["prefix"], str(tmp_path / "other" / "model.ckpt-7"),
                              extra=extra)
  result = _run_export(prefix, trained_like["root"] / "bert_config.json",
                       trained_like["root"] / "vocab.txt", tmp_path / "hf")
  assert (result.returncode, result.stderr.strip()) == (2, (
      "export: error: variable bert/encoder/layer_0/attention/self/relative_positions of the "
      "checkpoint is no weight of BertForPreTraining (another architecture's?); only BERT "
      "checkpoints with Google's names can be exported"))
  assert not (tmp_path / "hf").exists()


def test_a_weight_of_another_shape_than_the_config_makes_writes_nothing(trained_like,
                                                                        tmp_path):
  stitched = rewrite_checkpoint(
      trained_like["prefix"], str(tmp_path / "stitched" / "model.ckpt-7"),
      lambda name, value: value[:, :16] if name == "bert/pooler/dense/kernel" else value)
  result = _run_export(stitched, trained_like["root"] / "bert_config.json",
                       trained_like["root"] / "vocab.txt", tmp_path / "hf")
  assert result.returncode == 2
  assert result.stderr.strip() == (
      "export: error: --checkpoint=%s holds bert/pooler/dense/kernel of shape [32, 16] but "
      "--bert_config_file=%s makes it [32, 32]; pass the config the checkpoint was trained "
      "with" % (stitched, trained_like["root"] / "bert_config.json"))
  assert not (tmp_path / "hf").exists()


def _contents(folder):
  return {name: (folder / name).read_bytes() for name in sorted(os.listdir(str(folder)))}


def test_a_folder_with_files_or_holding_an_input_is_not_written_over(trained_like, tmp_path):
  root = trained_like["root"]
  held = tmp_path / "held"
  held.mkdir()
  (held / "config.json").write_text(json.dumps(TWO_LAYER_CONFIG))
  (held / "vocab.txt").write_text((root / "vocab.txt").read_text())
  before = _contents(held)
  for config, message in (
      (held / "config.json", "export: error: --bert_config_file=%s is inside --output_dir=%s, "
       "which the export would write over; pass a new --output_dir"
       % (held / "config.json", held)),
      (root / "bert_config.json", "export: error: --output_dir=%s already holds files "
       "(config.json, vocab.txt); the export writes a new folder and overwrites nothing: pass "
       "a new or empty --output_dir" % held)):
    result = _run_export(trained_like["prefix"], config, root / "vocab.txt", held)
    assert result.returncode == 2
    assert result.stderr.strip() == message
    assert _contents(held) == before
  # The checkpoint's own folder is an input too.
  result = _run_export(trained_like["prefix"], root / "bert_config.json", root / "vocab.txt",
                       root)
  assert result.returncode == 2
  assert "export: error: --checkpoint=%s" % root in result.stderr
  assert "is inside --output_dir=%s" % root in result.stderr
  # An empty folder is written, as a new one is.
  empty = tmp_path / "empty"
  empty.mkdir()
  result = _run_export(trained_like["prefix"], root / "bert_config.json", root / "vocab.txt",
                       empty)
  assert result.returncode == 0, result.stderr
  assert sorted(os.listdir(str(empty))) == ["config.json", "model.safetensors",
                                            "special_tokens_map.json", "tokenizer_config.json",
                                            "vocab.txt"]
  assert sorted(os.listdir(str(tmp_path))) == ["empty", "held"]  # No temporary folder left.


def test_an_empty_output_dir_or_a_vocab_folder_is_one_line_naming_what_to_pass(trained_like,
                                                                              tmp_path):
  root = trained_like["root"]
  for vocab, out, message in (
      (root / "vocab.txt", "", "--output_dir is empty; pass --output_dir=<a new folder>, e.g. "
       "hf_bert"),
      (root, tmp_path / "hf", "--vocab_file=%s is a folder; pass the vocab file (the vocab.txt "
       "the model was trained with)" % root)):
    result = _run_export(trained_like["prefix"], root / "bert_config.json", vocab, out)
    assert result.returncode == 2
    assert result.stderr.strip() == "export: error: " + message
  assert os.listdir(str(tmp_path)) == []


@pytest.mark.parametrize("changes,named", [
    (dict(num_hidden_layers=4), "num_hidden_layers=2 but --bert_config_file=%s says "
     "num_hidden_layers=4"),
    (dict(num_hidden_layers=1), "num_hidden_layers=2 but --bert_config_file=%s says "
     "num_hidden_layers=1"),
    (dict(intermediate_size=128, vocab_size=700), "intermediate_size=64, vocab_size=600 but "
     "--bert_config_file=%s says intermediate_size=128, vocab_size=700"),
], ids=["4-layers", "1-layer", "intermediate-and-vocab"])
def test_a_config_that_does_not_describe_the_checkpoint_writes_nothing(trained_like, tmp_path,
                                                                       changes, named):
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(dict(TWO_LAYER_CONFIG, **changes)))
  vocab = tmp_path / "vocab.txt"
  vocab.write_text(_vocab_text(changes.get("vocab_size", 600)))
  result = _run_export(trained_like["prefix"], config, vocab, tmp_path / "out")
  assert result.returncode == 2
  assert result.stderr.strip() == (
      "export: error: --checkpoint=%s holds a model with %s; pass the config the checkpoint "
      "was trained with" % (trained_like["prefix"], named % config))
  assert sorted(os.listdir(str(tmp_path))) == ["bert_config.json", "vocab.txt"]


def test_the_heads_are_checked_against_the_run_marker_beside_the_checkpoint(trained_like,
                                                                            tmp_path):
  # The shapes do not tell the number of heads; this recipe's run marker does.
  run = tmp_path / "run"
  run.mkdir()
  for name in os.listdir(str(trained_like["root"])):
    if name.startswith("model.ckpt-7."):
      shutil.copy(str(trained_like["root"] / name), str(run))
  checkpoints.write_run_marker(str(run), {"bert_config": TWO_LAYER_CONFIG})
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(dict(TWO_LAYER_CONFIG, num_attention_heads=4)))
  result = _run_export(run / "model.ckpt-7", config, trained_like["root"] / "vocab.txt",
                       tmp_path / "out")
  assert result.returncode == 2
  assert ("holds a model with num_attention_heads=2 but --bert_config_file=%s says "
          "num_attention_heads=4" % config) in result.stderr
  assert not (tmp_path / "out").exists()


def test_a_classifier_checkpoint_is_not_exported_with_random_heads(trained_like, tmp_path):
  reader = tf.train.load_checkpoint(trained_like["prefix"])
  with tf.Graph().as_default():
    encoder = [tf.Variable(reader.get_tensor(name), name=name)
               for name in reader.get_variable_to_shape_map() if name.startswith("bert/")]
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      prefix = tf.train.Saver(encoder).save(sess, str(tmp_path / "encoder" / "model.ckpt-3"),
                                            write_meta_graph=False)
  result = _run_export(prefix, trained_like["root"] / "bert_config.json",
                       trained_like["root"] / "vocab.txt", tmp_path / "out")
  assert result.returncode == 2
  assert result.stderr.strip() == (
      "export: error: --checkpoint=%s lacks 7 of the 46 weights transformers' "
      "BertForPreTraining needs (cls.predictions.bias, "
      "cls.predictions.transform.LayerNorm.bias, cls.predictions.transform.LayerNorm.weight, "
      "...), which it would fill at random; export a pretraining checkpoint" % prefix)
  assert not (tmp_path / "out").exists()
