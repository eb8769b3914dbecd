"""The tokenizer room: GPT-2's shipped ranks (ranks.py), its compaction to a corpus
(compaction.py), the tokenizer kinds a run can have (kinds.py), their Hugging Face form
(huggingface.py), and a pretrained model's tokenizer recognised (recognition.py)."""
