"""spark-bpe: exact, distributed byte-level BPE tokenizer training on Apache Spark."""

__version__ = "0.2.0"
