"""Offline tokenizer and text dataset for TorchTitan runs.

The torchtitan wheel ships neither a tokenizer nor a dataset, and jobs must not
reach a model hub. This builds both from text every Python install has (the
standard library's own sources), once, into ``$WORKBENCH_ASSETS`` (default
``~/.cache/workbench/titan-assets``):

``tokenizer/``   ``tokenizer.json`` (byte-level BPE, ``VOCAB_SIZE`` tokens, what
                 the llama3 debug model's embedding expects) and
                 ``tokenizer_config.json`` (BOS/EOS), read by torchtitan's
                 ``HuggingFaceTokenizer`` via ``hf_assets_path``.
``corpus/``      ``train.jsonl`` with one ``{"text": ...}`` per source file, read by
                 the ``c4_test`` dataset loader (``load_dataset(path, split="train")``)
                 via ``--dataloader.dataset_path``.

Replica groups start together and may all build at once: each builds into a
private temporary directory and renames it into place; the first rename wins
and the others discard theirs, so a reader never sees a half-written asset.
"""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

VOCAB_SIZE = 2048
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
CORPUS_BYTES = 8 * 2**20
VERSION = "1"


def assets_dir() -> Path:
    root = os.environ.get("WORKBENCH_ASSETS") or Path.home() / ".cache" / "workbench" / "titan-assets"
    return Path(root).expanduser() / f"v{VERSION}-vocab{VOCAB_SIZE}"


def source_texts(limit_bytes: int = CORPUS_BYTES) -> list[str]:
    """The standard library's Python sources, in a fixed order, up to ``limit_bytes``."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if len(text) < 200:
            continue
        texts.append(text)
        total += len(text)
        if total >= limit_bytes:
            break
    return texts


def _build(into: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # only when the assets are built

    texts = source_texts()
    corpus = into / "corpus"
    corpus.mkdir(parents=True)
    with open(corpus / "train.jsonl", "w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tok_dir = into / "tokenizer"
    tok_dir.mkdir()
    tokenizer.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True})
    )


def ensure_assets() -> Path:
    """Return the assets directory, building it first if it does not exist."""
    final = assets_dir()
    if (final / "tokenizer" / "tokenizer.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        _build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "tokenizer" / "tokenizer.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


if __name__ == "__main__":
    print(ensure_assets())
