"""load-corpus's data path and train-gpt's batches: where a text comes from (sources.py,
objectstore.py for s3:// and gs://), how it is cleaned (cleaning.py) and tokenized into token files
in bounded memory (tokenizer.py, tokenfiles.py, progress.py), and the batches read back from them
(batches.py)."""
