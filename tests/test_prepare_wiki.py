"""Tests of bert_pretrain/wiki: wikitext to text, sentences, and the whole pipeline.

The pipeline runs on tests/data/wiki_sample.xml, a small MediaWiki export (48 pages: 39
articles with templates, infoboxes, links, tables, references and non-ASCII text, plus
redirects, disambiguation pages, other namespaces and a stub) at small settings.
"""

import bz2
import errno
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time

import pytest
import tensorflow.compat.v1 as tf

from bert_pretrain import processes
from bert_pretrain.data import input_pipeline
from bert_pretrain.data import records
from bert_pretrain.data import tokenization
from bert_pretrain.wiki import clean
from bert_pretrain.wiki import extract
from bert_pretrain.wiki import markup
from bert_pretrain.wiki import pipeline
from bert_pretrain.wiki import sentences
from bert_pretrain.wiki import shard
from bert_pretrain.wiki import tfrecords
from bert_pretrain.wiki import workdir
from conftest import gone, workers_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SAMPLE = os.path.join(ROOT, "tests", "data", "wiki_sample.xml")
SMALL = dict(num_shards=4, num_eval_articles=4, num_eval_samples=20, max_seq_length=64,
             max_predictions_per_seq=10, dupe_factor=2, pages_per_chunk=10)
OUTPUTS = ("text", "train_data", "eval_intermediate", "eval_data", "manifest.json",
           "settings.json")


def start_cli(output_dir, vocab, dump=SAMPLE, jobs=1, **overrides):
  """Starts bash tools/prepare_wiki.sh with the small settings (it execs Python), in a
  process group of its own with its workers."""
  values = dict(SMALL, dump=dump, vocab=vocab, output_dir=output_dir, jobs=jobs)
  values.update(overrides)
  args = ["--%s=%s" % (k, v) for k, v in values.items() if v is not None]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.Popen(["bash", os.path.join(ROOT, "tools", "prepare_wiki.sh")] + args,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env, start_new_session=True)


def run_cli(output_dir, vocab, dump=SAMPLE, jobs=1, **overrides):
  """Runs start_cli's command; returns CompletedProcess. A run still going after 300 s
  is asked for its Python stacks and its workers' (SIGUSR2), which the failure shows."""
  process = start_cli(output_dir, vocab, dump, jobs, **overrides)
  try:
    out, err = process.communicate(timeout=300)
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGUSR2)
    time.sleep(2)
    os.killpg(process.pid, signal.SIGKILL)  # the workers too: they hold the pipes open
    out, err = process.communicate()
    raise AssertionError("prepare_wiki still ran after 300 s; its output and stacks:\n"
                         + out[-2000:] + err[-8000:])
  return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def error_line(result, status=2):
  """The one error line of a failed run; bad input and file errors exit 2 (as every tool)."""
  assert result.returncode == status, result.stdout + result.stderr
  lines = [l for l in result.stderr.splitlines() if l.startswith("prepare_wiki: error")]
  assert len(lines) == 1, result.stderr
  return lines[0]


def files_under(root):
  """{relative path: bytes} of the outputs (not work/ nor the lock) of a run."""
  found = {}
  for top in OUTPUTS:
    path = os.path.join(root, top)
    if os.path.isfile(path):
      found[top] = open(path, "rb").read()
    for folder, _, names in os.walk(path):
      for name in names:
        full = os.path.join(folder, name)
        found[os.path.relpath(full, root)] = open(full, "rb").read()
  return found


def documents(path):
  """The documents (lists of sentences) of a text file in create_pretraining_data format."""
  text = open(path, encoding="utf-8").read()
  return [d.split("\n") for d in text.split("\n\n") if d.strip()]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
  tokenization.build_wordpiece_vocab([SAMPLE], 1500, path)
  return path


@pytest.fixture(scope="module")
def run_a(tmp_path_factory, vocab):
  """One complete run (--jobs=1) that the other tests read or copy."""
  output_dir = str(tmp_path_factory.mktemp("run") / "a")
  result = run_cli(output_dir, vocab)
  assert result.returncode == 0, result.stderr
  return output_dir


# ---------------------------------------------------------------------------------------
# Wikitext, cleanup, sentences.
# ---------------------------------------------------------------------------------------


def test_nested_templates_are_removed_and_inline_ones_rendered():
  text = markup.wikitext_to_text(
      "{{Infobox city|name={{lang|fr|Paris}}|area={{convert|105|km2|{{abbr|sq mi}}}}}}\n"
      "The summit is {{convert|8849|m|ft}} high, in {{lang|ne|सगरमाथा}} terms.{{Citation "
      "needed|date={{CURRENTYEAR}}}} Hillary climbed it on {{start date|1953|5|29}}.")
  assert text == ("The summit is 8849 m high, in सगरमाथा terms. Hillary climbed it on "
                  "29 May 1953.")


def test_links_files_categories_and_external_links():
  text = markup.wikitext_to_text(
      "[[File:Draisine.jpg|thumb|The machine of [[Karl Drais]], about [[1817]]]]"
      "Riders of [[bicycle]]s in [[France|the country]] and [[Paris (band)|]] read "
      "[https://example.org/x the guide] and [http://example.org/bare].\n"
      "[[Category:Bicycles| ]]\n[[de:Fahrrad]]\n[[:Category:Bicycles|a category]] too.")
  assert text == ("Riders of bicycles in the country and Paris read the guide and .\n"
                  "a category too.")


def test_tables_references_comments_tags_quotes_and_headings():
  text = markup.wikitext_to_text(
      "'''Bread''' is ''baked''.<ref name=\"a\">{{cite book|title=X}}</ref> It keeps."
      "<ref name=\"a\"/><!-- hidden\nnote -->\n"
      "{| class=\"wikitable\"\n! A !! B\n|-\n| 1 ||\n{|\n| inner\n|}\n|}\n"
      "== History ==\nFlour &amp; water<br/>make <span lang=\"fr\">pain</span>.\n"
      "<math>x^2</math>Done.\n* a list item\n# numbered\n"
      "== References ==\nSmith, J. (2001). A book.\n=== Sub ===\nStill dropped.\n"
      "== Legacy ==\nKept again. __NOTOC__")
  assert text == ("Bread is baked. It keeps.\nFlour & water make pain.\nDone.\n"
                  "Kept again.")


