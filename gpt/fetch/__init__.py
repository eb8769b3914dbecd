"""Files from elsewhere, always ending as local files: object stores and Hugging Face datasets
through fsspec (objectstore.py), and a pretrained model's files from the Hub's cache, an object
store or a folder (model_source.py)."""
