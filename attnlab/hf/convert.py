"""``import_hf``: an HF checkpoint directory -> an attnlab run directory (a normal run:
``config.json`` and a step-0 checkpoint that ``generate``, ``extrapolate`` and ``train`` read);
``export_hf``: a run's latest checkpoint -> an HF checkpoint directory. Both are exact (float32
copies, transposes and concatenations), refuse what attnlab cannot represent in one line naming
the file or key, and write nothing unless everything succeeded.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import jax
import numpy as np

from attnlab import rundir
from attnlab.config import Config, DataConfig
from attnlab.hf.families import Family, HFError, family_of_config, family_of_model
from attnlab.hf.files import (Weights, check_target, read_config, staged, tokenizer_file,
                              write_directory)
from attnlab.checks import check
from attnlab.model import resolve
from attnlab.train.checkpoint import Checkpoints, path_name, param_shapes
from attnlab.train.load import load_config, load_params
from attnlab.train.optimizer import optimizer_for
from attnlab.train.state import TrainState, abstract_model


def import_hf(source: str | Path, workdir: str | Path, base: Config | None = None,
              notes: list[str] | None = None) -> Config:
    """Reads the HF checkpoint at ``source`` into a new run directory ``workdir``; the run's
    data and train sections and name are ``base``'s (default: ``data.seq_len`` the
    checkpoint's context, everything else attnlab's defaults), its model the checkpoint's.

    ``notes``: a list the import appends what the user should know to (an exact restriction
    such as BERT's single token type).

    Returns the run's config. Raises HFError / ConfigError in one line naming the file, HF key
    or field; ``workdir`` is then left as it was.
    """
    source, workdir = Path(source), Path(workdir)
    check_target(workdir)
    hf = read_config(source)
    family = family_of_config(hf)
    model = family.model_config(hf)
    if notes is not None:
        notes.extend(family.notes(hf))
    if base is None:
        _check_default_data_fits(model)
        cfg = Config(model=model, data=DataConfig(seq_len=family.context_length(hf)),
                     name=f"hf-{family.model_type}")
    else:
        cfg = dataclasses.replace(base, model=model)
    check(cfg)
    graphdef, abstract = abstract_model(cfg)
    arrays = read_params(family, cfg, Weights(source), param_shapes(abstract))
    params = jax.tree_util.tree_map_with_path(
        lambda p, _: jax.numpy.asarray(arrays[path_name(p)]), abstract)
    optimizer, _ = optimizer_for(cfg)
    state = TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params,
                       opt_state=optimizer.init(params))
    with staged(workdir) as stage:
        rundir.write_json_atomic(stage / rundir.CONFIG_FILE, cfg.to_dict())
        with Checkpoints(stage / rundir.CHECKPOINT_DIR, keep=cfg.train.keep_checkpoints) as c:
            c.save(state, {"step": 0, "data_position": 0, "tokens": 0,
                           "model": dataclasses.asdict(cfg.model),
                           "param_shapes": param_shapes(abstract),
                           "imported_from": str(source.absolute())})
        tokenizer = tokenizer_file(source)
        if tokenizer is not None:
            shutil.copyfile(tokenizer, stage / rundir.TOKENIZER_FILE)
    return cfg


def _check_default_data_fits(model) -> None:
    """Without --config a run gets attnlab's default data (bytes: 256 ids, and a masked
    model's [MASK] after them): a vocabulary too small for it is refused by what the
    checkpoint has, not by a tokenizer the user never chose."""
    need = 257 if resolve(model).objective.uses_mask else 256
    if model.vocab_size < need:
        mask = " and a [MASK] id after them" if need == 257 else ""
        raise HFError(f"config.json: vocab_size={model.vocab_size} is smaller than the 256 "
                      f"byte ids{mask} of attnlab's default data; import with --config naming "
                      f"data whose tokenizer fits (e.g. data.source=markov)")


def read_params(family: Family, cfg: Config, weights: Weights,
                shapes: dict[str, list[int]]) -> dict[str, np.ndarray]:
    """``{attnlab path: float32 array}`` from the checkpoint's tensors, every tensor checked
    against the model's shapes; a missing, misshapen or unexpected tensor is refused."""
    tensors = family.tensors(cfg.model)
    weights.rename(family.canonical)
    folded = family.folded()
    out: dict[str, np.ndarray] = {}
    for tensor in tensors:
        want = tensor.hf_shape([tuple(shapes[p]) for p in tensor.paths])
        _check_present(weights, tensor.key, want)
        got = weights.shapes[tensor.key]
        if tuple(got) != tuple(want):
            raise HFError(f"{weights.files[tensor.key]}: tensor {tensor.key} has shape "
                          f"{list(got)}, the config says {list(want)}")
        value = family.fold(tensor.key, weights.read(tensor.key),
                            lambda key: _read_present(weights, key))
        out.update(zip(tensor.paths, tensor.from_hf(value)))
    known = {t.key for t in tensors} | set(folded)
    copies = family.tied_copies(cfg.model)
    for key in sorted(set(weights.shapes) - known):
        if key.endswith(family.ignored_tensors) and family.ignored_tensors:
            continue
        if key in copies:
            # Some saves write a tied tensor too: accepted only as the parameter itself.
            value, tied = weights.read(key), out[copies[key]]
            if value.shape == tied.shape and np.array_equal(value, tied):
                continue
            raise HFError(f"{weights.files[key]}: tensor {key} differs from the tensor it is "
                          "tied to (attnlab holds one parameter for both)")
        raise HFError(f"{weights.files[key]}: tensor {key} has no place in attnlab's "
                      f"{family.model_type} model (a part attnlab lacks)")
    missing = set(shapes) - set(out)
    if missing:  # a family's map that misses a parameter of the model it builds
        raise HFError(f"{family.model_type}: no HF tensor holds {sorted(missing)[0]}")
    return out


def _check_present(weights: Weights, key: str, shape=None) -> None:
    if key not in weights.shapes:
        where = "" if shape is None else f" (shape {list(shape)})"
        raise HFError(f"{weights.directory}: missing tensor {key}{where}")


def _read_present(weights: Weights, key: str) -> np.ndarray:
    _check_present(weights, key)
    return weights.read(key)


def export_hf(run: str | Path, target: str | Path, step: int | None = None) -> dict:
    """Writes the run's checkpoint (latest, or ``step``) as an HF checkpoint directory at
    ``target``; returns its config. Raises HFError naming the field a family cannot hold."""
    run, target = Path(run), Path(target)
    check_target(target)
    cfg = load_config(run)
    family = family_of_model(cfg.model)
    hf = family.hf_config(cfg.model, cfg.data.seq_len)  # refusals before reading any tensor
    cfg, _, params = load_params(run, step)
    arrays = {path_name(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(params)}
    tensors, used = {}, set()
    for tensor in family.tensors(cfg.model):
        tensors[tensor.key] = tensor.to_hf(*(arrays[p] for p in tensor.paths))
        used.update(tensor.paths)
    if set(arrays) - used:
        raise HFError(f"model parameter {sorted(set(arrays) - used)[0]} has no place in a "
                      f"{family.model_type} checkpoint")
    tensors.update(family.unfolded(cfg.model))  # e.g. BERT's token types: zeros
    write_directory(target, hf, tensors, tokenizer_file(run))
    return hf