def test_unclosed_template_does_not_swallow_the_article():
  text = markup.wikitext_to_text("{{Infobox broken\n| name = X\n\nFirst line.\n"
                                       "Second {{nowrap|line}} here.")
  lines = text.split("\n")
  assert lines[-1] == "Second line here."
  cleaned = clean.clean_text(text)
  assert "{{" not in cleaned and "Second line here." in cleaned


def test_clean_text_drops_remnants_and_fixes_spacing():
  text = ("Paris (; French: ) is the capital of France .\n"
          "| name = leftover infobox parameter\n"
          "thumb|left|A caption that lost its link\n"
          "See http://example.org for the rest of the story today.\n"
          "Too short.\n"
          "{{unclosed template and some words\n"
          "東京は日本の首都です。")
  assert clean.clean_text(text).split("\n") == [
      "Paris is the capital of France.", "See for the rest of the story today.",
      "東京は日本の首都です。"]


@pytest.mark.parametrize("paragraph,expected", [
    ("Mr. Smith met Dr. Jones in St. Louis. They talked.",
     ["Mr. Smith met Dr. Jones in St. Louis.", "They talked."]),
    ("He moved to the U.S. in 1933. He settled there.",
     ["He moved to the U.S. in 1933.", "He settled there."]),
    ("He lived in the U.S. The war had begun.",
     ["He lived in the U.S.", "The war had begun."]),
    ("John F. Kennedy and J. R. R. Tolkien met. Nobody saw.",
     ["John F. Kennedy and J. R. R. Tolkien met.", "Nobody saw."]),
    ("It costs 3.14 euros, e.g. bread. Pi is about 3.14159. Next.",
     ["It costs 3.14 euros, e.g. bread.", "Pi is about 3.14159.", "Next."]),
    ("See No. 5 and pp. 12-14. Apple Inc. It grew. Apple Inc. Records sold.",
     ["See No. 5 and pp. 12-14.", "Apple Inc.", "It grew.", "Apple Inc. Records sold."]),
    ('She said "Stop!" Then she left? Yes (really). "Quoted." End',
     ['She said "Stop!"', "Then she left?", "Yes (really).", '"Quoted."', "End"]),
    ("東京は日本の首都です。人口は多い！Tokyo is big.",
     ["東京は日本の首都です。", "人口は多い！", "Tokyo is big."]),
    ("The year was c. 1500 in Europe. The end.",
     ["The year was c. 1500 in Europe.", "The end."]),
])
def test_sentence_segmentation(paragraph, expected):
  assert sentences.split_sentences(paragraph) == expected


# ---------------------------------------------------------------------------------------
# The pipeline on the sample dump.
# ---------------------------------------------------------------------------------------


def test_counts_and_balanced_shards(run_a):
  manifest = json.load(open(os.path.join(run_a, "manifest.json")))
  counts = manifest["counts"]
  assert counts["pages"] == 48
  assert counts["dropped"] == {"non_article": 4, "redirect": 2, "disambiguation": 2,
                               "near_empty": 1, "no_sentences": 0}
  assert counts["articles"] == 39
  assert counts["train"]["articles"] == 35 and counts["eval"]["articles"] == 4
  shards = sorted(os.listdir(os.path.join(run_a, "text", "train")))
  assert shards == ["part-%05d-of-00004" % i for i in range(4)]
  assert sorted(os.listdir(os.path.join(run_a, "train_data"))) == shards
  sizes = [os.path.getsize(os.path.join(run_a, "text", "train", s)) for s in shards]
  largest_article = max(len(("\n".join(d) + "\n\n").encode("utf-8"))
                        for s in shards
                        for d in documents(os.path.join(run_a, "text", "train", s)))
  # Each article goes to the smallest shard, so shards differ by at most one article.
  assert max(sizes) - min(sizes) <= largest_article
  assert sum(sizes) == counts["train"]["text_bytes"]
  sentences = sum(len(d) for s in shards
                  for d in documents(os.path.join(run_a, "text", "train", s)))
  assert sentences == counts["train"]["sentences"]


def test_text_is_clean_prose_with_non_ascii(run_a):
  text = "".join(open(os.path.join(run_a, "text", "train", n), encoding="utf-8").read()
                 for n in os.listdir(os.path.join(run_a, "text", "train")))
  text += open(os.path.join(run_a, "text", "eval", "eval.txt"), encoding="utf-8").read()
  for remnant in ("{{", "}}", "[[", "]]", "<ref", "{|", "|}", "'''", "thumb|", "http",
                  "&amp;", "Category:"):
    assert remnant not in text
  # Redirects, disambiguation pages, other namespaces and the stub are gone.
  for dropped in ("may refer to", "This template shows", "free online encyclopedia",
                  "This category contains", "Smallville", "only the disambiguation"):
    assert dropped not in text
  for kept in ("Île de la Cité", "東京は日本の首都です。", "Þingvellir", "São Paulo",
               "Dr. Curie later discovered the elements polonium and radium",
               "with a summit at 8849 m."):
    assert kept in text
  # One sentence a line: this one is split from the next at "Dr." no more.
  assert "\nDr. Curie later discovered" in text


