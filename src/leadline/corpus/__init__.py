"""The corpus: what the loss scores, the length, packing and the held-out split.

Every number leadline derives is counted in scored tokens — the labels the loss scores after
the causal shift, not the tokens read. The modules, one concern each:

- :mod:`~leadline.corpus.rows` — reading JSON Lines or rows in memory, the formats, bad rows;
- :mod:`~leadline.corpus.tokenize` / :mod:`~leadline.corpus.chat` — tokenizing as the loader
  will (chat template, EOS, assistant-only loss), batched;
- :mod:`~leadline.corpus.lengths` / :mod:`~leadline.corpus.profile` — the streaming profile;
- :mod:`~leadline.corpus.collate` — micro-batches with host-counted scored tokens;
- :mod:`~leadline.corpus.packing` — packed sequences with per-row boundaries;
- :mod:`~leadline.corpus.splits` / :mod:`~leadline.corpus.losses` — held-out rows as data.

Importing this package loads neither torch nor transformers; the functions that need them
import them when called.
"""

from leadline.corpus.collate import MicroBatch, collate
from leadline.corpus.losses import row_losses
from leadline.corpus.packing import Packing, pack_steps
from leadline.corpus.profile import CorpusProfile, data_notes, profile_corpus
from leadline.corpus.rows import Example, read_rows
from leadline.corpus.splits import Split, split_rows
from leadline.corpus.tokenize import TokenizedRow, tokenize_rows

__all__ = [
    "CorpusProfile",
    "Example",
    "MicroBatch",
    "Packing",
    "Split",
    "TokenizedRow",
    "collate",
    "data_notes",
    "pack_steps",
    "profile_corpus",
    "read_rows",
    "row_losses",
    "split_rows",
    "tokenize_rows",
]
