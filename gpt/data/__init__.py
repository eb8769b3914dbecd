"""load-corpus's work, the corpus path: the stage (corpus.py) reads a text from where it comes
from (sources.py; records of JSON Lines and Parquet, records.py; formats and decompression,
formats.py; read ahead on a thread, ahead.py), cleans it (cleaning.py) and tokenizes it into
token files in bounded memory (tokenfiles.py)."""