def test_no_eval_article_in_training(run_a):
  eval_documents = documents(os.path.join(run_a, "text", "eval", "eval.txt"))
  assert len(eval_documents) == 4
  train_sentences = set()
  for name in os.listdir(os.path.join(run_a, "text", "train")):
    for document in documents(os.path.join(run_a, "text", "train", name)):
      train_sentences.update(document)
  for document in eval_documents:
    assert not train_sentences & set(document)
  # The held-out articles are those with the smallest sha256 of their title.
  titles = []
  for name in sorted(os.listdir(os.path.join(run_a, "work", "sentences"))):
    if name.endswith(".jsonl"):
      for line in open(os.path.join(run_a, "work", "sentences", name), encoding="utf-8"):
        titles.append(json.loads(line)["title"])
  by_hash = sorted(titles, key=lambda t: hashlib.sha256(t.encode("utf-8")).hexdigest())
  held_out = set(by_hash[:4])
  first_sentences = {d[0] for d in eval_documents}
  for name in sorted(os.listdir(os.path.join(run_a, "work", "sentences"))):
    if name.endswith(".jsonl"):
      for line in open(os.path.join(run_a, "work", "sentences", name), encoding="utf-8"):
        article = json.loads(line)
        assert (article["sentences"][0] in first_sentences) == (article["title"] in held_out)


def test_records_readable_by_the_training_input_pipeline(run_a, vocab):
  manifest = json.load(open(os.path.join(run_a, "manifest.json")))
  vocab_size = len(tokenization.load_vocab(vocab))
  files = input_pipeline.list_record_files(os.path.join(run_a, "train_data"))
  assert len(files) == 4
  assert input_pipeline.check_record_files(files, 64, 10, vocab_size) == (
      manifest["counts"]["train"]["instances"])
  eval_files = input_pipeline.list_record_files(os.path.join(run_a, "eval_data"))
  assert [os.path.basename(f) for f in eval_files] == ["eval_20"]
  assert input_pipeline.check_record_files(eval_files, 64, 10, vocab_size) == 20
  with tf.Graph().as_default():
    dataset = input_pipeline.make_dataset(files, 32, 64, 10, is_training=False)
    batch = tf.data.make_one_shot_iterator(dataset).get_next()
    count = 0
    with tf.Session() as session:
      while True:
        try:
          values = session.run(batch)
        except tf.errors.OutOfRangeError:
          break
        count += len(values["input_ids"])
        assert values["input_ids"].shape[1] == 64
        assert values["masked_lm_ids"].shape[1] == 10
  assert count == manifest["counts"]["train"]["instances"]


def test_masking_statistics_within_tolerance(run_a):
  manifest = json.load(open(os.path.join(run_a, "manifest.json")))
  train = manifest["counts"]["train"]
  masked = mask = kept = tokens = 0
  for path in input_pipeline.list_record_files(os.path.join(run_a, "train_data")):
    for record in tf.io.tf_record_iterator(path):
      feature = tf.train.Example.FromString(record).features.feature
      ids = feature["input_ids"].int64_list.value
      length = sum(feature["input_mask"].int64_list.value)
      positions = [p for p, w in zip(feature["masked_lm_positions"].int64_list.value,
                                     feature["masked_lm_weights"].float_list.value) if w]
      labels = feature["masked_lm_ids"].int64_list.value
      tokens += length
      masked += len(positions)
      mask += sum(1 for p in positions if ids[p] == 4)  # [MASK] is id 4 in a built vocab
      kept += sum(1 for p, label in zip(positions, labels) if ids[p] == label)
  assert masked == train["masked_tokens"]
  assert 0.13 <= masked / tokens <= 0.16
  assert abs(mask / masked - 0.8) < 0.05
  assert abs(kept / masked - 0.1) < 0.04
  assert 0.4 <= train["random_next"] / train["instances"] <= 0.8


def test_manifest_sha256_matches_every_output(run_a):
  manifest = json.load(open(os.path.join(run_a, "manifest.json")))
  listed = manifest["files"]
  outputs = {p for p in files_under(run_a) if p not in ("manifest.json", "settings.json")}
  assert set(listed) == outputs
  for relative_path, digest in listed.items():
    data = open(os.path.join(run_a, relative_path), "rb").read()
    assert digest == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
  assert manifest["settings"]["max_seq_length"] == 64
  assert manifest["settings"]["dump_name"] == "wiki_sample.xml"
  assert manifest["counts"]["eval"]["instances"] == 20


def test_same_seed_gives_byte_identical_output_with_two_jobs(run_a, vocab, tmp_path):
  output_dir = str(tmp_path / "b")
  result = run_cli(output_dir, vocab, jobs=2)
  assert result.returncode == 0, result.stderr
  assert files_under(output_dir) == files_under(run_a)
  assert "[UNK]" not in result.stderr  # the dump's own vocab fits it


def test_a_vocab_that_leaves_most_of_the_text_unknown_stops_at_the_held_out_text(vocab,
                                                                                 tmp_path):
  tiny = tmp_path / "vocab.txt"
  tiny.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
  output_dir = str(tmp_path / "out")
  for _ in range(2):  # and again: the records made with it were deleted
    result = run_cli(output_dir, str(tiny))
    unknown, total = [int(n) for n in re.match(
        r"^prepare_wiki: error: (\d+) of the (\d+) tokens of the text \(\d+%\) are \[UNK\]: "
        r"the vocab does not fit the text; pass --vocab=<the model's vocab.txt>; the records "
        r"this run made with it are deleted, the text steps' work is kept$",
        error_line(result)).groups()]
    assert 0.9 * total < unknown < total
    assert not [n for n in os.listdir(os.path.join(output_dir, "train_data"))
                if n.startswith("part-")]
  # The vocab that fits is taken in the same folder, the text steps' work kept.
  result = run_cli(output_dir, vocab)
  assert result.returncode == 0, result.stderr
  assert "[UNK]" not in result.stderr
  assert "settings changed (vocab_sha256=" in result.stderr
  for step in ("extract", "clean", "segment", "shard"):
    assert re.search(r"^prepare_wiki: %s: .*done before" % step, result.stderr, re.M), (
        result.stderr)


