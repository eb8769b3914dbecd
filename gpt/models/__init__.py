"""The GPT (model.py) and what is computed with it: the chunked loss (loss.py), the spelled
embedding (spelling.py), and model/, the Hugging Face directory it is exported to and read back
from (export.py, with hf.py mapping our names and config to GPT-NeoX's or GPT-2's)."""
