"""Corpus, tokenizer cache and sampler (in this process; no training)."""

from __future__ import annotations

import hashlib
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsdpctl.workload import data
from fsdpctl.workload.config import ConfigError
from fsdpctl.workload.sampler import Sampler

pytestmark = pytest.mark.workload


def _hash(docs: list[str]) -> str:
    return hashlib.sha256("\x00".join(docs).encode()).hexdigest()


def test_builtin_corpus_is_deterministic_and_sized(monkeypatch):
    first = data.build_builtin_corpus()
    # the filesystem walk order must not matter: walk every folder in reverse
    real_walk = os.walk

    def reversed_walk(top, *args, **kwargs):
        for folder, dirs, files in real_walk(top, *args, **kwargs):
            dirs.reverse()
            yield folder, dirs, list(reversed(files))

    monkeypatch.setattr(data.os, "walk", reversed_walk)
    second = data.build_builtin_corpus()
    assert _hash(first) == _hash(second)
    size = sum(len(d) for d in first)
    assert 300_000 <= size <= data.BUILTIN_CAP_CHARS
    assert len(first) > 500
    text = "\n".join(first)
    assert text.count(" the ") > 2000  # English prose, not code


def test_builtin_corpus_cache_reuses_the_same_text(tmp_path):
    a = data.load_builtin(tmp_path)
    cached = list(tmp_path.glob("builtin-*.json"))
    assert len(cached) == 1
    b = data.load_builtin(tmp_path)
    assert a.digest == b.digest and a.train_docs == b.train_docs
    assert a.digest == data._digest(data.build_builtin_corpus(), None)