def test_held_out_records_made_before_with_a_vocab_that_does_not_fit_are_said_and_kept(
    run_a, vocab, tmp_path):
  """A folder an older version finished, which only warned: told again, nothing deleted."""
  output_dir = str(tmp_path / "older")
  shutil.copytree(run_a, output_dir)
  path = workdir.Layout(output_dir).marker("tfrecords", "eval_all")
  marker = json.loads(open(path).read())
  marker["stats"]["num_unknown_tokens"] = marker["stats"]["num_input_tokens"] - 1
  with open(path, "w") as f:
    f.write(json.dumps(marker))
  before = files_under(output_dir)
  result = run_cli(output_dir, vocab)
  assert result.returncode == 0, result.stderr
  assert re.search(r"^prepare_wiki: warning: \d+ of the \d+ tokens of the text \(100%\) are "
                   r"\[UNK\]", result.stderr, re.M), result.stderr
  assert files_under(output_dir) == before


def test_a_vocab_that_leaves_a_few_percent_unknown_is_a_warning(monkeypatch):
  said = []
  monkeypatch.setattr(tfrecords, "say", said.append)
  settings = {"do_lower_case": True}
  tfrecords._check_unknown_tokens({"num_unknown_tokens": 1, "num_input_tokens": 100}, "v",
                                  settings)
  assert said == []
  tfrecords._check_unknown_tokens({"num_unknown_tokens": 10, "num_input_tokens": 100}, "v",
                                  settings)
  assert said == ["warning: 10 of the 100 tokens of the text (10%) are [UNK]: the vocab does "
                  "not fit the text; pass --vocab=<the model's vocab.txt>"]
  with pytest.raises(workdir.PrepareError, match="51 of the 100 tokens"):
    tfrecords._check_unknown_tokens({"num_unknown_tokens": 51, "num_input_tokens": 100}, "v",
                                    settings)


def test_resume_redoes_only_what_is_missing(run_a, vocab, tmp_path):
  output_dir = str(tmp_path / "c")
  shutil.copytree(run_a, output_dir)  # copy2 keeps the modification times
  before = {p: os.stat(os.path.join(output_dir, p)).st_mtime_ns
            for p in files_under(output_dir)}
  original = files_under(run_a)
  # As a kill leaves things: one shard's TFRecords gone, a half-written temporary file,
  # an extraction chunk whose marker was never written.
  os.remove(os.path.join(output_dir, "train_data", "part-00002-of-00004"))
  temporary = os.path.join(output_dir, "train_data", "part-00001-of-00004.tmp-4242")
  with open(temporary, "wb") as f:
    f.write(b"half a record")
  os.remove(os.path.join(output_dir, "work", "done", "extract", "chunk-00003.json"))
  result = run_cli(output_dir, vocab)
  assert result.returncode == 0, result.stderr
  assert "extract: 48 pages in 5 chunks (4 done before)" in result.stderr
  assert "tfrecords: 1 files made (4 done before)" in result.stderr
  assert "shard: done before" in result.stderr
  assert not os.path.exists(temporary)
  after = files_under(output_dir)
  assert after == original
  changed = sorted(p for p in after if os.stat(os.path.join(output_dir, p)).st_mtime_ns
                   != before[p])
  assert changed == ["manifest.json", "train_data/part-00002-of-00004"]
  # Once every chunk is there, a rerun does not even read the dump.
  result = run_cli(output_dir, None, steps="extract,clean")
  assert result.returncode == 0, result.stderr
  assert "extract: done before (5 chunks)" in result.stderr


def test_another_casing_or_a_setting_of_a_step_left_out_is_refused(run_a, vocab):
  before = files_under(run_a)
  mtime = os.stat(os.path.join(run_a, "settings.json")).st_mtime_ns
  # Lower-casing, like the vocab, is a setting of step tfrecords, whose finished work goes
  # only with --redo_changed_steps.
  line = error_line(run_cli(run_a, vocab, do_lower_case="false", max_seq_length=128))
  assert ("holds a run made with other settings (do_lower_case=true there, false now; "
          "max_seq_length=64 there, 128 now): that redoes steps tfrecords") in line
  assert "pass --redo_changed_steps" in line
  # A step's setting is redone only by running that step: a forgotten flag on
  # --steps=manifest must not throw away the TFRecords.
  line = error_line(run_cli(run_a, vocab, steps="manifest", max_seq_length=128,
                            dupe_factor=5))
  assert ("holds a run made with other settings (max_seq_length=64 there, 128 now) of "
          "step tfrecords, which this run leaves out") in line
  assert "run step tfrecords (and the steps after it) to redo it" in line
  assert files_under(run_a) == before
  assert os.stat(os.path.join(run_a, "settings.json")).st_mtime_ns == mtime


def test_lowering_num_shards_after_its_error_keeps_the_text_steps_and_matches_a_fresh_run(
    run_a, vocab, tmp_path):
  output_dir = str(tmp_path / "out dir")
  line = error_line(run_cli(output_dir, vocab, num_shards=40))
  assert "39 articles, too few for 4 held-out articles and 40 shards" in line
  assert "lower --num_eval_articles or --num_shards and run again" in line
  assert "new --output_dir" not in line
  result = run_cli(output_dir, vocab)
  assert result.returncode == 0, result.stderr
  assert ("prepare_wiki: settings changed (num_shards=40 there, 4 now): redoing steps "
          "shard, tfrecords, eval, manifest; the finished work of the other steps is kept"
          in result.stderr)
  assert "extract: done before (5 chunks)" in result.stderr
  assert "clean: 5 chunks (5 done before)" in result.stderr
  assert "segment: 5 chunks (5 done before)" in result.stderr
  assert files_under(output_dir) == files_under(run_a)
  # The folder has a space: the hint quotes it, to be pasted into a shell as it is.
  assert "Train with --input_files_dir=%s --eval_files_dir=%s\n" % (
      shlex.quote(os.path.join(output_dir, "train_data")),
      shlex.quote(os.path.join(output_dir, "eval_data"))) in result.stdout


