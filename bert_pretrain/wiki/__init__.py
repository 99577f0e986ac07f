"""The Wikipedia pipeline: a MediaWiki dump -> MLPerf BERT TFRecords and eval set.

Run it with tools/prepare_wiki.sh or python3 -m bert_pretrain.wiki; __main__.py holds the
command line and its help, which explains the steps, resuming and the outputs. The
modules, in the order the data goes through them:

  pipeline.py     run_pipeline: checks the inputs and the settings against the output
                  folder, then runs the steps in order.
  workdir.py      the output folder: paths (Layout), atomic writes, done-markers, the
                  progress line, the lock (the worker processes: ../processes.py).
  extract.py      step extract: the dump's pages -> plain text, with markup.py
                  (wikitext_to_text).
  chunk_steps.py  steps clean and segment, with clean.py (clean_text) and sentences.py
                  (split_sentences).
  shard.py        step shard: held-out articles and balanced text shards.
  tfrecords.py    step tfrecords: create_pretraining_data on every shard.
  pack.py         step pack (--pack): bert_pretrain.pack_records on the training records.
  evalset.py      step eval: the eval set picked from the held-out instances.
  manifest.py     step manifest: counts and every output's sha256.
"""