def test_tokens_are_cached_atomically_and_reused(tmp_path):
    corpus = data.Corpus("t", ["hello world, this is a tiny corpus. " * 50, "another doc " * 40], None,
                         "ab" * 32)
    folder = data.cache_folder(tmp_path, corpus, 300)
    data.build_tokens(corpus, 300, folder)
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["meta.json", "tokenizer.json", "train.bin"]  # no temp files left
    stamp = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    data.build_tokens(corpus, 300, folder)  # cached: nothing rewritten
    assert stamp == {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    tokens = data.load_tokens(folder, val_fraction=0.25)
    assert tokens.train.dtype == np.uint16
    assert abs(len(tokens.val) / (len(tokens.train) + len(tokens.val)) - 0.25) < 0.01
    assert tokens.vocab_size <= 300
    assert len(tokens.train) + len(tokens.val) > 20


def _write_wikitext(folder: Path) -> Path:
    folder.mkdir(parents=True)
    text = "\n".join(d for d in (data.__doc__, data.Corpus.__doc__, np.__doc__) if d)
    (folder / "wiki.train.raw").write_text(" = Title = \n" + text * 3)
    (folder / "wiki.valid.raw").write_text(" = Other = \n" + text)
    (folder / "wiki.test.raw").write_text(" = Test = \n" + text[:500])
    return folder


def test_wikitext2_from_data_dir_keeps_its_own_split(tmp_path):
    folder = _write_wikitext(tmp_path / "wt2")
    corpus = data.load_corpus("wikitext2", str(folder), tmp_path / "cache")
    assert corpus.val_docs is not None and corpus.train_docs[0].startswith(" = Title")
    out = data.cache_folder(tmp_path / "cache", corpus, 400)
    data.build_tokens(corpus, 400, out)
    tokens = data.load_tokens(out, val_fraction=0.5)  # ignored: the dataset has a split
    assert (out / "val.bin").is_file() and len(tokens.train) > 2 * len(tokens.val)


def test_wikitext2_missing_files_and_missing_datasets(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"^data_dir: .* lacks wiki.train.raw"):
        data.load_corpus("wikitext2", str(tmp_path), tmp_path / "cache")
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(ConfigError) as info:
        data.fetch_wikitext2(tmp_path / "cache")
    assert info.value.name == "dataset" and "--data-dir" in info.value.fix


def test_wikitext2_hub_failure_is_one_clear_line(tmp_path, monkeypatch):
    def load_dataset(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wikitext' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(ConfigError) as info:
        data.fetch_wikitext2(tmp_path / "cache")
    assert "\n" not in str(info.value) and "Couldn't reach" in str(info.value)


def test_wikitext2_fetched_with_datasets_lands_in_the_cache(tmp_path, monkeypatch):
    splits = {"train": {"text": [" = A = \n", "train text\n"]}, "validation": {"text": ["valid\n"]},
              "test": {"text": ["test\n"]}}
    fake = types.SimpleNamespace(load_dataset=lambda *args, **kwargs: splits)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    data.fetch_wikitext2(tmp_path)
    corpus = data.load_corpus("wikitext2", None, tmp_path)
    assert corpus.train_docs == [" = A = \ntrain text\n"] and corpus.val_docs == ["valid\n"]
    monkeypatch.setitem(sys.modules, "datasets", None)
    data.fetch_wikitext2(tmp_path)  # cached: datasets not needed again


def test_path_dataset_file_and_folder(tmp_path):
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("second file\n")
    (folder / "sub" / "a.md").write_text("nested file\n")
    (folder / ".hidden").write_text("skip me\n")
    (folder / "blob.bin").write_bytes(bytes(range(256)))
    corpus = data.load_corpus(str(folder), None, tmp_path)
    assert corpus.train_docs == ["second file\n", "nested file\n"]  # sorted paths, text only
    single = data.load_corpus(str(folder / "b.txt"), None, tmp_path)
    assert single.train_docs == ["second file\n"]
    with pytest.raises(ConfigError, match="^dataset: "):
        data.load_corpus(str(tmp_path / "missing"), None, tmp_path)


# ---------------------------------------------------------------- sampler

TOKENS = np.arange(10_000, dtype=np.uint16)


def _step_windows(sampler: Sampler) -> list[np.ndarray]:
    return [x for x, _ in sampler.next_step()]


@settings(max_examples=30, deadline=None)
@given(world=st.sampled_from([1, 2, 4]), batch=st.integers(1, 4), accum=st.integers(1, 3),
       seed=st.integers(0, 10**6))
def test_global_batch_depends_only_on_its_size(world, batch, accum, seed):
    """world ranks x batch x accum see the same windows per step as one rank x (the product)."""
    single = Sampler(TOKENS, 16, world * batch * accum, world=1, rank=0, grad_accum=1, seed=seed)
    ranks = [Sampler(TOKENS, 16, batch, world=world, rank=r, grad_accum=accum, seed=seed)
             for r in range(world)]
    for _ in range(3):
        expected = _step_windows(single)[0]
        got = np.concatenate([w for s in ranks for w in _step_windows(s)])
        assert sorted(map(tuple, got)) == sorted(map(tuple, expected))


def test_ranks_get_disjoint_targets_shifted_by_one():
    a = Sampler(TOKENS, 8, 2, world=2, rank=0, grad_accum=1, seed=1)
    b = Sampler(TOKENS, 8, 2, world=2, rank=1, grad_accum=1, seed=1)
    (xa, ya), = a.next_step()
    (xb, _), = b.next_step()
    assert not set(xa[:, 0]) & set(xb[:, 0])
    assert (ya[:, :-1] == xa[:, 1:]).all() and xa.shape == (2, 8)


def test_sampler_resumes_from_its_state_and_rolls_epochs():
    sampler = Sampler(TOKENS[:200], 8, 4, world=1, rank=0, grad_accum=1, seed=3)  # 24 windows
    assert sampler.steps_per_epoch == 6
    seen = [_step_windows(sampler)[0] for _ in range(4)]
    state = sampler.state()
    later = [_step_windows(sampler)[0] for _ in range(5)]
    assert sampler.epoch == 1  # 9 steps of 4 windows: into the second epoch
    again = Sampler(TOKENS[:200], 8, 4, world=1, rank=0, grad_accum=1, seed=3)
    again.load_state(state)
    assert all((a == b).all() for a, b in zip(later, [_step_windows(again)[0] for _ in range(5)],
                                              strict=True))
    first_epoch = np.concatenate(seen + later[:2])
    assert len({row[0] for row in first_epoch}) == 24  # every window once per epoch