def test_lowering_num_eval_samples_after_its_error_runs_on_the_same_folder(
    run_a, vocab, tmp_path):
  output_dir = str(tmp_path / "out")
  line = error_line(run_cli(output_dir, vocab, num_eval_samples=1000))
  assert "fewer than --num_eval_samples=1000; lower --num_eval_samples (to " in line
  assert "new --output_dir" not in line
  # Found as soon as the held-out records are made, before any training shard.
  assert os.listdir(os.path.join(output_dir, "eval_intermediate")) == ["eval_all"]
  assert os.listdir(os.path.join(output_dir, "train_data")) == []
  result = run_cli(output_dir, vocab, steps="eval")
  assert result.returncode == 0, result.stderr
  assert ("settings changed (num_eval_samples=1000 there, 20 now): redoing step eval; "
          in result.stderr)
  assert os.listdir(os.path.join(output_dir, "eval_data")) == ["eval_20"]
  result = run_cli(output_dir, vocab)
  assert result.returncode == 0, result.stderr
  assert "settings changed" not in result.stderr and "eval: done before" in result.stderr
  assert "tfrecords: 4 files made (1 done before)" in result.stderr
  assert files_under(output_dir) == files_under(run_a)


def test_a_finished_folder_redoes_only_the_steps_a_changed_setting_touches(
    run_a, vocab, tmp_path):
  output_dir = str(tmp_path / "c")
  shutil.copytree(run_a, output_dir)
  original = files_under(run_a)
  # Finished work is deleted only when asked: a flag left out must not cost it.
  line = error_line(run_cli(output_dir, vocab, steps="eval", num_eval_samples=5))
  assert line.endswith("holds a run made with other settings (num_eval_samples=20 there, 5 "
                       "now): that redoes steps eval, manifest, whose finished work would be "
                       "deleted; pass --redo_changed_steps to do so, or the same settings to "
                       "resume")
  assert files_under(output_dir) == original
  result = run_cli(output_dir, vocab, steps="eval", num_eval_samples=5,
                   redo_changed_steps="true")
  assert result.returncode == 0, result.stderr
  assert ("settings changed (num_eval_samples=20 there, 5 now): redoing step eval (and "
          "manifest when run); " in result.stderr)
  after = files_under(output_dir)
  # The old eval set and the manifest that lists it are gone; nothing else changed.
  assert sorted(set(original) - set(after)) == ["eval_data/eval_20", "manifest.json"]
  assert sorted(set(after) - set(original)) == ["eval_data/eval_5"]
  kept = {p: b for p, b in original.items()
          if p not in ("eval_data/eval_20", "manifest.json", "settings.json")}
  assert {p: b for p, b in after.items() if p in kept} == kept
  settings = json.load(open(os.path.join(output_dir, "settings.json")))["settings"]
  assert settings["num_eval_samples"] == 5


def test_a_changed_setting_the_kept_records_cannot_meet_is_refused_before_work_is_deleted(
    run_a, vocab, tmp_path):
  output_dir = str(tmp_path / "c")
  shutil.copytree(run_a, output_dir)
  original = files_under(output_dir)
  result = run_cli(output_dir, vocab, steps="eval", num_eval_samples=1000,
                   redo_changed_steps="true")
  assert "fewer than --num_eval_samples=1000; lower --num_eval_samples (to " in error_line(
      result)
  assert "settings changed" not in result.stderr  # nothing is said to be redone
  assert files_under(output_dir) == original  # eval_data/eval_20 among them


def test_folder_of_other_files_is_refused(vocab, tmp_path):
  (tmp_path / "notes.txt").write_text("someone else's file")
  line = error_line(run_cli(str(tmp_path), vocab))
  assert "not empty and holds no settings.json" in line and "notes.txt" in line


@pytest.mark.parametrize("content,message", [
    ("<html><body>Not a dump</body></html>", "is not a MediaWiki XML export: its root "
     "element is <html>"),
    ("just some text, not XML at all", "is not a MediaWiki XML export (not XML"),
    ("", "is not a MediaWiki XML export (not XML"),
    ("BZh9 and no bz2 stream", "is not a valid bz2 file"),
])
def test_dump_that_is_not_mediawiki_xml_is_refused_before_the_output_folder_is_made(
    vocab, tmp_path, content, message):
  dump = tmp_path / "dump.xml"
  dump.write_text(content)
  line = error_line(run_cli(str(tmp_path / "out"), vocab, dump=str(dump)))
  assert message in line and ("pages-articles" in line or "download the dump" in line)
  assert not os.path.exists(str(tmp_path / "out"))


