"""Batches: the documented formula, exact resumption, epoch coverage, sharding, accounting."""

import hashlib
import subprocess
import sys
import warnings

import numpy as np
import pytest

from attnlab.config import DataConfig
from attnlab.data import Batches, check_budget, prepare, validation_batches

SEQ_LEN, BATCH, SEED = 32, 8, 7


@pytest.fixture(scope="module")
def data_cfg(tmp_path_factory):
    return DataConfig(max_bytes=120_000, cache_dir=str(tmp_path_factory.mktemp("batch_cache")))


@pytest.fixture(scope="module")
def corpus(data_cfg):
    return prepare(data_cfg)


def _reference_batch(tokens, seq_len, batch, seed, i):
    """Batch i written out row by row from the definition in attnlab/data/batches.py."""
    windows = (len(tokens) - 1) // seq_len
    rows = []
    for row in range(i * batch, (i + 1) * batch):
        epoch, position = divmod(row, windows)
        w = np.random.default_rng([seed, epoch]).permutation(windows)[position]
        rows.append(tokens[w * seq_len : w * seq_len + seq_len + 1])
    return np.stack(rows)


def test_batches_follow_the_definition(corpus):
    batches = Batches(corpus, "train", SEQ_LEN, BATCH, SEED)
    tokens = corpus.tokens("train")
    per_epoch = batches.windows_per_epoch
    assert per_epoch == (len(tokens) - 1) // SEQ_LEN
    straddling = per_epoch // BATCH  # a batch that holds the end of epoch 0 and start of epoch 1
    for i in [0, 1, 17, straddling, straddling + 1, 3 * straddling + 2]:
        got = batches[i]
        assert got.shape == (BATCH, SEQ_LEN + 1) and got.dtype == np.int32
        np.testing.assert_array_equal(got, _reference_batch(tokens, SEQ_LEN, BATCH, SEED, i))


def test_every_window_once_per_epoch(corpus):
    batches = Batches(corpus, "train", SEQ_LEN, BATCH, SEED)
    per_epoch = batches.windows_per_epoch
    n_batches = -(-2 * per_epoch // BATCH)  # enough for two epochs
    windows = np.concatenate([batches.window_indices(i) for i in range(n_batches)])
    for epoch in range(2):
        seen = windows[epoch * per_epoch : (epoch + 1) * per_epoch]
        np.testing.assert_array_equal(np.sort(seen), np.arange(per_epoch))
    # Epochs are shuffled differently.
    assert not np.array_equal(windows[:per_epoch], windows[per_epoch : 2 * per_epoch])


def test_every_target_token_is_predicted_once_per_epoch(corpus):
    batches = Batches(corpus, "train", SEQ_LEN, BATCH, SEED)
    per_epoch = batches.windows_per_epoch
    starts = (
        np.concatenate([batches.window_indices(i) for i in range(per_epoch // BATCH)]) * SEQ_LEN
    )
    targets = (starts[:, None] + np.arange(1, SEQ_LEN + 1)).reshape(-1)
    assert len(np.unique(targets)) == len(targets)  # no token predicted twice
    assert targets.min() >= 1 and targets.max() <= corpus.num_tokens("train") - 1


def test_resumed_run_sees_identical_batches(corpus, data_cfg):
    """Batch i after a restart (a fresh interpreter loading the cached corpus) is identical."""
    indices = [0, 5, 123, 4000]
    before = Batches(corpus, "train", SEQ_LEN, BATCH, SEED)
    digests = [hashlib.sha256(before[i].tobytes()).hexdigest() for i in indices]
    script = (
        "import hashlib; from attnlab.config import DataConfig; "
        "from attnlab.data import prepare, Batches; "
        f"c = prepare(DataConfig(max_bytes={data_cfg.max_bytes}, "
        f"cache_dir={data_cfg.cache_dir!r})); "
        f"b = Batches(c, 'train', {SEQ_LEN}, {BATCH}, {SEED}); "
        f"print(' '.join(hashlib.sha256(b[i].tobytes()).hexdigest() for i in {indices}))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == digests
    # Random access in any order, on a new object, gives the same batches.
    after = Batches(prepare(data_cfg), "train", SEQ_LEN, BATCH, SEED)
    for i in reversed(indices):
        np.testing.assert_array_equal(after[i], before[i])


def test_seed_changes_the_order_only(corpus):
    a = Batches(corpus, "train", SEQ_LEN, BATCH, seed=0)
    b = Batches(corpus, "train", SEQ_LEN, BATCH, seed=1)
    assert not np.array_equal(a[0], b[0])
    assert np.array_equal(np.sort(a.window_order(0)), np.sort(b.window_order(0)))


def test_token_accounting(corpus):
    batches = Batches(corpus, "train", SEQ_LEN, BATCH, SEED)
    assert batches.tokens_per_batch == BATCH * SEQ_LEN
    assert batches.tokens_after(9) == 10 * BATCH * SEQ_LEN
    assert batches.epoch(9) == pytest.approx(10 * BATCH / batches.windows_per_epoch)
    # One epoch of windows is one epoch of predicted tokens.
    steps = batches.windows_per_epoch / BATCH
    assert batches.epoch(steps - 1) == pytest.approx(1.0)
    assert batches.tokens_after(steps - 1) == batches.windows_per_epoch * SEQ_LEN


def test_process_slices_make_up_the_global_batch(corpus):
    whole = Batches(corpus, "train", SEQ_LEN, BATCH, SEED)
    shards = [
        Batches(corpus, "train", SEQ_LEN, BATCH, SEED, process_index=p, process_count=4)
        for p in range(4)
    ]
    for i in [0, 3, 99]:
        parts = [s[i] for s in shards]
        assert all(p.shape == (BATCH // 4, SEQ_LEN + 1) for p in parts)
        np.testing.assert_array_equal(np.concatenate(parts), whole[i])
    assert shards[1].tokens_per_batch == whole.tokens_per_batch  # counts are global


def test_validation_batches_are_fixed_and_from_validation(corpus):
    val = validation_batches(corpus, SEQ_LEN, batch_size=4, n_batches=3)
    assert val.shape == (3, 4, SEQ_LEN + 1) and val.dtype == np.int32
    np.testing.assert_array_equal(val, validation_batches(corpus, SEQ_LEN, 4, 3))
    stream = corpus.tokens("validation")
    windows = (len(stream) - 1) // SEQ_LEN
    starts = (np.arange(12) * windows // 12) * SEQ_LEN
    expected = np.stack([stream[s : s + SEQ_LEN + 1] for s in starts]).reshape(3, 4, -1)
    np.testing.assert_array_equal(val, expected)
    assert len(np.unique(starts)) == 12  # distinct windows


def test_budget_warning_past_one_epoch(corpus):
    per_epoch = Batches(corpus, "train", SEQ_LEN, BATCH, SEED).windows_per_epoch * SEQ_LEN
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_budget(corpus, per_epoch, SEQ_LEN) == []
    with pytest.warns(UserWarning, match="2.00 epochs"):
        messages = check_budget(corpus, 2 * per_epoch, SEQ_LEN)
    assert len(messages) == 1 and "repeated data" in messages[0]
