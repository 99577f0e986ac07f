r"""Fine-tuning BERT for sentence and sentence-pair classification (GLUE tasks or a TSV).

Starts from any BERT checkpoint this recipe or Google writes (the model's weights by
name; the classifier head, output_weights and output_bias as in Google's
run_classifier.py, starts fresh unless the checkpoint has it), then

  train (--do_train) -> save model.ckpt-N -> evaluate on dev (--do_eval) -> predict test
  (--do_predict: test_results.tsv, one line of class probabilities per example)

on one card, or on several with --horovod (launched like run_pretraining: one process per
card; gradients all-reduced, the global batch is --train_batch_size x ranks; rank 0
evaluates and predicts on the whole sets, so the numbers are a single card's).

--output_dir is locked and checked as run_pretraining's (checkpoints.py): a fine-tune
there is taken up only by the same command, which finds it trained and evaluates it;
anything else there is refused, nothing is written over.

This file holds the flags, their checks and the loop; the graph and the metrics are in
classifier.py, the data in classifier_data.py.

python3 -m bert_pretrain.run_classifier --task_name=mrpc --data_dir=glue/MRPC \
    --bert_config_file=bert_config.json --vocab_file=vocab.txt \
    --init_checkpoint=model.ckpt-28252 --output_dir=./mrpc
"""

import os
import sys
import time

from absl import flags
import numpy as np
import tensorflow.compat.v1 as tf

from bert_pretrain import config
from bert_pretrain.training import checkpoints
from bert_pretrain.training import inputs as inputs_lib
from bert_pretrain.training import logs
from bert_pretrain.finetune import classifier
from bert_pretrain.finetune import classifier_data
from bert_pretrain.distributed import device as device_lib
from bert_pretrain import errors
from bert_pretrain.training import meters
from bert_pretrain.model import modeling
from bert_pretrain.training import optimization
from bert_pretrain.training import pretraining
from bert_pretrain.distributed import ranks as ranks_lib
from bert_pretrain.data import tokenization
from bert_pretrain.wiki.workdir import file_digest

flags.DEFINE_enum("task_name", None, sorted(classifier_data.TASKS),
                  "GLUE task (its files as downloaded) or tsv: "
                  "text_a[<TAB>text_b]<TAB>label lines.")
flags.DEFINE_string("data_dir", None, "Folder of the task's train/dev/test files.")
flags.DEFINE_string("bert_config_file", None, "bert_config.json of the model.")
flags.DEFINE_string("vocab_file", None, "vocab.txt of the model.")
flags.DEFINE_bool("do_lower_case", True, "Lower-case the text (uncased models).")
flags.DEFINE_string("init_checkpoint", None, "Checkpoint to start from: a prefix, one of "
                    "its files, or a folder (its latest). None: random weights.")
flags.DEFINE_string("output_dir", None, "Fine-tuned checkpoint, eval_results.txt, "
                    "test_results.tsv.")
flags.DEFINE_bool("do_train", True, "Fine-tune on the train split.")
flags.DEFINE_bool("do_eval", True, "Evaluate on the dev split.")
flags.DEFINE_bool("do_predict", False, "Write class probabilities of the test split.")
flags.DEFINE_integer("max_seq_length", 128, "Tokens per example; longer ones are cut.")
flags.DEFINE_integer("train_batch_size", 32, "Examples per update on each card.")
flags.DEFINE_integer("eval_batch_size", 32, "Examples per evaluation or prediction batch.")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate.")
flags.DEFINE_float("num_train_epochs", 3.0, "Passes over the train split.")
flags.DEFINE_float("warmup_proportion", 0.1, "Share of the updates of linear warm-up.")
flags.DEFINE_enum("optimizer", "adam", ["adam", "lamb"], "Adam with weight decay (Google's "
                  "fine-tuning) or LAMB.")
flags.DEFINE_integer("display_loss_steps", 50, "Log the loss every this many updates.")
flags.DEFINE_integer("seed", None, "Random seed (head initialization, dropout, shuffling).")
# Device, precision, engine and threads: the same flags as run_pretraining's.
config.define_flags([config.Runtime])
FLAGS = flags.FLAGS