def test_dump_cut_short_is_one_line_that_asks_for_the_dump_again(vocab, tmp_path):
  # The whole dump, downloaded again, differs in size: its chunks are made anew, so the
  # line promises no kept work.
  data = open(SAMPLE, "rb").read()
  dump = tmp_path / "cut.xml"
  dump.write_bytes(data[:len(data) * 7 // 10])
  output_dir = tmp_path / "out"
  line = error_line(run_cli(str(output_dir), vocab, dump=str(dump)))
  assert "is damaged or cut short" in line and line.endswith(
      "; download the dump again, then rerun")
  assert not [n for n in os.listdir(output_dir / "work" / "extracted") if ".tmp" in n]
  compressed = tmp_path / "cut.xml.bz2"
  compressed.write_bytes(bz2.compress(data)[:-2000])
  line = error_line(run_cli(str(tmp_path / "out_bz2"), vocab, dump=str(compressed)))
  assert "ends inside its bz2 stream" in line


def test_refused_dump_leaves_nothing_that_blocks_the_corrected_command(run_a, vocab,
                                                                       tmp_path):
  """An HTML page, then a cut .bz2, are refused on a new folder; the corrected command
  on that folder then runs and makes what a clean folder gets."""
  output_dir = str(tmp_path / "out")
  html_page = tmp_path / "enwiki-latest-pages-articles.xml"
  html_page.write_text("<html><body>404 Not Found</body></html>\n" * 200)
  line = error_line(run_cli(output_dir, vocab, dump=str(html_page)))
  assert "is not a MediaWiki XML export" in line
  assert not os.path.exists(os.path.join(output_dir, "settings.json"))
  cut = tmp_path / "enwiki-latest-pages-articles.xml.bz2"
  cut.write_bytes(bz2.compress(open(SAMPLE, "rb").read())[:-2000])
  line = error_line(run_cli(output_dir, vocab, dump=str(cut)))
  assert "ends inside its bz2 stream" in line
  assert not os.path.exists(os.path.join(output_dir, "settings.json"))
  result = run_cli(output_dir, vocab)
  assert result.returncode == 0, result.stderr
  assert files_under(output_dir) == files_under(run_a)


def test_verify_rehashes_every_output_and_names_one_that_changed(run_a, vocab, tmp_path):
  output_dir = str(tmp_path / "out")
  shutil.copytree(run_a, output_dir)
  result = run_cli(output_dir, vocab, dump=None, steps="manifest", verify="true")
  assert result.returncode == 0, result.stderr
  count = len(json.load(open(os.path.join(output_dir, "manifest.json")))["files"])
  assert ("prepare_wiki: --verify: the %d output files hash as their markers recorded"
          % count) in result.stdout
  # A byte flipped in place, size and time kept: only re-hashing sees it.
  changed = sorted(n for n in os.listdir(os.path.join(output_dir, "train_data")))[0]
  path = os.path.join(output_dir, "train_data", changed)
  stat, data = os.stat(path), bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0xFF
  open(path, "wb").write(bytes(data))
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  line = error_line(run_cli(output_dir, vocab, dump=None, steps="manifest", verify="true"))
  assert "train_data/%s changed after it was made" % changed in line, line
  assert line.endswith("; delete it and rerun")


def test_a_first_step_whose_worker_died_binds_the_folder_to_no_settings(vocab, tmp_path,
                                                                         monkeypatch):
  # The rerun may come with other settings (fewer pages a chunk, after the OOM killer).
  def died(*unused_args):
    raise processes.WorkerDied()

  monkeypatch.setattr(pipeline, "run_extract", died)
  output_dir = str(tmp_path / "out")
  with pytest.raises(processes.WorkerDied):
    pipeline.run_pipeline(output_dir, dump=SAMPLE, vocab=vocab, jobs=2, **SMALL)
  assert not os.path.exists(os.path.join(output_dir, "settings.json"))


def test_bz2_dump_and_steps_run_alone(run_a, vocab, tmp_path):
  dump = tmp_path / "wiki_sample.xml.bz2"
  dump.write_bytes(bz2.compress(open(SAMPLE, "rb").read()))
  output_dir = str(tmp_path / "out")
  # An extract-only run leaves the later steps' settings free.
  result = run_cli(output_dir, None, dump=str(dump), steps="extract", num_shards=500)
  assert result.returncode == 0, result.stderr
  result = run_cli(output_dir, None, dump=None, steps="clean,segment,shard")
  assert result.returncode == 0, result.stderr
  for name in sorted(os.listdir(os.path.join(run_a, "text", "train"))):
    assert (open(os.path.join(output_dir, "text", "train", name), "rb").read() ==
            open(os.path.join(run_a, "text", "train", name), "rb").read())
  assert not os.path.exists(os.path.join(output_dir, "train_data"))


def multistream_bz2(xml, pages_per_stream=5):
  """Compresses an export as Wikimedia's -multistream dumps: header, page groups, footer."""
  head, rest = xml.split(b"  <page>", 1)
  pages = [b"  <page>" + p for p in rest.split(b"  <page>")]
  last, footer = pages[-1].rsplit(b"</mediawiki>", 1)
  pages[-1] = last
  groups = [b"".join(pages[i:i + pages_per_stream])
            for i in range(0, len(pages), pages_per_stream)]
  return b"".join(bz2.compress(part) for part in [head] + groups + [b"</mediawiki>" + footer])


def test_multistream_bz2_is_cut_between_streams(monkeypatch, tmp_path):
  xml = open(SAMPLE, "rb").read()
  path = tmp_path / "multi.xml.bz2"
  path.write_bytes(multistream_bz2(xml))
  monkeypatch.setattr(extract, "_BZ2_SEGMENT", 700)
  with open(str(path), "rb") as raw:
    assert extract._is_multistream_bz2(raw)
    segments = list(extract._bz2_segments(extract._CountingReader(raw)))
  assert len(segments) > 3
  assert b"".join(bz2.decompress(segment) for segment in segments) == xml


def test_multistream_bz2_decompressed_in_parallel(run_a, tmp_path):
  dump = tmp_path / "wiki_sample-multistream.xml.bz2"
  dump.write_bytes(multistream_bz2(open(SAMPLE, "rb").read()))
  output_dir = str(tmp_path / "out")
  result = run_cli(output_dir, None, dump=str(dump), steps="extract", jobs=2)
  assert result.returncode == 0, result.stderr
  extracted = os.path.join("work", "extracted")
  names = sorted(os.listdir(os.path.join(run_a, extracted)))
  assert sorted(os.listdir(os.path.join(output_dir, extracted))) == names
  for name in names:
    assert (open(os.path.join(output_dir, extracted, name), "rb").read() ==
            open(os.path.join(run_a, extracted, name), "rb").read())


def test_step_without_its_input_is_refused(vocab, tmp_path):
  line = error_line(run_cli(str(tmp_path / "out"), vocab, dump=None, steps="tfrecords"))
  assert "needs the text shards of step shard" in line and "--steps=shard" in line
  assert not (tmp_path / "out").exists()  # nor the folder with its lock file


def test_a_lock_file_a_refused_run_removed_is_not_taken_for_the_lock(tmp_path, monkeypatch):
  """Run B opened .lock; refused run A removed it; run C made a new one and holds it.
  B's lock on the removed file would exclude nobody: B finds C's and is refused."""
  layout = workdir.Layout(str(tmp_path / "out"))
  real_flock, holders = workdir.fcntl.flock, []

  def flock_after_a_and_c(handle, operation):
    if not holders:  # between B's open and its lock: A removes the file, C takes a new one
      os.remove(layout.lock)
      holders.append(open(layout.lock, "a+"))
      real_flock(holders[0], operation)
    real_flock(handle, operation)
  monkeypatch.setattr(workdir.fcntl, "flock", flock_after_a_and_c)
  with pytest.raises(workdir.PrepareError, match="another prepare_wiki run is using"):
    with workdir.locked(layout):
      pass
  holders[0].close()
  # A refused run leaves neither its lock file nor the folders it made.
  layout = workdir.Layout(str(tmp_path / "new" / "out"))
  monkeypatch.setattr(workdir.fcntl, "flock", real_flock)
  with pytest.raises(workdir.PrepareError, match="refused"):
    with workdir.locked(layout):
      raise workdir.PrepareError("refused")
  assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("values,message", [
    (dict(random_seed=-1), "--random_seed=-1 must be from 0 to 4294967295"),
    (dict(max_sequences_per_pack=0), "--max_sequences_per_pack=0 must be >= 1"),
])
def test_settings_out_of_range_are_refused_before_any_step(vocab, tmp_path, values, message):
  line = error_line(run_cli(str(tmp_path / "out"), vocab, pack="true", **values))
  assert message in line
  assert not os.path.exists(str(tmp_path / "out" / "work"))


def test_missing_vocab(tmp_path):
  output_dir = tmp_path / "out"
  line = error_line(run_cli(str(output_dir), str(tmp_path / "vocab.txt")))
  assert "vocab file" in line and "does not exist" in line and "--vocab=" in line
  assert not output_dir.exists()


def test_second_run_on_the_same_folder_is_refused(run_a, vocab):
  with workdir.locked(workdir.Layout(run_a)):
    line = error_line(run_cli(run_a, vocab))
  assert "another prepare_wiki run is using" in line


def test_full_disk_is_reported_and_finished_work_kept(run_a, vocab, tmp_path, monkeypatch):
  output_dir = str(tmp_path / "full")
  real_atomic_output = shard.atomic_output

  def full_disk(path, binary=False):
    if "part-00002" in path:
      raise OSError(errno.ENOSPC, "No space left on device", path)
    return real_atomic_output(path, binary)

  monkeypatch.setattr(shard, "atomic_output", full_disk)
  with pytest.raises(OSError) as raised:
    pipeline.run_pipeline(output_dir, dump=SAMPLE, vocab=vocab, **SMALL)
  message = pipeline.describe_os_error(raised.value)
  assert message.startswith("the disk is full writing ")
  assert "run the same command again: finished work is kept" in message
  assert sorted(os.listdir(os.path.join(output_dir, "work", "done"))) == [
      "clean", "clean.json", "extract", "extract.json", "segment", "segment.json"]
  assert not [n for n in os.listdir(os.path.join(output_dir, "text", "train"))]
  monkeypatch.setattr(shard, "atomic_output", real_atomic_output)
  pipeline.run_pipeline(output_dir, dump=SAMPLE, vocab=vocab, **SMALL)
  assert files_under(output_dir) == files_under(run_a)


def test_full_disk_names_the_file_or_else_the_output_folder(tmp_path):
  path = str(tmp_path / "part-00001-of-00004")
  with pytest.raises(OSError) as raised:
    with workdir.atomic_output(path) as writer:
      writer.write("text")
      # What write() raises on a full disk: no file named.
      raise OSError(errno.ENOSPC, "No space left on device")
  assert pipeline.describe_os_error(raised.value, str(tmp_path)).startswith(
      "the disk is full writing %s (No space left on device)" % path)
  assert os.listdir(str(tmp_path)) == []
  bare = OSError(errno.ENOSPC, "No space left on device")
  assert pipeline.describe_os_error(bare, "/data/bert wiki").startswith(
      "the disk is full writing files in /data/bert wiki (No space left on device)")


def test_sigterm_says_how_to_go_on_and_exits_143(vocab, tmp_path):
  output_dir = str(tmp_path / "out")
  values = dict(SMALL, dump=SAMPLE, vocab=vocab, output_dir=output_dir, jobs=2)
  process = subprocess.Popen(
      ["bash", os.path.join(ROOT, "tools", "prepare_wiki.sh")] +
      ["--%s=%s" % item for item in values.items()], stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, universal_newlines=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  seen = []
  for line in process.stderr:
    seen.append(line)
    if line.startswith("prepare_wiki: shard:"):
      break
  # Step tfrecords is starting its workers (each loads TensorFlow): stop it there.
  process.send_signal(signal.SIGTERM)
  _, rest = process.communicate(timeout=120)
  stderr = "".join(seen) + rest
  assert process.returncode == 143, stderr
  assert stderr.splitlines()[-1] == ("prepare_wiki: terminated (SIGTERM); run the same "
                                     "command again to go on where it stopped")
  assert "Traceback" not in stderr


def test_tensorflow_write_errors_read_as_os_errors():
  full = tf.errors.ResourceExhaustedError(None, None, "/x/part-1; No space left on device")
  error = records.os_error_from_tf(full, "/x/part-1")
  assert error.errno == errno.ENOSPC and error.filename == "/x/part-1"
  assert pipeline.describe_os_error(error).startswith(
      "the disk is full writing /x/part-1 (No space left on device)")
  other = records.os_error_from_tf(tf.errors.UnknownError(None, None, "bad"), "/y")
  assert pipeline.describe_os_error(other) == "/y: TensorFlow could not write it: bad"


def test_pack_adds_packed_records_to_a_finished_folder_and_resumes_like_the_others(
    run_a, vocab, tmp_path):
  output_dir = str(tmp_path / "packed")
  shutil.copytree(run_a, output_dir)
  original = files_under(run_a)
  result = run_cli(output_dir, vocab, pack="true")
  assert result.returncode == 0, result.stderr
  assert "tfrecords: 0 files made (5 done before)" in result.stderr
  assert "prepare_wiki: pack: %d sequences in, " % (
      json.load(open(os.path.join(run_a, "manifest.json")))["counts"]["train"]["instances"]
  ) in result.stderr
  assert "the packed training records are in %s" % os.path.join(
      output_dir, "packed_train_data") in result.stdout
  after = files_under(output_dir)
  changed = ("manifest.json", "settings.json")
  assert {p: b for p, b in after.items() if p not in changed} == {
      p: b for p, b in original.items() if p not in changed}
  settings = json.load(open(os.path.join(output_dir, "settings.json")))["settings"]
  assert settings["max_sequences_per_pack"] == 3
  packed = os.path.join(output_dir, "packed_train_data")
  names = sorted(n for n in os.listdir(packed) if n.startswith("part-"))
  assert names == ["part-%05d-of-00004" % i for i in range(4)]
  manifest = json.load(open(os.path.join(output_dir, "manifest.json")))
  assert sorted(p for p in manifest["files"] if p.startswith("packed_train_data/")) == [
      "packed_train_data/" + n for n in names]
  # A lost packed file is made again, the same; nothing else is redone.
  kept = open(os.path.join(packed, names[1]), "rb").read()
  os.remove(os.path.join(packed, names[1]))
  result = run_cli(output_dir, vocab, pack="true")
  assert result.returncode == 0, result.stderr
  assert "pack_records: write: 1 files written (3 done before)" in result.stderr
  assert open(os.path.join(packed, names[1]), "rb").read() == kept
  # Without --pack the folder is accepted as it is; step pack alone needs --pack, and
  # other packing settings are refused.
  result = run_cli(output_dir, vocab)
  assert result.returncode == 0, result.stderr
  assert "pack:" not in result.stderr
  line = error_line(run_cli(output_dir, vocab, steps="pack"))
  assert "step pack packs the training records only with --pack; pass --pack" in line
  line = error_line(run_cli(output_dir, vocab, max_sequences_per_pack=2))
  assert "(max_sequences_per_pack=3 there, 2 now) of step pack, which this run" in line
  # With --pack, other packing settings redo the packs alone, when asked to.
  line = error_line(run_cli(output_dir, vocab, pack="true", max_sequences_per_pack=2))
  assert line.endswith("(max_sequences_per_pack=3 there, 2 now): that redoes steps pack, "
                       "manifest, whose finished work would be deleted; pass "
                       "--redo_changed_steps to do so, or the same settings to resume")
  result = run_cli(output_dir, vocab, pack="true", max_sequences_per_pack=2,
                   redo_changed_steps="true")
  assert result.returncode == 0, result.stderr
  assert ("settings changed (max_sequences_per_pack=3 there, 2 now): redoing steps pack, "
          "manifest; " in result.stderr)
  assert "tfrecords: 0 files made (5 done before)" in result.stderr
  assert "eval: done before" in result.stderr
  manifest = json.load(open(os.path.join(output_dir, "manifest.json")))
  assert manifest["settings"]["max_sequences_per_pack"] == 2
  assert manifest["packed"]["sequences_in"] == manifest["packed"]["sequences_out"]


def test_sigusr2_prints_the_python_stacks_of_a_run_which_then_goes_on(vocab, tmp_path):
  process = start_cli(str(tmp_path / "out"), vocab, jobs=2)
  try:
    lines = []
    for line in process.stderr:  # the steps before tfrecords take a second or less
      lines.append(line)
      if line.startswith("prepare_wiki: shard: "):
        break
    process.send_signal(signal.SIGUSR2)
    out, err = process.communicate(timeout=300)
  finally:
    if process.poll() is None:
      process.kill()
  assert process.returncode == 0, "".join(lines) + err
  # faulthandler's dump of the main process, in whichever step it was; the signal may
  # reach another of its threads (the pool's), which is then the "Current thread".
  assert re.search(r'(?m)^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):\n'
                   r'(  File ".*", line \d+ in \S+\n)*  File ".*pipeline\.py", line \d+ in '
                   r'run_pipeline\n', err), err
  assert "prepare_wiki: done. Train with" in out


def _read_until_tfrecords(process):
  """The stderr of a start_cli run up to the start of step tfrecords (its workers then
  start, and load TensorFlow)."""
  seen = []
  for line in process.stderr:  # the steps before tfrecords take a second or less
    seen.append(line)
    if line.startswith("prepare_wiki: shard: "):
      break
  return "".join(seen)


def test_a_worker_killed_mid_run_ends_it_with_one_line_and_the_same_command_finishes(
    run_a, vocab, tmp_path):
  output_dir = str(tmp_path / "out")
  process = start_cli(output_dir, vocab, jobs=2)
  try:
    seen = _read_until_tfrecords(process)
    workers = workers_of(process.pid)
    os.kill(workers[0], signal.SIGKILL)
    out, err = process.communicate(timeout=300)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
  result = subprocess.CompletedProcess(process.args, process.returncode, out, seen + err)
  assert error_line(result, status=1) == "prepare_wiki: error: %s" % processes.WorkerDied()
  assert "Traceback" not in result.stderr
  assert gone(workers[1])  # the other worker did not go on alone
  assert os.path.exists(os.path.join(output_dir, "work", "done", "shard.json"))
  result = run_cli(output_dir, vocab, jobs=2)
  assert result.returncode == 0, result.stderr
  assert "shard: done before" in result.stderr
  assert files_under(output_dir) == files_under(run_a)
