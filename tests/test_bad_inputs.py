"""Every bad input of run_pretraining is one line that names the problem and the fix, with a
non-zero exit before training starts and output_dir left as it was; what is only a warning
trains on."""

import json
import os
import re
import shutil
import struct

import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import create_pretraining_data
from bert_pretrain.model import modeling
from conftest import (SAMPLE_TEXT, TINY_CONFIG, base_flags, pack_fixture_records,
                      run_pretraining)


def _packed_copy(data, tmp_path, summary=True, unpacked_file=False):
  """The fixture's training records packed into a folder: with or without the packer's
  pack_records.json (summary=False: none; "unfinished": one without its summary, as a
  stopped packing leaves), with one unpacked file beside the packs."""
  folder = tmp_path / "packed"
  pack_fixture_records(data["train"], folder)
  if summary == "unfinished":
    settings = json.loads((folder / "pack_records.json").read_text())
    del settings["summary"]
    (folder / "pack_records.json").write_text(json.dumps(settings))
  elif not summary:
    (folder / "pack_records.json").unlink()
  if unpacked_file:
    name = sorted(os.listdir(data["train"]))[0]
    shutil.copy(os.path.join(data["train"], name), str(folder / "zz-unpacked"))
  return str(folder)


def _corrupt_copy(data, tmp_path):
  folder = tmp_path / "corrupt"
  shutil.copytree(data["train"], str(folder))
  name = sorted(os.listdir(str(folder)))[0]
  blob = (folder / name).read_bytes()
  # Cut inside the record that spans the middle of the file: a cut that falls between two
  # records (the data, hence record sizes, vary with the vocab) leaves a valid shorter file.
  offset = 0
  while True:
    (length,) = struct.unpack("<Q", blob[offset:offset + 8])
    if offset + 12 + length + 4 > len(blob) // 2:
      break
    offset += 12 + length + 4
  (folder / name).write_bytes(blob[:offset + 12 + length // 2])
  return str(folder)


def _flipped_copy(data, tmp_path):
  folder = tmp_path / "flipped"
  shutil.copytree(data["train"], str(folder))
  name = sorted(os.listdir(str(folder)))[0]
  blob = bytearray((folder / name).read_bytes())
  blob[40] ^= 0xFF  # inside the first record's data: the CRC check fails
  (folder / name).write_bytes(bytes(blob))
  return str(folder)


def _records_of_length(data, tmp_path, seq, predictions, also_train=False, name="zz-other"):
  """A folder with a file `name` of records of other lengths, beside copies of the
  training files if also_train."""
  folder = tmp_path / "other_lengths"
  folder.mkdir()
  if also_train:
    for train_file in os.listdir(data["train"]):
      shutil.copy(os.path.join(data["train"], train_file), str(folder / train_file))
  create_pretraining_data.create_pretraining_data(
      [SAMPLE_TEXT], [str(folder / name)], data["vocab"], max_seq_length=seq,
      max_predictions_per_seq=predictions, dupe_factor=1, random_seed=3)
  return str(folder)


def _train_copy(data, tmp_path):
  folder = tmp_path / "train_copy"
  shutil.copytree(data["train"], str(folder))
  return str(folder)


def _config_with(tmp_path, **changes):
  path = tmp_path / "changed_config.json"
  path.write_text(json.dumps(dict(TINY_CONFIG, **changes)))
  return str(path)


def _big_vocab(data, tmp_path):
  path = tmp_path / "big_vocab.txt"
  words = open(data["vocab"]).read().split("\n")
  path.write_text("\n".join(words + ["extra%d" % i for i in range(1000)]))
  return str(path)


def _checkpoints_dir(tmp_path):
  from bert_pretrain import demo
  demo.write_fresh_checkpoint(modeling.BertConfig.from_dict(TINY_CONFIG),
                              str(tmp_path / "a_run" / "model.ckpt-0"))
  return str(tmp_path / "a_run")


def _empty_dir(tmp_path):
  (tmp_path / "empty").mkdir()
  return str(tmp_path / "empty")


def _readme_only_dir(tmp_path):
  (tmp_path / "readme_only").mkdir()
  (tmp_path / "readme_only" / "README.txt").write_text("no records here")
  return str(tmp_path / "readme_only")


def _not_records_dir(tmp_path):
  (tmp_path / "not_records").mkdir()
  (tmp_path / "not_records" / "part-0").write_text("just some text, not a TFRecord file\n" * 3)
  return str(tmp_path / "not_records")


def _encoder_checkpoint(tmp_path, **changes):
  """A checkpoint of the tiny BERT's encoder (its config with `changes`) with a classifier
  head, as run_classifier writes: no masked-LM nor next-sentence head."""
  prefix = str(tmp_path / "fine_tuned" / "model.ckpt-9")
  with tf.Graph().as_default():
    modeling.BertModel(modeling.BertConfig.from_dict(dict(TINY_CONFIG, **changes)), False,
                       tf.zeros([1, 8], tf.int32))
    tf.get_variable("output_weights", [2, TINY_CONFIG["hidden_size"]])
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      tf.train.Saver().save(sess, prefix, write_meta_graph=False)
  return prefix


def _unwritable_output(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  return str(blocker / "out")


BAD_INPUTS = [
    ("missing data folder", lambda d, t: dict(input_files_dir=str(t / "nope")),
     r"--input_files_dir=\S+ does not exist"),
    ("empty data folder", lambda d, t: dict(input_files_dir=_empty_dir(t)),
     r"holds no TFRecord files"),
    ("no files matching", lambda d, t: dict(input_files_dir=_readme_only_dir(t)),
     r"holds no TFRecord files"),
    ("the evaluation records among the training ones", lambda d, t: dict(
        input_files_dir=d["eval"]),
     r"\S+/eval/part-0 is both a training and an evaluation file: the accuracy would be "
     r"measured on trained records; pass held-out records as --eval_files_dir"),
    ("a run's folder as the training records", lambda d, t: dict(
        input_files_dir=_checkpoints_dir(t)),
     r"--input_files_dir=\S+/a_run holds a run's checkpoints or logs "
     r"\(model.ckpt-0.data-00000-of-00001\), not TFRecords; pass the folder of the records$"),
    ("not TFRecords", lambda d, t: dict(input_files_dir=_not_records_dir(t)),
     r"corrupt TFRecord file"),
    ("truncated TFRecord", lambda d, t: dict(input_files_dir=_corrupt_copy(d, t)),
     r"corrupt TFRecord file .*part-0"),
    ("flipped byte in a TFRecord", lambda d, t: dict(input_files_dir=_flipped_copy(d, t)),
     r"corrupt TFRecord file .*part-0"),
    ("records of another sequence length", lambda d, t: dict(max_seq_length=128),
     r"records of max_seq_length 64 .* pass --max_seq_length=64"),
    ("training files of two lengths", lambda d, t: dict(
        input_files_dir=_records_of_length(d, t, 32, 5, also_train=True)),
     r"zz-other holds records of max_seq_length 32 and max_predictions_per_seq 5, but the "
     r"run's are 64 and 10, as in \S+/part-0; make it again with those \(or move it out\)$"),
    ("training files of two lengths, the odd one first", lambda d, t: dict(
        input_files_dir=_records_of_length(d, t, 32, 5, also_train=True, name="aa-other")),
     r"aa-other holds records of max_seq_length 32 and max_predictions_per_seq 5, but the "
     r"run's are 64 and 10, as in \S+/part-0; make it again with those \(or move it out\)$"),
    ("evaluation records of another length", lambda d, t: dict(
        eval_files_dir=_records_of_length(d, t, 32, 5)),
     r"zz-other holds records of max_seq_length 32 and max_predictions_per_seq 5, but the "
     r"run's are 64 and 10, as in the training records; make it again with those"),
    ("a corrupt evaluation file", lambda d, t: dict(eval_files_dir=_corrupt_copy(d, t)),
     r"corrupt TFRecord file \S+part-0.*; re-create or remove the file$"),
    ("output_dir that is the data folder", lambda d, t: dict(
        input_files_dir=_train_copy(d, t), output_dir=str(t / "train_copy")),
     r"--output_dir=\S+train_copy holds the run's records, and its checkpoints would be read "
     r"as records; pass another --output_dir$"),
    ("missing eval folder", lambda d, t: dict(eval_files_dir=str(t / "nope")),
     r"--eval_files_dir=\S+ does not exist"),
    ("missing bert_config.json", lambda d, t: dict(bert_config_file=str(t / "nope.json")),
     r"bert config \S+ does not exist"),
    ("invalid bert_config.json", lambda d, t: dict(bert_config_file=_config_with(
        t, hidden_size="big")), r"hidden_size must be a positive integer"),
    ("dropout probability above 1", lambda d, t: dict(bert_config_file=_config_with(
        t, hidden_dropout_prob=1.5)), r"hidden_dropout_prob must be a probability from 0 to "
     r"below 1, got 1.5; fix bert_config.json$"),
    ("one token type for two segments", lambda d, t: dict(bert_config_file=_config_with(
        t, type_vocab_size=1)), r"type_vocab_size=1 in \S+, but pretraining records hold two "
     r"segments; set type_vocab_size to 2$"),
    ("negative threads", lambda d, t: dict(intra_op_threads=-1),
     r"--intra_op_threads=-1 must not be negative \(0: chosen for this host\)$"),
    ("negative seed", lambda d, t: dict(seed=-1),
     r"--seed=-1 must be from 0 to 2147483647 \(or leave it out: the run draws one\)$"),
    ("seed too large", lambda d, t: dict(seed=2 ** 31), r"--seed=2147483648 must be from 0"),
    ("vocab larger than vocab_size", lambda d, t: dict(vocab_file=_big_vocab(d, t)),
     r"has \d+ tokens but vocab_size in \S+ is 600"),
    ("data ids beyond vocab_size", lambda d, t: dict(bert_config_file=_config_with(
        t, vocab_size=100)), r"holds token id \d+ but vocab_size is 100"),
    ("checkpoint path that does not exist", lambda d, t: dict(
        init_checkpoint=str(t / "model.ckpt-5")), r"no checkpoint there"),
    ("max_seq_length above max_position_embeddings", lambda d, t: dict(
        bert_config_file=_config_with(t, max_position_embeddings=32)),
     r"--max_seq_length=64 is above max_position_embeddings=32"),
    ("batch size 0", lambda d, t: dict(train_batch_size=0),
     r"--train_batch_size=0 must be at least 1"),
    ("bert_config.json is a folder", lambda d, t: dict(bert_config_file=_empty_dir(t)),
     r"bert config \S+ is a folder; pass --bert_config_file=PATH/bert_config.json$"),
    ("negative keep_checkpoint_max", lambda d, t: dict(keep_checkpoint_max=-1),
     r"--keep_checkpoint_max=-1 must not be negative"),
    ("output_dir that cannot be written", lambda d, t: dict(output_dir=_unwritable_output(t)),
     r"--output_dir=\S+ cannot be written"),
    ("output_dir with glob characters", lambda d, t: dict(output_dir=str(t / "run[1]")),
     r"--output_dir=\S+run\[1\]: TensorFlow reads checkpoints by pattern, and the \[1\] in "
     r"this path would not match their files; pass a path without brackets$"),
    ("negative learning rate", lambda d, t: dict(learning_rate=-1),
     r"--learning_rate=-1 must be positive \(the peak of the schedule\) and finite; pass "
     r"e.g. --learning_rate=5e-05$"),
    ("learning rate 0", lambda d, t: dict(learning_rate=0), r"--learning_rate=0 must be positive"),
    ("infinite learning rate", lambda d, t: dict(learning_rate="inf"),
     r"--learning_rate=inf must be positive \(the peak of the schedule\) and finite"),
    ("a moment's decay of 1 or more", lambda d, t: dict(beta_1=1.5),
     r"--beta_1=1.5 must be from 0 to below 1 \(the first moment's decay\) and finite; pass "
     r"e.g. --beta_1=0.9$"),
    ("negative epsilon", lambda d, t: dict(epsilon=-1),
     r"--epsilon=-1 must be positive and finite; pass e.g. --epsilon=1e-06$"),
    ("negative decay power", lambda d, t: dict(poly_power=-1),
     r"--poly_power=-1 must be 0 or more \(the schedule's decay: 1 linear, 0 none\) and "
     r"finite"),
    ("loss scale beyond float32", lambda d, t: dict(amp_dtype="float16", init_loss_scale=1e39),
     r"--init_loss_scale=1e\+39 must be at least 1 and finite"),
    ("infinite loss scale", lambda d, t: dict(amp_dtype="float16", init_loss_scale="inf"),
     r"--init_loss_scale=inf must be at least 1 and finite; pass e.g. "
     r"--init_loss_scale=32768$"),
    ("loss scale NaN", lambda d, t: dict(amp_dtype="float16", init_loss_scale="nan"),
     r"--init_loss_scale=nan must be at least 1 and finite"),
    ("accuracy target above 1", lambda d, t: dict(stop_threshold=2),
     r"--stop_threshold=2 must be a masked-LM accuracy from 0 to 1 \(0: never stop\)$"),
    ("packed mode on unpacked records", lambda d, t: dict(enable_packed_data_mode="true"),
     r"--enable_packed_data_mode expects packed records, but \S+ holds unpacked ones; pack "
     r"them .* or drop the flag$"),
    ("sequences a pack for unpacked records", lambda d, t: dict(avg_seq_per_pack=2),
     r"--avg_seq_per_pack=2 is for packed records, but \S+ holds unpacked ones"),
    ("packed records of other masked positions", lambda d, t: dict(
        input_files_dir=_packed_copy(d, t), max_predictions_per_seq=20),
     r"holds packed records of max_seq_length 64 and 13 masked positions for 3 sequences, "
     r"but .* pass --max_seq_length=64 --max_predictions_per_seq=10$"),
    ("packed records without the packer's figure", lambda d, t: dict(
        input_files_dir=_packed_copy(d, t, summary=False)),
     r"holds packed records, but no finished pack_records.json beside them says how many "
     r"sequences a pack holds; pass --avg_seq_per_pack=N"),
    ("packed records of a packing that did not finish", lambda d, t: dict(
        input_files_dir=_packed_copy(d, t, summary="unfinished"), avg_seq_per_pack=1.5),
     r"packed holds the packs of a pack_records run that did not finish \(\S+ has no "
     r"summary\): some files are missing; run the same pack_records command again to "
     r"finish it$"),
    ("sequences a pack that disagree with the packer's", lambda d, t: dict(
        input_files_dir=_packed_copy(d, t), avg_seq_per_pack=2.5),
     r"--avg_seq_per_pack=2.5 disagrees with the [\d.]+ sequences a pack of the records"),
    ("negative sequences a pack", lambda d, t: dict(avg_seq_per_pack=-1),
     r"--avg_seq_per_pack=-1 must not be negative \(0: the packer's figure\)$"),
    ("more sequences a pack than a pack holds", lambda d, t: dict(
        input_files_dir=_packed_copy(d, t, summary=False), avg_seq_per_pack=4),
     r"--avg_seq_per_pack=4 is outside 1..3, the sequences a pack of \S+ holds"),
    ("packed training and an evaluation set of another length", lambda d, t: dict(
        input_files_dir=_packed_copy(d, t), eval_files_dir=_records_of_length(d, t, 32, 5)),
     r"zz-other holds records of max_seq_length 32 and max_predictions_per_seq 5, but the "
     r"run's are 64 and 10, as in the packed training records' sequences; make it again "
     r"with those"),
    ("a packed evaluation set", lambda d, t: dict(eval_files_dir=_packed_copy(d, t)),
     r"holds packed records where unpacked ones are expected: .* the evaluation set "
     r"unpacked, as MLPerf's eval_10k"),
    ("packed and unpacked records in one folder", lambda d, t: dict(
        input_files_dir=_packed_copy(d, t, unpacked_file=True)),
     r"zz-unpacked holds unpacked records where packed ones are expected"),
    ("negative matmul peak", lambda d, t: dict(peak_tflops=-5),
     r"--peak_tflops=-5 must be 0 or more and finite \(a card's matmul peak in TFLOPS; 0: "
     r"none\)$"),
    ("float16 and --noamp", lambda d, t: dict(amp_dtype="float16", amp="false"),
     r"--amp_dtype=float16 asks for float16 compute and --noamp for float32; pass one$"),
    ("--use_fp16 and --noamp", lambda d, t: dict(use_fp16="true", amp="false"),
     r"--use_fp16 asks for mixed precision and --noamp for float32; pass one$"),
    ("no logical CPU devices", lambda d, t: dict(distribution="mirrored", cpu_devices=0),
     r"--cpu_devices=0 must be at least 1 \(the logical CPU devices of "
     r"--distribution=mirrored, one replica each\); pass --cpu_devices=2 or more"),
    ("more than 4 logical CPU devices a core", lambda d, t: dict(
        distribution="mirrored", cpu_devices=4 * os.cpu_count() + 1),
     r"--cpu_devices=%d is more than 4 a core of this host's %d cores; pass at most "
     r"--cpu_devices=%d$" % (4 * os.cpu_count() + 1, os.cpu_count(), 4 * os.cpu_count())),
    ("a stall timeout shorter than a rank's start", lambda d, t: dict(stall_timeout_s=3),
     r"--stall_timeout_s=3 is shorter than a rank's start-up; pass 10 or more \(0 turns the "
     r"check off\)$"),
    ("a negative size of the record sets read whole", lambda d, t: dict(
        full_record_check_mb=-1), r"--full_record_check_mb=-1 must not be negative$"),
    ("a micro-batch whose attention TensorFlow cannot index", lambda d, t: dict(
        train_batch_size=10 ** 6),
     r"--train_batch_size=1000000 at --max_seq_length=64: the attention of a micro-batch "
     r"would hold 1000000 x 64 x 64 elements, more than TensorFlow indexes; lower "
     r"--train_batch_size and raise --num_accumulation_steps$"),
    ("one file for both logs", lambda d, t: dict(dllog_path=str(t / "run.log"),
                                                  mllog_path=str(t / "run.log")),
     r"the JSON-lines log and the MLPerf log would both go to \S+run.log \(--dllog_path, "
     r"--mllog_path, or their defaults in --output_dir\); pass another path for one of them$"),
    ("the JSON-lines log where the MLPerf log goes", lambda d, t: dict(
        dllog_path=str(t / "out" / "mlperf.log")),
     r"the JSON-lines log and the MLPerf log would both go to \S+out/mlperf.log"),
    ("a negative initializer range", lambda d, t: dict(
        bert_config_file=_config_with(t, initializer_range=-1)),
     r"initializer_range must be a positive number \(the weights' initial standard "
     r"deviation, 0.02 in BERT\), got -1; fix bert_config.json$"),
    ("a mistyped number of layers", lambda d, t: dict(
        bert_config_file=_config_with(t, num_hidden_layers=10 ** 12)),
     r"changed_config.json describes a model of 8.54e\+15 weights, whose training state "
     r"alone takes \d+ GiB, more than this host's \d+ GiB of memory"),
    ("a model larger than the host's memory", lambda d, t: dict(
        bert_config_file=_config_with(t, max_position_embeddings=10 ** 10)),
     r"changed_config.json describes a model of 3.2e\+11 weights, whose training state "
     r"alone takes \d+ GiB, more than this host's \d+ GiB of memory; check its sizes"),
    ("evaluation without a checkpoint", lambda d, t: dict(do_train="false"),
     r"--nodo_train evaluates a checkpoint but none is given, so every weight would be "
     r"random; pass --init_checkpoint \(or --eval_checkpoint_path\), or --allow_random_heads"),
    ("evaluation of a checkpoint without the heads", lambda d, t: dict(
        do_train="false", eval_checkpoint_path=_encoder_checkpoint(t)),
     r"--nodo_train evaluates \S+/fine_tuned/model.ckpt-9, which has no masked-LM head "
     r"\(cls/predictions/\) and no next-sentence head \(cls/seq_relationship/\): those "
     r"weights would be random, and so would the accuracy .* or --allow_random_heads to "
     r"evaluate it anyway$"),
    ("training from a checkpoint of more layers", lambda d, t: dict(
        init_checkpoint=_encoder_checkpoint(t, num_hidden_layers=2)),
     r"--init_checkpoint=\S+ holds a model with num_hidden_layers=2 but "
     r"--bert_config_file=\S+ says num_hidden_layers=1; pass the config the checkpoint was "
     r"trained with$"),
    ("evaluation with a config of more layers", lambda d, t: dict(
        do_train="false", init_checkpoint=_encoder_checkpoint(t),
        bert_config_file=_config_with(t, num_hidden_layers=3)),
     r"--init_checkpoint=\S+ holds a model with num_hidden_layers=1 but "
     r"--bert_config_file=\S+ says num_hidden_layers=3"),
]


def test_a_negative_start_of_the_warm_up_as_mlperfs_reference_points_set_is_accepted():
  from absl import flags  # pylint: disable=g-import-not-at-top
  from bert_pretrain import config  # pylint: disable=g-import-not-at-top
  from bert_pretrain.training import inputs  # pylint: disable=g-import-not-at-top

  def settings(*argv):
    values = flags.FlagValues()
    config.define_pretraining_flags(values)
    values(["run_pretraining"] + list(argv))
    return config.settings_from_flags(values)

  inputs.check_settings(settings("--start_warmup_step=-700"))
  with pytest.raises(ValueError, match="--num_warmup_steps=-700 must not be negative"):
    inputs.check_settings(settings("--num_warmup_steps=-700"))

# The bad inputs found only by reading a record set whole, which the run does once MLPerf's
# clock has started (the rules start it before the data is read): the run's logs are written.
READ_ON_THE_CLOCK = {"truncated TFRecord", "a corrupt evaluation file"}


def test_a_training_set_missing_a_shard_its_names_count_is_a_warning(pretraining_data,
                                                                      tmp_path):
  """part-00001-of-00003 not copied: trained on the others (a subset may be meant)."""
  shards = tmp_path / "shards"
  shards.mkdir()
  for index, name in ((0, "part-0"), (2, "part-1")):
    shutil.copy(os.path.join(pretraining_data["train"], name),
                str(shards / ("part-%05d-of-00003" % index)))
  result = run_pretraining(*base_flags(pretraining_data, tmp_path / "out", num_train_steps=1,
                                       input_files_dir=str(shards)))
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("warning: the training files are 2 of the 3 their names count: %s is not there; "
          "training on those found" % (shards / "part-00001-of-00003")) in result.stdout


@pytest.mark.parametrize("case,overrides,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_a_one_line_error(pretraining_data, tmp_path, case, overrides, message):
  out = tmp_path / "out"
  out.mkdir()
  (out / "model.ckpt-keep.txt").write_text("an earlier result")
  flags = base_flags(pretraining_data, out)
  for name, value in overrides(pretraining_data, tmp_path).items():
    flags = [f for f in flags if not f.startswith("--%s=" % name)] + ["--%s=%s" % (name, value)]
  result = run_pretraining(*flags)
  assert result.returncode != 0, case
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1, result.stderr
  assert re.search(message, errors[0]), errors[0]
  assert "Traceback" not in result.stderr
  assert "Step " not in result.stdout
  assert (out / "model.ckpt-keep.txt").read_text() == "an earlier result"
  written = set(os.listdir(str(out))) - {"model.ckpt-keep.txt"}
  if case in READ_ON_THE_CLOCK:
    # Found reading a small set whole once MLPerf's clock runs, before the first update:
    # the MLPerf log ends as a failed run's does.
    keys = [json.loads(l.split(":::MLLOG ", 1)[1]) for l in
            (out / "mlperf.log").read_text().splitlines()]
    assert [k["key"] for k in keys][-2:] == ["run_start", "run_stop"], keys[-2:]
    assert keys[-1]["metadata"]["status"] == "aborted"
    assert not [name for name in written if name.startswith("model.ckpt")], written
  else:
    assert not written


def test_random_heads_are_evaluated_when_the_flag_says_so(pretraining_data, tmp_path):
  result = run_pretraining(*base_flags(pretraining_data, tmp_path / "out", do_train="false",
                                       eval_checkpoint_path=_encoder_checkpoint(tmp_path),
                                       allow_random_heads=None, max_eval_steps=1))
  assert result.returncode == 0, result.stderr
  assert re.search(r"^warning: Model variables not in the checkpoint \(initialized fresh\): "
                   r"cls/", result.stdout, re.M), result.stdout[-3000:]
  assert "***** Eval results *****" in result.stdout
  # The log says where the weights came from, and counts the fresh heads a warning.
  records = [json.loads(line) for line in open(str(tmp_path / "out" / "dllog.json"))]
  (weights,) = [r for r in records if r["type"] == "weights"]
  assert (weights["from"], weights["checkpoint"]) == (
      "init_checkpoint", str(tmp_path / "fine_tuned" / "model.ckpt-9"))
  assert weights["fresh"] and all(name.startswith("cls/") for name in weights["fresh"])
  assert weights["loaded"] == 16 * TINY_CONFIG["num_hidden_layers"] + 5 + 2
  # One batch of the eval set is not MLPerf's eval_10k: its accuracy is said not comparable.
  evaluated = int(re.search(r"^  eval_samples = (\d+)$", result.stdout, re.M).group(1))
  assert [r["message"] for r in records if r["type"] == "warning"] == [
      "Model variables not in the checkpoint (initialized fresh): " +
      ", ".join(weights["fresh"]),
      "the evaluation read %d sequences, not the 10000 of MLPerf's eval_10k: its masked-LM "
      "accuracy is not comparable with MLPerf's target (--stop_threshold=0.72); "
      "--max_eval_steps=0 evaluates the whole set" % evaluated]


def test_half_written_and_foreign_files_are_not_training_data(pretraining_data, tmp_path):
  from bert_pretrain.data import input_pipeline
  folder = tmp_path / "records"
  shutil.copytree(pretraining_data["train"], str(folder))
  for name in ("part-9.tmp-1234", "README.md", "manifest.json", ".hidden", "part-8.tmp"):
    (folder / name).write_text("not records")
  (folder / "empty-part").write_bytes(b"")
  files = input_pipeline.list_record_files(str(folder))
  assert [os.path.basename(f) for f in files] == sorted(os.listdir(pretraining_data["train"]))