LABELS_FILE = "labels.txt"  # Written beside a fine-tuned checkpoint: its labels in id order.


def fine_tune_labels_file(init_checkpoint):
  """The labels.txt of the fine-tuned checkpoint evaluated without training, or None."""
  if FLAGS.do_train or not init_checkpoint:
    return None
  path = os.path.join(os.path.dirname(init_checkpoint), LABELS_FILE)
  return path if os.path.isfile(path) else None


def task_labels(init_checkpoint):
  """The labels in id order: those a fine-tuned checkpoint was trained with (its
  labels.txt) when it is evaluated without training, else the task's."""
  path = fine_tune_labels_file(init_checkpoint)
  if path:
    with open(path, encoding="utf-8") as f:
      return [line.rstrip("\n") for line in f if line.strip()]
  # The labels come from train.tsv: one that is not labels (a header line, swapped
  # columns) is refused here, before a head of its size is checked or trained.
  return classifier_data.task_labels(
      FLAGS.task_name, FLAGS.data_dir,
      warn=lambda line: print("run_classifier: warning: " + line, file=sys.stderr))


def read_task(tokenizer, splits, labels, labels_from):
  """Per split asked for, (examples, features): every file is read and checked first,
  then tokenized (labels_from: where the labels came from, for an error)."""
  examples = {}
  for split in splits:
    examples[split] = classifier_data.read_examples(FLAGS.task_name, FLAGS.data_dir, split,
                                                    labels, labels_from)
    if not examples[split]:
      raise ValueError("%s has no examples; pass a --data_dir whose %s split has some"
                       % (classifier_data.task_file(FLAGS.task_name, FLAGS.data_dir, split),
                          split))
  data = {split: (examples[split], classifier_data.convert_examples(
      examples[split], labels, tokenizer, FLAGS.max_seq_length)) for split in splits}
  # A vocab that does not fit the text trains on [UNK]s, as create_pretraining_data warns.
  unknown = tokens = 0
  for _, features in data.values():
    ids = features["input_ids"][features["input_mask"] > 0]
    unknown += int(np.sum(ids == tokenizer.vocab["[UNK]"]))
    tokens += int(np.sum(~np.isin(ids, tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"]))))
  warning = tokenization.unknown_tokens_warning(
      unknown, tokens,
      tokenization.casing_fix(FLAGS.vocab_file, FLAGS.do_lower_case, "--vocab_file"))
  if warning:
    print("run_classifier: warning: " + warning, file=sys.stderr)
  return data


def check_head(init_checkpoint, num_labels, hidden_size):
  """A checkpoint's classifier head must fit the task; without training it must exist."""
  shapes = dict(tf.train.list_variables(init_checkpoint))
  want = [num_labels, hidden_size]
  if "output_weights" not in shapes:
    if not FLAGS.do_train:
      raise ValueError("--nodo_train but %s has no classifier head (output_weights); pass "
                       "the checkpoint run_classifier wrote, or train" % init_checkpoint)
  elif list(shapes["output_weights"]) != want:
    raise ValueError("%s has a classifier head of %d labels, the task has %d; start from the "
                     "pretraining checkpoint instead" % (init_checkpoint,
                                                         shapes["output_weights"][0],
                                                         num_labels))


def check_flags():
  """Checks the flags and reads the data, before any graph; returns (bert_config,
  init_checkpoint prefix or None, labels, data). Raises ValueError (one line)."""
  examples = {"task_name": "one of %s" % ", ".join(sorted(classifier_data.TASKS)),
              "data_dir": "the task's folder of .tsv files",
              "bert_config_file": "the model's bert_config.json",
              "vocab_file": "the model's vocab.txt",
              "output_dir": "a folder for the fine-tune and its results"}
  for name, example in examples.items():
    if not getattr(FLAGS, name):
      raise ValueError("--%s is required; pass %s" % (name, example))
  if not os.path.isdir(FLAGS.data_dir):
    raise ValueError("--data_dir=%s %s; pass %s" % (
        FLAGS.data_dir, "is a file" if os.path.exists(FLAGS.data_dir) else "does not exist",
        examples["data_dir"]))
  if not (FLAGS.do_train or FLAGS.do_eval or FLAGS.do_predict):
    raise ValueError("--nodo_train, --nodo_eval and no --do_predict: nothing to do; pass "
                     "one of them")
  if not FLAGS.do_train and not FLAGS.init_checkpoint:
    raise ValueError("--nodo_train needs --init_checkpoint, the fine-tuned checkpoint to "
                     "evaluate")
  for name in ("train_batch_size", "eval_batch_size", "display_loss_steps"):
    if getattr(FLAGS, name) < 1:
      raise ValueError("--%s=%d must be positive" % (name, getattr(FLAGS, name)))
  if FLAGS.max_seq_length < 3:
    raise ValueError("--max_seq_length=%d leaves no room for text beside [CLS] and [SEP]; "
                     "pass 3 or more (128 is usual)" % FLAGS.max_seq_length)
  # Written as not (in range): NaN fails every comparison, so it is refused too.
  if FLAGS.do_train and not 0 < FLAGS.num_train_epochs <= config.FLOAT32_MAX:
    raise ValueError("--num_train_epochs=%g must be positive and finite (the passes over the "
                     "train split); pass e.g. --num_train_epochs=%g, or --nodo_train"
                     % (FLAGS.num_train_epochs, FLAGS["num_train_epochs"].default))
  if FLAGS.do_train and not 0 < FLAGS.learning_rate <= config.FLOAT32_MAX:
    raise ValueError("--learning_rate=%g must be positive and finite (the peak of the "
                     "schedule); pass e.g. --learning_rate=%g"
                     % (FLAGS.learning_rate, FLAGS["learning_rate"].default))
  if not 0 <= FLAGS.warmup_proportion <= 1:
    raise ValueError("--warmup_proportion=%g must be in [0, 1] (the share of the updates "
                     "that warm up); pass e.g. --warmup_proportion=%g"
                     % (FLAGS.warmup_proportion, FLAGS["warmup_proportion"].default))
  if FLAGS.seed is not None and not 0 <= FLAGS.seed < config.SEED_LIMIT:
    raise ValueError("--seed=%d must be from 0 to %d (or leave it out)"
                     % (FLAGS.seed, config.SEED_LIMIT - 1))
  for name in ("bert_config_file", "vocab_file"):
    if not os.path.isfile(getattr(FLAGS, name)):
      raise ValueError("--%s=%s does not exist; pass the model's file"
                       % (name, getattr(FLAGS, name)))
  bert_config = modeling.BertConfig.from_json_file(FLAGS.bert_config_file)
  if FLAGS.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError("--max_seq_length=%d exceeds the model's max_position_embeddings=%d; "
                     "lower --max_seq_length" % (FLAGS.max_seq_length,
                                                 bert_config.max_position_embeddings))
  tokenizer = tokenization.FullTokenizer(FLAGS.vocab_file, do_lower_case=FLAGS.do_lower_case)
  if len(tokenizer.vocab) > bert_config.vocab_size:
    raise ValueError("--vocab_file has %d tokens but the model's vocab_size is %d; pass the "
                     "vocab.txt of --bert_config_file's model"
                     % (len(tokenizer.vocab), bert_config.vocab_size))
  init_checkpoint = None
  if FLAGS.init_checkpoint:
    init_checkpoint = checkpoints.resolve_checkpoint(FLAGS.init_checkpoint)
  labels = task_labels(init_checkpoint)
  if init_checkpoint:
    checkpoints.check_config(init_checkpoint, bert_config,
                             "--bert_config_file=%s" % FLAGS.bert_config_file)
    check_head(init_checkpoint, len(labels), bert_config.hidden_size)
    check_fine_tune_vocab(init_checkpoint)
  splits = [s for s, wanted in (("train", FLAGS.do_train), ("dev", FLAGS.do_eval),
                                ("test", FLAGS.do_predict)) if wanted]
  data = read_task(tokenizer, splits, labels,
                   fine_tune_labels_file(init_checkpoint) or "train.tsv")
  if FLAGS.do_train:
    present = sorted(set(example.label for example in data["train"][0]))
    if len(present) < 2:
      raise ValueError("%s has only the label %r (%d examples): a classifier learns nothing "
                       "from one label; pass a --data_dir whose training split holds examples "
                       "of at least two labels"
                       % (classifier_data.task_file(FLAGS.task_name, FLAGS.data_dir, "train"),
                          present[0], len(data["train"][0])))
  return bert_config, init_checkpoint, labels, data


def check_fine_tune_vocab(init_checkpoint):
  """Refuses a vocab or casing other than those a fine-tuned --init_checkpoint was
  trained with (its run marker records them): its ids would name other tokens."""
  try:
    earlier = checkpoints.read_run_marker(os.path.dirname(init_checkpoint)) or {}
  except ValueError:
    # The marker serves the run that wrote it; fine-tuning from its checkpoint needs none.
    print("run_classifier: warning: %s is damaged: --vocab_file and --do_lower_case are "
          "not checked against the ones --init_checkpoint=%s was trained with"
          % (os.path.join(os.path.dirname(init_checkpoint), checkpoints.RUN_MARKER),
             init_checkpoint), file=sys.stderr)
    return
  if earlier.get("tool") != "run_classifier":
    return
  if earlier.get("vocab_sha256") not in (None, file_digest(FLAGS.vocab_file)["sha256"]):
    raise ValueError("--vocab_file=%s is not the vocab the fine-tune --init_checkpoint=%s "
                     "was trained with (another sha256): its ids would name other tokens; "
                     "pass that vocab.txt" % (FLAGS.vocab_file, init_checkpoint))
  if earlier.get("do_lower_case") not in (None, FLAGS.do_lower_case):
    raise ValueError("--init_checkpoint=%s was fine-tuned with --%sdo_lower_case; pass the "
                     "same" % (init_checkpoint, "" if earlier["do_lower_case"] else "no"))


def train_steps(num_examples, replicas):
  """The updates of --num_train_epochs over num_examples at the global batch (at least 1)."""
  return max(1, int(num_examples * FLAGS.num_train_epochs /
                    (FLAGS.train_batch_size * replicas)))


def resume_settings(bert_config, labels, init_checkpoint, num_train_steps, replicas):
  """What a run must share with the fine-tune in its --output_dir to take it as its own
  (the run marker records them): the model and task, and with --do_train everything
  that makes the fine-tune (a fine-tune is saved once, at its end: resumed, it is done).
  """
  settings = {"tool": "run_classifier", "task_name": FLAGS.task_name, "labels": labels,
              "bert_config": bert_config.to_dict(), "max_seq_length": FLAGS.max_seq_length,
              "do_lower_case": FLAGS.do_lower_case,
              "vocab_sha256": file_digest(FLAGS.vocab_file)["sha256"]}
  if FLAGS.do_train:
    settings.update(
        data_dir=os.path.abspath(FLAGS.data_dir), num_train_epochs=FLAGS.num_train_epochs,
        num_train_steps=num_train_steps,
        train_sha256=file_digest(classifier_data.task_file(FLAGS.task_name, FLAGS.data_dir,
                                                           "train"))["sha256"],
        init_checkpoint=os.path.abspath(init_checkpoint) if init_checkpoint else None,
        global_batch=FLAGS.train_batch_size * replicas, learning_rate=FLAGS.learning_rate,
        warmup_proportion=FLAGS.warmup_proportion, optimizer=FLAGS.optimizer,
        seed=FLAGS.seed)
  return settings


def check_inputs_unchanged(settings):
  """Refuses a fine-tune in --output_dir made from other bytes of train.tsv or the vocab
  than this run's, though at the same paths (the run marker records their digests; an
  older marker without them is taken as before)."""
  if not checkpoints.index_files(FLAGS.output_dir):
    return  # No fine-tune there: nothing to take up (as find_resume_checkpoint).
  earlier = checkpoints.read_run_marker(FLAGS.output_dir) or {}
  if earlier.get("tool") != "run_classifier":
    return  # find_resume_checkpoint names whose folder it is.
  files = (("train_sha256", classifier_data.task_file(FLAGS.task_name, FLAGS.data_dir,
                                                      "train")),
           ("vocab_sha256", "--vocab_file=%s" % FLAGS.vocab_file))
  changed = [name for key, name in files
             if key in earlier and key in settings and earlier[key] != settings[key]]
  if changed:
    raise ValueError("--output_dir=%s holds a fine-tune of other inputs: %s changed since it "
                     "was trained (another sha256); pass a new --output_dir, or the files "
                     "it was trained on" % (FLAGS.output_dir, " and ".join(changed)))


def earlier_fine_tune(settings, init_checkpoint):
  """The fine-tune --output_dir already holds: its checkpoint prefix, or None.

  Raises:
    ValueError: it is not run_classifier's, it was made from other bytes of train.tsv or
      the vocab, or with other settings (named), or --nodo_train would write the results
      of another checkpoint beside it.
  """
  check_inputs_unchanged(settings)
  prefix = checkpoints.find_resume_checkpoint(FLAGS.output_dir, settings)
  if prefix and not FLAGS.do_train and (
      not init_checkpoint or os.path.abspath(prefix) != os.path.abspath(init_checkpoint)):
    raise ValueError("--output_dir=%s holds the fine-tune %s; evaluating --init_checkpoint=%s "
                     "there would replace its results; pass another --output_dir (or "
                     "--init_checkpoint=%s to evaluate that one)"
                     % (FLAGS.output_dir, os.path.basename(prefix), init_checkpoint,
                        FLAGS.output_dir))
  if not prefix:
    evaluated = (checkpoints.read_run_marker(FLAGS.output_dir) or {}).get(
        "evaluated_checkpoint")
    if evaluated and (FLAGS.do_train or evaluated != os.path.abspath(init_checkpoint)):
      raise ValueError("--output_dir=%s holds the results of evaluating %s; %s there "
                       "would replace them; pass another --output_dir"
                       % (FLAGS.output_dir, evaluated, "a fine-tune" if FLAGS.do_train else
                          "evaluating --init_checkpoint=%s" % init_checkpoint))
  return prefix


def make_iterator(features, batch_size, ranks=None, seed=None):
  """An iterator over batches of the feature arrays: with ranks, this rank's share
  (every ranks.size-th example), shuffled, repeated and in full batches (training);
  without, in order, once, the last batch partial. The arrays are fed when it is
  initialized (as constants they would bloat the graph past protobuf's 2 GB on MNLI).

  Returns:
    (iterator, feed dict for its initializer).
  """
  if ranks is not None:
    features = {k: v[ranks.rank::ranks.size] for k, v in features.items()}  # Processes.
  placeholders = {k: tf.placeholder(v.dtype, v.shape) for k, v in features.items()}
  dataset = tf.data.Dataset.from_tensor_slices(placeholders)
  if ranks is None:
    dataset = dataset.batch(batch_size)
  else:
    dataset = dataset.shuffle(len(features["label_ids"]), seed=seed).repeat()
    dataset = dataset.batch(batch_size, drop_remainder=True)
  feed = {placeholders[k]: v for k, v in features.items()}
  if ranks is None:
    return tf.data.make_initializable_iterator(dataset), feed
  return ranks.iterator(dataset), feed


def run_in_order(sess, graph, fetches):
  """Runs `fetches` (keys of graph) over a whole in-order split; returns a dict of their
  arrays, concatenated over the batches."""
  sess.run(graph["iterator"].initializer, graph["feed"])
  parts = []
  while True:
    try:
      parts.append(sess.run({k: graph[k] for k in fetches}))
    except tf.errors.OutOfRangeError:
      return {k: np.concatenate([p[k] for p in parts]) for k in fetches}


def main(argv):
  logs.whole_lines()
  if len(argv) > 1:
    errors.unexpected_arguments("run_classifier", argv[1:])
  tf.logging.set_verbosity(tf.logging.ERROR)
  tf.disable_v2_behavior()
  errors.take_stop_signals()
  ranks = None
  ended = "an unexpected error (its Python traceback is in its output)"  # its peers say it
  try:
    bert_config, init_checkpoint, labels, data = check_flags()
    runtime = config.from_flags(config.Runtime)
    device = device_lib.detect_device(runtime.device, config.mixed_precision(),
                                      runtime.amp_dtype)
    if runtime.horovod and runtime.distribution not in ("none", "horovod"):
      raise ValueError("--horovod and --distribution=%s disagree; pass one"
                       % runtime.distribution)
    device_lib.check_cpu_devices(runtime.cpu_devices, runtime.engine(), os.cpu_count())
    inputs_lib.check_no_other_run(FLAGS.output_dir, runtime.engine())  # before Horovod's init
    ranks = ranks_lib.Ranks(runtime.engine(), runtime.stall_timeout_s, FLAGS.output_dir,
                            device_lib.replica_devices(device, runtime.cpu_devices),
                            program="run_classifier")
    num_train_steps = 0
    if FLAGS.do_train:
      if len(data["train"][0]) < FLAGS.train_batch_size * ranks.replicas:
        raise ValueError("%d training examples do not fill one global batch of %d x %d "
                         "ranks; lower --train_batch_size"
                         % (len(data["train"][0]), FLAGS.train_batch_size, ranks.replicas))
      num_train_steps = train_steps(len(data["train"][0]), ranks.replicas)
    settings = resume_settings(bert_config, labels, init_checkpoint, num_train_steps,
                               ranks.replicas)
    earlier = earlier_fine_tune(settings, init_checkpoint)
    if ranks.is_chief:
      os.makedirs(FLAGS.output_dir, exist_ok=True)  # Before training: a bad path fails now.
      # Held while this frame lives (the whole run), as run_pretraining's.
      lock = checkpoints.OutputDirLock(FLAGS.output_dir)
      lock.acquire()
    status = run(bert_config, init_checkpoint, labels, data, ranks, device, num_train_steps,
                 settings, earlier)
    ranks.part(status)
    ended = None
    return status
  except ValueError as e:
    ended = str(e)
    errors.print_error("run_classifier", ended)
    return 2
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM's errors.Terminated
    ended = "stopped by a signal"
    return errors.stopped_by_signal(
        "run_classifier", e, "run the same command again (a fine-tune is saved at its end: "
        "one stopped before it starts over)")
  except (EnvironmentError, tf.errors.OpError) as e:
    if not errors.is_file_error(e):
      if ranks is not None and isinstance(e, tf.errors.OpError) and ranks.is_job_error(e):
        ranks = None  # a peer's failure ended this rank: the peer's own line names it
      raise
    ended = errors.os_error_message(e)
    errors.print_error("run_classifier", ended)
    return 2
  finally:
    if ranks is not None:  # its heartbeat says done, or the error its peers then name
      ranks.stop(error=ended)


def train_replica(bert_config, features, num_labels, dtype, global_step, num_train_steps,
                  ranks):
  """The update of one replica; returns what the loop fetches: "step" (global_step after
  the update), "loss" (averaged over the replicas) and "learning_rate"."""
  outputs = classifier.build_classifier(bert_config, features, num_labels, True, dtype)
  learning_rate = optimization.learning_rate_schedule(
      global_step, FLAGS.learning_rate, num_train_steps,
      int(num_train_steps * FLAGS.warmup_proportion))
  loss_scale = optimization.DynamicLossScale() if dtype == tf.float16 else None
  several = ranks.replicas > 1
  _, update_op = optimization.create_train_ops(
      outputs["loss"], optimization.create_optimizer(FLAGS.optimizer, learning_rate),
      global_step, allreduce_fn=ranks.all_reduce if several else None,
      loss_scale=loss_scale)
  with tf.control_dependencies([update_op]):
    # One more, or the same when float16 loss scaling skipped an overflowing update.
    new_step = global_step.read_value()
  loss = outputs["loss"]
  if several:
    loss = ranks.all_reduce([loss], name="display_loss")[0]
  return {"step": new_step, "loss": loss, "learning_rate": learning_rate}


def initialize(sess, earlier, init_checkpoint, model_variables, broadcast_op, log):
  """Initializes the variables, then loads earlier's weights (a finished fine-tune) or
  init_checkpoint's, and broadcasts rank 0's."""
  sess.run(tf.global_variables_initializer())
  if earlier:
    checkpoints.restore_model_weights(sess, earlier, model_variables, log=log)
    if FLAGS.do_train:
      log("--output_dir=%s already holds this fine-tune (%s, the same settings): nothing to "
          "train, it is evaluated" % (FLAGS.output_dir, os.path.basename(earlier)))
  elif init_checkpoint:
    checkpoints.restore_model_weights(sess, init_checkpoint, model_variables, log=log)
  else:
    log("No --init_checkpoint: the model starts from random weights")
  if broadcast_op is not None:
    sess.run(broadcast_op)


def run(bert_config, init_checkpoint, labels, data, ranks, device, num_train_steps, settings,
        earlier=None):
  """Builds the graphs, then trains, saves, evaluates and predicts. Returns the exit status.

  num_train_steps: the updates (0 without --do_train). settings: resume_settings, written
  as the run marker. earlier: earlier_fine_tune's checkpoint, which this run takes as it
  is: trained already, it is evaluated.
  """
  log = print if ranks.is_chief else (lambda line: None)
  if FLAGS.seed is not None:
    tf.set_random_seed(FLAGS.seed)
  global_batch = FLAGS.train_batch_size * ranks.replicas
  log("run_classifier: task %s, labels %s, %s; %d rank(s), batch %d x %d ranks, %d updates, "
      "%s compute" % (FLAGS.task_name, labels, ", ".join(
          "%s %d examples" % (s, len(e)) for s, (e, _) in sorted(data.items())),
          ranks.replicas, FLAGS.train_batch_size, ranks.replicas, num_train_steps,
          device.dtype.name + (" (%s)" % device.why if device.why else "")))
  graphs = {}
  with ranks.scope():  # Under a tf.distribute strategy, mirrored variables.
    global_step = tf.train.get_or_create_global_step()
    if FLAGS.do_train:
      train_iterator, train_feed = make_iterator(data["train"][1], FLAGS.train_batch_size,
                                                 ranks, FLAGS.seed)
      display = ranks.merged(ranks.each_replica(
          lambda features: train_replica(bert_config, features, len(labels), device.dtype,
                                         global_step, num_train_steps, ranks),
          train_iterator.get_next()))
    for split in ("dev", "test"):
      # Rank 0 evaluates and predicts alone, but every rank builds the graphs: without
      # training they create the variables, which the ranks must all have alike.
      if split in data:
        iterator, feed = make_iterator(data[split][1], FLAGS.eval_batch_size)
        with tf.variable_scope("", reuse=tf.AUTO_REUSE):
          graphs[split] = dict(classifier.build_classifier(
              bert_config, iterator.get_next(), len(labels), False, device.dtype),
                               iterator=iterator, feed=feed)
    model_variables = tf.trainable_variables()
    # Checked once, before the save: nothing with NaN or Inf is written (as run_pretraining).
    all_finite = checkpoints.all_finite(model_variables) if FLAGS.do_train else None
    broadcast_op = ranks.broadcast_op()
  gpu = None
  if device.kind == "GPU":
    gpu = "all" if ranks.strategy else device_lib.gpu_index(ranks, len(device.gpus))
  threads = FLAGS.intra_op_threads or max(1, (os.cpu_count() or 1) // ranks.local_size)
  ranks.doing = "the session, the weights' broadcast from rank 0"
  sess = ranks.session(pretraining.session_config(
      threads, FLAGS.inter_op_threads or 2, gpu, FLAGS.use_xla,
      cpu_devices=FLAGS.cpu_devices if device.kind == "CPU" else 1))
  initialize(sess, earlier, init_checkpoint, model_variables, broadcast_op, log)

  if FLAGS.do_train and ranks.is_chief and not earlier:
    checkpoints.write_run_marker(FLAGS.output_dir, settings)
  elif ranks.is_chief and not earlier:  # the results of which checkpoint, for the next run
    checkpoints.write_run_marker(FLAGS.output_dir, dict(
        settings, evaluated_checkpoint=os.path.abspath(init_checkpoint)))
  if FLAGS.do_train and not earlier:
    ranks.doing = "fine-tuning: %d updates, each with the gradients' all-reduce" % (
        num_train_steps)
    sess.run(train_iterator.initializer, train_feed)
    status = train(sess, display, all_finite, num_train_steps, global_batch, device.dtype, log)
    if status is not None:
      return status
    if ranks.is_chief:
      saver = tf.train.Saver(model_variables, save_relative_paths=True)
      log("Saved %s" % checkpoints.save_checkpoint(saver, sess, FLAGS.output_dir,
                                                   num_train_steps, resumes=False))
      write_lines(os.path.join(FLAGS.output_dir, LABELS_FILE), labels)
  if not ranks.is_chief:
    return 0  # Rank 0 evaluates and predicts on the whole sets.
  ranks.doing = "evaluating and predicting (rank 0 alone)"
  if FLAGS.do_eval:
    dev = run_in_order(sess, graphs["dev"], ["predictions", "per_example_loss"])
    results = classifier.classification_metrics(
        FLAGS.task_name, data["dev"][1]["label_ids"], dev["predictions"])
    results["eval_loss"] = float(np.mean(dev["per_example_loss"]))
    results["eval_examples"] = len(dev["predictions"])
    write_lines(os.path.join(FLAGS.output_dir, "eval_results.txt"),
                ["%s = %s" % item for item in sorted(results.items())])
    log("***** Eval results *****")
    for key, value in sorted(results.items()):
      log("  %s = %s" % (key, value))
  if FLAGS.do_predict:
    probabilities = run_in_order(sess, graphs["test"], ["probabilities"])["probabilities"]
    path = os.path.join(FLAGS.output_dir, "test_results.tsv")
    write_lines(path, ["\t".join("%.6f" % p for p in row) for row in probabilities])
    log("Wrote the class probabilities of %d test examples (columns: %s) to %s"
        % (len(probabilities), " ".join(labels), path))
  return 0


def train(sess, display, all_finite, num_train_steps, global_batch, dtype, log):
  """Runs the updates, logging every --display_loss_steps (display: an update's fetches,
  all_finite: whether the weights are finite). Returns None, or diverged's exit status."""
  meter = meters.Throughput(global_batch, warmup_steps=min(10, num_train_steps // 2))
  step, runs = 0, 0
  while step < num_train_steps:
    runs += 1
    shown = runs % FLAGS.display_loss_steps == 0 or step + 1 == num_train_steps
    start = time.time()
    values = sess.run(display if shown else {"step": display["step"]})
    meter.update(time.time() - start)
    step = values["step"]
    if shown:
      log("Step %d, loss: %.4f, learning_rate: %.3e, sentences_per_second: %.2f"
          % (step, values["loss"], values["learning_rate"], meter.window_fps()))
      meter.new_window()
      # The loss fetched for the log (the last update's is always): no cost per step. It is
      # averaged over the ranks, so they stop together. float16 skips such a step, which
      # ends only while the weights are finite.
      if not np.isfinite(values["loss"]):
        if dtype != tf.float16:
          return diverged("Loss is %s at step %d" % (values["loss"], step))
        if not sess.run(all_finite):
          return diverged("NaN or Inf in the weights after step %d" % step)
  meter.stop()
  log("Throughput Average (sentences/sec) = %.2f" % meter.averages()[1])
  # A finite last loss was computed before the last update: the weights are checked too.
  if not sess.run(all_finite):
    return diverged("NaN or Inf in the weights after step %d" % step)
  return None


def diverged(what):
  """Says in one line that the fine-tune diverged (what: where) and that nothing was saved;
  returns the exit status, 1 (as run_pretraining's)."""
  errors.print_error("run_classifier", "%s: stopping without saving. Lower --learning_rate "
                     "or raise --warmup_proportion and run again" % what)
  return 1


def write_lines(path, lines):
  """Writes text lines to path atomically (a temporary name, then a rename)."""
  tmp = "%s.tmp-%d" % (path, os.getpid())
  with open(tmp, "w", encoding="utf-8") as writer:
    writer.write("".join(line + "\n" for line in lines))
  os.replace(tmp, path)


if __name__ == "__main__":
  errors.run_main("run_classifier", main)
